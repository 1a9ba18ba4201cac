package replica

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"testing"
)

var (
	floorsOld = []AuthFloor{{Sender: 1, Channel: 0, Incarnation: 5, Counter: 7}}
	floorsNew = []AuthFloor{{Sender: 1, Channel: 0, Incarnation: 5, Counter: 900}, {Sender: 3, Channel: 2, Incarnation: 6, Counter: 8}}
)

// writeSlot writes gen's slot of fs into the file image b, only its
// first keep bytes (a write torn there; -1: all of it).
func writeSlot(b []byte, gen uint64, fs []AuthFloor, keep int) {
	s := EncodeAuthFloorsSlot(gen, fs)
	if keep >= 0 {
		s = s[:keep]
	}
	copy(b[AuthFloorsSlotOffset(gen):], s)
}

// TestAuthFloorsFileSurvivesTornWrite: a floors file written in place
// keeps its last complete record whatever a crash tears. The second
// write torn after each of its bytes, and every byte of it flipped: the
// file reads as the first write (or, whole, as the second), never as an
// error or a mix. Planted (testingAuthFloorsOneSlot: every write into the
// same slot): a torn write leaves no record.
func TestAuthFloorsFileSurvivesTornWrite(t *testing.T) {
	torn, flipped, errs := tearSecondWrite(t)
	if errs != 0 {
		t.Fatalf("%d torn or flipped second writes left no readable record", errs)
	}
	testingAuthFloorsOneSlot = true
	defer func() { testingAuthFloorsOneSlot = false }()
	_, _, pErrs := tearSecondWrite(t)
	if pErrs == 0 {
		t.Fatalf("planted (one slot): every torn write still read back; the test does not show the second slot's use")
	}
	fmt.Printf("floors file torn writes: torn=%d flipped=%d unreadable=%d; planted (one slot): unreadable=%d\n", torn, flipped, errs, pErrs)
}

// tearSecondWrite writes floorsOld as write 1 and floorsNew as write 2,
// torn after each byte and with each byte flipped, and checks what each
// file reads as: a number of unreadable files, the rest checked.
func tearSecondWrite(t *testing.T) (torn, flipped, unreadable int) {
	t.Helper()
	check := func(b []byte, what string, whole bool) {
		fs, gen, err := DecodeAuthFloorsFile(b)
		switch {
		case err != nil:
			unreadable++
		case whole && (gen != 2 || !slices.Equal(fs, floorsNew)):
			t.Errorf("%s: read write %d %+v, want write 2", what, gen, fs)
		case !whole && (gen != 1 || !slices.Equal(fs, floorsOld)):
			t.Errorf("%s: read write %d %+v, want write 1", what, gen, fs)
		}
	}
	n := len(EncodeAuthFloorsSlot(2, floorsNew))
	for keep := 0; keep <= n; keep++ {
		b := AuthFloorsFileImage(1, floorsOld)
		writeSlot(b, 2, floorsNew, keep)
		check(b, fmt.Sprintf("torn after %d of %d bytes", keep, n), keep == n)
		torn++
	}
	for i := 0; i < n; i++ {
		b := AuthFloorsFileImage(1, floorsOld)
		writeSlot(b, 2, floorsNew, -1)
		b[int(AuthFloorsSlotOffset(2))+i] ^= 0x04
		check(b, fmt.Sprintf("byte %d flipped", i), false)
		flipped++
	}
	return torn, flipped, unreadable
}

// TestDecodeAuthFloorsFileMalformed: a file with no good slot, of another
// size, or with a slot that claims more than a record can hold is an
// error; a version 1 file reads as its record and write number 0; of two
// good slots the higher write number wins, wherever it stands.
func TestDecodeAuthFloorsFileMalformed(t *testing.T) {
	b := AuthFloorsFileImage(1, floorsOld)
	writeSlot(b, 2, floorsNew, -1)
	if fs, gen, err := DecodeAuthFloorsFile(b); err != nil || gen != 2 || !slices.Equal(fs, floorsNew) {
		t.Fatalf("two good slots: write %d %+v %v, want write 2", gen, fs, err)
	}
	writeSlot(b, 3, floorsOld, -1) // slot 1 again, now the newer
	if fs, gen, err := DecodeAuthFloorsFile(b); err != nil || gen != 3 || !slices.Equal(fs, floorsOld) {
		t.Fatalf("write 3 in the second slot: write %d %+v %v, want write 3", gen, fs, err)
	}
	if fs, gen, err := DecodeAuthFloorsFile(EncodeAuthFloors(floorsNew)); err != nil || gen != 0 || !slices.Equal(fs, floorsNew) {
		t.Fatalf("a version 1 file: write %d %+v %v, want its record and write 0", gen, fs, err)
	}
	for _, bad := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"zeros", make([]byte, AuthFloorsFileBytes)},
		{"one byte short", AuthFloorsFileImage(1, floorsOld)[:AuthFloorsFileBytes-1]},
		{"one byte long", append(AuthFloorsFileImage(1, floorsOld), 0)},
		{"write number 0", AuthFloorsFileImage(0, floorsOld)},
		{"a slot in the other's place", func() []byte {
			b := make([]byte, AuthFloorsFileBytes)
			copy(b[AuthFloorsSlotOffset(2):], EncodeAuthFloorsSlot(1, floorsOld))
			return b
		}()},
		{"a length past a record", func() []byte {
			b := AuthFloorsFileImage(1, floorsOld)
			off := int(AuthFloorsSlotOffset(1)) + len(authFloorsSlotMagic) + 8
			b[off], b[off+1], b[off+2], b[off+3] = 0xff, 0xff, 0, 0
			return b
		}()},
	} {
		if fs, _, err := DecodeAuthFloorsFile(bad.b); err == nil {
			t.Errorf("%s: read as %+v, want an error", bad.name, fs)
		}
	}
	// A slot whose own checksum holds around a damaged record: the
	// record's checksum refuses it.
	s := EncodeAuthFloorsSlot(1, floorsOld)
	s[authFloorsSlotHead+len(authFloorsMagic)] ^= 1
	s = encodeAuthFloorsSlotRaw(1, s[authFloorsSlotHead:len(s)-4])
	b = make([]byte, AuthFloorsFileBytes)
	copy(b[AuthFloorsSlotOffset(1):], s)
	if _, _, err := DecodeAuthFloorsFile(b); err == nil || !strings.Contains(err.Error(), "no valid slot") {
		t.Errorf("a slot around a damaged record: %v, want no valid slot", err)
	}
}

// encodeAuthFloorsSlotRaw is EncodeAuthFloorsSlot around any record bytes.
func encodeAuthFloorsSlotRaw(gen uint64, rec []byte) []byte {
	b := append([]byte(authFloorsSlotMagic), make([]byte, 12)...)
	binary.LittleEndian.PutUint64(b[len(authFloorsSlotMagic):], gen)
	binary.LittleEndian.PutUint32(b[len(authFloorsSlotMagic)+8:], uint32(len(rec)))
	b = append(b, rec...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

// FuzzDecodeAuthFloorsFile: whatever the bytes, decoding returns an error
// or records every one of which is a valid floor, from a version 1 file
// (write 0) or a slot that encodes back to the same bytes.
func FuzzDecodeAuthFloorsFile(f *testing.F) {
	b := AuthFloorsFileImage(1, floorsOld)
	writeSlot(b, 2, floorsNew, -1)
	f.Add(b)
	f.Add(AuthFloorsFileImage(7, nil))
	f.Add(EncodeAuthFloors(floorsNew))
	f.Add(make([]byte, AuthFloorsFileBytes))
	f.Fuzz(func(t *testing.T, b []byte) {
		fs, gen, err := DecodeAuthFloorsFile(b)
		if err != nil {
			return
		}
		if gen == 0 {
			if !bytes.Equal(EncodeAuthFloors(fs), b) {
				t.Fatalf("a version 1 file decoded to %+v, which encodes differently", fs)
			}
			return
		}
		s := EncodeAuthFloorsSlot(gen, fs)
		off := AuthFloorsSlotOffset(gen)
		if !bytes.Equal(b[off:off+int64(len(s))], s) {
			t.Fatalf("write %d decoded to %+v, which is not what its slot holds", gen, fs)
		}
	})
}
