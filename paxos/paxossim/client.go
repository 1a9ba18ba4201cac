package paxossim

import (
	"errors"
	"fmt"

	"github.com/anishathalye/porcupine"

	"synod/paxos"
)

// Client limits, in ticks and operations.
const (
	clientTimeoutTicks   = 12 // an attempt with no answer this long is retried elsewhere
	clientThinkTicksMax  = 6  // idle time between two operations
	opsPerClientMax      = 60
	simKeys              = 3
	proposeRetryTicksMin = 1
)

var keyNames = [simKeys]string{"x", "y", "z"}

// pendingOp is a client's one outstanding operation. A write keeps its
// (client, seq) across retries, so exactly-once dedup in the state machine
// makes its final result known however many attempts reached the log.
type pendingOp struct {
	in   kvInput
	seq  uint64 // writes only
	cmd  []byte // writes only: the encoded command
	hist int    // index into the run's history

	target    paxos.NodeID
	attemptAt int64 // tick of the current attempt; -1 before the first
	submitted bool  // the current attempt was accepted by target

	readID    uint64
	readIndex paxos.Slot
	haveIndex bool
}

// client issues operations one at a time against whichever node it
// believes leads, following the nodes' leader hints and retrying on
// timeouts.
type client struct {
	id       uint32
	idx      int // porcupine ClientId
	seq      uint64
	leader   paxos.NodeID // current guess
	op       *pendingOp
	nextOpAt int64 // tick
	ops      int
	seen     [simKeys]string // last value observed per key, for CAS
	retries  int
}

func (s *sim) clientStep(c *client, tick int64) {
	if c.op == nil {
		if s.liveness || c.ops >= opsPerClientMax || tick < c.nextOpAt {
			return
		}
		s.newOp(c)
	}
	op := c.op
	if op.in.Op == opGet {
		s.readStep(c, op, tick)
	} else {
		s.writeStep(c, op, tick)
	}
}

func (s *sim) newOp(c *client) {
	c.ops++
	k := s.r.intn(simKeys)
	in := kvInput{Key: keyNames[k]}
	switch s.r.intn(8) {
	case 0, 1, 2:
		in.Op = opGet
	case 3, 4:
		in.Op = opAppend
	case 5:
		in.Op = opPut
	default:
		in.Op = opCAS
		in.Expect = c.seen[k]
		if s.r.chance(1, 4) {
			in.Expect = "" // sometimes expect the initial value
		}
	}
	op := &pendingOp{in: in, target: c.leader, attemptAt: -1}
	if s.r.chance(1, 5) {
		// Sometimes ask a random node: clients that only follow hints
		// would stay with a deposed leader until they time out, and never
		// race a new leader against an old one's lease.
		op.target = s.nodes[s.r.intn(len(s.nodes))].id
	}
	if in.Op != opGet {
		c.seq++
		op.seq = c.seq
		op.in.Value = fmt.Sprintf("%d.%d;", c.id, c.seq)
		cmd := command{Op: in.Op, Client: c.id, Seq: c.seq, Key: in.Key, Value: op.in.Value, Expect: in.Expect}
		op.cmd = appendCommand(nil, &cmd)
	}
	op.hist = len(s.history)
	s.history = append(s.history, porcupine.Operation{
		ClientId: c.idx, Input: op.in, Call: s.now, Output: kvOutput{}, Return: returnNever,
	})
	c.op = op
	s.tracef("client %d: call %s", c.id, kvModel.DescribeOperation(op.in, kvOutput{}))
}

func (s *sim) complete(c *client, out string) {
	op := c.op
	h := &s.history[op.hist]
	h.Output = kvOutput{Known: true, Value: out}
	h.Return = s.now
	s.result.Ops++
	for i, k := range keyNames {
		if k == op.in.Key {
			switch {
			case op.in.Op == opGet:
				c.seen[i] = out
			case op.in.Op == opPut, op.in.Op == opCAS && out == resultTrue:
				c.seen[i] = op.in.Value
			}
		}
	}
	s.tracef("client %d: done %s at node %d", c.id, kvModel.DescribeOperation(op.in, h.Output), op.target)
	c.op = nil
	c.leader = op.target
	c.nextOpAt = s.now/microsPerTick + s.r.between(0, clientThinkTicksMax)
}

// retarget picks the next node to try: the hint of the node that refused,
// else a random node.
func (s *sim) retarget(c *client, op *pendingOp, hint paxos.NodeID) {
	if hint != 0 && hint != op.target && s.byID[hint] != nil {
		op.target = hint
	} else {
		op.target = s.nodes[s.r.intn(len(s.nodes))].id
	}
	c.leader = op.target
}

func (s *sim) writeStep(c *client, op *pendingOp, tick int64) {
	if sn := s.byID[op.target]; sn != nil && sn.up() {
		if ss, ok := sn.app.sessions[c.id]; ok && ss.Seq >= op.seq {
			if ss.Seq != op.seq {
				s.chk.violate("client %d: session at node %d is at seq %d beyond outstanding %d", c.id, sn.id, ss.Seq, op.seq)
			}
			s.complete(c, ss.Result)
			return
		}
	}
	if !op.attemptDue(tick) {
		return
	}
	if op.submitted {
		c.retries++
		s.result.Retries++
		s.retarget(c, op, 0)
	}
	op.attemptAt = tick
	op.submitted = false
	sn := s.byID[op.target]
	if sn == nil || !sn.up() {
		s.retarget(c, op, 0)
		return
	}
	err := sn.n.Propose([][]byte{op.cmd})
	s.process(sn)
	switch {
	case err == nil:
		op.submitted = true
	case errors.Is(err, paxos.ErrNotLeader):
		s.retarget(c, op, sn.n.Status().Leader)
	case errors.Is(err, paxos.ErrProposalsFull), errors.Is(err, paxos.ErrStopped), errors.Is(err, paxos.ErrTransferring):
		s.retarget(c, op, 0) // a hand-over refuses proposals until the next leader leads
	default:
		s.chk.violate("node %d: Propose returned an unexpected error: %v", sn.id, err)
	}
}

func (s *sim) readStep(c *client, op *pendingOp, tick int64) {
	if s.opts.plantStaleReads {
		// The planted bug: answer from whatever state the node has.
		if sn := s.byID[op.target]; sn != nil && sn.up() {
			s.complete(c, sn.app.data[op.in.Key])
		} else {
			s.retarget(c, op, 0)
		}
		return
	}
	if op.haveIndex {
		if sn := s.byID[op.target]; sn != nil && sn.up() && sn.app.applied >= op.readIndex {
			s.complete(c, sn.app.data[op.in.Key])
			return
		}
	}
	if !op.attemptDue(tick) {
		return
	}
	if op.submitted {
		c.retries++
		s.result.Retries++
		s.retarget(c, op, 0)
	}
	delete(s.readWaiters, op.readID)
	op.attemptAt = tick
	op.submitted = false
	op.haveIndex = false
	sn := s.byID[op.target]
	if sn == nil || !sn.up() {
		s.retarget(c, op, 0)
		return
	}
	s.nextReadID++
	op.readID = s.nextReadID
	s.readWaiters[op.readID] = readWaiter{c: c, node: sn.id, incarnation: sn.incarnation}
	err := sn.n.ReadIndex(op.readID)
	if err != nil {
		delete(s.readWaiters, op.readID)
	}
	switch {
	case err == nil:
		op.submitted = true
	case errors.Is(err, paxos.ErrNotLeader):
		s.retarget(c, op, sn.n.Status().Leader)
	case errors.Is(err, paxos.ErrReadsFull), errors.Is(err, paxos.ErrStopped):
		s.retarget(c, op, 0)
	default:
		s.chk.violate("node %d: ReadIndex returned an unexpected error: %v", sn.id, err)
	}
	s.process(sn)
}

// readWaiter routes a ReadState back to the client that asked for it.
type readWaiter struct {
	c           *client
	node        paxos.NodeID
	incarnation int
}

// readState delivers a ReadState from node sn.
func (s *sim) readState(sn *simNode, rs paxos.ReadState) {
	w, ok := s.readWaiters[rs.ID]
	if !ok || w.node != sn.id || w.incarnation != sn.incarnation {
		return // an answer to an abandoned attempt
	}
	delete(s.readWaiters, rs.ID)
	op := w.c.op
	if op == nil || op.readID != rs.ID {
		return
	}
	op.readIndex = rs.Index
	op.haveIndex = true
	s.result.Counts.LeaseOrBarrierReads++
}

// attemptDue reports whether the operation should be (re)submitted now: it
// never was, its last submission timed out, or its last one was refused a
// moment ago.
func (op *pendingOp) attemptDue(tick int64) bool {
	if op.attemptAt < 0 {
		return true
	}
	if op.submitted {
		return tick-op.attemptAt >= clientTimeoutTicks
	}
	return tick-op.attemptAt >= proposeRetryTicksMin
}
