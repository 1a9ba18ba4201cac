// Package paxos is Multi-Paxos as a pure, deterministic state machine in the
// shape of etcd's RawNode: Tick, Step, Propose, Ready, Advance. It starts no
// goroutines, reads no clock and does no I/O; randomness (election timeouts)
// comes from Config.Seed. See Node for the Ready contract.
//
// # Protocol
//
// Ballots are (Round, Node). A node whose randomized election timer fires
// first runs a pre-check round (MsgPreCheck): only when a majority of the
// membership answers that it has not heard from a leader within
// ElectionTicks, holds no lease for another node, and has committed no
// further than the asking node does it run phase 1. This keeps a node that
// rejoins after a partition from deposing a healthy leader, and a node that
// lags from campaigning while one with less to learn could (a lagging
// candidate's phase 1 outlasted its timeout under load, and each new
// campaign captured every acceptor's promise again: see
// TestLaggingNodeDoesNotHoldElections). A transfer's target skips the
// pre-check. An acceptor that compacted slots a candidate has not
// committed refuses its Prepare without promising. A leader that has not
// heard from a majority within ElectionTicks steps down (check quorum).
// Both timers count time the node ran, not the ticks a stalled caller owes
// it in one Elapse: a node judges its peers silent only after it stepped
// what they sent (see Elapse); leases, which are safety, follow every tick.
//
// Phase 1 runs once for every undecided slot: MsgPrepare from the
// candidate's commit index + 1 upward. A MsgPromise reports the acceptor's
// accepted entries above that point (in chunks of at most
// EntriesPerMessageMax) and its commit index; entries at or below it are
// chosen and are adopted outright, otherwise the highest ballot per slot
// wins. Holes become EntryNoop. The new leader commits at once the run of
// slots from its commit index whose values a promise reported committed,
// keeping the copies it holds under the ballot reported so that followers
// holding them store nothing again (chosen_prefix.go); it re-proposes every
// other adopted slot under its own ballot and adds a noop of its own (its
// first slot under its ballot); reads are served only once that noop is
// committed.
//
// Phase 2 is per slot with a pipeline window of inflightSlotsMax slots
// beyond the commit index (Config.PipelineSlotsMax narrows it for slots
// that are not full). Proposals queue (ProposalQueueMax) and are
// batched into slots (SlotCmdsMax, SlotBytesMax) when the caller collects a
// Ready. The leader learns a commit from a majority of MsgAccepted for the
// same (slot, ballot); every count is reported as an AckEvent and through
// AckCount. The leader's own acceptance is one of them only once it is
// durable: it travels in Ready.OwnAccepted, which the caller persists in
// parallel with sending the Accepts, and counts when the caller reports it
// with OwnAcceptedDurable; until then the leader delivers no committed slot
// it holds only in memory (ownvote.go). The commit index travels on the
// next MsgAccept or MsgHeartbeat.
// A follower commits slot s <= Commit only when it holds the value accepted
// under the sender's ballot (the leader proposes one value per slot per
// ballot); otherwise its heartbeat answer shows it lagging and the leader
// sends the chosen entries (MsgCatchup), or its snapshot (MsgSnapshot) when
// they were compacted. Unacknowledged Accepts are resent every heartbeat;
// duplicates and reordering are harmless because every handler is
// idempotent per (slot, ballot).
//
// # Leases
//
// An acceptor that answers a heartbeat from leader L at its tick t promises
// not to promise or accept a higher ballot from any node but L until
// t + LeaseTicks (its own ticks). The leader's lease is valid until
// send-tick(h) + LeaseTicks - DriftTicks for the newest heartbeat h a
// majority acked. While it holds, no other node can complete phase 1, so the
// leader answers ReadIndex at once with its commit index. Otherwise
// ReadIndex waits for a read barrier: a heartbeat round acked by a majority.
// A restarted node honours the leases it may have granted before the crash
// by refusing every new ballot for LeaseTicks after start.
//
// # Which clock each lease decision uses
//
// Every decision reads the node's own tick counter (now), which only Tick
// advances; the node never sees another node's clock:
//
//   - granting (handleHeartbeat, NoteLeaderContact): the refusal window
//     runs from now at the moment the heartbeat is stepped;
//   - refusing (leaseBlocks, in Prepare, Accept, Heartbeat and the
//     pre-check): now < leaseUntil at the moment the message is stepped;
//   - the leader's validity (leaseValid, in ReadIndex and Status): now at
//     the moment of the call, against send-tick(h) recorded in
//     broadcastHeartbeat when h was queued;
//   - the restart refusal: LeaseTicks from NewNode.
//
// The argument needs every now to be current when it is read: the caller
// must deliver every tick that has passed in real time before it hands the
// node an input (Step, ReadIndex, Propose, Campaign, NoteLeaderContact),
// reading its clock after the input arrived (kv/replica's loopClock does
// this in both of its loop branches). Then, for a heartbeat h sent at real
// time S and stepped by an acceptor at real time R >= S, the acceptor's
// window ends no earlier than R + LeaseTicks*tick_a - tick_a (its reading
// rounds down by less than one tick) and the leader's lease ends no later
// than S + (LeaseTicks - DriftTicks)*tick_l. DriftTicks bounds the
// difference: rate drift between the two clocks over one lease plus the
// one-tick rounding, so it must be at least 1. A node whose caller stepped
// inputs with a stale now (a paused process resuming) could grant a window
// that had already ended in real time, or believe a lease that had; the
// runtime's clock contract rules that out, and its tests plant exactly
// that bug (kv/replica TestingStaleClock) to show they catch it.
//
// # Membership
//
// One change at a time, and a ConfChange stops the pipeline until it
// commits; see ProposeConfChange for the rule and the safety argument.
// Members are voters or learners (membership.go): a learner receives the
// log but counts in no quorum, grants no lease and never campaigns;
// ConfPromote makes it a voter once it is within PromoteLagSlotsMax of the
// leader. A node started with Config.Join knows no membership until it
// installs a snapshot (join.go). TransferLeadership hands leadership to a
// caught-up voter without waiting out the leases (transfer.go).
//
// # Bad input
//
// Step drops and counts (Status().Dropped) any message that no correct peer
// could send: a foreign cluster, an unknown sender, a proposer message whose
// ballot is not the sender's, impossible slots or ranges. The wire decoder
// (UnmarshalMessage) checks every length against its limit before
// allocating. A broken internal invariant panics with the node's state.
package paxos
