package replica

import (
	"errors"
	"fmt"
	"time"
)

// Snapshot staging and the disk reserve. A node that catches up by
// snapshot writes the whole state into a staging directory beside its
// live store (kv/sm "Staged restores") before it swaps it in, so for a
// while it needs room for both. Staging that ran the filesystem full would
// also starve the live store, and a Pebble that cannot write its MANIFEST
// stops the process; so the fetcher checks this node's disk (the probe of
// ShareDiskSpace: free space against disk_free_min_bytes) before a
// transfer and before staging every chunk, and stops stagingMarginBytes
// above the reserve: the partial copy is removed, the transfer ends
// "no_space"
// (synod_snapshot_transfers_total{direction="received",result="no_space"}),
// a warning says so, and the next attempt waits snapshotNoSpaceBackoff.
// Such a node cannot catch up until it has room for the state twice over.
// The margin keeps the staging itself from taking the node below its
// reserve, so its disk report does not say low (and the leader does not
// refuse the cluster's growing writes) because a member tried to stage a
// snapshot it has no room for.

// snapshotNoSpaceBackoff is how long the fetcher waits after stopping at
// the reserve before it tries again (a var: tests shorten it).
var snapshotNoSpaceBackoff = 30 * time.Second

// stagingMarginBytes is how far above the reserve staging stops. The
// probe reads the free space afresh before every chunk (at most
// snapshotChunkBytesMax), so staging overshoots by a chunk and what the
// table writer holds; the margin also leaves room for the live store's
// own writes meanwhile. With a reading cached for 250 ms a staging on
// tmpfs overshot the margin by 14 MiB (TestFollowerCatchUpStopsAtReserve:
// 82 MiB free under a 96 MiB reserve).
const stagingMarginBytes = 32 << 20

var errSnapNoSpace = errors.New("replica: no room to stage the snapshot")

// stagingRoom returns errSnapNoSpace when this node's disk is below its
// reserve + stagingMarginBytes, or its free space cannot be read (staged:
// bytes of the transfer staged so far, for the message).
// Without a probe (no ShareDiskSpace) it never refuses.
func (r *Replica) stagingRoom(staged uint64) error {
	p := r.diskProbe.Load()
	if p == nil {
		return nil
	}
	d := (*p)()
	switch {
	case d.ReadFailed:
		return fmt.Errorf("%w: the free space cannot be read (%d bytes staged)", errSnapNoSpace, staged)
	case d.Low || (d.ReserveBytes > 0 && d.FreeBytes < d.ReserveBytes+stagingMarginBytes):
		return fmt.Errorf("%w: %d bytes free, within %d of the reserve of %d (disk_free_min_bytes), with %d bytes staged; the state needs room twice over while it is staged",
			errSnapNoSpace, d.FreeBytes, stagingMarginBytes, d.ReserveBytes, staged)
	case d.ReserveBytes == 0 && d.StagingFreeKnown && d.StagingFreeBytes < stagingMarginBytes:
		// Without a reserve nothing else looks, and a staging store that
		// meets a full disk stops the process (Pebble's MANIFEST write:
		// a CI run's node on a full disk was offered a snapshot, began to
		// stage it and exited).
		return fmt.Errorf("%w: %d bytes free (no disk reserve set), under the %d a transfer needs to begin, with %d bytes staged",
			errSnapNoSpace, d.StagingFreeBytes, stagingMarginBytes, staged)
	}
	return nil
}

// waitOrStop waits d, or until Close; false when Close came first.
func (r *Replica) waitOrStop(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.stop:
		return false
	case <-t.C:
		return true
	}
}
