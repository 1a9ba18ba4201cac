package sm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
)

// SnapshotInfo describes a snapshot stream VerifySnapshot checked.
type SnapshotInfo struct {
	Slot       uint64 // the applied slot the stream reflects
	Records    uint64 // every record: data and metadata
	DataKeys   uint64 // tenant keys
	DataBytes  uint64 // key and value bytes of the tenant keys (user keys, without the tenant prefix)
	Tenants    uint64 // tenants with at least one key
	Clients    uint64 // exactly-once table entries
	Tombstones uint64 // exactly-once tombstones
	// Membership is the membership the stream records (members.go);
	// HasMembership is false when none was ever changed through the log.
	Membership    Membership
	HasMembership bool
}

// VerifySnapshot reads a whole snapshot stream (what Snapshot produces) and
// checks it as Restore would, without storing anything: the format, every
// record's kind, lengths and key, the end record's count and checksum,
// nothing after it; and beyond what Restore needs before it opens the
// result: keys in strictly increasing order (as Snapshot writes them), the
// applied slot stored in the stream equal to its header's, every
// exactly-once entry and tombstone decodable, and the membership, when the
// stream records one, decodable. Errors wrap ErrBadSnapshot.
func VerifySnapshot(r io.Reader) (SnapshotInfo, error) {
	var info SnapshotInfo
	var prev []byte
	var lastTenant []byte
	appliedSeen := false
	var applied []byte
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadSnapshot}, args...)...)
	}
	slot, count, err := scanSnapshot(r, func(key, val []byte) error {
		if prev != nil && bytes.Compare(key, prev) <= 0 {
			return bad("key %x does not sort after %x", key, prev)
		}
		prev = key
		switch {
		case !bytes.HasPrefix(key, metaPrefix):
			info.DataKeys++
			info.DataBytes += uint64(len(key)-len(metaPrefix)) + uint64(len(val))
			if !bytes.Equal(key[:len(metaPrefix)], lastTenant) {
				info.Tenants++
				lastTenant = key[:len(metaPrefix)]
			}
		case bytes.Equal(key, appliedKey):
			appliedSeen, applied = true, val
		case bytes.HasPrefix(key, clientsKeyPrefix):
			if _, err := decodeClientEntry(val); err != nil {
				return bad("exactly-once entry %x: %v", key, err)
			}
			info.Clients++
		case bytes.Equal(key, membersKey):
			if len(val) < 8 {
				return bad("membership of %d bytes", len(val))
			}
			members, err := DecodeMembership(val[8:])
			if err != nil {
				return bad("membership: %v", err)
			}
			info.Membership = Membership{Slot: binary.BigEndian.Uint64(val), Members: members}
			info.HasMembership = true
		case bytes.HasPrefix(key, usageKeyPrefix):
			if len(key) != len(usageKeyPrefix)+4 {
				return bad("usage key %x of %d bytes", key, len(key))
			}
			if _, err := decodeUsage(val); err != nil {
				return bad("usage key %x: %v", key, err)
			}
		case bytes.HasPrefix(key, tombsKeyPrefix):
			if _, err := decodeTombstone(val); err != nil {
				return bad("exactly-once tombstone %x: %v", key, err)
			}
			info.Tombstones++
		}
		return nil
	})
	if err != nil {
		return SnapshotInfo{}, err
	}
	info.Slot, info.Records = slot, count
	switch {
	case !appliedSeen:
		// Restore refuses it too (checkApplied).
		return SnapshotInfo{}, bad("header slot %d, but the stream stores no applied slot", slot)
	case appliedSeen && (len(applied) != 8 || binary.BigEndian.Uint64(applied) != slot):
		return SnapshotInfo{}, bad("header slot %d, stored applied slot %x", slot, applied)
	}
	return info, nil
}
