// Package pmem is the acceptor's durable log: a file mapped MAP_SHARED whose
// stores are made durable by persist barriers instead of write()+fsync().
// An acceptor may answer Promise or Accepted only after SetPromised or
// Persist covering that state has returned.
//
// # Persist modes
//
//	mode   file                        persist                                  survives
//	dax    on a DAX fs (mount -o dax)  CLWB|CLFLUSHOPT|CLFLUSH per line + SFENCE process crash, power loss
//	msync  ordinary file               msync(MS_SYNC) of the dirty pages        process crash, power loss
//	shm    under /dev/shm (tmpfs)      SFENCE only                              process crash only (NOT power loss)
//
// dax maps with MAP_SYNC|MAP_SHARED_VALIDATE; if the kernel refuses that the
// open fails with an error naming the fix; it is never silently downgraded.
// Every result measured in shm mode must say that it does not survive a
// power loss.
//
// # Region layout
//
// All integers are little-endian. Everything in this section, and the
// constants Magic, FormatVersion, headerBytes, recordHeaderBytes,
// recordAlignBytes and the RecordType values, are part of the on-media
// format: changing any of them needs a new FormatVersion.
//
//	offset  bytes  content
//	0       64     identity line (written once, at format; its magic last)
//	64      64     meta copy 0
//	128     64     meta copy 1
//	192     3904   zero
//	4096    n      data ring: records, 64-byte aligned, n = RegionBytes-4096
//
// Identity line:
//
//	+0  magic "SYNODPML"   [8]byte
//	+8  format version     uint32   (FormatVersion)
//	+12 reserved           uint32   (zero)
//	+16 cluster id         uint64
//	+24 node id            uint64
//	+32 region bytes       uint64
//	+40 seed               uint64   (random at format; seeds every checksum)
//	+48 reserved           uint64   (zero)
//	+56 checksum           uint64   xxhash64(bytes 0..56)
//
// Format persists the whole header with the magic zeroed, then stores and
// persists the magic (one aligned 8-byte store): a zero magic means the
// format was interrupted and Open formats again, unless a meta copy shows
// a generation >= 1 (then the region is refused as corrupt).
//
// Meta copy (double-buffered: an update writes the copy NOT holding the
// newest sequence and persists that one line, so a crash tears at most the
// copy being written and recovery falls back to the other, older one; a
// ballot is therefore never torn):
//
//	+0  checksum           uint64   xxhash64 seeded with seed over bytes 8..64
//	+8  sequence           uint64   the valid copy with the larger one wins
//	+16 promised round     uint64
//	+24 promised node      uint64
//	+32 head position      uint64   logical position of the oldest live record
//	+40 truncated below    uint64   records with Slot below this are dead
//	+48 generation         uint64   incremented and persisted by every Open
//	+56 reserved           uint64   (zero)
//
// Record (starts on a 64-byte boundary of the ring; occupies
// roundup(56+length, 64) bytes; never crosses the end of the ring):
//
//	+0  checksum           uint64   xxhash64 seeded with seed over bytes 8..56+length
//	+8  length             uint32   payload bytes
//	+12 type               uint8    RecordEntry, RecordPad, RecordSnapshotMark
//	+13 reserved           [3]byte  (zero)
//	+16 slot               uint64
//	+24 ballot round       uint64
//	+32 ballot node        uint64
//	+40 position           uint64   logical position of this record
//	+48 generation         uint64   generation of the Open that wrote it
//	+56 payload            [length]byte
//
// A logical position grows forever; a record at position p lives at ring
// offset p mod n. Storing the position in the record tells a record of
// this lap from a stale one left by an earlier lap at the same offset.
// Storing the generation tells a record written after the last recovery
// from a stale one an earlier incarnation wrote beyond a tail that recovery
// cut (generations along the log never decrease). When a record does not
// fit before the end of the ring a RecordPad record fills the rest of the
// ring and the record starts at the next lap. Append zeroes the 64-byte
// line after the last record (the end marker; none when the ring is full)
// and Persist covers it, so recovery finds a clean end there instead of
// the stale bytes of an earlier lap.
//
// # Space reclamation: a ring with a head
//
// TruncateBelow(s) records s as the truncation point (Iterate never again
// returns a record with Slot < s) and advances the head over the leading
// records whose Slot is below s. Slots are not monotonic in the log (an
// acceptor re-accepts a slot with a higher ballot, and slots arrive out of
// order), so the head stops at the first record whose Slot >= s: the space
// of dead records behind a live one is reclaimed only once that live one is
// truncated too. Append never overwrites a record at or after the head: it
// returns a *FullError (errors.Is(err, ErrFull)) and appends nothing.
//
// # Limits
//
//   - RecordBytesMax (1 MiB) bounds one record, header and padding included;
//     a record is also refused if it exceeds half the data ring, because a
//     record plus the pad before it might then never fit. Both return
//     ErrRecordTooLarge.
//   - RegionBytesMin (64 KiB) and RegionBytesMax (1 TiB) bound the region;
//     the size must be a multiple of RegionAlignBytes (4 KiB). Open refuses
//     other sizes with ErrRegionSize.
//   - AppendBatchRecordsMax bounds one Append call.
//
// Recovery is described by the decision table in recover.go.
package pmem
