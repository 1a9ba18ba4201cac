package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// The floors file: two slots written in turn, in place.
//
// kvnode records the floors every authFloorsPersistEvery while they
// change. Version 1 of the file was one record (EncodeAuthFloors) written
// to a new file, fsynced, renamed over the old one and the directory
// fsynced: a journal commit ten times a second, 2.4-3.0 % of each node's
// CPU at half the write ceiling on the 2-core VM
// (docs/benchmarking.md, "The replay floors written in place"). Version 2
// is a file of two fixed slots (AuthFloorsFileBytes, allocated once): the
// g-th write goes to slot g%2 and is flushed with fdatasync; its size and
// blocks never change, so no metadata has to reach the disk. A crash in
// the middle of a write tears at most that slot, whose checksum then
// fails, and the other slot, one write older, is read instead: what a
// restart may lose is the same as before, the packets of the last
// interval.
//
// A slot: authFloorsSlotMagic, the write number g (u64), the record's
// length n (u32), the record (EncodeAuthFloors, itself checksummed), and a
// CRC-32C of everything before it in the slot; little endian. The bytes
// after it up to the slot's end are not read.

const (
	// authFloorsSlotMagic opens a slot of the version 2 file.
	authFloorsSlotMagic = "SYNODAS2"
	// authFloorsSlotHead is a slot's header: magic, write number, length.
	authFloorsSlotHead = len(authFloorsSlotMagic) + 8 + 4
	// AuthFloorsSlotBytes is one slot: the largest record with its header
	// and checksum, rounded up to 4 KiB (a slot never shares a page with
	// the other).
	AuthFloorsSlotBytes = (authFloorsSlotHead + AuthFloorsBytesMax + 4 + 4095) / 4096 * 4096
	// AuthFloorsFileBytes is the version 2 file's size: two slots.
	AuthFloorsFileBytes = 2 * AuthFloorsSlotBytes
)

// AuthFloorsSlotOffset is where write number gen goes in the file.
func AuthFloorsSlotOffset(gen uint64) int64 {
	if testingAuthFloorsOneSlot {
		return 0
	}
	return int64(gen%2) * int64(AuthFloorsSlotBytes)
}

// testingAuthFloorsOneSlot plants a file written always into its first
// slot: a torn write then leaves no good record
// (TestAuthFloorsFileSurvivesTornWrite).
var testingAuthFloorsOneSlot bool

// EncodeAuthFloorsSlot encodes fs as write number gen (unpadded: write it
// at AuthFloorsSlotOffset(gen)).
func EncodeAuthFloorsSlot(gen uint64, fs []AuthFloor) []byte {
	rec := EncodeAuthFloors(fs)
	b := make([]byte, 0, authFloorsSlotHead+len(rec)+4)
	b = append(b, authFloorsSlotMagic...)
	b = binary.LittleEndian.AppendUint64(b, gen)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(rec)))
	b = append(b, rec...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

// AuthFloorsFileImage is a whole version 2 file whose only record is fs as
// write number gen (the other slot zero): what a node writes, the
// classic way, when it has no such file yet.
func AuthFloorsFileImage(gen uint64, fs []AuthFloor) []byte {
	b := make([]byte, AuthFloorsFileBytes)
	copy(b[AuthFloorsSlotOffset(gen):], EncodeAuthFloorsSlot(gen, fs))
	return b
}

// DecodeAuthFloorsFile decodes a floors file: for a version 2 file, the
// records of its valid slot with the higher write number, and that number
// (at least 1: writes are numbered from 1); for a file of version 1 (one
// record, the whole file), its records and write number 0, which tells
// the writer to replace it. A version 2 file with no valid slot, or
// anything else, is an error and no records.
func DecodeAuthFloorsFile(b []byte) (fs []AuthFloor, gen uint64, err error) {
	if len(b) != AuthFloorsFileBytes {
		fs, err = DecodeAuthFloors(b)
		if err != nil {
			return nil, 0, fmt.Errorf("%w (%d bytes; a version 2 file has %d)", err, len(b), AuthFloorsFileBytes)
		}
		return fs, 0, nil
	}
	var errs [2]error
	found := false
	for i := range 2 {
		sfs, sgen, serr := decodeAuthFloorsSlot(b[i*AuthFloorsSlotBytes : (i+1)*AuthFloorsSlotBytes])
		if serr == nil && AuthFloorsSlotOffset(sgen) != int64(i*AuthFloorsSlotBytes) {
			serr = fmt.Errorf("write %d in the other write numbers' slot", sgen)
		}
		if serr != nil {
			errs[i] = serr
			continue
		}
		if !found || sgen > gen {
			fs, gen, found = sfs, sgen, true
		}
	}
	if !found {
		return nil, 0, fmt.Errorf("%w: no valid slot (first: %v; second: %v)", errAuthFloors, errs[0], errs[1])
	}
	return fs, gen, nil
}

// decodeAuthFloorsSlot decodes one slot (AuthFloorsSlotBytes).
func decodeAuthFloorsSlot(s []byte) ([]AuthFloor, uint64, error) {
	if string(s[:len(authFloorsSlotMagic)]) != authFloorsSlotMagic {
		return nil, 0, errors.New("no slot magic")
	}
	gen := binary.LittleEndian.Uint64(s[len(authFloorsSlotMagic):])
	if gen == 0 {
		return nil, 0, errors.New("write number 0")
	}
	n := int(binary.LittleEndian.Uint32(s[len(authFloorsSlotMagic)+8:]))
	if n > AuthFloorsBytesMax {
		return nil, 0, fmt.Errorf("a record of %d bytes (at most %d)", n, AuthFloorsBytesMax)
	}
	end := authFloorsSlotHead + n
	if crc32.Checksum(s[:end], crcTable) != binary.LittleEndian.Uint32(s[end:]) {
		return nil, 0, errors.New("checksum mismatch")
	}
	fs, err := DecodeAuthFloors(s[authFloorsSlotHead:end])
	if err != nil {
		return nil, 0, err
	}
	return fs, gen, nil
}
