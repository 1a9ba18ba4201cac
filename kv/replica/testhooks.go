package replica

import (
	"sync/atomic"
	"time"
)

// Planted bugs. Each is off unless a test (or a kvnode built with the
// synod_plant build tag, see cmd/kvnode/plant.go) turns it on before any
// Replica starts; the tests that turn one on show that a check catches the
// bug it plants. Production code never sets them.
var (
	// TestingStaleClock plants the stale-clock bug: the consensus loop
	// hands inputs (reads, messages, control functions) to the paxos
	// node with the clock of the last ticker event instead of delivering
	// the ticks owed first (clock.go), so a leader resumed after a pause
	// may check its lease against a frozen clock.
	TestingStaleClock bool
	// TestingReusedProposalIDs plants the reused-identity bug: proposal
	// ids restart at 1 in every process with a zero boot id, and the
	// apply loop answers a waiting writer without checking that the
	// command is its own, so an entry of an earlier life re-applied after
	// a restart answers a new writer with another command's result.
	TestingReusedProposalIDs bool
	// TestingReadBeforeApplied plants the early read: a linearizable read
	// is released as soon as its read index is known, before the apply
	// loop has reached it.
	TestingReadBeforeApplied bool
	// TestingApplyQueueBlocks plants the loop before the apply backlog
	// (apply_backlog.go): the consensus loop waits for room in the apply
	// queue, so a stalled apply loop stops its heartbeats and its commits
	// once 256 batches queue (TestSlowApplyKeepsLeader, e2e
	// TestFollowerApplyStallKeepsItsLoop).
	TestingApplyQueueBlocks bool
)

// testingDelayAfterControl, set by a test, makes the consensus loop sleep
// after running a control function and before it publishes the status:
// it widens the window in which a caller that got its answer from the
// function still sees the status from before it (TransferLeadership's
// waiter must not be fooled by it).
var testingDelayAfterControl time.Duration

// testingNoPipelineGate, when true, leaves the pipeline gate open
// (pipeline_gate.go): the consensus loop drains the tenant scheduler into
// paxos's FIFO queue on every input, as it did before the gate. Tests
// plant it to show TestPipelineGateLetsVictimOvertake catches the loss of
// fair queuing.
var testingNoPipelineGate atomic.Bool

// testingNoPipelineBytes plants the pipeline gate without its byte bound
// (pipelineBytesMax): commands alone bound it, as before.
var testingNoPipelineBytes atomic.Bool

// testingTrackPipelinePeak, when true, has the consensus loop record in
// testingPipelinePeak the most bytes of proposed, unanswered writes it saw
// right after taking a batch from the tenant scheduler with the gate
// engaged (a batch taken while one tenant writes alone is not bounded).
var (
	testingTrackPipelinePeak atomic.Bool
	testingPipelinePeak      atomic.Int64
)

// notePipelinePeak raises testingPipelinePeak to n.
func notePipelinePeak(n int) {
	for {
		old := testingPipelinePeak.Load()
		if int64(n) <= old || testingPipelinePeak.CompareAndSwap(old, int64(n)) {
			return
		}
	}
}

// testingWidePipeline, when true at a replica's New, gives its paxos
// node the default pipeline window (1,024 slots) instead of
// pipelineSlotsMax, as before the window: TestPipelineWindowHoldsWrites
// plants it to show its measures catch the loss.
var testingWidePipeline bool

// testingNoCatchUpTail, when true, turns catchUpFloor off
// (snapshot_compact.go): a node compacts through its snapshot, keeping no
// tail for followers a little behind. The planted twin inside
// TestCatchUpTailServesShortLag.
var testingNoCatchUpTail bool

// testingNoRecoverPendingMembership, when true, makes a restarted node
// ignore the membership changes in the entries it recovered
// (recoverPendingMembership does nothing), as before that function
// existed: TestRestartHearsMemberAddedSinceFlush plants it to show it
// catches the loss.
var testingNoRecoverPendingMembership bool

// testingNoSideEviction, when set, plants the side channel's old
// admission: a full table refuses every new connection, so idle
// unauthenticated ones lock peers out (TestSideChannelIdleConnsDoNotLockOutPeers).
var testingNoSideEviction bool

// testingCatchupsSkipAdmission plants the bug admitAccept's catch-up rule
// removes: catch-ups are stepped whatever room the acceptor log has, so a
// follower restarted with a full log stalls on the first one
// (TestRestartedFullLogCatchesUp).
var testingCatchupsSkipAdmission bool

// testingNoOwnBacklog plants the wedge own_backlog.go removes: a leader's
// own acceptances that do not fit in the acceptor log stall the whole
// Ready (TestOwnEntriesWaitForRoom; TestStalledLeaderSaysItStepsDown uses
// it to make a leader stall).
var testingNoOwnBacklog bool

// testingTailKeptForBacklog plants the gap catchUpFloor closes: the
// catch-up tail is kept while the leader's own acceptances wait for room
// (TestTailGivesWayToOwnBacklog).
var testingTailKeptForBacklog bool

// TestingOwnWaitVotesEarly plants the bug own_backlog.go must not have: an
// own acceptance that waits for log room is reported durable at once, so
// the leader's vote counts for a value it has not stored (the replica
// simulator's planted bugs).
var TestingOwnWaitVotesEarly bool

// testingStallHidesStatus plants the bug publishStatus's call in the
// stalled branch removes: a node stalled on a full log keeps the status of
// when it stalled (TestStalledLeaderSaysItStepsDown).
var testingStallHidesStatus bool

// TestingNoChosenNotes plants the gap chosen.go closes: no chosen-through
// slot is noted, so a restart counts every record above its applied slot
// uncommitted (TestRestartCommitsItsRecords).
var TestingNoChosenNotes bool

// TestingChosenNoteLastSlot plants a wrong chosen-through note: the last
// slot the node holds instead of the last it delivered, so a restart
// commits entries that were never chosen (the replica simulator must
// catch it: TestReplicaSimCatchesPlantedBugs).
var TestingChosenNoteLastSlot bool

// testingSideProvenAtHead, when set, plants the side channel's admission
// before 2026-12-05: a connection was proven by its first frame head
// (replayed or not, addressed here or not), which the head check did not
// hold against the replay window, and its body took the proven peers'
// budget for sideBodyTimeout (sidechannel.go, sideConn).
var testingSideProvenAtHead atomic.Bool // read by side channels the helpers leave running until the test ends

// testingSnapRequestUnaddressed, when true, makes a snapshot server ignore
// the server a request names (snapshot_serve.go), as before requests
// named one: TestSnapRequestReplayedToAnotherMember shows its check
// catches a request captured on its way to one member and replayed to
// another.
var testingSnapRequestUnaddressed bool

// testingSnapServesDeparted, when true, makes isMember the snapshot
// server's check before 2026-12-07: any node in the address book,
// departed members included.
// TestRemovedNodeGetsNoSnapshot shows its check catches a removed node
// that kept the secret fetching the whole state.
var testingSnapServesDeparted bool

// testingAnswerBeforeApplied, when set, plants the apply loop's order
// before 2026-12-05: a slot's writes were answered before Applied() moved
// to the slot (here with a pause between, so a test sees it every time):
// TestAnsweredWriteIsApplied shows its check catches it.
var testingAnswerBeforeApplied bool

// testingSideIgnoresHeard, when set, plants the gap sideChannel.heard
// closes: a sender backing off from a peer that was down sleeps its whole
// backoff (up to sideDialBackoffMax) after the peer is back.
var testingSideIgnoresHeard atomic.Bool

// testingOvertakenCounted, when set, plants the false alarm
// sideChannel.overtaken removes: a member's connection overtaken by its
// newer one has its late frames counted as refused replays.
var testingOvertakenCounted atomic.Bool

// testingMemberIgnorePending, when true, plants the membership operations'
// old judgement: "already in force" read from the committed membership
// while another change is uncommitted (a remove of a node whose add is in
// flight answered OK and did nothing).
var testingMemberIgnorePending bool

// testingMemberWaitForState, when true, plants the old wait of a
// membership operation: for the state its change makes ("node 2 is a
// learner") instead of its own record committing, so a change undone by
// the next one within a poll is never answered.
var testingMemberWaitForState bool

// testingNoLearnContacts, when true, plants the joiner's old book: only
// its configured contacts, so a leader its config does not list is
// refused as an unknown sender (TestJoinerLearnsLeaderNotInItsPeers).
var testingNoLearnContacts bool

// testingContactKeepsFirstAddr, when true, plants a joiner that keeps the
// first address it learned for a contact, so a member's packet replayed
// from elsewhere strands it (TestJoinerLearnsLeaderNotInItsPeers).
var testingContactKeepsFirstAddr bool

// testingStuckHandOverWaits, when set, plants the stuck leader's old
// hand-over: the operator's (paxos TransferLeadership), which waits until
// nothing is in flight, so a leader whose own vote cannot count never
// completes it (TestStuckLeaderWithSlotsInFlightHandsOver).
var testingStuckHandOverWaits atomic.Bool

// testingNoOwnVoteStuck, when set, plants the progress watch without its
// own-vote check: a leader whose own writes never become durable, with a
// follower behind, commits nothing and is not counted stuck
// (TestStuckLeaderWithSlotsInFlightHandsOver).
var testingNoOwnVoteStuck atomic.Bool
