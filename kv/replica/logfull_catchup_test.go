package replica

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"synod/paxos"
	"synod/pmem"
)

// cappedLog is an acceptor log that reports itself full past capBytes in
// use: a small ring for one node of a test cluster.
type cappedLog struct {
	AcceptorLog
	capBytes int64
}

func (l cappedLog) Append(entries []paxos.Entry) error {
	if used, _ := l.AcceptorLog.Usage(); used >= l.capBytes {
		return fmt.Errorf("%w: capped at %d bytes", ErrLogFull, l.capBytes)
	}
	return l.AcceptorLog.Append(entries)
}

func (l cappedLog) Usage() (used, capacity int64) {
	used, _ = l.AcceptorLog.Usage()
	return used, l.capBytes
}

// TestFullLogFollowerCatchesUp: a restarted follower with a small acceptor
// log lags below the leader's compaction point; while its snapshot
// transfer is held after the first chunk, the leader keeps writing and the
// follower's log fills with entries it cannot commit (they lie above the
// snapshot it has not installed). Once the transfer completes, the
// follower must install the snapshot and catch up: a full log must not
// stop it from taking input (HEAD before the fix stalled its Ready on the
// full log, so the install was deferred forever).
func TestFullLogFollowerCatchesUp(t *testing.T) {
	defer withChunkBytes(4 << 10)()
	const keys, valBytes = 80, 500
	const capBytes, fillBytes = AcceptorLogBytesMin, 8 << 10
	var capped atomic.Uint64
	c := newTestClusterWith(t, func(c *testCluster) {
		c.snapEvery = 20
		c.wrapLog = func(id paxos.NodeID, l AcceptorLog) AcceptorLog {
			if uint64(id) == capped.Load() {
				return cappedLog{AcceptorLog: l, capBytes: capBytes}
			}
			return l
		}
	})
	leader, f := laggingFollower(c, keys, valBytes)

	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	TestingSnapshotChunkHook = func(node paxos.NodeID, seq uint64) {
		if node == f && seq == 1 {
			once.Do(func() {
				close(held)
				<-release
			})
		}
	}
	defer func() { c.stopAll(); TestingSnapshotChunkHook = nil }() // the cluster first: its loops read the hook
	capped.Store(uint64(f))
	c.start(f)
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("the follower started no snapshot transfer")
	}
	// Fill the follower's log with entries above the snapshot.
	val := strings.Repeat("w", fillBytes)
	deadline := time.Now().Add(20 * time.Second)
	n := 0
	for counterValue(c.nodes[f].r.metrics.LogFull) == 0 {
		if time.Now().After(deadline) {
			used, ring := c.nodes[f].r.alog.Usage()
			t.Fatalf("the follower's log never filled (%d/%d bytes)", used, ring)
		}
		c.put(fmt.Sprintf("w%04d", n), val)
		n++
	}
	for i := 0; i < 40; i++ { // and keep writing into the full log
		c.put(fmt.Sprintf("w%04d", n), val)
		n++
	}
	close(release)
	for i := 0; i < 40; i++ { // and while the follower catches up
		c.put(fmt.Sprintf("w%04d", n), val)
		n++
	}
	c.checkCaughtUp(leader, f, keys, valBytes)
	if counterValue(c.nodes[f].r.metrics.Installed) == 0 {
		t.Fatal("the follower caught up without installing a snapshot: the test did not exercise the install")
	}
	t.Logf("follower %d caught up at slot %d after %d writes into its full log", f, c.nodes[f].r.Applied(), n)
}

// TestAcceptBytesOverEstimates: the admission estimate of an Accept is at
// least the ring space its entries take in a real acceptor log, for empty,
// small, unaligned and large entries (an under-estimate would let a Ready
// stall on a full log again).
func TestAcceptBytesOverEstimates(t *testing.T) {
	plog, _, err := OpenPMemLog(pmem.Options{Path: filepath.Join(t.TempDir(), "est.pmem"), SizeBytes: 8 << 20,
		Mode: pmem.ModeMsync, ClusterID: 9, NodeID: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer plog.Close()
	b := paxos.Ballot{Round: 1 << 40, Node: 3}
	shapes := [][][]byte{nil, {{}}, {[]byte("x")}, {make([]byte, 61), make([]byte, 3)}, {make([]byte, 64<<10)}}
	for i, cmds := range shapes {
		typ := paxos.EntryNormal
		if cmds == nil {
			typ = paxos.EntryNoop
		}
		m := paxos.Message{Type: paxos.MsgAccept, Entries: []paxos.Entry{{Slot: paxos.Slot(1000 + i), Ballot: b, Type: typ, Cmds: cmds}}}
		before, _ := plog.Usage()
		if err := plog.Append(m.Entries); err != nil {
			t.Fatal(err)
		}
		after, _ := plog.Usage()
		if est := acceptBytes(&m); est < after-before {
			t.Fatalf("shape %d: estimated %d bytes, the log took %d", i, est, after-before)
		}
	}
}

// TestAccelFastPathKeepsReserve: the accel fast path's log writes stop
// where admission does (admitBytesMax): a record that would eat into the
// reserve is refused with ErrLogFull (the plane then hands the accept up
// to software), though the ring still has room for it.
func TestAccelFastPathKeepsReserve(t *testing.T) {
	plog, _, err := OpenPMemLog(pmem.Options{Path: filepath.Join(t.TempDir(), "fast.pmem"), SizeBytes: pmem.RegionHeaderBytes + AcceptorLogBytesMin,
		Mode: pmem.ModeMsync, ClusterID: 9, NodeID: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer plog.Close()
	w := &accelWAL{log: plog}
	b := paxos.Ballot{Round: 1, Node: 2}
	payload := make([]byte, 64<<10)
	refused := false
	for s := paxos.Slot(1); s < 1000 && !refused; s++ {
		rec := pmem.Record{Type: pmem.RecordEntry, Slot: uint64(s), Ballot: pmem.Ballot{Round: b.Round, Node: uint64(b.Node)},
			Payload: paxos.AppendEntry(nil, &paxos.Entry{Slot: s, Ballot: b, Type: paxos.EntryNormal, Cmds: [][]byte{payload}})}
		used, capacity := plog.Usage()
		err := w.Append([]pmem.Record{rec})
		switch {
		case err == nil:
			if after, _ := plog.Usage(); after > admitBytesMax(capacity) {
				t.Fatalf("slot %d: the fast path filled %d of %d bytes, past the %d admission keeps", s, after, capacity, admitBytesMax(capacity))
			}
		case errors.Is(err, ErrLogFull):
			if used+int64(len(rec.Payload)) < admitBytesMax(capacity)-acceptEntryOverheadBytes {
				t.Fatalf("slot %d refused at %d of %d bytes, well below the line", s, used, capacity)
			}
			if capacity-used < int64(len(rec.Payload))+acceptEntryOverheadBytes {
				t.Fatalf("the ring itself was full (%d of %d): the test did not reach the reserve first", used, capacity)
			}
			refused = true
		default:
			t.Fatal(err)
		}
	}
	if !refused {
		t.Fatal("the fast path never kept the reserve")
	}
}

// acceptBytes over-estimates the ring space m's entries take, as admission
// counts an entry it would store (entryRingBytes).
func acceptBytes(m *paxos.Message) int64 {
	var n int64
	for i := range m.Entries {
		n += entryRingBytes(&m.Entries[i])
	}
	return n
}
