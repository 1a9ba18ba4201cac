package replica

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"synod/kv/sm"
	"synod/paxos"
)

// Disk reports: every node tells every other member, once per
// diskReportInterval, how much room its data directory's filesystem has
// and whether that is below its own reserve, so that the leader, which
// alone admits writes (kv/space), refuses writes that would grow the store
// while any member is short, not only while the leader itself is. A
// follower cannot refuse what it is asked to apply: a committed write it
// has no room for stalls its store, and Pebble stops the process when it
// cannot write its MANIFEST.
//
// A report is a small datagram on the consensus port, beside paxos
// messages and accel frames, sealed like them when the cluster has a
// secret. Layout (little endian), part of the wire format:
//
//	offset size field
//	0      1    diskReportMagic (never a paxos codec version or accelFrameMagic)
//	1      1    diskReportVersion (1)
//	2      1    flags: bit 0 below the reserve, bit 1 the free space could not be read,
//	            bit 2 the sender is stuck (stuck.go: it makes no progress applying or truncating)
//	3      1    reserved, 0
//	4      8    cluster id
//	12     8    from node
//	20     8    to node
//	28     8    free bytes (int64, >= 0)
//	36     8    the sender's reserve in bytes (int64, >= 0; 0: no reserve)
//
// A node of a version that predates reports drops them as undecodable
// consensus input (its synod_inbound_dropped_total grows by one per member
// per second during a rolling upgrade) and simply does not learn of its
// peers' disks; a node that knows the first two flags only (before the
// stuck flag) drops a report that carries the third. A report is believed only from a member of the committed
// membership other than the receiver, under the cluster's id, and (with a
// secret) only when its from field is the authenticated sender, and only
// by the node its to field names (the seal does not cover the receiver: a
// sealed report sent to one member and replayed to another is dropped, as
// paxos messages and accel frames are by their own to fields); it counts
// for diskReportStaleAfter, so a member that stops reporting (down,
// partitioned, removed) stops holding writes back.
const (
	diskReportMagic   = 0xD5
	diskReportVersion = 1
	diskReportBytes   = 44

	diskReportFlagLow        = 1 << 0
	diskReportFlagReadFailed = 1 << 1
	diskReportFlagStuck      = 1 << 2
	diskReportFlagsKnown     = diskReportFlagLow | diskReportFlagReadFailed | diskReportFlagStuck

	// diskReportInterval is how often a node sends its report.
	diskReportInterval = time.Second
	// diskReportStaleAfter is how long a report counts: several intervals,
	// so that a lost datagram or two does not flap the answer.
	diskReportStaleAfter = 5 * diskReportInterval
	// diskReportBytesMax bounds the byte figures a report may carry (an
	// exabyte): anything larger is malformed.
	diskReportBytesMax = 1 << 60
)

// DiskSpace is one node's view of its own data directory's filesystem.
type DiskSpace struct {
	Node paxos.NodeID
	// FreeBytes is the free space at the node's last reading.
	FreeBytes int64
	// ReserveBytes is the node's disk_free_min_bytes (0: no reserve).
	ReserveBytes int64
	// Low: FreeBytes is below ReserveBytes, or the reading failed.
	Low bool
	// ReadFailed: the node could not read its free space (it counts as
	// low: a node that cannot tell must not fill its disk).
	ReadFailed bool
	// StagingFreeBytes is, on a node without a reserve (ReserveBytes 0,
	// so FreeBytes is not read), the free space of the store's
	// filesystem read for this probe, when StagingFreeKnown. Local only:
	// a report does not carry it (stagingRoom uses it).
	StagingFreeBytes int64
	StagingFreeKnown bool
	// Stuck: the node has made no progress applying or truncating its
	// log with work waiting (stuck.go); it is no leader to hand over to.
	// Not about the disk, but carried by the same report.
	Stuck bool
}

var errBadDiskReport = errors.New("replica: malformed disk report")

// errMisaddressed: an authenticated packet whose payload is addressed to
// another node, a copy of a member's traffic to that node (the seal does
// not name the receiver). Counted as an authentication refusal.
var errMisaddressed = errors.New("replica: consensus packet addressed to another node (a replay of another member's traffic?)")

// isDiskReport says whether a datagram is a disk report (by its first
// byte).
func isDiskReport(b []byte) bool { return len(b) > 0 && b[0] == diskReportMagic }

// appendDiskReport appends the report of d, for node to of cluster, to buf.
func appendDiskReport(buf []byte, cluster uint64, to paxos.NodeID, d DiskSpace) []byte {
	var flags byte
	if d.Low {
		flags |= diskReportFlagLow
	}
	if d.ReadFailed {
		flags |= diskReportFlagReadFailed
	}
	if d.Stuck {
		flags |= diskReportFlagStuck
	}
	buf = append(buf, diskReportMagic, diskReportVersion, flags, 0)
	buf = binary.LittleEndian.AppendUint64(buf, cluster)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(d.Node))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(to))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(max(d.FreeBytes, 0)))
	return binary.LittleEndian.AppendUint64(buf, uint64(max(d.ReserveBytes, 0)))
}

// parseDiskReport decodes a report; anything but exactly one well-formed
// report of this version is an error.
func parseDiskReport(b []byte) (cluster uint64, to paxos.NodeID, d DiskSpace, err error) {
	if len(b) != diskReportBytes {
		return 0, 0, d, fmt.Errorf("%w: %d bytes, want %d", errBadDiskReport, len(b), diskReportBytes)
	}
	if b[0] != diskReportMagic {
		return 0, 0, d, fmt.Errorf("%w: magic %#x", errBadDiskReport, b[0])
	}
	if b[1] != diskReportVersion {
		return 0, 0, d, fmt.Errorf("%w: version %d", errBadDiskReport, b[1])
	}
	if b[2]&^diskReportFlagsKnown != 0 || b[3] != 0 {
		return 0, 0, d, fmt.Errorf("%w: unknown flags %#x/%#x", errBadDiskReport, b[2], b[3])
	}
	cluster = binary.LittleEndian.Uint64(b[4:12])
	to = paxos.NodeID(binary.LittleEndian.Uint64(b[20:28]))
	free := binary.LittleEndian.Uint64(b[28:36])
	reserve := binary.LittleEndian.Uint64(b[36:44])
	if free > diskReportBytesMax || reserve > diskReportBytesMax {
		return 0, 0, d, fmt.Errorf("%w: byte figure above %d", errBadDiskReport, uint64(diskReportBytesMax))
	}
	d = DiskSpace{
		Node:         paxos.NodeID(binary.LittleEndian.Uint64(b[12:20])),
		FreeBytes:    int64(free),
		ReserveBytes: int64(reserve),
		Low:          b[2]&diskReportFlagLow != 0,
		ReadFailed:   b[2]&diskReportFlagReadFailed != 0,
		Stuck:        b[2]&diskReportFlagStuck != 0,
	}
	if d.Node == 0 || to == 0 {
		return 0, 0, d, fmt.Errorf("%w: node 0", errBadDiskReport)
	}
	if d.ReadFailed && !d.Low {
		return 0, 0, d, fmt.Errorf("%w: a failed reading must be low", errBadDiskReport)
	}
	return cluster, to, d, nil
}

// diskReports holds the latest report of each member. Bounded: one entry
// per node of the committed membership (at most paxos.MembersMax); entries
// of nodes that left are dropped when the next report arrives. Written by
// the receive loop only; read on every growing write (MembersLowOnDisk)
// without a lock, from an immutable list of the low ones.
type diskReports struct {
	mu     sync.Mutex // held while latest changes (receive loop) and while stepDownTarget reads it (consensus loop)
	latest map[paxos.NodeID]diskReportSeen
	low    atomic.Pointer[[]diskReportSeen] // the entries of latest that say low
}

type diskReportSeen struct {
	d  DiskSpace
	at time.Time
}

// isMember reports whether id is in the committed membership ms.
func isMember(ms []sm.Member, id paxos.NodeID) bool {
	return slices.ContainsFunc(ms, func(m sm.Member) bool { return paxos.NodeID(m.ID) == id })
}

// receiveDiskReport believes a decoded report if it is from a member other
// than this node, under this cluster, and (sender != 0: the datagram was
// authenticated) from the node that sealed it. It returns why not.
func (r *Replica) receiveDiskReport(b []byte, sender paxos.NodeID) error {
	cluster, to, d, err := parseDiskReport(b)
	if err != nil {
		return err
	}
	switch members := r.membersNow().members; {
	case cluster != r.cfg.ClusterID:
		return fmt.Errorf("%w: cluster %d", errBadDiskReport, cluster)
	case to != r.cfg.ID:
		return fmt.Errorf("%w: %w: disk report to node %d", errBadDiskReport, errMisaddressed, to)
	case sender != 0 && d.Node != sender:
		return fmt.Errorf("%w: from %d, sealed by %d", errBadDiskReport, d.Node, sender)
	case d.Node == r.cfg.ID:
		return fmt.Errorf("%w: from this node's id", errBadDiskReport)
	case !isMember(members, d.Node):
		return fmt.Errorf("%w: node %d is not a member", errBadDiskReport, d.Node)
	case r.faults.drop(d.Node):
		return nil // a partition injected by /debug/faults
	default:
		r.disks.note(d, r.cfg.Now(), members)
		return nil
	}
}

// note records d, keeps the table to the membership and publishes the low
// entries.
func (dr *diskReports) note(d DiskSpace, now time.Time, members []sm.Member) {
	dr.mu.Lock()
	defer dr.mu.Unlock()
	if dr.latest == nil {
		dr.latest = make(map[paxos.NodeID]diskReportSeen, len(members))
	}
	for id := range dr.latest {
		if !isMember(members, id) {
			delete(dr.latest, id)
		}
	}
	dr.latest[d.Node] = diskReportSeen{d: d, at: now}
	if cur := dr.low.Load(); cur != nil && len(*cur) == 0 && !d.Low {
		return // nothing was low and nothing is: the published list stands
	}
	low := []diskReportSeen{}
	for _, s := range dr.latest {
		if s.d.Low {
			low = append(low, s)
		}
	}
	slices.SortFunc(low, func(a, b diskReportSeen) int { return cmp.Compare(a.d.Node, b.d.Node) })
	dr.low.Store(&low)
}

// MembersLowOnDisk returns the reports, received within
// diskReportStaleAfter from nodes still in the committed membership, that
// say the sender's disk is below its reserve, ordered by node id. This
// node's own disk is not among them: its owner reads it directly. Safe
// from any goroutine, without a lock.
func (r *Replica) MembersLowOnDisk() []DiskSpace {
	p := r.disks.low.Load()
	if p == nil || len(*p) == 0 {
		return nil
	}
	members := r.membersNow().members
	now := r.cfg.Now()
	var low []DiskSpace
	for _, s := range *p {
		if now.Sub(s.at) < diskReportStaleAfter && isMember(members, s.d.Node) {
			low = append(low, s.d)
		}
	}
	return low
}

// ShareDiskSpace starts sending this node's disk report, read from probe,
// to every other member once per diskReportInterval, until Close; snapshot
// staging stops at the reserve by the same probe (snapshot_room.go). probe is
// called on the report loop, never on the consensus loop (it may statfs);
// its Node field is overwritten with this node's id. Call it once,
// before or after Start.
func (r *Replica) ShareDiskSpace(probe func() DiskSpace) {
	r.diskProbe.Store(&probe) // snapshot staging reads it too (snapshot_room.go)
	r.loopsWG.Add(1)
	go r.diskReportLoop(probe)
}

func (r *Replica) diskReportLoop(probe func() DiskSpace) {
	defer r.loopsWG.Done()
	t := time.NewTicker(diskReportInterval)
	defer t.Stop()
	for {
		r.sendDiskReport(probe)
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
	}
}

// sendDiskReport sends one report to every other member of the committed
// membership. Never blocks: when the send queue is full the report is
// dropped (the next one follows within a second).
func (r *Replica) sendDiskReport(probe func() DiskSpace) {
	d := probe()
	d.Node, d.Stuck = r.cfg.ID, r.Stuck()
	var out []outMsg
	for _, m := range r.membersNow().members {
		if id := paxos.NodeID(m.ID); id != r.cfg.ID {
			out = append(out, outMsg{to: id, b: appendDiskReport(make([]byte, 0, diskReportBytes), r.cfg.ClusterID, id, d)})
		}
	}
	if len(out) == 0 {
		return
	}
	select {
	case r.outbound <- out:
	default:
		r.metrics.OutboundDropped.Inc()
	}
}

// stepDownTarget picks the voter a stuck leader hands over to (stuck.go):
// one of voters other than self whose report is fresh (within
// diskReportStaleAfter) and says it is not stuck and can read its disk;
// one not below its reserve first, then one other than avoid (the target
// of a hand-over that did not complete: a node can be unable to take over
// before its reports say so), then the highest commit index in commits
// (what each voter last reported to this leader; a voter missing from it
// counts as 0), then the lowest id; avoid only when it is the only one.
// The commit rank matters because a stuck leader hands over at once
// (stuck.go): a voter that knows more slots chosen than the leader does
// can commit the leader's in-flight slots from its own log, where the
// leader could not (e2e TestFullLogStaysLive). It returns 0 when there is
// none, and how many fresh reports from voters it saw.
func (dr *diskReports) stepDownTarget(now time.Time, voters []paxos.NodeID, self, avoid paxos.NodeID, commits map[paxos.NodeID]paxos.Slot) (to paxos.NodeID, fresh int) {
	dr.mu.Lock()
	defer dr.mu.Unlock()
	rank := func(d DiskSpace, id paxos.NodeID) int { // lower is better
		r := 0
		if d.Low {
			r += 2
		}
		if id == avoid {
			r++
		}
		return r
	}
	best := 0
	for _, id := range voters {
		s, ok := dr.latest[id]
		if id == self || !ok || now.Sub(s.at) >= diskReportStaleAfter {
			continue
		}
		fresh++
		if s.d.Stuck || s.d.ReadFailed {
			continue
		}
		r := rank(s.d, id)
		if to == 0 || r < best || r == best && (commits[id] > commits[to] || commits[id] == commits[to] && id < to) {
			to, best = id, r
		}
	}
	return to, fresh
}
