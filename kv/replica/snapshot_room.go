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
// transfer and before staging every chunk, and stops at the reserve: the
// partial copy is removed, the transfer ends "no_space"
// (synod_snapshot_transfers_total{direction="received",result="no_space"}),
// a warning says so, and the next attempt waits snapshotNoSpaceBackoff.
// Such a node cannot catch up until it has room for the state twice
// over: its disk report says low meanwhile only while the staging sits at
// the reserve, for a moment per attempt.

// snapshotNoSpaceBackoff is how long the fetcher waits after stopping at
// the reserve before it tries again (a var: tests shorten it).
var snapshotNoSpaceBackoff = 30 * time.Second

var errSnapNoSpace = errors.New("replica: no room to stage the snapshot")

// stagingRoom returns errSnapNoSpace when this node's disk is below its
// reserve (staged: bytes of the transfer staged so far, for the message).
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
	case d.Low:
		return fmt.Errorf("%w: %d bytes free, below the reserve of %d (disk_free_min_bytes), with %d bytes staged; the state needs room twice over while it is staged",
			errSnapNoSpace, d.FreeBytes, d.ReserveBytes, staged)
	}
	return nil
}

// waitOrStop waits d, or until Close.
func (r *Replica) waitOrStop(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.stop:
	case <-t.C:
	}
}
