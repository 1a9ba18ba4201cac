package accel

import (
	"io"
	"sync"

	"synod/paxos"
	"synod/pmem"
)

// Plane is the live co-processor model: the state New sized once from a
// Spec, behind one lock, so the receive loop, the heartbeat loop and the
// Paxos goroutine may all drive it. Every input gets the next sequence
// number, is applied, and (when tracing) is recorded with its outputs, in
// lock order; a replay of the trace reproduces every output exactly.
//
// All methods append the plane's output events to dst and return it
// (append style, no allocation when dst has room). Non-tick inputs are
// stamped with the injected clock (WithClock) or, without one, with the
// newest Tick's time.
type Plane struct {
	mu    sync.Mutex
	s     *state
	seq   uint64
	wal   WAL
	clock func() uint64
	tw    *TraceWriter
	stats Stats
	batch [1]pmem.Record // the fast path appends one record at a time
}

// Stats counts what the plane did since New.
type Stats struct {
	Inputs, Commits, HandUps, FastAccepts, Heartbeats, HeartbeatAcks, ElectionTimeouts uint64
	LeaseGained, LeaseLost, Admitted, Refused                                          uint64
}

// Option configures New.
type Option func(*Plane)

// WithWAL gives the accept fast path its durable log. Without one, every
// Accept is handed up (the fast path needs somewhere to persist).
func WithWAL(w WAL) Option { return func(p *Plane) { p.wal = w } }

// WithClock stamps non-tick inputs with now() (ticks of TickDuration).
func WithClock(now func() uint64) Option { return func(p *Plane) { p.clock = now } }

// WithTrace records every input and output to w in the trace format
// (README.md). Errors writing it are sticky and reported by Close and
// TraceErr; they never disturb the plane.
func WithTrace(w io.Writer) Option { return func(p *Plane) { p.tw = NewTraceWriter(w) } }

// New validates spec and builds a plane. Registers start at zero: role
// off, no members, window base 0, every tenant bucket unlimited.
func New(spec Spec, opts ...Option) (*Plane, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	p := &Plane{s: newState(spec)}
	for _, o := range opts {
		o(p)
	}
	if p.tw != nil {
		p.tw.WriteHeader(spec)
	}
	return p, nil
}

// Spec returns the plane's spec.
func (p *Plane) Spec() Spec { return p.s.spec }

// Apply feeds one raw input (Seq is assigned here, Now is taken as given)
// and appends its outputs. Replays use it; the typed methods below are
// what the runtime calls. An input with an output kind is handed up.
func (p *Plane) Apply(dst []Event, in Event) []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.applyLocked(dst, in)
}

func (p *Plane) applyLocked(dst []Event, in Event) []Event {
	p.seq++
	in.Seq = p.seq
	n := len(dst)
	dst = p.s.apply(in, dst)
	p.count(dst[n:])
	if p.tw != nil {
		p.tw.Write(in)
		for _, e := range dst[n:] {
			p.tw.Write(e)
		}
	}
	return dst
}

func (p *Plane) count(out []Event) {
	p.stats.Inputs++
	for _, e := range out {
		switch e.Kind {
		case OutCommit:
			p.stats.Commits++
		case OutHandUp:
			p.stats.HandUps++
		case OutSendAccepted:
			p.stats.FastAccepts++
		case OutHeartbeat:
			p.stats.Heartbeats++
		case OutHeartbeatAck:
			p.stats.HeartbeatAcks++
		case OutElectionTimeout:
			p.stats.ElectionTimeouts++
		case OutLeaseGained:
			p.stats.LeaseGained++
		case OutLeaseLost:
			p.stats.LeaseLost++
		case OutAdmit:
			if e.Flags == 1 {
				p.stats.Admitted++
			} else {
				p.stats.Refused++
			}
		}
	}
}

// input stamps and applies a typed input.
func (p *Plane) input(dst []Event, in Event) []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	in.Now = p.stampLocked()
	return p.applyLocked(dst, in)
}

func (p *Plane) stampLocked() uint64 {
	if p.clock != nil {
		return p.clock()
	}
	return p.s.now
}

// Tick advances the plane clock to now (ticks; an earlier now is ignored)
// and runs the timers: lease check, heartbeat emission, election timeout.
func (p *Plane) Tick(dst []Event, now uint64) []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.applyLocked(dst, Event{Kind: InTick, Now: now})
}

// SetRole writes the role register. Becoming leader schedules a heartbeat
// on the next tick; becoming follower starts the election timer; leaving
// leader drops the lease (OutLeaseLost).
func (p *Plane) SetRole(dst []Event, r Role) []Event {
	return p.input(dst, Event{Kind: InSetRole, Flags: uint8(r)})
}

// SetBallot writes the ballot this node leads with (heartbeats carry it;
// acks must echo it). A change forgets every ack and drops the lease.
func (p *Plane) SetBallot(dst []Event, b paxos.Ballot) []Event {
	return p.input(dst, Event{Kind: InSetBallot, Ballot: b})
}

// SetPromised writes the promised-ballot register. Software writes it
// whenever it promises (after the promise is durable); the fast path
// raises it itself when it accepts a higher ballot.
func (p *Plane) SetPromised(dst []Event, b paxos.Ballot) []Event {
	return p.input(dst, Event{Kind: InSetPromised, Ballot: b})
}

// SetQuorum writes the quorum register (1..Spec.Replicas).
func (p *Plane) SetQuorum(dst []Event, q int) []Event {
	if q < 0 {
		q = 0 // handed up as a bad quorum size
	}
	return p.input(dst, Event{Kind: InSetQuorum, Len: uint32(q)})
}

// SetMember writes member-table entry index (node 0 clears it).
func (p *Plane) SetMember(dst []Event, index int, node paxos.NodeID) []Event {
	return p.input(dst, Event{Kind: InSetMember, Index: clampIndex(index), Node: node})
}

// SetSelf says which member-table entry is this node.
func (p *Plane) SetSelf(dst []Event, index int) []Event {
	return p.input(dst, Event{Kind: InSetSelf, Index: clampIndex(index)})
}

// SetWindowBase writes the lowest slot of the window; the window is
// [base, base+WindowSlots). The leader writes its lowest uncommitted slot,
// a follower its commit index + 1.
func (p *Plane) SetWindowBase(dst []Event, base paxos.Slot) []Event {
	return p.input(dst, Event{Kind: InSetWindowBase, Slot: base})
}

// SetTenant writes tenant-table entry index: ops/s and bytes/s with bursts
// (tokens); a zero rate leaves that dimension unlimited. The buckets start
// full.
func (p *Plane) SetTenant(dst []Event, index int, opsPerSec, opsBurst, bytesPerSec, bytesBurst uint64) []Event {
	dst = p.input(dst, Event{Kind: InSetTenantOps, Index: clampIndex(index), Value: opsPerSec, Value2: opsBurst})
	return p.input(dst, Event{Kind: InSetTenantBytes, Index: clampIndex(index), Value: bytesPerSec, Value2: bytesBurst})
}

// Arm tells the leader's aggregator that Accept(slot, ballot) is being
// sent; the leader's own acceptance counts as the first ack, so software
// must arm only after its own acceptance is durable. Quorum 1 commits at
// once.
func (p *Plane) Arm(dst []Event, slot paxos.Slot, b paxos.Ballot) []Event {
	return p.input(dst, Event{Kind: InArm, Slot: slot, Ballot: b})
}

// OnAccepted feeds an Accepted(slot, ballot) from acceptor from to the
// aggregator. Reaching the quorum emits exactly one OutCommit per armed
// (slot, ballot); duplicates and late acks emit nothing; mismatches are
// handed up.
func (p *Plane) OnAccepted(dst []Event, slot paxos.Slot, b paxos.Ballot, from paxos.NodeID) []Event {
	return p.input(dst, Event{Kind: InAccepted, Slot: slot, Ballot: b, Node: from})
}

// OnAcceptedRange feeds an Accepted that acknowledges the slots [first,
// last] (paxos.MsgAccepted carries Slot and Index): one input per slot, at
// most WindowSlots of them; a longer range's tail is handed up.
func (p *Plane) OnAcceptedRange(dst []Event, first, last paxos.Slot, b paxos.Ballot, from paxos.NodeID) []Event {
	n := 0
	for s := first; s <= last && s >= first; s++ {
		if n == p.s.spec.WindowSlots {
			// Beyond anything the window can hold: one input for the rest,
			// which the aggregator hands up as out of window.
			return p.OnAccepted(dst, last, b, from)
		}
		dst = p.OnAccepted(dst, s, b, from)
		n++
	}
	return dst
}

// OnAccept runs the follower fast path for Accept(slot, ballot) from the
// leader: if the ballot is at least the promised register and the slot is
// in the window, payload is appended to the WAL and persisted, and the
// outputs are OutSendAccepted (send it now) then OutMirror (tell software);
// otherwise, or if the WAL fails, OutHandUp. payload is the entry exactly
// as software would persist it (the runtime's encoding), so recovery does
// not care which path wrote it.
func (p *Plane) OnAccept(dst []Event, slot paxos.Slot, b paxos.Ballot, from paxos.NodeID, payload []byte) []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	in := Event{Kind: InAccept, Slot: slot, Ballot: b, Node: from, Len: uint32(min(len(payload), 1<<31))}
	in.Now = p.stampLocked()
	if in.Now > p.s.now {
		p.s.now = in.Now // the check below must see the same clock apply will
	}
	// The WAL is touched only when the check passes, and under the lock, so
	// no register write can slip between the check and the apply. Its
	// outcome is part of the input: a replay needs no WAL.
	if p.s.acceptCheck(&in) == ReasonNone {
		if !p.persistLocked(slot, b, p.s.promised.Less(b), payload) {
			in.Flags |= FlagWALFailed
		}
	}
	return p.applyLocked(dst, in)
}

func (p *Plane) persistLocked(slot paxos.Slot, b paxos.Ballot, raise bool, payload []byte) bool {
	if p.wal == nil {
		return false
	}
	if raise {
		pr, ok := p.wal.(Promiser)
		if !ok || pr.SetPromised(pmemBallot(b)) != nil {
			return false
		}
	}
	p.batch[0] = walEntry(slot, b, payload)
	err := p.wal.Append(p.batch[:])
	p.batch[0] = pmem.Record{} // do not pin the payload
	if err != nil {
		return false
	}
	return p.wal.Persist() == nil
}

// OnHeartbeat feeds a leader's heartbeat to a follower: a heartbeat at the
// promised ballot from a member restarts the election timer and emits
// OutHeartbeatAck (echoing sentAt); anything else is handed up.
func (p *Plane) OnHeartbeat(dst []Event, from paxos.NodeID, b paxos.Ballot, sentAt uint64) []Event {
	return p.input(dst, Event{Kind: InHeartbeat, Node: from, Ballot: b, Value: sentAt})
}

// OnHeartbeatAck feeds a follower's ack to the leader's lease engine.
func (p *Plane) OnHeartbeatAck(dst []Event, from paxos.NodeID, b paxos.Ballot, sentAt uint64) []Event {
	return p.input(dst, Event{Kind: InHeartbeatAck, Node: from, Ballot: b, Value: sentAt})
}

// Admit runs the shaper on tenant-table entry index for one frame of
// frameBytes: ok, or refused with the wait in ticks until it would pass.
func (p *Plane) Admit(index int, frameBytes int) (ok bool, retryAfterTicks uint64) {
	var buf [1]Event
	out := p.input(buf[:0], Event{Kind: InAdmit, Index: clampIndex(index), Len: uint32(max(0, min(frameBytes, 1<<31)))})
	if len(out) == 0 || out[0].Kind != OutAdmit {
		return false, 0
	}
	return out[0].Flags == 1, out[0].Value
}

// LeaseValid reports the leader's lease as of the newest tick.
func (p *Plane) LeaseValid() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.s.leaseValid
}

// Stats returns the counters.
func (p *Plane) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// TraceErr returns the first error writing the trace, if any.
func (p *Plane) TraceErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tw == nil {
		return nil
	}
	return p.tw.Err()
}

// Close flushes the trace.
func (p *Plane) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tw == nil {
		return nil
	}
	return p.tw.Flush()
}

func clampIndex(i int) uint16 {
	if i < 0 || i > 0xFFFF {
		return 0xFFFF // out of every table: handed up
	}
	return uint16(i)
}
