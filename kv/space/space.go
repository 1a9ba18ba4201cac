// Package space refuses writes that would take a tenant past its storage
// quota or fill the node's disk, before they are proposed, and compacts
// the store when the disk is low so that deletes give space back.
//
// Contract. Guard wraps a server.Backend. On the node that leads (writes
// sent elsewhere pass through to be redirected), a write is answered
// NO_SPACE, with nothing proposed, when
//   - the tenant has a quota (tenants.Spec.QuotaBytes) and the write
//     would grow what the tenant stores (sm.Usage: user keys + values +
//     sm.KeyOverheadBytes per key) past it, counting what its writes
//     already in flight on this node may add, or
//   - the write writes a value (PUT, CAS, a BATCH with a put) and the
//     filesystem holding the data directory has fewer free bytes than the
//     reserve (Config.DiskFreeMinBytes), or
//   - the write writes a value and another member reports that its own
//     disk is below its own reserve (Config.MembersLow: kv/replica's disk
//     reports, refreshed every second and believed for five), since a
//     follower cannot refuse a committed write it has no room for.
//
// Below a disk reserve (this node's or a member's) every write that
// leaves a value (writesValue) is refused, whatever it does to the count:
// an overwrite takes new disk space until a compaction frees the old
// value. Deletes (DELETE, a BATCH whose every key ends deleted, such as
// RESP's DEL) are never refused, so a tenant or a node can always make
// room; a delete of an absent key writes nothing.
// Against a quota, which counts logical bytes, a write that does not grow
// the tenant's usage (an overwrite with a value no longer than the old
// one, a BATCH whose deletes free as much as its puts take) passes. A
// write the exactly-once table already decides (a retry of an applied
// write, a stale seq) is never refused: it is answered from the table.
//
// The check is admission, not part of the state machine. Writes in flight
// count at their upper bound (every value as if its key were new), so
// concurrent writes near the quota may be refused that would have fit one
// after the other; a write whose request timed out (UNAVAILABLE) stops
// counting though it may still apply, so a tenant passes its quota by at
// most such writes. Keeping it out of Apply is deliberate: replicas
// configured with different quotas (during a rolling configuration
// change) would otherwise disagree about which writes applied.
package space

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"synod/internal/lograte"
	"synod/kv/proto"
	"synod/kv/server"
	"synod/kv/sm"
	"synod/tenants"
)

// Limits and defaults.
const (
	// DiskFreeMinBytesDefault is the free space a node keeps on its data
	// directory's filesystem when the configuration names none: room for
	// Pebble's flushes and compactions (which write before they delete)
	// and for the writes already in flight.
	DiskFreeMinBytesDefault = 1 << 30
	// diskSampleInterval is how old a free-space reading may be: at most
	// one statfs per interval, whatever the write rate.
	diskSampleInterval = 250 * time.Millisecond
	// batchKeysTracked bounds the overlay of a BATCH's own writes while its
	// growth is computed: at most proto.BatchOpsMax keys.
	batchKeysTracked = proto.BatchOpsMax
)

// Ledger is what the guard reads of the state machine (*sm.SM implements
// it): usage figures, the length of a stored value, whether the
// exactly-once table already decides a write, and the compaction that
// gives back the space of deleted and overwritten values.
type Ledger interface {
	Usage(tenant tenants.ID) sm.Usage
	ValueLen(tenant tenants.ID, key []byte) (int, bool, error)
	Answered(tenant tenants.ID, client, seq uint64) bool
	Garbage() uint64
	StoredBytes() uint64
	Compact() error
}

// Config configures a Guard.
type Config struct {
	Registry *tenants.Registry // the tenants' quotas (Spec.QuotaBytes; 0: none)
	Ledger   Ledger
	// DataDir is a path on the filesystem whose free space is watched.
	DataDir string
	// DiskFreeMinBytes is the reserve; 0 turns the disk check off.
	DiskFreeMinBytes int64
	// FreeBytes reads the free space of DataDir's filesystem; nil is
	// statfs (tests plant their own).
	FreeBytes func(path string) (int64, error)
	// Now is the clock of the disk sampling; nil is time.Now.
	Now func() time.Time
	// MembersLow returns the other members whose latest report says their
	// disk is below their reserve (nil: none, or no reports). Called on
	// every growing write: it must not block.
	MembersLow func() []MemberDisk
	// IsLeader reports whether this node leads; nil: always. Only the
	// leader checks: a write sent to a follower passes through to be
	// redirected (or proxied) to the leader, which decides.
	IsLeader func() bool
}

// MemberDisk is another member's report that its disk is short.
type MemberDisk struct {
	Node         uint64
	FreeBytes    int64 // at the member's last reading
	ReserveBytes int64 // the member's disk_free_min_bytes
	ReadFailed   bool  // the member could not read its free space
}

// Guard is a server.Backend that refuses growing writes for space and
// hands everything else to the backend it wraps.
type Guard struct {
	inner server.Backend
	cfg   Config

	sampleMu sync.Mutex   // one statfs at a time
	sampled  atomic.Int64 // unix nanoseconds of the last reading; 0: none
	free     atomic.Int64 // free bytes at the last reading
	freeErr  atomic.Value // error of the last reading (errBox), nil when it read

	refusedQuota, refusedDisk, refusedMemberDisk atomic.Uint64

	pending      map[tenants.ID]*atomic.Int64 // growth bounds of writes in flight, per tenant; read-only after New
	pendingMu    sync.Mutex                   // guards unregistered
	unregistered *atomic.Int64                // the counter of tenants not in the registry

	compactions  atomic.Uint64
	stopC, doneC chan struct{}   // the reclaim loop (reclaim.go)
	skipLog      lograte.Limiter // the "cannot compact" lines (reclaimSkipLogEvery)
}

type errBox struct{ err error }

var _ server.Backend = (*Guard)(nil)

// New wraps inner.
func New(inner server.Backend, cfg Config) *Guard {
	if cfg.FreeBytes == nil {
		cfg.FreeBytes = statfsFree
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.IsLeader == nil {
		cfg.IsLeader = func() bool { return true }
	}
	g := &Guard{inner: inner, cfg: cfg, pending: map[tenants.ID]*atomic.Int64{}}
	g.skipLog.Every = reclaimSkipLogEvery
	// One counter per registered tenant, made here: the map is then only
	// read on the request path (no lock per write).
	for _, sp := range cfg.Registry.All() {
		g.pending[sp.ID] = new(atomic.Int64)
	}
	return g
}

// Stats counts the writes refused since New.
type Stats struct {
	RefusedQuota uint64 // past a tenant's quota
	RefusedDisk  uint64 // below the disk reserve
	// RefusedMemberDisk: another member reported its disk below its
	// reserve.
	RefusedMemberDisk uint64
	// MembersLow is how many other members report their disk below their
	// reserve now.
	MembersLow int
	// FreeBytes is the last free-space reading (-1 before the first, and
	// while the last one failed).
	FreeBytes int64
	// Compactions run to give back space (reclaim.go).
	Compactions uint64
}

// Stats returns the counters.
func (g *Guard) Stats() Stats {
	free := int64(-1)
	if b, _ := g.freeErr.Load().(errBox); g.sampled.Load() != 0 && b.err == nil {
		free = g.free.Load()
	}
	return Stats{RefusedQuota: g.refusedQuota.Load(), RefusedDisk: g.refusedDisk.Load(),
		RefusedMemberDisk: g.refusedMemberDisk.Load(), MembersLow: len(g.membersLow()),
		FreeBytes: free, Compactions: g.compactions.Load()}
}

// membersLow is Config.MembersLow's answer (nil without it).
func (g *Guard) membersLow() []MemberDisk {
	if g.cfg.MembersLow == nil {
		return nil
	}
	return g.cfg.MembersLow()
}

// Do implements server.Backend.
func (g *Guard) Do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
	bound := growthBound(req)
	if bound <= 0 {
		return g.inner.Do(ctx, tenant, req) // reads, deletes, batches of deletes
	}
	// Count this write in flight first, then check: two writes checked
	// at once both see each other.
	p := g.pendingOf(tenant)
	inFlight := p.Add(bound) - bound
	defer p.Add(-bound)
	if resp := g.admit(tenant, req, bound, inFlight); resp != nil {
		return resp
	}
	return g.inner.Do(ctx, tenant, req)
}

// pendingOf is tenant's in-flight counter: one made by New for every
// registered tenant (the only tenants a connection can authenticate as),
// else one shared by any other (tests' backends), under a lock.
func (g *Guard) pendingOf(tenant tenants.ID) *atomic.Int64 {
	if p := g.pending[tenant]; p != nil {
		return p
	}
	g.pendingMu.Lock()
	defer g.pendingMu.Unlock()
	if g.unregistered == nil {
		g.unregistered = new(atomic.Int64)
	}
	return g.unregistered
}

// admit returns the NO_SPACE answer for a write that writes a value (its
// growth at most bound > 0) and may not run now, or nil. Below a disk
// reserve (this node's or another member's) no such write runs, whatever
// it does to its tenant's count: an overwrite, even a shrinking one, takes
// new disk space until a compaction frees the old value, and a compaction
// needs room of its own (an outside tester filled a node's disk to 0 with
// same-size overwrites at the reserve, when only growth was refused). The
// quota counts logical bytes: a write that does not grow the count passes
// it. inFlight is what the tenant's other writes in flight may add.
func (g *Guard) admit(tenant tenants.ID, req *proto.Request, bound, inFlight int64) *proto.Response {
	var quota int64
	if spec, ok := g.cfg.Registry.Get(tenant); ok {
		quota = spec.QuotaBytes
	}
	used := int64(g.cfg.Ledger.Usage(tenant).Bytes)
	overQuota := quota > 0 && used+inFlight+bound > quota
	lowDisk := g.diskLow()
	lowMembers := g.membersLow()
	if !overQuota && !lowDisk && len(lowMembers) == 0 {
		return nil
	}
	// Near a limit. A follower does not decide (the leader will), and a
	// write the exactly-once table decides is answered from it.
	if !g.cfg.IsLeader() || g.cfg.Ledger.Answered(tenant, req.ClientID, req.Seq) {
		return nil
	}
	switch writes := writesValue(req); {
	case lowDisk && writes:
		g.refusedDisk.Add(1)
		return proto.Errorf(proto.StatusNoSpace, "the node's disk has %d bytes free, below its reserve of %d (disk_free_min_bytes); only deletes are served until it has room", g.free.Load(), g.cfg.DiskFreeMinBytes)
	case len(lowMembers) > 0 && writes:
		g.refusedMemberDisk.Add(1)
		m := lowMembers[0]
		if m.ReadFailed {
			return proto.Errorf(proto.StatusNoSpace, "node %d cannot read its disk's free space; only deletes are served until every member has room", m.Node)
		}
		return proto.Errorf(proto.StatusNoSpace, "node %d's disk has %d bytes free, below its reserve of %d (disk_free_min_bytes); only deletes are served until every member has room", m.Node, m.FreeBytes, m.ReserveBytes)
	}
	if !overQuota {
		return nil
	}
	// Over the quota by the bound: compute what the write really adds.
	growth, err := g.growth(tenant, req)
	if err != nil {
		return proto.Errorf(proto.StatusInternal, "reading the current value: %v", err)
	}
	if growth <= 0 || used+inFlight+growth <= quota {
		return nil
	}
	g.refusedQuota.Add(1)
	if inFlight > 0 {
		return proto.Errorf(proto.StatusNoSpace, "tenant %d stores %d bytes and has writes in flight that may add %d; this write adds %d, past its quota of %d (quota_bytes)", tenant, used, inFlight, growth, quota)
	}
	return proto.Errorf(proto.StatusNoSpace, "tenant %d stores %d bytes; this write adds %d, past its quota of %d (quota_bytes)", tenant, used, growth, quota)
}

// writesValue reports whether req leaves a value under some key: a PUT or
// CAS, or a BATCH in which some key's last operation is not a delete. A
// BATCH that ends every key it touches with a delete (RESP's DEL: a CAS
// that checks the value read, then the delete) writes tombstones only.
func writesValue(req *proto.Request) bool {
	switch req.Op {
	case proto.OpPut, proto.OpCAS:
		return true
	case proto.OpBatch:
		last := make(map[string]bool, min(len(req.Ops), batchKeysTracked)) // key -> its last op deletes it
		for i := range req.Ops {
			last[string(req.Ops[i].Key)] = req.Ops[i].Op == proto.OpDelete
		}
		for _, deletes := range last {
			if !deletes {
				return true
			}
		}
	}
	return false
}

// growthBound is an upper bound of what req adds to its tenant's usage,
// from the request alone: every value it writes, as if no key existed.
func growthBound(req *proto.Request) int64 {
	switch req.Op {
	case proto.OpPut, proto.OpCAS:
		return sm.KeyCost(len(req.Key), len(req.Value))
	case proto.OpBatch:
		var n int64
		for i := range req.Ops {
			if op := &req.Ops[i]; op.Op != proto.OpDelete {
				n += sm.KeyCost(len(op.Key), len(op.Value))
			}
		}
		return n
	}
	return 0
}

// growth is what req adds to its tenant's usage against the current state
// (negative when it frees more than it takes), assuming every condition
// holds.
func (g *Guard) growth(tenant tenants.ID, req *proto.Request) (int64, error) {
	type state struct {
		len     int
		present bool
	}
	seen := make(map[string]state, min(len(req.Ops)+1, batchKeysTracked))
	cur := func(key []byte) (state, error) {
		if st, ok := seen[string(key)]; ok {
			return st, nil
		}
		n, ok, err := g.cfg.Ledger.ValueLen(tenant, key)
		return state{n, ok}, err
	}
	var total int64
	write := func(key, value []byte, del bool) error {
		st, err := cur(key)
		if err != nil {
			return err
		}
		if st.present {
			total -= sm.KeyCost(len(key), st.len)
		}
		next := state{}
		if !del {
			total += sm.KeyCost(len(key), len(value))
			next = state{len(value), true}
		}
		seen[string(key)] = next
		return nil
	}
	switch req.Op {
	case proto.OpPut, proto.OpCAS:
		return total, write(req.Key, req.Value, false)
	case proto.OpBatch:
		for i := range req.Ops {
			op := &req.Ops[i]
			if err := write(op.Key, op.Value, op.Op == proto.OpDelete); err != nil {
				return 0, err
			}
		}
	}
	return total, nil
}

// diskLow reports whether the data directory's filesystem had less free
// space than the reserve at the latest reading, reading again when the
// last one is older than diskSampleInterval. A failed reading counts as
// low: a node that cannot tell must not fill its disk.
func (g *Guard) diskLow() bool {
	if g.cfg.DiskFreeMinBytes <= 0 {
		return false
	}
	g.refreshFree()
	if b, _ := g.freeErr.Load().(errBox); b.err != nil {
		return true
	}
	return g.free.Load() < g.cfg.DiskFreeMinBytes
}

// DiskSpace is this node's own reading for its disk report to the other
// members and for snapshot staging (kv/replica ShareDiskSpace): the free
// bytes read now (one statfs; the last reading when another is in
// progress), the reserve, and whether the free space is below it or could
// not be read. Fresh, not the admission's reading of up to
// diskSampleInterval ago: staging calls it before every chunk, and on a
// fast disk a quarter second of staging is tens of MiB. With the reserve
// off the node never reports low.
func (g *Guard) DiskSpace() (free, reserve int64, low, readFailed bool) {
	if g.cfg.DiskFreeMinBytes <= 0 {
		return 0, 0, false, false
	}
	g.sample(g.cfg.Now().UnixNano())
	b, _ := g.freeErr.Load().(errBox)
	free = g.free.Load()
	return free, g.cfg.DiskFreeMinBytes, b.err != nil || free < g.cfg.DiskFreeMinBytes, b.err != nil
}

// refreshFree reads the free space again when the last reading is older
// than diskSampleInterval (or there is none): the admission calls it on
// every write that grows the store, the metrics on every scrape (with the
// reserve off, or no writes, nothing else reads it).
func (g *Guard) refreshFree() {
	now := g.cfg.Now().UnixNano()
	if last := g.sampled.Load(); last == 0 || now-last >= int64(diskSampleInterval) {
		g.sample(now)
	}
}

func (g *Guard) sample(now int64) {
	if g.sampled.Load() == 0 {
		g.sampleMu.Lock() // no figure yet: wait for the first
		defer g.sampleMu.Unlock()
		if g.sampled.Load() != 0 {
			return
		}
	} else if !g.sampleMu.TryLock() {
		return // another writer is reading it; use the last figure
	} else {
		defer g.sampleMu.Unlock()
	}
	free, err := g.cfg.FreeBytes(g.cfg.DataDir)
	g.freeErr.Store(errBox{err})
	if err == nil {
		g.free.Store(free)
	}
	g.sampled.Store(now)
}

// statfsFree is the space an unprivileged writer may still use on path's
// filesystem.
func statfsFree(path string) (int64, error) {
	_, free, err := FilesystemBytes(path)
	return free, err
}

// FilesystemBytes is what statfs says of path's filesystem: its size, and
// the bytes an unprivileged writer may still use (what the reserve is
// checked against).
func FilesystemBytes(path string) (size, free int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	return int64(st.Blocks) * int64(st.Bsize), int64(st.Bavail) * int64(st.Bsize), nil
}
