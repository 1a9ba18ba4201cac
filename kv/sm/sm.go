// Package sm is synod's replicated state machine: a Pebble database holding
// every tenant's keys, the applied slot and the exactly-once client table.
//
// Durability contract. Pebble runs with its WAL disabled: the consensus log
// (the PMem acceptor log) is the write-ahead log. Every Apply writes the
// slot's data, the client-table updates and the new applied slot in one
// Pebble batch, committed without sync, so after a crash the store holds a
// prefix of applied slots whose last slot is exactly Applied(); the runtime
// replays the log from Applied()+1. Flush makes everything applied so far
// durable and returns that slot: the log may be truncated up to it, never
// beyond.
//
// Key layout (the constants are part of the on-disk format):
//
//	tenant u32 BE | user key              tenant data; tenant 0 is never a tenant
//	0x00000000 | "applied"                u64 BE: last applied slot
//	0x00000000 | "c" | tenant | client    exactly-once entry (see clients.go)
//	0x00000000 | "e" | tenant | client    exactly-once tombstone of an evicted entry
//	0x00000000 | "restoring"              written by versions before the verified restore (see Restore); refused
//	0x00000000 | "u" | tenant             the tenant's stored keys and bytes (usage.go)
//	0x00000000 | "U"                      the slot the usage entries are exact at (usage.go)
//
// Exactly-once. Every write carries (client id, seq, first unacked); the
// client table (clients.go) answers a retried write with its remembered
// result instead of applying it again. Each tenant has its own share of the
// table (Options.ClientsMax): a tenant flooding new client ids evicts only
// its own least-recently-applied clients. An evicted client leaves a
// tombstone, its next sequence: a retry of any earlier write gets
// SEQUENCE_STALE (never a second apply), while its new writes go on
// working. A tenant remembers TombstonesPerShare times its share of
// evicted clients; only past that is a client forgotten. The shares are
// part of the state machine's definition: every replica must be opened
// with the same ones, or replicas may decide differently whether a retried
// write applies.
//
// Concurrency: Apply, Restore and Flush are serialised by the SM; Get and
// Scan may run concurrently with them and read the latest committed state;
// after Close they return ErrClosed.
// Reads during Restore see the state before it, until the verified new
// state is swapped in.
package sm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/rs/zerolog"

	"synod/kv/proto"
	"synod/tenants"
)

// Limits of the state machine.
const (
	// ClientsPerTenantDefault is a tenant's share of the exactly-once
	// table (entries, one per client id) when Options names none.
	ClientsPerTenantDefault = 1024
	// ClientsPerTenantMin and ClientsPerTenantMax bound a configured share.
	ClientsPerTenantMin = 16
	ClientsPerTenantMax = 16384
	// ClientsTotalMax bounds the sum of the shares in Options.ClientsMax,
	// and so the table's memory: an entry holds up to ResultsPerClientMax
	// results. It is TenantsMax x ClientsPerTenantMin: every tenant of a
	// full registry still gets the minimum share.
	ClientsTotalMax = tenants.TenantsMax * ClientsPerTenantMin
	// TombstonesPerShare: a tenant keeps up to this many tombstones (16
	// bytes each) of evicted clients per entry of its share; past that its
	// oldest are forgotten.
	TombstonesPerShare = 16
	// ResultsPerClientMax bounds the remembered results of one client: at
	// most this many of its writes may be unacknowledged at once. It equals
	// the per-connection pipeline depth.
	ResultsPerClientMax = proto.InflightPerConnMax
	// restoreBatchBytesMax is what the memory bound reserves for the
	// staging side besides the memtables (memory.go). Staging once queued
	// batches of this size; it now writes sstables and ingests them
	// (snapshot_ingest.go), whose writer buffers a block and the table's
	// index on the Go heap; the reserve stays as a margin.
	restoreBatchBytesMax = 4 << 20
)

// Errors.
var (
	ErrClosed          = errors.New("sm: closed")
	ErrReservedTenant  = errors.New("sm: tenant 0 is reserved")
	ErrRestoreUnfinish = errors.New("sm: a restore did not finish; restore a snapshot again")
	ErrBadSnapshot     = errors.New("sm: bad snapshot")
	// ErrSlotGap: Apply or ApplyMembership was given a slot above
	// Applied()+1. Every committed slot (commands, no-op or membership
	// change) advances the applied slot by exactly one, so a gap means the
	// caller lost committed slots on the way here; applying past them would
	// make this replica's state differ from the others' silently. Nothing
	// changes and the SM stays usable (its state is still a prefix of the
	// log); the caller must not go on.
	ErrSlotGap = errors.New("sm: slot is not the next after the applied slot")
)

// Options configures Open.
type Options struct {
	// CacheBytes is Pebble's block cache size; 0 picks Pebble's default.
	CacheBytes int64
	// MemTableBytes is Pebble's memtable size; 0 picks Pebble's default.
	MemTableBytes uint64
	// MemTables is Pebble's MemTableStopWritesThreshold; 0 picks Pebble's
	// default. PebbleMemoryFor derives all three from a memory share, and
	// one cache of CacheBytes is shared by every Pebble the SM opens
	// (memory.go).
	MemTables int
	// ReadSlots bounds the client reads inside Pebble (read_slots.go):
	// GETs pin at most ReadSlots*ReadSlotPinBytes of blocks beyond the
	// cache. 0 picks half the cache's worth (readSlotsFor); otherwise it
	// must be within ReadSlotsMin..ReadSlotsMax (kvnode derives it from
	// its memory budget: ReadSlotsFor).
	ReadSlots int
	// Log receives Pebble's messages; nil discards them.
	Log *zerolog.Logger
	// ClientsMax is each tenant's share of the exactly-once table
	// (ClientsPerTenantMin..ClientsPerTenantMax, ClientsTotalMax in all); a
	// tenant it does not name gets ClientsDefault. Every replica must be
	// opened with the same shares: they decide which clients are evicted,
	// and so whether a retried write is answered or refused.
	ClientsMax map[tenants.ID]int
	// ClientsDefault is the share of a tenant ClientsMax does not name; 0
	// is ClientsPerTenantDefault.
	ClientsDefault int
}

// readSlots is ReadSlots, or its default for the cache.
func (o Options) readSlots() int {
	if o.ReadSlots == 0 {
		return readSlotsFor(o.CacheBytes)
	}
	return o.ReadSlots
}

// validate checks the shares and the read slots.
func (o Options) validate() error {
	if o.ReadSlots != 0 && (o.ReadSlots < ReadSlotsMin || o.ReadSlots > ReadSlotsMax) {
		return fmt.Errorf("sm: %d read slots outside %d..%d", o.ReadSlots, ReadSlotsMin, ReadSlotsMax)
	}
	inRange := func(n int) bool { return n >= ClientsPerTenantMin && n <= ClientsPerTenantMax }
	if o.ClientsDefault != 0 && !inRange(o.ClientsDefault) {
		return fmt.Errorf("sm: default client share %d outside %d..%d", o.ClientsDefault, ClientsPerTenantMin, ClientsPerTenantMax)
	}
	total := 0
	for id, n := range o.ClientsMax {
		if !inRange(n) {
			return fmt.Errorf("sm: tenant %d: client share %d outside %d..%d", id, n, ClientsPerTenantMin, ClientsPerTenantMax)
		}
		total += n
	}
	if total > ClientsTotalMax {
		return fmt.Errorf("sm: client shares total %d, more than ClientsTotalMax=%d", total, ClientsTotalMax)
	}
	return nil
}

// SM is the state machine. Create it with Open.
type SM struct {
	dir  string
	opts Options
	db   *pebble.DB // replaced by Restore (under mu and dbMu)

	applied atomic.Uint64 // last applied slot; Invariant: equals the stored applied key

	// dbMu keeps reads off a closed Pebble: Get and Scan hold it shared,
	// Close exclusively while it closes the database.
	dbMu     sync.RWMutex
	dbClosed bool
	// reads bounds the GETs and SCANs inside Pebble at once (read_slots.go).
	reads *readSlots
	// lens remembers large values' lengths, so that a GET with no room for
	// its answer is refused without reading the store (value_lens.go).
	lens valueLens
	// alens remembers the applied state's value lengths for the usage
	// accounting of writes (apply_lens.go); guarded by mu.
	alens applyLens

	mu      sync.Mutex // serialises Apply, Restore, Flush, Close
	clients map[tenants.ID]*tenantClients
	broken  error // set when a batch failed to commit: the SM can no longer apply
	closed  bool

	snapMu sync.Mutex
	snaps  map[*io.PipeReader]struct{} // open snapshot streams, closed by Close
	snapWG sync.WaitGroup
	stager *Stager // the open staging, if any (snapshot_stage.go)

	// Counters of the client table since Open (ClientStats).
	evicted, forgotten atomic.Uint64

	mem pebbleMem // the cache shared by every Pebble opened (memory.go)

	usage usageTable // every tenant's stored keys and bytes (usage.go)

	installed atomic.Uint64 // Installed

	garbage       atomic.Uint64                      // values deleted or replaced since Open or Compact
	compactMu     sync.Mutex                         // one Compact at a time
	compactCancel atomic.Pointer[context.CancelFunc] // the running Compact's (stopCompaction)
}

var (
	metaPrefix   = []byte{0, 0, 0, 0}
	appliedKey   = []byte("\x00\x00\x00\x00applied")
	restoringKey = []byte("\x00\x00\x00\x00restoring")
	// installedKey holds the slot of the snapshot this state was last
	// restored from (Installed). Like restoringKey it belongs to this
	// directory alone: never streamed, refused in a stream.
	installedKey     = []byte("\x00\x00\x00\x00installed")
	clientsKeyPrefix = []byte("\x00\x00\x00\x00c")
	tombsKeyPrefix   = []byte("\x00\x00\x00\x00e")
	// keyspaceEnd sorts after every key the SM can hold: a 4-byte tenant
	// prefix plus at most KeyBytesMax bytes of user key.
	keyspaceEnd = bytes.Repeat([]byte{0xff}, 4+proto.KeyBytesMax+1)
)

// localKey reports whether key is one of this directory's own keys, which
// no snapshot stream carries: a restore in progress, the installed slot.
func localKey(key []byte) bool {
	return bytes.Equal(key, restoringKey) || bytes.Equal(key, installedKey)
}

// Open opens (or creates) the state machine in dir. It refuses a directory
// whose last Restore did not finish (ErrRestoreUnfinish).
//
// A Restore that a crash interrupted is finished first (a verified new
// state is swapped in) or discarded (an unverified one): see Restore.
func Open(dir string, opts Options) (*SM, error) {
	dir = filepath.Clean(dir)
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := recoverRestore(dir); err != nil {
		return nil, err
	}
	s := &SM{dir: dir, opts: opts, snaps: map[*io.PipeReader]struct{}{}, reads: newReadSlots(opts.readSlots())}
	db, err := pebble.Open(dir, s.pebbleOptions())
	if err != nil {
		s.mem.release()
		return nil, fmt.Errorf("opening pebble in %s: %w", dir, err)
	}
	s.db = db
	if err := s.load(); err != nil {
		db.Close()
		s.mem.release()
		return nil, err
	}
	return s, nil
}

// pebbleOptions are the options of every Pebble the SM opens (the live
// one and a restore's).
func (s *SM) pebbleOptions() *pebble.Options {
	log := zerolog.Nop()
	if s.opts.Log != nil {
		log = *s.opts.Log
	}
	limiter := newPebbleLimiter()
	po := &pebble.Options{DisableWAL: true, Logger: pebbleLogger{log: log, limiter: limiter}, EventListener: pebbleEvents(log, limiter),
		FS: vfs.OnDiskFull(vfs.Default, diskFullPause)}
	// Bloom filters on every level (L1 and below inherit L0's policy).
	// Every applied PUT reads its key's old value length first (usage
	// accounting, slotBatch.valueLen); for a key that is not there, as in a
	// load of new keys, that Get would search an index block of every level
	// its key range overlaps. Filter blocks live in the block cache, so
	// they are inside the memory bound.
	po.Levels[0].FilterPolicy = bloom.FilterPolicy(bloomBitsPerKey)
	// Values of valueSeparationBytesMin and more live in blob files that
	// compactions move by reference instead of rewriting. Opening a store
	// of an older format ratchets it (an older kvnode can no longer open
	// it).
	po.FormatMajorVersion = pebble.FormatValueSeparation
	po.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy {
		return pebble.ValueSeparationPolicy{
			Enabled:               true,
			MinimumSize:           valueSeparationBytesMin,
			MaxBlobReferenceDepth: valueSeparationReferenceDepthMax,
			RewriteMinimumAge:     valueSeparationRewriteAgeMin,
			TargetGarbageRatio:    valueSeparationGarbageRatio,
		}
	}
	s.setPebbleMemory(po) // cache and memtables: only there (memory.go)
	return po
}

// bloomBitsPerKey sizes the sstables' Bloom filters: 10 bits a key give
// about 1 % false positives (CockroachDB's choice).
const bloomBitsPerKey = 10

// Value separation (Pebble's blob files). Megabyte values were rewritten
// by every compaction that passed them: with 1 MB PUTs, compactions took
// 18-21 % of each node's CPU; with the values in blob files a megabyte
// cost an eighth less CPU, the bulk tenant went 4 % faster and its
// neighbour's p99 fell 12 % (docs/benchmarking.md, "A megabyte copied
// fewer times", its paragraph on Pebble's value separation).
const (
	// valueSeparationBytesMin: smaller values stay in the sstables, where
	// a read finds them in the block it already loaded.
	valueSeparationBytesMin = 64 << 10
	// valueSeparationReferenceDepthMax bounds the blob files one sstable
	// may reference before a compaction rewrites their values together.
	valueSeparationReferenceDepthMax = 10
	// valueSeparationRewriteAgeMin and valueSeparationGarbageRatio: a blob
	// file at least this old is rewritten once this share of its values
	// was overwritten or deleted, so the garbage on disk stays about a
	// fifth of the separated bytes.
	valueSeparationRewriteAgeMin = 5 * time.Minute
	valueSeparationGarbageRatio  = 0.2
)

// load reads the applied slot and the client table from Pebble.
func (s *SM) load() error {
	if _, ok, err := s.getRaw(restoringKey); err != nil {
		return err
	} else if ok {
		return ErrRestoreUnfinish
	}
	v, ok, err := s.getRaw(appliedKey)
	if err != nil {
		return err
	}
	var applied uint64
	if ok {
		if len(v) != 8 {
			return fmt.Errorf("sm: applied key holds %d bytes, want 8", len(v))
		}
		applied = binary.BigEndian.Uint64(v)
	}
	s.applied.Store(applied)
	if err := s.loadInstalled(applied); err != nil {
		return err
	}
	clients, err := loadClients(s.db)
	if err != nil {
		return err
	}
	s.clients = clients
	usage, err := loadUsage(s.db, applied)
	if err != nil {
		return err
	}
	s.usage.replace(usage)
	return nil
}

func (s *SM) getRaw(key []byte) ([]byte, bool, error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("sm: reading %q: %w", key, err)
	}
	out := bytes.Clone(v)
	closer.Close()
	return out, true, nil
}

// ClientStats describes the exactly-once table.
type ClientStats struct {
	Entries    int    // clients with remembered results
	Tombstones int    // evicted clients still remembered
	Evicted    uint64 // entries turned into tombstones since Open
	Forgotten  uint64 // tombstones dropped since Open
}

// ClientStats returns the table's size and its counters.
func (s *SM) ClientStats() ClientStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := ClientStats{Evicted: s.evicted.Load(), Forgotten: s.forgotten.Load()}
	for _, tc := range s.clients {
		st.Entries += len(tc.entries)
		st.Tombstones += len(tc.tombs)
	}
	return st
}

// loadInstalled reads the installed slot. A state written before it was
// recorded may have been restored from a snapshot at any slot up to its
// applied one: it gets the applied slot, the bound that is always safe,
// and keeps it (written with the next flush; a new state gets 0 so).
func (s *SM) loadInstalled(applied uint64) error {
	v, ok, err := s.getRaw(installedKey)
	if err != nil {
		return err
	}
	if !ok {
		s.installed.Store(applied)
		if err := s.db.Set(installedKey, binary.BigEndian.AppendUint64(nil, applied), pebble.NoSync); err != nil {
			return fmt.Errorf("sm: recording the installed slot: %w", err)
		}
		return nil
	}
	if len(v) != 8 {
		return fmt.Errorf("sm: installed key holds %d bytes, want 8", len(v))
	}
	got := binary.BigEndian.Uint64(v)
	if got > applied {
		return fmt.Errorf("sm: installed slot %d above the applied slot %d", got, applied)
	}
	s.installed.Store(got)
	return nil
}

// Installed is the slot of the snapshot this state was last restored from
// (Restore, InstallStaged, or a staged copy Open swapped in); 0 when it
// never was. Its contract, which the consensus log's recovery relies on
// (kv/replica recover_tail.go): every slot above it and at or below
// Applied was applied from the node's own log, so a record the log holds
// for such a slot is the value applied there; at or below it, the log may
// hold records of values that were never chosen. A state written before
// the slot was recorded reports the applied slot it was opened with.
func (s *SM) Installed() uint64 { return s.installed.Load() }

// Applied returns the last applied slot (0 before the first Apply).
func (s *SM) Applied() uint64 { return s.applied.Load() }

// Flush writes Pebble's memtables to disk and returns the applied slot
// that is now durable: the consensus log may be truncated up to it.
func (s *SM) Flush() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	if s.dbClosed {
		return 0, s.broken
	}
	slot := s.applied.Load()
	if err := s.db.Flush(); err != nil {
		return 0, fmt.Errorf("sm: flushing: %w", err)
	}
	return slot, nil
}

// Abandon closes Pebble without flushing, leaving the directory as a
// process crash would: only what Flush (or Pebble's own flushes) made
// durable remains, and a reopen finds Applied() at that point. It is for
// crash tests and simulators; a real node calls Close.
func (s *SM) Abandon() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	defer s.mem.release() // after Pebble closed
	s.abortSnapshots()
	s.abortStaging()
	s.stopCompaction()
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if s.dbClosed {
		return nil
	}
	s.dbClosed = true
	return s.db.Close()
}

// Close flushes (so that a clean shutdown needs no log replay), aborts open
// snapshot streams and closes Pebble.
func (s *SM) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	defer s.mem.release() // after Pebble closed
	s.snapMu.Lock()
	for pr := range s.snaps {
		pr.CloseWithError(ErrClosed)
	}
	s.snapMu.Unlock()
	s.snapWG.Wait()
	s.abortStaging()
	s.stopCompaction()
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if s.dbClosed {
		return nil // a failed Restore swap closed it already
	}
	s.dbClosed = true
	ferr := s.db.Flush()
	cerr := s.db.Close()
	if ferr != nil {
		return fmt.Errorf("sm: flushing at close: %w", ferr)
	}
	if cerr != nil {
		return fmt.Errorf("sm: closing pebble: %w", cerr)
	}
	return nil
}

// dataKey returns the Pebble key of a tenant's user key.
func dataKey(tenant tenants.ID, key []byte) []byte {
	k := make([]byte, 4, 4+len(key))
	binary.BigEndian.PutUint32(k, uint32(tenant))
	return append(k, key...)
}

// tenantEnd returns the exclusive upper bound of a tenant's keyspace.
func tenantEnd(tenant tenants.ID) []byte {
	if tenant == 0xFFFFFFFF {
		return keyspaceEnd
	}
	return binary.BigEndian.AppendUint32(nil, uint32(tenant)+1)
}
