package replica

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"time"

	"synod/accel"
	"synod/paxos"
)

// Accel heartbeat frames are small datagrams on the consensus port, beside
// paxos messages. Layout (little endian), part of the wire format:
//
//	offset size field
//	0      1    accelFrameMagic (never a paxos codec version)
//	1      1    kind: 1 heartbeat (leader -> follower), 2 ack (follower -> leader)
//	2      8    cluster id
//	10     8    from node
//	18     8    to node
//	26     8    ballot round
//	34     8    ballot node
//	42     8    sentAt: the leader plane's clock (ticks of accel.TickDuration), echoed by the ack
//
// A node without accel drops them without counting them as bad input; a
// node with accel feeds them to its plane. Paxos's own heartbeats keep
// running on the consensus loop, so nodes without accel still hear the
// leader.
const (
	accelFrameMagic     = 0xA5
	accelFrameBytes     = 50
	accelFrameHeartbeat = 1
	accelFrameAck       = 2
	// accelTimerPeriodsPerHeartbeat is how many timer ticks the plane gets
	// per heartbeat period (the plane's doc asks for at most a quarter).
	accelTimerPeriodsPerHeartbeat = 4
	// loopWedgedElections is how many election timeouts the consensus
	// loop may go without beginning an iteration before the plane stops
	// sending heartbeats for it. A shorter stall (GC, a slow persist, a
	// burst of work) costs no leader change; a loop that is wedged must not
	// keep the followers loyal to a leader that cannot commit or answer.
	loopWedgedElections = 5
)

type accelFrame struct {
	kind     uint8
	cluster  uint64
	from, to paxos.NodeID
	ballot   paxos.Ballot
	sentAt   uint64
}

var errBadAccelFrame = errors.New("replica: malformed accel frame")

// isAccelFrame says whether a datagram is an accel frame rather than a
// paxos message (by its first byte).
func isAccelFrame(b []byte) bool { return len(b) > 0 && b[0] == accelFrameMagic }

func appendAccelFrame(buf []byte, f *accelFrame) []byte {
	buf = append(buf, accelFrameMagic, f.kind)
	buf = binary.LittleEndian.AppendUint64(buf, f.cluster)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(f.from))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(f.to))
	buf = binary.LittleEndian.AppendUint64(buf, f.ballot.Round)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(f.ballot.Node))
	return binary.LittleEndian.AppendUint64(buf, f.sentAt)
}

func parseAccelFrame(b []byte) (accelFrame, error) {
	if len(b) != accelFrameBytes || b[0] != accelFrameMagic || (b[1] != accelFrameHeartbeat && b[1] != accelFrameAck) {
		return accelFrame{}, errBadAccelFrame
	}
	u := func(off int) uint64 { return binary.LittleEndian.Uint64(b[off : off+8]) }
	return accelFrame{kind: b[1], cluster: u(2), from: paxos.NodeID(u(10)), to: paxos.NodeID(u(18)),
		ballot: paxos.Ballot{Round: u(26), Node: paxos.NodeID(u(34))}, sentAt: u(42)}, nil
}

// startTimers runs the plane's heartbeat and lease engine on its own
// goroutine (accel.Plane.RunTimers with real ticks).
func (a *accelMirror) startTimers() {
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	period := time.Duration(a.plane.Spec().HeartbeatPeriodTicks) * accel.TickDuration / accelTimerPeriodsPerHeartbeat
	period = max(period, 100*time.Microsecond)
	a.timerWG.Add(1)
	go func() {
		defer a.timerWG.Done()
		a.plane.RunTimers(ctx, accel.RealTicks(ctx, period, a.epoch), a.timerEvents)
	}()
}

// timerEvents handles the timer loop's outputs: heartbeats go straight to
// the send loop; an election timeout asks the consensus loop to campaign.
func (a *accelMirror) timerEvents(evs []accel.Event) {
	r := a.r
	for _, ev := range evs {
		switch ev.Kind {
		case accel.OutHeartbeat:
			if r.loopWedged() {
				a.wedgedBeats.Add(1)
				continue
			}
			s := r.status.Load() // the latest membership: voters and learners
			out := make([]outMsg, 0, len(s.Members)+len(s.Learners))
			for _, id := range slices.Concat(s.Members, s.Learners) {
				if id == r.cfg.ID || r.faults.drop(id) {
					continue
				}
				f := accelFrame{kind: accelFrameHeartbeat, cluster: r.cfg.ClusterID, from: r.cfg.ID, to: id,
					ballot: ev.Ballot, sentAt: ev.Value}
				out = append(out, outMsg{to: id, b: appendAccelFrame(make([]byte, 0, accelFrameBytes), &f)})
			}
			if len(out) > 0 {
				select {
				case r.outbound <- out:
				default:
					r.metrics.OutboundDropped.Inc()
				}
			}
		case accel.OutElectionTimeout:
			// Blocking: an election must not be lost (the plane emits the
			// timeout once; the campaign re-arms its timer).
			select {
			case r.controlC <- a.campaign:
			case <-r.stop:
			}
		}
	}
}

// loopWedged reports whether the consensus loop has not begun an iteration
// for loopWedgedElections election timeouts.
func (r *Replica) loopWedged() bool {
	return r.clk.sinceAlive() > time.Duration(loopWedgedElections*r.cfg.ElectionTicks)*r.cfg.Tick
}

// campaign starts an election on the plane's timeout (consensus loop).
func (a *accelMirror) campaign() {
	a.fence() // paxos's own promise must hold every fast-accepted entry
	if err := a.r.node.Campaign(); err != nil {
		a.r.log.Debug().Err(err).Msg("campaign on the accel election timeout")
	} else {
		a.elections.Add(1)
	}
	a.forceRole = true // re-arm the plane's election timer
}

// frame handles an accel frame addressed to this node (receive loop;
// deliver parsed it and checked its destination).
func (a *accelMirror) frame(f accelFrame) {
	r := a.r
	if f.cluster != r.cfg.ClusterID || f.from == r.cfg.ID || r.faults.drop(f.from) {
		r.metrics.InboundDropped.Inc()
		return
	}
	if _, ok := r.peer(f.from); !ok {
		r.metrics.InboundDropped.Inc()
		return
	}
	var buf [4]accel.Event
	switch f.kind {
	case accelFrameHeartbeat:
		out := a.plane.OnHeartbeat(buf[:0], f.from, f.ballot, f.sentAt)
		acked := false
		for _, ev := range out {
			if ev.Kind != accel.OutHeartbeatAck {
				continue
			}
			acked = true
			ack := accelFrame{kind: accelFrameAck, cluster: r.cfg.ClusterID, from: r.cfg.ID, to: ev.Node,
				ballot: ev.Ballot, sentAt: ev.Value}
			r.sendNow(ev.Node, appendAccelFrame(make([]byte, 0, accelFrameBytes), &ack))
		}
		a.check.plane(out)
		if acked {
			a.noteContact(f.from)
		}
	case accelFrameAck:
		a.check.plane(a.plane.OnHeartbeatAck(buf[:0], f.from, f.ballot, f.sentAt))
	}
}

// noteContact tells paxos (on the consensus loop) that the plane heard the
// leader; coalesced, and dropped when the control queue is full (the next
// heartbeat tries again).
func (a *accelMirror) noteContact(from paxos.NodeID) {
	if !a.contactPending.CompareAndSwap(false, true) {
		return
	}
	select {
	case a.r.controlC <- func() {
		a.contactPending.Store(false)
		a.r.node.NoteLeaderContact(from)
	}:
	default:
		a.contactPending.Store(false)
	}
}

// paxosHeartbeat restarts the plane's election timer on a paxos heartbeat
// at the promised ballot, so a follower of a leader without accel does not
// time out (receive loop). Software answers the heartbeat; the plane's ack
// is not sent.
func (a *accelMirror) paxosHeartbeat(m *paxos.Message) {
	if m.Type != paxos.MsgHeartbeat || m.Reject {
		return
	}
	var buf [2]accel.Event
	a.check.plane(a.plane.OnHeartbeat(buf[:0], m.From, m.Ballot, 0))
}

// received is the receive loop's accel hook for a decoded message
// addressed to this node. It returns true when the fast path took the
// message (it is already queued for the consensus loop).
func (a *accelMirror) received(m *paxos.Message, datagram bool) bool {
	switch m.Type {
	case paxos.MsgAccepted:
		a.accepted(m, datagram)
	case paxos.MsgHeartbeat:
		a.paxosHeartbeat(m)
	case paxos.MsgAccept:
		return a.accept(m)
	}
	return false
}
