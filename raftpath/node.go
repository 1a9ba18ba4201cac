package raftpath

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"synod/kv/sm"
)

// Limits and defaults of a node.
const (
	// SnapshotEntriesDefault is how many applied entries pass between
	// snapshots (etcd's default snapshot-count is 10,000 too).
	SnapshotEntriesDefault = 10000
	// KeepEntriesDefault entries stay in memory after a snapshot so that
	// a follower slightly behind catches up from the log, not a snapshot.
	KeepEntriesDefault = 5000
	// writesPendingMax bounds proposals waiting for their result.
	writesPendingMax = 1 << 16
	// readsPendingMax bounds reads waiting for the next ReadIndex round.
	readsPendingMax = 1 << 16
	readStatesQueue = 256
	// envelopeBytes prefixes every proposed command with its proposal id,
	// so the proposing node can match the applied result to the caller.
	envelopeBytes   = 8
	maxSizePerMsg   = 1 << 20
	maxInflightMsgs = 256
	fatalQueue      = 1
)

// Errors of a node.
var (
	ErrStopped     = errors.New("raftpath: node stopped")
	ErrBusy        = errors.New("raftpath: too many requests pending")
	ErrUnavailable = errors.New("raftpath: unavailable")
	ErrLeaderLost  = errors.New("raftpath: leadership lost; outcome unknown")
)

// NotLeaderError says which node leads (0: unknown) and its client address.
type NotLeaderError struct {
	Leader     uint64
	ClientAddr string
}

func (e *NotLeaderError) Error() string {
	return fmt.Sprintf("raftpath: not the leader (leader %d at %q)", e.Leader, e.ClientAddr)
}

// Peer is one member.
type Peer struct {
	ID         uint64
	Addr       string // raft TCP address
	ClientAddr string // client protocol address (for NOT_LEADER redirects)
}

// Config configures a Node.
type Config struct {
	ID    uint64
	Peers []Peer
	// DataDir holds the state machine (DataDir/sm).
	DataDir string
	// WALDir holds the WAL and received snapshots; "" is DataDir/raft.
	WALDir string
	// Tick is raft's logical clock period; ElectionTicks and
	// HeartbeatTicks are in ticks.
	Tick           time.Duration
	ElectionTicks  int
	HeartbeatTicks int
	// SnapshotEntries: applied entries between snapshots (0: default).
	SnapshotEntries uint64
	// KeepEntries: entries kept in memory below a snapshot (0: default).
	KeepEntries uint64
	// Listener, when set, is the raft listener (tests pre-open it);
	// otherwise the node listens on its own peer address.
	Listener net.Listener
	Log      zerolog.Logger
	// SM configures the state machine (its exactly-once client shares);
	// every replica must use the same.
	SM sm.Options

	// fs holds the WAL and the received snapshot files; nil is the
	// operating system's (osFS). Tests put simulated media here.
	fs fileSystem
	// testingAckBeforeSync plants a durability bug, for the power-loss
	// test to prove it catches one: the Ready loop writes entries and
	// hard state to the WAL without fdatasync (they reach the page cache
	// only) and then sends, applies and acknowledges as usual, so
	// acknowledged entries become durable only at the WAL's next sync for
	// another reason (a snapshot, a new segment, Close). That breaks
	// raft's contract: a SIGKILL keeps the page cache and cannot see it;
	// a power loss does. Never set outside tests.
	testingAckBeforeSync bool
}

// Node is one raft replica of the kv state machine.
type Node struct {
	cfg   Config
	fs    fileSystem
	sm    *sm.SM
	wal   *WAL
	store *storage
	node  raft.Node
	tr    *transport
	cs    *pb.ConfState

	// Written by the Ready loop, read by request goroutines.
	lead          atomic.Uint64
	role          atomic.Int32 // raft.StateType
	term          atomic.Uint64
	commit        atomic.Uint64
	applied       atomic.Uint64 // Invariant: applied <= commit
	leaderChanges atomic.Uint64
	restores      atomic.Uint64
	// snapshots counts snapshots taken for compaction, snapshotNanos the
	// time they took in total (Ready loop writes, metrics read).
	snapshots     atomic.Uint64
	snapshotNanos atomic.Int64

	appliedMu sync.Mutex
	appliedCh chan struct{} // closed and replaced whenever applied grows

	snapIndex uint64 // Ready loop only

	propMu  sync.Mutex
	pending map[uint64]chan sm.Result
	propSeq atomic.Uint64

	readMu      sync.Mutex
	readPending []chan error
	readKick    chan struct{}
	readStates  chan raft.ReadState
	readSeq     uint64

	fatal     chan error
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// Open recovers the node's WAL and state machine and starts it.
func Open(cfg Config) (*Node, error) {
	if cfg.ID == 0 || cfg.ID >= 1<<16 {
		return nil, fmt.Errorf("raftpath: node id %d outside 1..65535", cfg.ID)
	}
	if cfg.Tick <= 0 || cfg.HeartbeatTicks <= 0 || cfg.ElectionTicks <= cfg.HeartbeatTicks {
		return nil, fmt.Errorf("raftpath: need tick > 0 and 0 < heartbeat ticks (%d) < election ticks (%d)", cfg.HeartbeatTicks, cfg.ElectionTicks)
	}
	if cfg.SnapshotEntries == 0 {
		cfg.SnapshotEntries = SnapshotEntriesDefault
	}
	if cfg.KeepEntries == 0 {
		cfg.KeepEntries = KeepEntriesDefault
	}
	if cfg.WALDir == "" {
		cfg.WALDir = filepath.Join(cfg.DataDir, "raft")
	}
	fs := cfg.fs
	if fs == nil {
		fs = osFS{}
	}
	var self *Peer
	voters := make([]uint64, 0, len(cfg.Peers))
	for i := range cfg.Peers {
		voters = append(voters, cfg.Peers[i].ID)
		if cfg.Peers[i].ID == cfg.ID {
			self = &cfg.Peers[i]
		}
	}
	if self == nil {
		return nil, fmt.Errorf("raftpath: node %d is not among the peers", cfg.ID)
	}
	wal, rec, err := openWAL(fs, cfg.WALDir)
	if err != nil {
		return nil, err
	}
	if rec.CutBytes > 0 {
		cfg.Log.Warn().Int64("bytes", rec.CutBytes).Msg("raft wal: cut a torn tail")
	}
	if rec.Snapshot == nil {
		// Bootstrap: every node starts from the same snapshot at index 1
		// holding the voters, so no node needs configuration entries.
		rec.Snapshot = &pb.SnapshotMetadata{Index: proto.Uint64(1), Term: proto.Uint64(1),
			ConfState: &pb.ConfState{Voters: voters}}
		if err := wal.SaveSnapshot(rec.Snapshot); err != nil {
			wal.Close()
			return nil, err
		}
	}
	store, err := openSM(fs, filepath.Join(cfg.DataDir, "sm"), cfg.WALDir, rec.Snapshot.GetIndex(), cfg.SM)
	if err != nil {
		wal.Close()
		return nil, err
	}
	ms := raft.NewMemoryStorage()
	if err := ms.ApplySnapshot(&pb.Snapshot{Metadata: rec.Snapshot}); err != nil {
		store.Close()
		wal.Close()
		return nil, fmt.Errorf("raftpath: loading the snapshot: %w", err)
	}
	if rec.HardState != nil {
		ms.SetHardState(rec.HardState)
	}
	if err := ms.Append(rec.Entries); err != nil {
		store.Close()
		wal.Close()
		return nil, fmt.Errorf("raftpath: loading entries: %w", err)
	}
	ln := cfg.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", self.Addr); err != nil {
			store.Close()
			wal.Close()
			return nil, fmt.Errorf("raftpath: listening for peers: %w", err)
		}
	}
	n := &Node{
		cfg: cfg, fs: fs, sm: store, wal: wal, store: &storage{MemoryStorage: ms, sm: store},
		cs:        rec.Snapshot.GetConfState(),
		appliedCh: make(chan struct{}), pending: map[uint64]chan sm.Result{},
		readKick: make(chan struct{}, 1), readStates: make(chan raft.ReadState, readStatesQueue),
		fatal: make(chan error, fatalQueue), stop: make(chan struct{}),
		snapIndex: rec.Snapshot.GetIndex(),
	}
	n.applied.Store(rec.Snapshot.GetIndex())
	n.commit.Store(max(rec.Snapshot.GetIndex(), rec.HardState.GetCommit()))
	n.term.Store(rec.HardState.GetTerm())
	rc := &raft.Config{
		ID: cfg.ID, ElectionTick: cfg.ElectionTicks, HeartbeatTick: cfg.HeartbeatTicks,
		Storage: n.store, Applied: rec.Snapshot.GetIndex(),
		MaxSizePerMsg: maxSizePerMsg, MaxInflightMsgs: maxInflightMsgs,
		MaxUncommittedEntriesSize: 1 << 30,
		CheckQuorum:               true, PreVote: true, ReadOnlyOption: raft.ReadOnlySafe,
		Logger: &raftLogger{log: cfg.Log.With().Str("loop", "raft").Logger()},
	}
	n.tr = newTransport(cfg.ID, ln, cfg.Peers, cfg.Log)
	n.node = raft.RestartNode(rc)
	n.tr.start(n.node)
	n.wg.Add(2)
	go n.run()
	go n.readLoop()
	return n, nil
}

// openSM opens the state machine; when it is behind the WAL's snapshot (a
// crash during a received snapshot's restore), it restores the saved
// snapshot file.
func openSM(fs fileSystem, dir, walDir string, snapIndex uint64, opts sm.Options) (*sm.SM, error) {
	s, err := sm.Open(dir, opts)
	if errors.Is(err, sm.ErrRestoreUnfinish) {
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
		// A restore was cut short: start empty and restore the snapshot
		// file again below.
		s, err = sm.Open(dir, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("raftpath: opening the state machine: %w", err)
	}
	if s.Applied() < snapIndex {
		f, ferr := fs.Open(snapFile(walDir, snapIndex))
		if errors.Is(ferr, os.ErrNotExist) && snapIndex == 1 {
			// The bootstrap snapshot holds no state: index 1 is an empty
			// slot, applied as one so that the state machine's applied
			// index runs on without a gap (sm.ErrSlotGap).
			if _, err := s.Apply(1, nil); err != nil {
				s.Close()
				return nil, fmt.Errorf("raftpath: applying the bootstrap index: %w", err)
			}
			return s, nil
		}
		if ferr != nil {
			s.Close()
			return nil, fmt.Errorf("raftpath: state machine at %d is behind snapshot %d and its file is unreadable: %w", s.Applied(), snapIndex, ferr)
		}
		defer f.Close()
		if err := s.Restore(f); err != nil {
			s.Close()
			return nil, fmt.Errorf("raftpath: restoring snapshot %d: %w", snapIndex, err)
		}
	}
	return s, nil
}

func snapFile(walDir string, index uint64) string {
	return filepath.Join(walDir, fmt.Sprintf("snap-%016d.bin", index))
}

// SM returns the node's state machine.
func (n *Node) SM() *sm.SM { return n.sm }

// Fatal delivers a storage error that stopped the Ready loop.
func (n *Node) Fatal() <-chan error { return n.fatal }

// LeaderChanges counts the times this node saw a new leader.
func (n *Node) LeaderChanges() uint64 { return n.leaderChanges.Load() }

// SnapshotsRestored counts snapshots received from a leader and restored.
func (n *Node) SnapshotsRestored() uint64 { return n.restores.Load() }

// SnapshotsTaken counts the snapshots this node took for compaction and
// the time taking them took in total (state machine flush, WAL record,
// log compaction: the Ready loop is blocked for all of it).
func (n *Node) SnapshotsTaken() (uint64, time.Duration) {
	return n.snapshots.Load(), time.Duration(n.snapshotNanos.Load())
}

// Leader returns the leader this node knows (0: none).
func (n *Node) Leader() uint64 { return n.lead.Load() }

// IsLeader reports whether this node leads.
func (n *Node) IsLeader() bool { return raft.StateType(n.role.Load()) == raft.StateLeader }

// Applied returns the last applied index.
func (n *Node) Applied() uint64 { return n.applied.Load() }

// Close stops the node and closes the WAL and the state machine. It is
// graceful: everything acknowledged is already in a majority of WALs.
func (n *Node) Close() error {
	var err error
	n.closeOnce.Do(func() {
		close(n.stop)
		n.node.Stop()
		n.tr.close()
		n.wg.Wait()
		n.failPending(ErrStopped)
		err = errors.Join(n.wal.Close(), n.sm.Close())
	})
	return err
}

func (n *Node) fail(err error) {
	select {
	case n.fatal <- err:
	default:
	}
}

// run is the Ready loop: etcd's raftNode.start in one goroutine.
func (n *Node) run() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			n.node.Tick()
		case rd := <-n.node.Ready():
			if err := n.handleReady(rd); err != nil {
				n.cfg.Log.Error().Err(err).Msg("raft ready loop stopped")
				n.fail(err)
				return
			}
			n.node.Advance()
		case <-n.stop:
			return
		}
	}
}

func (n *Node) handleReady(rd raft.Ready) error {
	if ss := rd.SoftState; ss != nil {
		old := n.lead.Swap(ss.Lead)
		if ss.Lead != old && ss.Lead != raft.None {
			n.leaderChanges.Add(1)
		}
		wasLeader := raft.StateType(n.role.Swap(int32(ss.RaftState))) == raft.StateLeader
		if wasLeader && ss.RaftState != raft.StateLeader {
			n.failPending(ErrLeaderLost)
		}
	}
	if hs := rd.HardState; hs != nil {
		n.term.Store(hs.GetTerm())
	}
	snap := rd.Snapshot
	if !raft.IsEmptySnap(snap) {
		// As etcd: the snapshot's data is durable before the WAL says
		// the log starts there.
		if err := writeFileSync(n.fs, snapFile(n.cfg.WALDir, snap.GetMetadata().GetIndex()), snap.GetData()); err != nil {
			return err
		}
		if err := n.wal.SaveSnapshot(snap.GetMetadata()); err != nil {
			return err
		}
	}
	hs := rd.HardState
	if raft.IsEmptyHardState(hs) {
		hs = nil
	}
	mustSync := rd.MustSync
	if n.cfg.testingAckBeforeSync {
		mustSync = false // the planted bug: see Config.testingAckBeforeSync
	}
	if err := n.wal.Save(hs, rd.Entries, mustSync); err != nil {
		return err
	}
	if !raft.IsEmptySnap(snap) {
		meta := snap.GetMetadata()
		if err := n.store.ApplySnapshot(&pb.Snapshot{Metadata: meta}); err != nil {
			return fmt.Errorf("applying snapshot to storage: %w", err)
		}
		if err := n.sm.Restore(bytes.NewReader(snap.GetData())); err != nil {
			return fmt.Errorf("restoring snapshot %d: %w", meta.GetIndex(), err)
		}
		n.restores.Add(1)
		n.cs = meta.GetConfState()
		n.snapIndex = meta.GetIndex()
		n.removeSnapFiles(meta.GetIndex())
		n.setApplied(meta.GetIndex())
	}
	if hs != nil {
		n.store.SetHardState(hs)
	}
	if err := n.store.Append(rd.Entries); err != nil {
		return fmt.Errorf("appending to storage: %w", err)
	}
	// Entries and hard state are durable: now the messages may go.
	n.tr.send(rd.Messages)
	if err := n.apply(rd.CommittedEntries); err != nil {
		return err
	}
	for _, rs := range rd.ReadStates {
		select {
		case n.readStates <- rs:
		default: // the read loop retries a round whose state was dropped
		}
	}
	return n.maybeSnapshot()
}

// apply applies committed entries in order and answers the proposals this
// node made.
func (n *Node) apply(ents []*pb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	last := n.applied.Load()
	for _, e := range ents {
		idx := e.GetIndex()
		if idx <= last {
			continue
		}
		switch e.GetType() {
		case pb.EntryType_EntryNormal:
			if len(e.GetData()) < envelopeBytes {
				// The leader's empty entry of a new term.
				if _, err := n.sm.Apply(idx, nil); err != nil {
					return err
				}
				break
			}
			id := binary.BigEndian.Uint64(e.GetData())
			res, err := n.sm.Apply(idx, [][]byte{e.GetData()[envelopeBytes:]})
			if err != nil {
				return err
			}
			if len(res) == 1 {
				n.deliver(id, res[0])
			}
		case pb.EntryType_EntryConfChange, pb.EntryType_EntryConfChangeV2:
			// Membership is static; no node proposes these. Apply them
			// anyway should one appear, so raft's view stays whole.
			var cc pb.ConfChangeI
			if e.GetType() == pb.EntryType_EntryConfChange {
				c := &pb.ConfChange{}
				if err := proto.Unmarshal(e.GetData(), c); err != nil {
					return fmt.Errorf("decoding conf change %d: %w", idx, err)
				}
				cc = c
			} else {
				c := &pb.ConfChangeV2{}
				if err := proto.Unmarshal(e.GetData(), c); err != nil {
					return fmt.Errorf("decoding conf change %d: %w", idx, err)
				}
				cc = c
			}
			n.cs = n.node.ApplyConfChange(cc)
			if _, err := n.sm.Apply(idx, nil); err != nil {
				return err
			}
		}
		last = idx
	}
	n.commit.Store(max(n.commit.Load(), last))
	n.setApplied(last)
	return nil
}

func (n *Node) setApplied(idx uint64) {
	n.applied.Store(idx)
	n.commit.Store(max(n.commit.Load(), idx))
	n.appliedMu.Lock()
	close(n.appliedCh)
	n.appliedCh = make(chan struct{})
	n.appliedMu.Unlock()
}

// waitApplied returns once applied >= idx.
func (n *Node) waitApplied(ctx context.Context, idx uint64) error {
	for {
		n.appliedMu.Lock()
		ch := n.appliedCh
		n.appliedMu.Unlock()
		if n.applied.Load() >= idx {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-n.stop:
			return ErrStopped
		}
	}
}

// maybeSnapshot takes a snapshot every SnapshotEntries applied entries:
// flush the state machine (so the snapshot point is durable), record it in
// the WAL (which drops covered segments) and compact the in-memory log.
func (n *Node) maybeSnapshot() error {
	applied := n.applied.Load()
	if applied-n.snapIndex < n.cfg.SnapshotEntries {
		return nil
	}
	start := time.Now()
	slot, err := n.sm.Flush()
	if err != nil {
		return err
	}
	if slot != applied {
		return fmt.Errorf("raftpath: state machine flushed %d, applied %d", slot, applied)
	}
	snap, err := n.store.CreateSnapshot(slot, n.cs, nil)
	if err != nil {
		return fmt.Errorf("creating snapshot %d: %w", slot, err)
	}
	if err := n.wal.SaveSnapshot(snap.GetMetadata()); err != nil {
		return err
	}
	n.snapIndex = slot
	n.removeSnapFiles(slot)
	if slot > n.cfg.KeepEntries {
		if err := n.store.Compact(slot - n.cfg.KeepEntries); err != nil && !errors.Is(err, raft.ErrCompacted) {
			return fmt.Errorf("compacting the log: %w", err)
		}
	}
	n.snapshots.Add(1)
	n.snapshotNanos.Add(int64(time.Since(start)))
	return nil
}

// removeSnapFiles drops received snapshot files older than index: the
// state machine is at or past it.
func (n *Node) removeSnapFiles(index uint64) {
	names, _ := n.fs.ReadDir(n.cfg.WALDir)
	keep := filepath.Base(snapFile(n.cfg.WALDir, index))
	for _, name := range names {
		if strings.HasPrefix(name, "snap-") && strings.HasSuffix(name, ".bin") && name < keep {
			n.fs.Remove(filepath.Join(n.cfg.WALDir, name))
		}
	}
}

func writeFileSync(fs fileSystem, path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := fs.Create(tmp, false)
	if err != nil {
		return fmt.Errorf("writing snapshot file: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing snapshot file: %w", err)
	}
	if err := f.Datasync(); err != nil {
		f.Close()
		return fmt.Errorf("syncing snapshot file: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fs.Rename(tmp, path); err != nil {
		return err
	}
	return fs.SyncDir(filepath.Dir(path))
}

// Write proposes cmd (an sm command) and returns its result once applied
// here. Only the leader accepts writes (as the Paxos path does); others
// answer NotLeaderError.
func (n *Node) Write(ctx context.Context, cmd []byte) (sm.Result, error) {
	if !n.IsLeader() {
		return sm.Result{}, n.notLeader()
	}
	id := uint64(n.cfg.ID)<<48 | n.propSeq.Add(1)&(1<<48-1)
	ch := make(chan sm.Result, 1)
	n.propMu.Lock()
	if len(n.pending) >= writesPendingMax {
		n.propMu.Unlock()
		return sm.Result{}, ErrBusy
	}
	n.pending[id] = ch
	n.propMu.Unlock()
	data := make([]byte, envelopeBytes, envelopeBytes+len(cmd))
	binary.BigEndian.PutUint64(data, id)
	data = append(data, cmd...)
	if err := n.node.Propose(ctx, data); err != nil {
		n.forget(id)
		if errors.Is(err, raft.ErrProposalDropped) {
			return sm.Result{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		return sm.Result{}, err
	}
	select {
	case res, ok := <-ch:
		if !ok {
			return sm.Result{}, ErrLeaderLost
		}
		return res, nil
	case <-ctx.Done():
		n.forget(id)
		return sm.Result{}, ctx.Err()
	}
}

func (n *Node) forget(id uint64) {
	n.propMu.Lock()
	delete(n.pending, id)
	n.propMu.Unlock()
}

func (n *Node) deliver(id uint64, res sm.Result) {
	n.propMu.Lock()
	ch := n.pending[id]
	delete(n.pending, id)
	n.propMu.Unlock()
	if ch != nil {
		ch <- res
	}
}

// failPending ends every waiting proposal: after a step-down their
// outcome is unknown (the new leader may still commit them; a client
// retry with the same sequence is answered exactly once).
func (n *Node) failPending(error) {
	n.propMu.Lock()
	for id, ch := range n.pending {
		close(ch)
		delete(n.pending, id)
	}
	n.propMu.Unlock()
}

func (n *Node) notLeader() error {
	lead := n.lead.Load()
	e := &NotLeaderError{Leader: lead}
	for _, p := range n.cfg.Peers {
		if p.ID == lead {
			e.ClientAddr = p.ClientAddr
		}
	}
	return e
}

// ReadBarrier returns once this node's state machine reflects every write
// committed before the call: a ReadIndex round (confirmed by a quorum of
// heartbeats) and a wait for the applied index to reach it. Reads arriving
// during a round share the next one.
func (n *Node) ReadBarrier(ctx context.Context) error {
	if !n.IsLeader() {
		return n.notLeader()
	}
	done := make(chan error, 1)
	n.readMu.Lock()
	if len(n.readPending) >= readsPendingMax {
		n.readMu.Unlock()
		return ErrBusy
	}
	n.readPending = append(n.readPending, done)
	n.readMu.Unlock()
	select {
	case n.readKick <- struct{}{}:
	default:
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// readIndexTimeout bounds one ReadIndex round: two election timeouts.
func (n *Node) readIndexTimeout() time.Duration {
	return 2 * time.Duration(n.cfg.ElectionTicks) * n.cfg.Tick
}

// readLoop runs one ReadIndex round at a time for the reads queued so far.
func (n *Node) readLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			n.readMu.Lock()
			for _, w := range n.readPending {
				w <- ErrStopped
			}
			n.readPending = nil
			n.readMu.Unlock()
			return
		case <-n.readKick:
		}
		n.readMu.Lock()
		batch := n.readPending
		n.readPending = nil
		n.readMu.Unlock()
		if len(batch) == 0 {
			continue
		}
		err := n.readRound()
		for _, w := range batch {
			w <- err
		}
	}
}

func (n *Node) readRound() error {
	n.readSeq++
	rctx := binary.BigEndian.AppendUint64(nil, n.readSeq)
	ctx, cancel := context.WithTimeout(context.Background(), n.readIndexTimeout())
	defer cancel()
	if err := n.node.ReadIndex(ctx, rctx); err != nil {
		return fmt.Errorf("%w: read index: %v", ErrUnavailable, err)
	}
	for {
		select {
		case rs := <-n.readStates:
			if !bytes.Equal(rs.RequestCtx, rctx) {
				continue // a state from an earlier, timed-out round
			}
			if err := n.waitApplied(ctx, rs.Index); err != nil {
				return fmt.Errorf("%w: waiting for apply: %v", ErrUnavailable, err)
			}
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%w: read index round timed out (no quorum?)", ErrUnavailable)
		case <-n.stop:
			return ErrStopped
		}
	}
}

// Status is this node's view for STATUS replies and kvbench.
type Status struct {
	ID, Leader, Term, Commit, Applied uint64
	Role                              raft.StateType
	// Match is the leader's view of each follower's log (leader only).
	Match map[uint64]uint64
	// Active is the leader's view of which followers answered recently.
	Active map[uint64]bool
}

// Status returns this node's view.
func (n *Node) Status() Status {
	s := Status{ID: n.cfg.ID, Leader: n.lead.Load(), Term: n.term.Load(), Commit: n.commit.Load(),
		Applied: n.applied.Load(), Role: raft.StateType(n.role.Load())}
	if s.Role == raft.StateLeader {
		rs := n.node.Status()
		s.Match, s.Active = map[uint64]uint64{}, map[uint64]bool{}
		for id, pr := range rs.Progress {
			s.Match[id] = pr.Match
			s.Active[id] = pr.RecentActive
		}
		s.Commit = max(s.Commit, rs.HardState.GetCommit())
	}
	return s
}

// raftLogger adapts zerolog to raft.Logger; raft's Panic/Fatal stay fatal.
type raftLogger struct{ log zerolog.Logger }

func (l *raftLogger) Debug(v ...any)                 { l.log.Debug().Msg(fmt.Sprint(v...)) }
func (l *raftLogger) Debugf(format string, v ...any) { l.log.Debug().Msgf(format, v...) }
func (l *raftLogger) Error(v ...any)                 { l.log.Error().Msg(fmt.Sprint(v...)) }
func (l *raftLogger) Errorf(format string, v ...any) { l.log.Error().Msgf(format, v...) }
func (l *raftLogger) Info(v ...any)                  { l.log.Debug().Msg(fmt.Sprint(v...)) }
func (l *raftLogger) Infof(format string, v ...any)  { l.log.Debug().Msgf(format, v...) }
func (l *raftLogger) Warning(v ...any)               { l.log.Warn().Msg(fmt.Sprint(v...)) }
func (l *raftLogger) Warningf(format string, v ...any) {
	l.log.Warn().Msgf(format, v...)
}
func (l *raftLogger) Fatal(v ...any) { l.log.Fatal().Msg(fmt.Sprint(v...)) }
func (l *raftLogger) Fatalf(format string, v ...any) {
	l.log.Fatal().Msgf(format, v...)
}
func (l *raftLogger) Panic(v ...any) { panic(fmt.Sprint(v...)) }
func (l *raftLogger) Panicf(format string, v ...any) {
	panic(fmt.Sprintf(format, v...))
}
