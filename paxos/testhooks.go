package paxos

// TestingQuorumOffByOne is test only: when true the leader uses n/2 instead
// of n/2+1 as quorum. The simulator sets it to show that its checkers catch
// a planted safety bug. Production code never sets it.
var TestingQuorumOffByOne bool

// Planted lease bugs, test only: each makes one lease rule wrong so that
// the simulators' lease oracle can show it catches it (paxossim's planted
// tests). Production code never sets them.
var (
	// TestingLeaseFromAckArrival dates the leader's lease from the
	// arrival of the majority's heartbeat acks instead of the heartbeat's
	// send tick.
	TestingLeaseFromAckArrival bool
	// TestingNoRestartRefusal makes a restarted node forget to refuse new
	// ballots for LeaseTicks.
	TestingNoRestartRefusal bool
	// TestingLeaseIgnoresDrift does not subtract DriftTicks from the
	// leader's lease.
	TestingLeaseIgnoresDrift bool
)

// Planted membership bugs, test only (paxossim's membership-heavy profile
// must catch them):
var (
	// TestingPhase1IgnoresAdoptedConfChange makes a candidate need
	// promises from a majority of the membership at its commit point only,
	// ignoring the memberships adopted but uncommitted ConfChanges produce.
	TestingPhase1IgnoresAdoptedConfChange bool
	// TestingAssignPastConfChange lets the leader assign and send slots
	// above a ConfChange that is not committed yet (the pipeline stop and
	// the send cap both removed).
	TestingAssignPastConfChange bool
	// TestingLearnerAcksCount counts a learner's Accepted toward a slot's
	// quorum as if it were a voter (the quorum size stays the voters').
	TestingLearnerAcksCount bool
)

// TestingTransferKeepsLease, test only: a leader handing over
// (TransferLeadership) releases its acceptors' leases without stepping
// down, and goes on answering reads from its own lease (paxossim's lease
// oracle must catch it).
var TestingTransferKeepsLease bool

// TestingInstallStaleSnapshot is test only: InstallSnapshot accepts a
// snapshot at or below the commit index (any above the log's first slot),
// rolling the node back. paxossim's planted test must catch it through the
// offer, fetch and install flow (late transfers). Production code never
// sets it.
var TestingInstallStaleSnapshot bool

// TestingVoteBeforePersist is test only: when true the leader counts its
// own acceptance toward the quorum as soon as it accepts, before the caller
// reports it durable (OwnAcceptedDurable). paxossim's planted test shows
// its oracles catch it. Production code never sets it.
var TestingVoteBeforePersist bool

// quorum returns the number of acceptors out of n that form a majority.
func quorum(n int) int {
	if TestingQuorumOffByOne {
		return n / 2
	}
	return n/2 + 1
}

// TestingPreCheckIgnoresCommit, test only: members grant a pre-check
// whatever the asking node has committed (the rule before the up-to-date
// check of handlePreCheck), so TestLaggingNodeDoesNotHoldElections shows
// the livelock it prevents.
var TestingPreCheckIgnoresCommit bool

// TestingIgnoreLogRoom, when set, plants the bug the log-room rule removes:
// a node campaigns whatever room its log has left (logroom.go), so a
// restarted node whose log is full of entries it does not know committed
// wins and stalls on its own re-proposals.
var TestingIgnoreLogRoom bool

// TestingNoStuckCatchupOffer, when set, plants the gap catchupStuck closes:
// a peer whose catch-ups make no progress is sent entries for ever, never
// a snapshot until the leader compacts past it.
var TestingNoStuckCatchupOffer bool

// TestingStuckAcrossSilence, when set, plants the gap heardFrom closes: a
// peer's stuck count survives a silence, so a peer that was down (its
// commit index unmoved across the outage) is offered a snapshot a few
// catch-ups after it returns, however short its log's gap.
var TestingStuckAcrossSilence bool

// TestingIgnoreChosen, when set, plants the gap DurableState.Chosen closes:
// a restarted node counts every entry above its applied slot
// uncommitted, whatever was recorded chosen.
var TestingIgnoreChosen bool

// TestingDeferForever, when set, plants an unbounded deferral: a node short
// of log room never campaigns (logroom.go), so a group whose members all
// lack it elects no leader (TestNoRoomAnywhereStillElects).
var TestingDeferForever bool

// TestingReproposeChosen, when set, plants what chosen_prefix.go removes:
// a new leader re-proposes under its ballot the values its promises
// reported committed, storing each again on itself and every acceptor, and
// a catch-up stores again every value the acceptor holds under another
// ballot than the leader's.
var TestingReproposeChosen bool

// TestingNoReballot (tests only) hands out every re-stored value whole
// (no Held) and counts it whole for log room: the behaviour before
// re-ballot records (reballot.go).
var TestingNoReballot bool

// TestingReballotAnyBase (tests only) is a planted bug: a re-ballot names
// the log's entry whether or not it was stored (a leader's own acceptance
// still in flight among them), so a re-ballot can reach the log before
// the record it names.
var TestingReballotAnyBase bool

// TestingReportUnanswered (tests only) is a planted bug: PeerProgress
// calls every tracked member's figures reported, also a member that never
// answered this leader (its commit 0 then reads as a slot).
var TestingReportUnanswered bool
