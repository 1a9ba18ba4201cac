package replica

import (
	"time"

	"synod/kv/proto"
	"synod/paxos"
	"synod/pmem"
	"synod/tenants"
)

// The size chain, derived from the acceptor-log record up (kv/proto states
// the result for clients and walks it down):
const (
	// entryCmdBytesMax is the largest command one paxos entry may carry
	// alone and still fit in one acceptor-log record.
	entryCmdBytesMax = pmem.RecordPayloadBytesMax - paxos.EntryHeaderBytes - paxos.CmdLenBytes
	// CommandBytesMax is the largest state-machine command a write may
	// encode to: its envelope fills entryCmdBytesMax exactly.
	CommandBytesMax = entryCmdBytesMax - envelopeHeaderBytes
	// slotBatchBytesMax is what a slot batching several commands encodes
	// to at most (paxos cuts a slot at SlotBytesMax of command bytes).
	slotBatchBytesMax = paxos.EntryHeaderBytes + paxos.SlotCmdsMax*paxos.CmdLenBytes + paxos.SlotBytesMax
	// AcceptorLogBytesMin is the smallest acceptor-log ring New accepts:
	// every node must take every record a leader may send, whatever its
	// own size, and keep logReservePercent of it free for a leadership's
	// whole uncommitted window (below).
	AcceptorLogBytesMin = 8 * pmem.RecordBytesMax
)

// A full acceptor log must never wedge the cluster. Its records above the
// applied slot cannot be truncated, so a log filled with entries not yet
// committed could only be freed by committing them, and a node that wins
// an election re-proposes exactly those entries under its ballot: it must
// append them again before anything commits. Two bounds make room for it:
const (
	// leaderInflightBytesMax bounds the encoded entries a leader holds
	// above its commit index (paxos.Config.InflightBytesMax): its window
	// is at most this plus one entry. It is a constant, not a share of the
	// node's own log, because the window must fit in every member's
	// reserve, whatever size each member's log has.
	leaderInflightBytesMax = pmem.RecordBytesMax / 2
	// logReservePercent of every acceptor log is kept free by admission:
	// a follower takes no accept (accept_admission.go; the accel fast
	// path likewise) that would leave less than it free. A follower that
	// becomes leader then has room for the window it adopts and
	// re-proposes (leaderInflightBytesMax plus one entry, each with its
	// record overhead) and its own noop.
	logReservePercent = 25
	// leadSlackBytes is what a node keeps back from the room it declares
	// for its re-proposals (declareLogRoom): its noop, and an entry only
	// the promises report. A follower that respected admission holds at
	// most a window above its commit (leaderInflightBytesMax plus one
	// entry, with their record overheads), which fits: the reserve holds
	// it and leadSlackBytes (the compile-time check after this block).
	leadSlackBytes = pmem.RecordBytesMax
)

// Compile-time checks of the chain: each line stops compiling if the
// relation in its comment breaks (an index other than 0 into a [1]array,
// or a negative array length, is a compile error).
var (
	// kv/proto's CommandBytesMax is the one derived here.
	_ = [1]struct{}{}[proto.CommandBytesMax-CommandBytesMax]
	// A batched slot fits in a record: slotBatchBytesMax <= record payload.
	_ = [pmem.RecordPayloadBytesMax - slotBatchBytesMax]struct{}{}
	// paxos takes and decodes every command the runtime may propose:
	// entryCmdBytesMax <= paxos.CmdBytesMax.
	_ = [paxos.CmdBytesMax - entryCmdBytesMax]struct{}{}
	// The reserve of the smallest log holds a leadership's whole window:
	// leaderInflightBytesMax + one record + the ring overhead of a full
	// pipeline of entries <= AcceptorLogBytesMin * logReservePercent%.
	// Transfers' log retention gives way before a leader's log reaches the
	// line where it holds proposals: snapshotRetainLogPercentMax < 100 -
	// logReservePercent, and so does the usage that asks for a snapshot.
	_ = [100 - logReservePercent - snapshotRetainLogPercentMax - 1]struct{}{}
	_ = [100 - logReservePercent - logSnapshotUsedPercent - 1]struct{}{}
	// The catch-up tail never keeps a log that usage wants compacted.
	_ = [logSnapshotUsedPercent - CatchUpLogPercentMax - 1]struct{}{}
	_ = [AcceptorLogBytesMin*logReservePercent/100 - (leaderInflightBytesMax + leadSlackBytes + paxos.InflightSlotsMax*acceptEntryOverheadBytes)]struct{}{}
	// ... and a follower's window with the slack declareLogRoom keeps.
	_ = [AcceptorLogBytesMin*logReservePercent/100 - (leaderInflightBytesMax + paxos.SlotBytesMax + leadSlackBytes + paxos.InflightSlotsMax*acceptEntryOverheadBytes)]struct{}{}
)

// Limits of the runtime. Every queue and retry is bounded by one of these.
const (
	// inboundMsgsMax is how many decoded consensus messages wait for the
	// consensus loop; the receive loop drops beyond it, as a full socket
	// buffer would (Paxos retransmits).
	inboundMsgsMax = 4096
	// proposeQueueMax is how many client writes wait to be proposed when
	// there is no tenant scheduler (with one, per tenant, its class's
	// overload threshold: overload.go); a write beyond it is answered
	// THROTTLED at once.
	proposeQueueMax = 4096
	// proposeQueueBytesMax bounds the envelope bytes of the writes that
	// wait to be proposed, node-wide: in proposeQueue without a tenant
	// scheduler, and with one as the sum of its per-tenant bounds
	// (tenantQueueBytesMax); a write past it is answered THROTTLED at
	// once. Counts bound nothing
	// when a value is a megabyte: 1,000 pipelined megabyte writes took a
	// leader's heap to 192 MiB on a 192 MiB budget, half of it envelopes
	// of writes whose requests had already been given up (kv/README.md
	// "Memory"). The leader's window is leaderInflightBytesMax, so this
	// keeps it fed many times over.
	proposeQueueBytesMax = 32 << 20
	// pipelineSlotsMax is the leader's pipeline window for slots that are
	// not full (paxos.Config.PipelineSlotsMax): it assigns such a slot
	// only while fewer than this many above its commit index wait to be
	// chosen, and writes that come meanwhile join it in paxos's queue (a
	// full slot, 256 writes or 256 KiB, goes out at once; paxos's queue
	// is bounded as before, by paxos.ProposalQueueMax and the request
	// budgets upstream). With paxos's
	// default window (1,024 slots) a leader fed below its capacity gave
	// nearly every write a slot of its own (1.06-1.35 writes per slot at
	// half the ceiling on every Paxos path), and every slot costs an
	// Accept, a persist and an answer on each follower: the CPU that
	// batching would save went into queueing. Measured side by side with
	// kvbench (docs/benchmarking.md, "The pipeline window"): the
	// closed-loop ceiling rose 30-95 % and the tail at one offered load
	// fell on the shm and accel paths; 256 KiB values, which fill a slot
	// each, kept their throughput only once full slots were let through
	// (a window on every slot cost them a third).
	// A write that finds the window open gets its slot at once, so one
	// client alone sees no change; 2 keeps one slot in the air while the
	// next fills.
	pipelineSlotsMax = 2
	// proposeBatchCmdsMax and proposeBatchBytesMax bound one Propose call.
	proposeBatchCmdsMax  = 256
	proposeBatchBytesMax = 1 << 20
	// readQueueMax is how many reads wait for a read index.
	readQueueMax = 4096
	// readsPendingMax bounds reads that hold a read index and wait for the
	// apply loop to reach it.
	readsPendingMax = 16384
	// outboundBatchesMax is how many encoded Ready message batches wait for
	// the send loop; the consensus loop blocks beyond it.
	outboundBatchesMax = 256
	// applyQueueBatchesMax is how many committed batches wait for the apply
	// loop in its queue; beyond it they wait in the apply backlog, whose
	// bounds are in apply_backlog.go.
	applyQueueBatchesMax = 256
	// controlQueueMax bounds requests to the consensus loop (compaction,
	// status).
	controlQueueMax = 16
	// recvBatchPackets caps one ReadBatch call.
	recvBatchPackets = 64
	// recvBufferBytes is the size of one receive buffer (a datagram never
	// exceeds it; larger messages travel on the side channel).
	recvBufferBytes = 65536

	// sideFrameBytesMax is the largest side-channel frame: the largest
	// consensus message (paxos.MessageBytesMax, a snapshot included) and
	// its seal. A peer that announces more is disconnected.
	sideFrameBytesMax = paxos.MessageBytesMax + authOverheadBytes
	// pmemPayloadsBytesMax is the most the acceptor log adapter keeps of
	// the buffer it encodes a batch's payloads in between batches
	// (PMemLog.payloads).
	pmemPayloadsBytesMax = 1 << 20
	// sideRecvBufBytesMax and sideSpareBufs bound the frame buffers a
	// side-channel receiver keeps between frames to read the next ones
	// into (sidechannel.go, takeBuf): the Accept of a 1 MiB value fits
	// one, so a stream of them is read without allocating and zeroing a
	// buffer each; a larger frame's buffer is dropped once delivered. At
	// most 8 MiB kept node-wide, outside sideBufferedBytesMax.
	sideRecvBufBytesMax = 2 << 20
	sideSpareBufs       = 4
	// sideBufferedBytesMax bounds the frame bodies buffered at once across
	// every side-channel connection of a node (two of the largest); a
	// receiver waits for room before reading a body.
	sideBufferedBytesMax = 2 * sideFrameBytesMax
	// sideProbationBytesMax bounds, within sideBufferedBytesMax, the
	// bodies buffered at once for the first frames of connections not yet
	// proven (sidechannel.go, sideConn): one of the largest, so proven
	// peers always have the other.
	sideProbationBytesMax = sideFrameBytesMax
	// sideBudgetUnitBytes is the grain of those budgets.
	sideBudgetUnitBytes = 64 << 10
	// sideBodyTimeout bounds how long an authenticated frame's body may
	// take to arrive (a slow sender cannot hold the budget).
	sideBodyTimeout = 30 * time.Second
	// chosenNoteEvery bounds the chosen-through notes in the acceptor
	// log's header (chosen.go): one header write (64 bytes persisted) per
	// this interval at most. Short, because under a heavy load a
	// small log turns over in about a second (16 MiB at 25 MB/s): a note
	// a second old covered none of the records a killed node held.
	chosenNoteEvery = 100 * time.Millisecond
	// deferredLogEvery bounds the warnings of a node that keeps deferring
	// its elections (paxos logroom.go): one per this interval.
	deferredLogEvery = 10 * time.Second
	// sideQueueMsgsMax is how many messages wait per peer for the side
	// channel; more are dropped (Paxos retransmits).
	sideQueueMsgsMax = 64
	// sideQueueBytesMax bounds the bytes of the messages waiting per peer
	// for the side channel (a message larger than it is taken into an
	// empty queue); past it messages are dropped, as past
	// sideQueueMsgsMax: Paxos retransmits. Counts alone let 64 catch-ups
	// of 4 MiB wait for a slow peer; with megabyte writes a leader's
	// queued Accepts and catch-ups held 53 MB of a 192 MiB budget.
	sideQueueBytesMax = 8 << 20
	// sideDialBackoffMin and sideDialBackoffMax bound reconnect backoff.
	sideDialBackoffMin = 10 * time.Millisecond
	sideDialBackoffMax = 1 * time.Second
	// sideHeardSilence: a peer heard after this long without a datagram
	// has returned, and its sender, if backing off, dials at once
	// (sideChannel.heard). Longer than kvnode's heartbeat interval (20
	// ms), shorter than an outage that grows the backoff.
	sideHeardSilence = 100 * time.Millisecond
	// sideDialTimeout and sideWriteTimeout bound one dial and one frame write.
	sideDialTimeout  = 1 * time.Second
	sideWriteTimeout = 5 * time.Second
	// sideConnsMax bounds accepted side-channel connections. When it is
	// reached the oldest connection that has not authenticated a head yet
	// is closed for a new one (sidechannel.go, sideConn).
	sideConnsMax = 64
	// sideHeadTimeout bounds how long an accepted connection may take to
	// send its first frame head (or a snapshot transfer's magic).
	sideHeadTimeout = 5 * time.Second

	// snapshotEverySlots is how many applied slots pass between snapshots
	// (each snapshot lets the node compact and the PMem log truncate).
	snapshotEverySlots = 20000
	// logSnapshotUsedPercent: past this share of the acceptor log in use,
	// a snapshot is requested (at most once per election timeout) so the
	// log truncates before it fills.
	logSnapshotUsedPercent = 50
	// catchUpTailDivisor: compaction keeps the last
	// every/catchUpTailDivisor slots below a snapshot in the log
	// (snapshot_compact.go, catchUpFloor): 5,000 slots at the default
	// snapshotEverySlots, as etcd keeps 5,000 entries for slow followers.
	catchUpTailDivisor = 4
	// CatchUpLogPercentMax: the tail of slots is kept only while the
	// acceptor log is below this share in use, and the tail by bytes
	// (Config.CatchUpLogPercent, log_tail.go) holds at most this share,
	// so a compaction the log's usage asked for (logSnapshotUsedPercent)
	// always frees the rest.
	CatchUpLogPercentMax = 40
	// logFullRetryTicks is how often, in ticks, a stalled Ready whose
	// append hit a full PMem log is retried.
	logFullRetryTicks = 10

	// peersMax bounds the membership (a bitmask of blocked peers is used by
	// the fault hook).
	peersMax = 64
)

// Compile-time: the protocol's largest member id is the largest id below
// peersMax.
var _ = [1]struct{}{}[proto.MemberIDMax+1-peersMax]

// tenantQueueBytesMax is the bytes bound of each tenant's scheduler queue
// on a node with tenants tenants: their share of proposeQueueBytesMax, at
// most tenants.TenantQueueBytesMax. Each queue also takes one write of any
// size when empty, so the node holds at most proposeQueueBytesMax plus one
// largest write per tenant, and no tenant's queue, full or not, refuses
// another tenant's write (isolation: the check is per tenant only).
func tenantQueueBytesMax(tenantCount int) int {
	return min(tenants.TenantQueueBytesMax, proposeQueueBytesMax/max(tenantCount, 1))
}

// SideConnsMax is sideConnsMax for callers that budget the node's file
// descriptors (kvnode).
const SideConnsMax = sideConnsMax
