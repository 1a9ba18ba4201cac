// Package replica is synod's replica runtime: it wires one paxos.Node to the
// PMem acceptor log, the datagram transport (afxdp.Conn plus a TCP side
// channel for large messages), the Pebble state machine and the client
// server.
//
// # Goroutines and queues
//
// Every queue is bounded; the bound is a named constant in limits.go.
//
//	receive loop    Conn.ReadBatch -> UnmarshalMessage -> inbound (inboundMsgsMax, drop when full, like a socket buffer)
//	side receivers  one per accepted TCP conn: frames -> inbound (blocking: large messages are costly to resend)
//	consensus loop  owns the paxos.Node: ticks (time.Ticker), inbound, proposals (proposeQueueMax),
//	                read-index requests (readQueueMax), control; every input after the owed ticks
//	                (clock.go); then the Ready loop:
//	                  1. SetPromised / Append + one Persist   (durable first)
//	                  2. encode Messages -> outbound          (outboundBatchesMax)
//	                  3. Snapshot and Committed -> apply queue (applyQueueBatchesMax), or the apply backlog when it
//	                     is full (applyBacklogBatchesMax, applyBacklogBytesMax; a leader takes no new writes past half,
//	                     and only a full backlog waits: apply_backlog.go)
//	                  4. ReadStates -> read waiters; Advance
//	send loop       outbound -> Conn.WriteBatch, or the side channel when a message exceeds MaxPayload
//	side senders    one per peer, queue sideQueueMsgsMax and sideQueueBytesMax, reconnect with bounded backoff
//	apply loop      apply queue -> StateMachine.Apply in slot order -> answers writers, wakes readers,
//	                takes a snapshot every snapshotEverySlots applied slots (an asynchronous
//	                flush: it reads no state and never blocks; snapshot_compact.go)
//	fetch loop      one snapshot transfer at a time: an offer -> stream from the peer -> staging
//	                -> InstallSnapshot -> the apply loop swaps it in (snapshot_fetch.go)
//	transfer conns  one per snapshot served, at most snapshotServesMax (snapshot_serve.go)
//
// The receive, send, consensus and apply loops can be pinned to CPUs. Each
// loop only receives; the work is in step functions (consensusInput,
// applyInput, snapshotNow, deliver), so that the deterministic replica
// simulator (replicasim_test.go) drives the same code one input at a time,
// in an order its seed chooses, on a simulated clock (Config.Now).
//
// The node's clock follows the monotonic clock: before any input (a
// message, a read, a proposal, a control function such as a campaign) is
// handed to the node, every tick period that has passed by a clock reading
// taken after the input arrived is delivered first, in the normal and the
// stalled (full log) branch alike (clock.go). A leader resumed after a
// pause or a starved loop therefore never checks its lease, and a follower
// never dates the lease it grants, with a clock older than the input. The
// accel plane's heartbeats, which run on their own goroutine, stop when the
// consensus loop has not begun an iteration for loopWedgedElections
// election timeouts, so a wedged leader loses its followers.
//
// # Durability and space
//
// Ready.Promised and Ready.Accepted go to the PMem log (one Persist per
// Ready) before any message of that Ready is sent. A leader's own
// acceptances (Ready.OwnAccepted) are appended in Ready order on the
// consensus loop, but their Persist runs on the persister goroutine while
// the Accepts are already out (persister.go): paxos counts the leader's
// vote, and the leader delivers those slots, only once it completed. So
// heartbeats, lease renewal and ticks never wait behind the leader's msync
// (the persister's queue is bounded by ownRangesMax runs; past it the
// consensus loop persists itself). The log is truncated below the slot a
// snapshot covers once the state machine has flushed it. Past
// logSnapshotUsedPercent of the log in use, a snapshot is requested; a full
// log stalls the Ready (writes are refused with UNAVAILABLE) until a
// snapshot lets the log truncate, and the same Ready is then retried.
// An inbound Accept is stepped only when the log has room for its entries
// (accept_admission.go); one that does not fit is dropped, as if lost, so
// a follower whose log fills with entries it cannot commit yet keeps
// taking heartbeats, promises and its snapshot install instead of
// stalling (TestFullLogFollowerCatchesUp).
// New refuses a state machine that has applied less than the log's
// truncation point (ErrStateBehindLog): those slots are nowhere on this
// node, and starting would let it answer Prepares with holes for chosen
// slots. A snapshot is streamed from a peer, staged beside the live state
// and verified in full before it replaces anything (snapshot_wire.go,
// sm.BeginStage); there is no size limit.
//
// # Accel
//
// With Config.Accel set ("soft"), the accel plane model takes the
// mechanical consensus work off the consensus loop (accel.go): the
// leader's quorum aggregator counts Accepted on the receive loop and its
// commit events hand slots to the apply loop in order (accel_commit.go);
// a follower persists and answers Accepts at its promised ballot from the
// receive loop, behind a promise fence (accel_fast.go); heartbeats and the
// election timer run on the plane's own goroutine and paxos runs with
// ExternalElection (accel_heartbeat.go). Paxos stays authoritative: the
// plane's commit decisions are checked against its AckEvents with a
// bounded checker (accel_check.go).
//
// # Writes and reads
//
// A write is wrapped in an envelope (origin node, boot id, proposal number;
// envelope.go) so that the apply loop can hand the state machine's result
// to the waiting writer on the node that proposed it. The boot id is drawn
// at every process start, so an entry of an earlier life, re-applied after
// a restart, never names a writer of this one; and a writer is answered
// only by the entry holding the very envelope it proposed. A write whose outcome is unknown (leadership
// lost, deadline) is answered UNAVAILABLE; the client retries with the same
// (client id, sequence) and the state machine's exactly-once table applies
// it once.
//
// Reads ask the node for a read index (ReadIndex), wait until the applied
// slot reaches it, then read the state machine directly.
//
// # Membership
//
// The membership is owned by the log (members.go): every change is a
// ConfChange whose context is the whole resulting membership with
// addresses; applying it stores that record in the state machine with the
// slot, and a restarted node reads it back instead of its config's peers
// (which only bootstrap a new cluster). The peer tables (address book,
// side channel, authenticated senders, accel member table, STATUS rows)
// follow it at run time. Membership operations and leadership transfer
// run on the leader (members_ops.go); Config.Join starts a node that waits
// to be added and catches up by snapshot.
package replica
