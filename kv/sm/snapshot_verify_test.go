package sm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// snapshotStream applies a few writes for two tenants and returns the
// snapshot stream and its slot.
func snapshotStream(t *testing.T) ([]byte, uint64) {
	t.Helper()
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	a.apply(1, put("a", "1"))
	a.apply(1, put("b", "22"))
	a.apply(2, put("c", "333"))
	return snapshotBytes(t, s)
}

func TestVerifySnapshot(t *testing.T) {
	stream, slot := snapshotStream(t)
	info, err := VerifySnapshot(bytes.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	// Records: 3 data keys, 2 client entries, the applied slot, 2 tenants'
	// usage entries and the usage marker.
	want := SnapshotInfo{Slot: slot, Records: 9, DataKeys: 3, DataBytes: 1 + 1 + 1 + 2 + 1 + 3, Tenants: 2, Clients: 2}
	if !reflect.DeepEqual(info, want) {
		t.Fatalf("info %+v, want %+v", info, want)
	}
}

// reseal rewrites the end record of a stream whose records were edited, so
// that only the check under test can catch the edit.
func reseal(t *testing.T, body []byte, count uint64) []byte {
	t.Helper()
	end := append([]byte{snapEnd}, binary.BigEndian.AppendUint64(nil, count)...)
	return append(append([]byte(nil), body...), binary.BigEndian.AppendUint64(end, xxhash.Sum64(body))...)
}

func record(key, val []byte) []byte {
	b := []byte{snapRecord}
	b = binary.BigEndian.AppendUint32(b, uint32(len(key)))
	b = append(b, key...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(val)))
	return append(b, val...)
}

func TestVerifySnapshotRefuses(t *testing.T) {
	stream, slot := snapshotStream(t)
	head := append(append([]byte(nil), snapshotMagic...), binary.BigEndian.AppendUint64(nil, slot)...)
	applied := record(appliedKey, binary.BigEndian.AppendUint64(nil, slot))
	flip := append([]byte(nil), stream...)
	flip[30] ^= 0x10
	cases := map[string][]byte{
		"truncated":        stream[:len(stream)-1],
		"bit flip":         flip,
		"trailing":         append(append([]byte(nil), stream...), 0),
		"out of order":     reseal(t, append(append(append([]byte(nil), head...), record([]byte("\x00\x00\x00\x02b"), nil)...), append(record([]byte("\x00\x00\x00\x01a"), nil), applied...)...), 3),
		"duplicate key":    reseal(t, append(append(append([]byte(nil), head...), applied...), applied...), 2),
		"no applied slot":  reseal(t, append(append([]byte(nil), head...), record([]byte("\x00\x00\x00\x01a"), nil)...), 1),
		"applied mismatch": reseal(t, append(append([]byte(nil), head...), record(appliedKey, binary.BigEndian.AppendUint64(nil, slot+1))...), 1),
		"bad client entry": reseal(t, append(append(append([]byte(nil), head...), applied...), record(append(bytes.Clone(clientsKeyPrefix), 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9), []byte{1, 2})...), 2),
		"bad tombstone":    reseal(t, append(append(append([]byte(nil), head...), applied...), record(append(bytes.Clone(tombsKeyPrefix), 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9), make([]byte, 16))...), 2),
	}
	for name, b := range cases {
		if _, err := VerifySnapshot(bytes.NewReader(b)); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: %v, want ErrBadSnapshot", name, err)
		}
	}
}
