package replica

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"synod/kv/sm"
	"synod/paxos"
)

func TestDiskReportRoundTrip(t *testing.T) {
	for _, d := range []DiskSpace{
		{Node: 1},
		{Node: 3, FreeBytes: 12345, ReserveBytes: 1 << 30, Low: true},
		{Node: paxos.MembersMax, FreeBytes: diskReportBytesMax, ReserveBytes: diskReportBytesMax},
		{Node: 2, Low: true, ReadFailed: true, ReserveBytes: 1},
		{Node: 4, FreeBytes: 1 << 40, Stuck: true},
		{Node: 5, Low: true, ReadFailed: true, Stuck: true},
	} {
		b := appendDiskReport(nil, 77, 5, d)
		if len(b) != diskReportBytes || !isDiskReport(b) || isAccelFrame(b) {
			t.Fatalf("%+v: %d bytes, isDiskReport %v, isAccelFrame %v", d, len(b), isDiskReport(b), isAccelFrame(b))
		}
		if _, err := paxos.UnmarshalMessage(b); err == nil {
			t.Fatalf("%+v: a report decodes as a paxos message", d)
		}
		cl, to, got, err := parseDiskReport(b)
		if err != nil || cl != 77 || to != 5 || got != d {
			t.Fatalf("round trip of %+v: cluster %d, to %d, %+v, %v", d, cl, to, got, err)
		}
	}
}

// TestDiskReportMalformed walks every length around the report's and every
// field's bad values: each is an error, none panics.
func TestDiskReportMalformed(t *testing.T) {
	good := appendDiskReport(nil, 77, 1, DiskSpace{Node: 3, FreeBytes: 10, ReserveBytes: 20, Low: true})
	for n := 0; n <= diskReportBytes+1; n++ {
		b := append(append([]byte(nil), good...), 0)[:n]
		if _, _, _, err := parseDiskReport(b); (err == nil) != (n == diskReportBytes) {
			t.Fatalf("%d bytes: %v", n, err)
		}
	}
	bad := map[string]func(b []byte){
		"magic":              func(b []byte) { b[0] = accelFrameMagic },
		"version 0":          func(b []byte) { b[1] = 0 },
		"version 2":          func(b []byte) { b[1] = 2 },
		"unknown flag":       func(b []byte) { b[2] |= 1 << 3 },
		"high flag":          func(b []byte) { b[2] |= 1 << 7 },
		"reserved byte":      func(b []byte) { b[3] = 1 },
		"node 0":             func(b []byte) { clear(b[12:20]) },
		"to node 0":          func(b []byte) { clear(b[20:28]) },
		"free above max":     func(b []byte) { b[35] = 0x20 },
		"reserve above max":  func(b []byte) { b[43] = 0x80 },
		"failed but not low": func(b []byte) { b[2] = diskReportFlagReadFailed },
	}
	for name, edit := range bad {
		b := append([]byte(nil), good...)
		edit(b)
		if _, _, _, err := parseDiskReport(b); !errors.Is(err, errBadDiskReport) {
			t.Errorf("%s: %v, want errBadDiskReport", name, err)
		}
	}
}

func FuzzParseDiskReport(f *testing.F) {
	f.Add(appendDiskReport(nil, 1, 3, DiskSpace{Node: 2, FreeBytes: 5, ReserveBytes: 6, Low: true}))
	f.Add([]byte{diskReportMagic})
	f.Fuzz(func(t *testing.T, b []byte) {
		cl, to, d, err := parseDiskReport(b)
		if err != nil {
			return
		}
		if again := appendDiskReport(nil, cl, to, d); !bytes.Equal(again, b) {
			t.Fatalf("accepted %x, re-encodes as %x", b, again)
		}
	})
}

// reportTestReplica is a Replica with just what disk reports touch: node
// 1 of members 1, 2, 3, cluster 77, a settable clock.
func reportTestReplica(now *time.Time) *Replica {
	r := &Replica{cfg: Config{ID: 1, ClusterID: 77, Now: func() time.Time { return *now }}, faults: &Faults{}}
	r.memberView.Store(&memberView{members: []sm.Member{{ID: 1}, {ID: 2}, {ID: 3, Learner: true}}})
	return r
}

// TestDiskReportsBelievedFromMembersOnly: a report counts only from
// another member, under this cluster, from its sealer, for
// diskReportStaleAfter, while its sender is a member.
func TestDiskReportsBelievedFromMembersOnly(t *testing.T) {
	now := time.Unix(1000, 0)
	r := reportTestReplica(&now)
	low := func(node paxos.NodeID) []byte {
		return appendDiskReport(nil, 77, 1, DiskSpace{Node: node, FreeBytes: 1, ReserveBytes: 2, Low: true})
	}
	refused := []struct {
		name   string
		b      []byte
		sender paxos.NodeID
	}{
		{"another cluster", appendDiskReport(nil, 78, 1, DiskSpace{Node: 2, Low: true}), 0},
		{"addressed to another node (a sealed report replayed here)", appendDiskReport(nil, 77, 3, DiskSpace{Node: 2, Low: true}), 2},
		{"sealed by another node", low(2), 3},
		{"this node's id", low(1), 0},
		{"not a member", low(9), 9},
		{"malformed", low(2)[:10], 2},
	}
	for _, c := range refused {
		if err := r.receiveDiskReport(c.b, c.sender); !errors.Is(err, errBadDiskReport) {
			t.Fatalf("%s: %v, want refused", c.name, err)
		}
		if got := r.MembersLowOnDisk(); got != nil {
			t.Fatalf("%s: believed: %+v", c.name, got)
		}
	}
	// A partition injected by /debug/faults drops it silently.
	r.faults.Block(2)
	if err := r.receiveDiskReport(low(2), 2); err != nil || r.MembersLowOnDisk() != nil {
		t.Fatalf("a report from a blocked peer: %v, %+v", err, r.MembersLowOnDisk())
	}
	r.faults.HealAll()

	// Believed: the learner 3 (sealed by itself), then the voter 2 (no secret).
	if err := r.receiveDiskReport(low(3), 3); err != nil {
		t.Fatal(err)
	}
	if err := r.receiveDiskReport(low(2), 0); err != nil {
		t.Fatal(err)
	}
	if got := r.MembersLowOnDisk(); len(got) != 2 || got[0].Node != 2 || got[1].Node != 3 || got[0].FreeBytes != 1 {
		t.Fatalf("two low members: %+v", got)
	}
	// Node 2 has room again.
	if err := r.receiveDiskReport(appendDiskReport(nil, 77, 1, DiskSpace{Node: 2, FreeBytes: 5, ReserveBytes: 2}), 2); err != nil {
		t.Fatal(err)
	}
	if got := r.MembersLowOnDisk(); len(got) != 1 || got[0].Node != 3 {
		t.Fatalf("after node 2 reported room: %+v", got)
	}
	// Node 3 stops reporting: it counts until diskReportStaleAfter, not at it.
	now = now.Add(diskReportStaleAfter - time.Nanosecond)
	if got := r.MembersLowOnDisk(); len(got) != 1 {
		t.Fatalf("just before the report is stale: %+v", got)
	}
	now = now.Add(time.Nanosecond)
	if got := r.MembersLowOnDisk(); got != nil {
		t.Fatalf("a stale report counts: %+v", got)
	}
	// A fresh one counts again, until node 3 leaves the membership.
	if err := r.receiveDiskReport(low(3), 3); err != nil || len(r.MembersLowOnDisk()) != 1 {
		t.Fatalf("fresh report: %v, %+v", err, r.MembersLowOnDisk())
	}
	r.memberView.Store(&memberView{members: []sm.Member{{ID: 1}, {ID: 2}}})
	if got := r.MembersLowOnDisk(); got != nil {
		t.Fatalf("a removed member's report counts: %+v", got)
	}
	if err := r.receiveDiskReport(low(3), 3); !errors.Is(err, errBadDiskReport) {
		t.Fatalf("a removed member's report: %v", err)
	}
	// The table holds members only.
	if err := r.receiveDiskReport(low(2), 2); err != nil {
		t.Fatal(err)
	}
	r.disks.mu.Lock()
	n := len(r.disks.latest)
	r.disks.mu.Unlock()
	if n != 1 {
		t.Fatalf("the report table holds %d entries for one other member", n)
	}
}

// TestDiskReportReachesLeader: real replicas over loopback with the
// cluster secret: a follower's low report reaches the leader within a few
// report intervals, and so does its recovery.
func TestDiskReportReachesLeader(t *testing.T) {
	c := newTestClusterWith(t, func(c *testCluster) { c.secret = secretA })
	l := c.leader()
	f := paxos.NodeID(1)
	if f == l {
		f = 2
	}
	var lowNow atomic.Bool
	lowNow.Store(true)
	for id, nd := range c.nodes {
		nd.r.ShareDiskSpace(func() DiskSpace {
			if id == f && lowNow.Load() {
				return DiskSpace{FreeBytes: 100, ReserveBytes: 200, Low: true}
			}
			return DiskSpace{FreeBytes: 300, ReserveBytes: 200}
		})
	}
	wait := func(what string, ok func([]DiskSpace) bool) {
		t.Helper()
		deadline := time.Now().Add(4 * diskReportInterval)
		for {
			got := c.nodes[l].r.MembersLowOnDisk()
			if ok(got) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the leader sees %+v", what, got)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wait("follower low", func(d []DiskSpace) bool {
		return len(d) == 1 && d[0].Node == f && d[0].FreeBytes == 100 && d[0].ReserveBytes == 200
	})
	lowNow.Store(false)
	wait("follower back with room", func(d []DiskSpace) bool { return d == nil })
	fmt.Printf("disk reports: follower %d low seen by leader %d, and its recovery\n", f, l)
}

// TestSnapshotStagingStopsAtReserve: a follower catching up by snapshot
// whose disk falls below its reserve while it stages stops at the next
// chunk: the transfer ends no_space, its partial copy is removed, nothing
// is installed, and it tries again after the back-off only once it has
// room; then it catches up.
func TestSnapshotStagingStopsAtReserve(t *testing.T) {
	defer withChunkBytes(8 << 10)()
	oldBackoff := snapshotNoSpaceBackoff
	snapshotNoSpaceBackoff = 200 * time.Millisecond
	defer func() { snapshotNoSpaceBackoff = oldBackoff }()
	var low, armed atomic.Bool
	probe := func() DiskSpace {
		if low.Load() {
			return DiskSpace{FreeBytes: 10, ReserveBytes: 20, Low: true}
		}
		return DiskSpace{FreeBytes: 20 + stagingMarginBytes, ReserveBytes: 20}
	}
	c := newTestClusterWith(t, func(c *testCluster) {
		c.snapEvery = 20
		c.secret = secretA
		c.diskProbe = map[paxos.NodeID]func() DiskSpace{1: probe, 2: probe, 3: probe}
	})
	leader, f := laggingFollower(c, 80, 500)
	before, err := os.ReadDir(c.dir)
	if err != nil {
		t.Fatal(err)
	}
	// One byte less than the margin stops a transfer before it begins.
	if err := c.nodes[leader].r.stagingRoom(0); err != nil {
		t.Fatalf("at the margin: %v", err)
	}
	setProbe := func(p func() DiskSpace) { c.nodes[leader].r.diskProbe.Store(&p) }
	setProbe(func() DiskSpace { return DiskSpace{FreeBytes: 20 + stagingMarginBytes - 1, ReserveBytes: 20} })
	if err := c.nodes[leader].r.stagingRoom(0); !errors.Is(err, errSnapNoSpace) {
		t.Fatalf("one byte inside the margin: %v", err)
	}
	setProbe(func() DiskSpace { return DiskSpace{} }) // reserve off, free space unknown
	if err := c.nodes[leader].r.stagingRoom(0); err != nil {
		t.Fatalf("reserve off: %v", err)
	}
	// Reserve off, the free space read for staging: the margin alone
	// (a staging store on a full disk stops the process).
	setProbe(func() DiskSpace { return DiskSpace{StagingFreeBytes: stagingMarginBytes, StagingFreeKnown: true} })
	if err := c.nodes[leader].r.stagingRoom(0); err != nil {
		t.Fatalf("reserve off, at the margin: %v", err)
	}
	setProbe(func() DiskSpace { return DiskSpace{StagingFreeBytes: stagingMarginBytes - 1, StagingFreeKnown: true} })
	if err := c.nodes[leader].r.stagingRoom(0); !errors.Is(err, errSnapNoSpace) {
		t.Fatalf("reserve off, one byte under the margin: %v", err)
	}
	// The disk falls below the reserve once two chunks are staged.
	armed.Store(true)
	TestingSnapshotChunkHook = func(id paxos.NodeID, seq uint64) {
		if id == f && seq == 2 && armed.CompareAndSwap(true, false) {
			low.Store(true)
		}
	}
	defer func() { c.stopAll(); TestingSnapshotChunkHook = nil }() // the cluster first: its loops read the hook
	c.start(f)
	fm := &c.nodes[f].r.metrics.Snap
	deadline := time.Now().Add(20 * time.Second)
	for counterValue(fm.Transfers.WithLabelValues(dirReceived, resultNoSpace)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no transfer stopped at the reserve: no_space %v, ok %v, failed %v", counterValue(fm.Transfers.WithLabelValues(dirReceived, resultNoSpace)),
				counterValue(fm.Transfers.WithLabelValues(dirReceived, resultOK)), counterValue(fm.Transfers.WithLabelValues(dirReceived, resultFailed)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if armed.Load() {
		t.Fatal("the staging never reached its second chunk")
	}
	if n := counterValue(c.nodes[f].r.metrics.Installed); n != 0 {
		t.Fatalf("installed %v snapshots below the reserve", n)
	}
	staged := counterValue(fm.ReceivedBytes)
	if staged == 0 || staged > 3*8<<10 {
		t.Fatalf("staged %v bytes before stopping, want 1-3 chunks of 8 KiB", staged)
	}
	after, err := os.ReadDir(c.dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("the aborted staging left entries: %d in %s before, %d after", len(before), c.dir, len(after))
	}
	// Room again: it catches up.
	low.Store(false)
	c.checkCaughtUp(leader, f, 80, 500)
	fmt.Printf("snapshot staging at the reserve: stopped_after_bytes=%v no_space_transfers>=2 installed_while_low=0 caught_up_after_room=true\n", staged)
}
