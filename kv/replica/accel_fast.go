package replica

import (
	"fmt"
	"sync"
	"sync/atomic"

	"synod/accel"
	"synod/paxos"
	"synod/pmem"
)

// mirrorQueueMax bounds the Accepts the fast path persisted and answered
// that wait for the consensus loop; when it is full the fast path declines
// (the Accept goes to paxos the ordinary way), so a mirror is never dropped.
const mirrorQueueMax = 1024

// fastPath is the follower's accept fast path: an Accept addressed to this
// node at exactly the promised ballot, for slots in the plane's window, is
// handed to Plane.OnAccept on the receive loop, which appends the entries
// to the acceptor log (the same record software writes: a pmem entry record
// whose payload is paxos.AppendEntry) and persists them; the receive loop
// then sends the Accepted software would send and queues the Accept for the
// consensus loop (the mirror), where paxos accepts it again and learns its
// commit index.
//
// Why it is safe. An acceptor may answer Accepted(s, b) only if it has not
// promised a higher ballot, and every Promise it sends must report every
// entry it accepted before. Three rules keep both true:
//
//  1. The fast path accepts only at b == the durable promised ballot
//     (open), so it never promises anything itself and never overrides a
//     lease paxos granted (accepting a higher ballot stays with paxos).
//  2. Before paxos steps any inbound message, and before it campaigns, the
//     consensus loop steps every queued mirror first, whether the path is
//     open or already closed (by a stall or a role change); when the
//     message could raise its promise or make it answer with a promise (a
//     ballot above the open one, or a pre-check answer that may start its
//     own phase 1) it also closes the path first (fence). So paxos holds
//     every fast-accepted entry before it promises, its Promise reports
//     them, and a later Accept at the older ballot is refused by paxos and
//     the plane alike.
//  3. The fast path decides and queues its mirror under one lock and never
//     drops a mirror (it declines when the mirror queue is full), so the
//     fence sees every accept made before it closed.
//
// The plane's promised register is written right after a promise is
// durable, before the Ready's messages (a Promise among them) are sent;
// with rule 1 it never lags the durable promise. Persisting before
// answering is the plane's own contract (OnAccept emits SEND-ACCEPTED only
// after the WAL's Persist returned), and the Accepted carries what
// handleAccept would send: the Accept's ballot, the accepted range and
// this node's commit index (as last published; the leader only takes the
// maximum).
type fastPath struct {
	mu      sync.Mutex   // orders fast accepts with their mirrors against fences
	open    paxos.Ballot // zero: closed; else the ballot the fast path accepts
	promise paxos.Ballot // the durable promised ballot
	mirrorC chan paxos.Message
	// persisted remembers, per window row, the (slot, ballot) the fast path
	// made durable, so software does not persist the same entry again.
	persisted []slotBallot
	// sent remembers, per window row, the (slot, ballot) whose Accepted the
	// fast path handed to the send loop and software has not yet repeated.
	sent    []slotBallot
	buf     []accel.Event
	payload []byte

	accepts atomic.Uint64
	skipped atomic.Uint64
}

type slotBallot struct {
	slot   paxos.Slot
	ballot paxos.Ballot
}

func (f *fastPath) init(promised paxos.Ballot) {
	f.promise = promised
	f.mirrorC = make(chan paxos.Message, mirrorQueueMax)
	f.persisted = make([]slotBallot, accelWindowSlots)
	f.sent = make([]slotBallot, accelWindowSlots)
}

// durable records a newly durable promise; an open fast path at another
// ballot closes (registers reopens it at the new one).
func (f *fastPath) durable(b paxos.Ballot) {
	f.mu.Lock()
	if f.promise.Less(b) {
		f.promise = b
	}
	if f.open != f.promise {
		f.open = paxos.Ballot{}
	}
	f.mu.Unlock()
}

// reopen opens the fast path at the promised ballot when this node follows
// and that promise is durable, and closes it otherwise (consensus loop).
func (f *fastPath) reopen(s *paxos.Status, notStalled bool) {
	f.mu.Lock()
	if s.Role == paxos.RoleFollower && notStalled && !s.Promised.IsZero() && s.Promised == f.promise {
		f.open = s.Promised
	} else {
		f.open = paxos.Ballot{}
	}
	f.mu.Unlock()
}

// acceptable reports whether m is an Accept the fast path may take: what
// paxos.Node.validate and handleAccept would store in full (the fast path
// must never persist an entry paxos would drop).
func (r *Replica) acceptable(m *paxos.Message) bool {
	if m.Type != paxos.MsgAccept || m.Reject || len(m.Entries) == 0 || m.Cluster != r.cfg.ClusterID ||
		m.From == r.cfg.ID || m.Ballot.Node != m.From || m.Ballot.Round == 0 ||
		len(m.Entries) > paxos.EntriesPerMessageMax {
		return false
	}
	if _, ok := r.peer(m.From); !ok {
		return false
	}
	for i := range m.Entries {
		e := &m.Entries[i]
		if e.Ballot != m.Ballot || e.Slot == 0 || e.Slot > m.Commit+accelWindowSlots ||
			(i > 0 && e.Slot != m.Entries[i-1].Slot+1) ||
			e.Type < paxos.EntryNormal || e.Type > paxos.EntryNoop || len(e.Cmds) > paxos.CmdsPerEntryMax {
			return false
		}
	}
	return true
}

// accept runs the fast path for m (receive loop). It returns true when it
// took m: the entries are durable, the Accepted is on its way and m is
// queued for paxos; false leaves m to the ordinary path.
func (a *accelMirror) accept(m *paxos.Message) bool {
	r := a.r
	if !r.acceptable(m) {
		return false
	}
	f := &a.fast
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.open.IsZero() || m.Ballot != f.open || len(f.mirrorC) == cap(f.mirrorC) {
		return false
	}
	evs := f.buf[:0]
	var first, last paxos.Slot
	// One persist for the whole Accept: the plane's per-entry Persist is
	// deferred to the one below, which runs before the Accepted leaves
	// (the plane's ordering, kept by the runtime, at a batch's cost).
	a.wal.deferPersist = true
	for i := range m.Entries {
		e := &m.Entries[i]
		if f.persisted[e.Slot&(accelWindowSlots-1)] == (slotBallot{e.Slot, m.Ballot}) {
			// A resent Accept: durable already (one value per slot and
			// ballot), so it is answered without a second copy in the log.
			if first == 0 {
				first = e.Slot
			}
			last = e.Slot
			continue
		}
		f.payload = paxos.AppendEntry(f.payload[:0], e)
		n := len(evs)
		evs = a.plane.OnAccept(evs, e.Slot, m.Ballot, m.From, f.payload)
		sent := false
		for _, ev := range evs[n:] {
			sent = sent || ev.Kind == accel.OutSendAccepted
		}
		if !sent {
			break // handed up: the rest stays with paxos (Accepted ranges are contiguous)
		}
		f.persisted[e.Slot&(accelWindowSlots-1)] = slotBallot{e.Slot, m.Ballot}
		if first == 0 {
			first = e.Slot
		}
		last = e.Slot
	}
	a.wal.deferPersist = false
	f.buf = evs[:0]
	a.check.plane(evs)
	if first == 0 {
		return false
	}
	if err := a.wal.log.Persist(); err != nil {
		// Nothing is answered; paxos, handed the Accept the ordinary
		// way, appends and persists the entries itself (or stops the
		// replica if the log is broken).
		for s := first; s <= last; s++ {
			f.persisted[s&(accelWindowSlots-1)] = slotBallot{}
		}
		return false
	}
	f.accepts.Add(uint64(last - first + 1))
	reply := paxos.Message{Type: paxos.MsgAccepted, Cluster: r.cfg.ClusterID, From: r.cfg.ID, To: m.From,
		Ballot: m.Ballot, Slot: first, Index: last, Commit: r.status.Load().Commit}
	if r.sendNow(m.From, paxos.AppendMessage(make([]byte, 0, paxos.MessageSize(&reply)), &reply)) {
		for s := first; s <= last; s++ {
			f.sent[s&(accelWindowSlots-1)] = slotBallot{s, m.Ballot}
		}
	}
	f.mirrorC <- *m // room was checked under f.mu; only this path sends
	return true
}

// alreadySent reports whether m is the Accepted paxos produced for a
// mirror whose Accepted the fast path already sent (every slot of the
// range, same ballot), and forgets those marks, so that at most one
// software Accepted is dropped per fast one (consensus loop, step 2). The
// dropped message differs only in a newer commit index, which the leader
// learns from the next heartbeat answer.
func (f *fastPath) alreadySent(m *paxos.Message) bool {
	if m.Type != paxos.MsgAccepted || m.Reject || m.Index < m.Slot || m.Index-m.Slot >= accelWindowSlots {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := m.Slot; s <= m.Index; s++ {
		if f.sent[s&(accelWindowSlots-1)] != (slotBallot{s, m.Ballot}) {
			return false
		}
	}
	for s := m.Slot; s <= m.Index; s++ {
		f.sent[s&(accelWindowSlots-1)] = slotBallot{}
	}
	return true
}

// sendNow queues one encoded datagram for the send loop without blocking;
// a full queue drops it (Paxos retransmits) and it returns false.
func (r *Replica) sendNow(to paxos.NodeID, b []byte) bool {
	select {
	case r.outbound <- []outMsg{{to: to, b: b}}:
		return true
	default:
		r.metrics.OutboundDropped.Inc()
		return false
	}
}

// needsFence reports whether the fast path is open and m could make paxos
// promise, so that it must close before paxos steps m (consensus loop).
func (f *fastPath) needsFence(m *paxos.Message) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.needsFenceLocked(m)
}

func (f *fastPath) needsFenceLocked(m *paxos.Message) bool {
	return !f.open.IsZero() && (f.open.Less(m.Ballot) || m.Type == paxos.MsgPreCheckResp)
}

// fence closes the fast path and steps every mirror queued before it
// closed (consensus loop). registers reopens it after the Ready loop.
func (a *accelMirror) fence() { a.stepMirrors(nil) }

// stepMirrors steps every mirror queued so far (consensus loop). When m is
// non-nil and could make paxos promise, it first closes the fast path, so
// no accept can slip in between the mirrors stepped here and m.
//
// Mirrors are stepped before every inbound message, whether the fast path
// is open or not: a path closed by a stall or a role change may still have
// mirrors queued, and a Promise paxos sends must report every entry the
// fast path already made durable and acknowledged.
func (a *accelMirror) stepMirrors(m *paxos.Message) {
	f := &a.fast
	f.mu.Lock()
	if m == nil || f.needsFenceLocked(m) {
		f.open = paxos.Ballot{}
	}
	n := len(f.mirrorC)
	f.mu.Unlock()
	for i := 0; i < n; i++ {
		a.r.step(<-f.mirrorC)
	}
}

// stepInbound steps a message from the inbound queue after every queued
// mirror, fencing first when the fast path is open and m could make paxos
// promise (consensus loop).
func (r *Replica) stepInbound(m paxos.Message) {
	if r.accel != nil {
		r.accel.stepMirrors(&m)
	}
	if !r.admitAccept(&m) {
		return // no room in the acceptor log: as if lost (accept_admission.go)
	}
	r.step(m)
}

// mirrors is the fast path's mirror queue (nil when accel is off: a nil
// channel is never ready).
func (r *Replica) mirrors() chan paxos.Message {
	if r.accel == nil {
		return nil
	}
	return r.accel.fast.mirrorC
}

// notPersisted returns the entries of es the fast path has not already
// made durable at the same ballot (consensus loop, before persisting a
// Ready). One value per (slot, ballot): the record the fast path wrote is
// the one software would write, so skipping it changes nothing on disk.
func (f *fastPath) notPersisted(es []paxos.Entry) []paxos.Entry {
	f.mu.Lock()
	defer f.mu.Unlock()
	keep := -1 // index of the first entry to drop, -1 if none
	for i := range es {
		p := f.persisted[es[i].Slot&(accelWindowSlots-1)]
		if p.slot == es[i].Slot && p.ballot == es[i].Ballot {
			keep = i
			break
		}
	}
	if keep < 0 {
		return es
	}
	out := make([]paxos.Entry, 0, len(es))
	out = append(out, es[:keep]...)
	for i := keep; i < len(es); i++ {
		p := f.persisted[es[i].Slot&(accelWindowSlots-1)]
		if p.slot == es[i].Slot && p.ballot == es[i].Ballot {
			f.skipped.Add(1)
			continue
		}
		out = append(out, es[i])
	}
	return out
}

// accelWAL is the fast path's durable log: the replica's acceptor log.
// *PMemLog takes the plane's records as they are (pmem.Log is safe for
// concurrent use); another AcceptorLog gets the entry decoded back.
type accelWAL struct {
	log AcceptorLog
	// deferPersist (set under fastPath.mu around one Accept's entries)
	// makes Persist a no-op: the fast path persists once after the last
	// entry and before it sends anything.
	deferPersist bool
}

// recordAppender is implemented by acceptor logs that take pmem records.
type recordAppender interface {
	appendRecords(recs []pmem.Record) error
}

func (w *accelWAL) Append(recs []pmem.Record) error {
	// The fast path keeps the log's reserve as admission does
	// (accept_admission.go): past it the plane declines and the accept
	// goes up to software, which drops it.
	var need int64
	for _, rec := range recs {
		need += int64(len(rec.Payload)) + acceptEntryOverheadBytes
	}
	if used, capacity := w.log.Usage(); capacity > 0 && used+need > admitBytesMax(capacity) {
		return fmt.Errorf("%w: the fast path keeps the log's reserve", ErrLogFull)
	}
	if ra, ok := w.log.(recordAppender); ok {
		return ra.appendRecords(recs)
	}
	es := make([]paxos.Entry, 0, len(recs))
	for _, rec := range recs {
		e, err := paxos.UnmarshalEntry(append([]byte(nil), rec.Payload...))
		if err != nil {
			return fmt.Errorf("decoding a fast-path entry: %w", err)
		}
		es = append(es, e)
	}
	return w.log.Append(es)
}

func (w *accelWAL) Persist() error {
	if w.deferPersist {
		return nil
	}
	return w.log.Persist()
}

// appendRecords appends pmem records directly (no shared buffer: safe
// beside the consensus loop's Append).
func (p *PMemLog) appendRecords(recs []pmem.Record) error { return p.l.Append(recs) }
