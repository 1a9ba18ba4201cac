// Package accel is the model of synod's consensus co-processor: the
// engines an FPGA between NIC and host would run, with fixed-size state
// loaded from a plain Spec into a live Plane, and a trace of every input
// and output that the RTL co-simulation (rtl/) replays cycle-exactly.
//
// # Engines
//
//   - Quorum aggregator (leader): a table of Spec.WindowSlots rows {slot
//     tag, ballot, ack bitmask, committed}, row = slot & (W-1). Arm sets a
//     row when the leader sends Accept (its own ack bit set); OnAccepted
//     sets a bit; popcount(mask & members) >= quorum emits one OutCommit.
//     Mismatched tag or ballot, a slot beyond the window, an unknown
//     sender: OutHandUp. Duplicates and late acks emit nothing.
//   - Accept fast path (follower): ballot >= promised register and slot in
//     [base, base+W): append to the WAL, persist, OutSendAccepted, then
//     OutMirror. Otherwise, or if the WAL fails, OutHandUp.
//   - Heartbeat and lease engine: on Tick, a leader emits OutHeartbeat
//     every HeartbeatPeriodTicks and keeps its lease (self plus every member
//     whose newest acked heartbeat was sent within LeaseTicks-LeaseDrift
//     reaches the quorum: OutLeaseGained/OutLeaseLost); a follower acks a
//     heartbeat at its promised ballot (OutHeartbeatAck) and emits
//     OutElectionTimeout once when none came for ElectionTicks + jitter.
//   - Shaper: per-tenant ops and bytes token buckets (tenants.AdmitPair,
//     integer micro-tokens), Admit -> OutAdmit with a retry-after.
//
// The plane owns no truth. Every packet it handles still reaches the
// software Paxos node, which counts the same acks and is authoritative;
// Checker counts disagreements between the two commit streams.
//
// # Determinism
//
// The plane has no clock and no goroutine. Time is the Now of each input
// in ticks (TickDuration = 1µs); inputs are applied one at a time under a
// lock, each with the next sequence number. The transition function is
// pure in (state, input): integers only, no maps, bounded loops (over the
// member table), so the RTL can implement it exactly. The WAL outcome of
// an Accept is recorded in the input (FlagWALFailed), so a replay needs no
// WAL.
//
// # Wiring it into the replica runtime
//
// One Plane per replica, created with New(spec, WithWAL(pmemLog),
// WithClock(nowTicks)) and, for co-simulation runs, WithTrace(file).
//
// Registers (Paxos goroutine, after each Ready is handled and Advance
// called): read node.Status() and write SetRole (RoleLeader for a leader,
// RoleFollower for a follower, RoleOff for a candidate or when accel is
// off), SetBallot(st.Ballot), SetPromised(st.Promised) (after the promise
// is durable), SetWindowBase(st.Commit+1); on start and on every
// membership change SetMember for each member-table entry, SetSelf and
// SetQuorum(len(members)/2+1). A member keeps its table index for as long
// as it is a member (write a removed member's entry as 0, never compact the
// table): the ack bits of in-flight slots are indexed by it, and moving the
// leader's own bit would leave those slots uncommitted in the plane.
// Tenants: SetTenant per table entry from
// the registry (the runtime keeps the tenants.ID -> index mapping).
//
// Leader, arming: Arm counts the leader's own acceptance, so it must come
// only once that acceptance is durable. The leader sends its Accepts
// before its own write completes (paxos Ready.OwnAccepted, persisted in
// parallel and reported with OwnAcceptedDurable), so Arm(entry.Slot,
// msg.Ballot) comes for every entry of every MsgAccept once the entry was
// both sent and made durable, whichever happens last (re-arming the same
// slot and ballot for another peer is a no-op).
//
// Leader, receive loop: for a MsgAccepted without Reject, call
// OnAccepted(s, m.Ballot, m.From) for s in [m.Slot, m.Index] before
// queueing the message for the Paxos goroutine; an Accepted for a (slot,
// ballot) sent but not armed yet is held back and fed right after its Arm
// (a follower's write often finishes before the leader's own). An OutCommit goes straight
// to the commit/apply loop: the slot's value is what the leader proposed
// at (slot, ballot), so the apply loop can apply contiguous committed
// slots and answer their clients without waiting for the Paxos goroutine;
// when Ready.Committed later delivers those slots it skips the ones
// already applied (it must still call Advance as the contract says).
//
// Follower, receive loop: for a MsgAccept, call OnAccept(e.Slot,
// m.Ballot, m.From, payload) for each entry, where payload is the entry
// encoded exactly as the runtime persists Ready.Accepted (so recovery does
// not care which path wrote it). On OutSendAccepted send a MsgAccepted
// {Slot, Index: Slot, Ballot, From: self, To: ev.Node} from the receive
// loop; then queue the Accept for the Paxos goroutine as usual (that is
// the mirror). When Ready.Accepted holds an entry the fast path already
// persisted under the same ballot, the runtime may skip persisting it
// again, and it may drop the duplicate MsgAccepted (the aggregator ignores
// duplicates anyway). OutHandUp needs no action: the message reaches
// Paxos like every other.
//
// Heartbeat loop: a dedicated goroutine (pinned beside the receive loop)
// runs p.RunTimers(ctx, RealTicks(ctx, period, epoch), emit), with period
// at most HeartbeatPeriodTicks/4. emit sends OutHeartbeat as a small
// accel-heartbeat frame (ballot, sentAt) to every member; a follower's
// receive loop calls OnHeartbeat and sends the OutHeartbeatAck frame back
// at once; the leader's receive loop calls OnHeartbeatAck. OutLeaseLost,
// OutLeaseGained and OutElectionTimeout go to the Paxos goroutine's
// inbox. A node without accel answers accel-heartbeat frames in software
// with the same rule (ack when the ballot equals its promise), which is
// what lets nodes with and without accel share a cluster.
//
// Everything the plane emits is also what the trace records, so a run of
// the runtime with tracing on is a co-simulation input for rtl/.
package accel
