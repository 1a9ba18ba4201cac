package paxos

// Log room: a node that cannot persist what it would re-propose does not
// campaign.
//
// A new leader re-proposes, under its ballot, every entry it holds above
// its commit index (and those the promises report) before anything else;
// each re-proposal is a new record in its own acceptor log. Config's
// InflightBytesMax keeps a running leader's uncommitted entries within the
// room every follower keeps free, but a node that restarted knows nothing
// committed beyond what it applied: every record between its applied slot
// and the real commit index counts as uncommitted, and with an apply loop
// that lagged the commit index by most of the log those are far more than
// the room left. Such a node that won an election stalled on its own
// re-proposals with a full log: its consensus loop took no input until the
// log had room, which only committing those very entries could give, and
// it kept its followers' promises (an e2e run: a restarted node with 60
// records of 256 KiB above its applied slot in a 16 MiB log won round 5,
// stalled, and answered its clients as leader for 35 minutes while the
// other two had elected a leader of their own).
//
// So the caller declares the room (SetLogRoom) and a node whose entries
// above its commit index would not fit does not start a pre-check, a
// campaign or a transfer's election, and a candidate whose phase 1
// adopted more than fits does not take the leadership (roomForPhase2); it stays a follower, catches up (a
// snapshot install frees its log) and campaigns once they fit, so that a
// member with room wins first. The deferral is bounded: after
// deferralMaxTicks without hearing from a leader the node campaigns
// whatever its room. A group whose live members all lack the room would
// otherwise elect no leader at all (an outside run: three nodes restarted
// together, each with 25 records above its applied slot behind an older
// live record, deferred for minutes), and a leader that stalls on its
// re-proposals is no worse than none: it steps down on check quorum and
// says so (kv/replica publishes its status while stalled).

// SetLogRoom declares how many bytes of its acceptor log the node may fill
// with re-proposals if it led: the log's free space less what the caller
// keeps for the entries other acceptors may report in phase 1 and the new
// leader's noop. A negative value declares no limit (the default). Like a
// tick it may be called between inputs; it never changes the node's
// output.
func (n *Node) SetLogRoom(bytes int64) { n.logRoom = bytes }

// deferralMaxTicks bounds a run of deferred elections: ten election
// timeouts without a leader.
func (n *Node) deferralMaxTicks() int64 { return 10 * int64(n.cfg.ElectionTicks) }

// roomToLead reports whether the entries above the commit index, each
// with Config.RecordOverheadBytes, fit in the declared room, or the node
// has deferred for deferralMaxTicks without hearing from a leader; it
// counts a refusal in Status.ElectionsDeferred.
func (n *Node) roomToLead() bool {
	if n.logRoom < 0 || TestingIgnoreLogRoom {
		return true
	}
	if need := n.reproposalBytes(n.logRoom); need <= n.logRoom {
		return true
	}
	return n.deferOrForce()
}

// roomForPhase2 is roomToLead for a candidate whose phase 1 completed:
// whether every value it would re-propose, those the promises brought
// included (a node behind the others adopts their uncommitted entries),
// with noops in holes and its own, fits in the declared room (an outside
// run: a node won with 5.8 of 16.8 MB in use, stalled on the values its
// promises brought, and stayed stalled).
func (n *Node) roomForPhase2() bool {
	if n.logRoom < 0 || TestingIgnoreLogRoom {
		return true
	}
	c := n.cand
	end := c.chosenPrefixEnd()
	need := int64(entryBytes(&Entry{Type: EntryNoop})+n.cfg.RecordOverheadBytes) + n.chosenPrefixBytes(end)
	for s := end + 1; s <= c.maxSlot && need <= n.logRoom; s++ {
		e := Entry{Slot: s, Type: EntryNoop}
		if v, ok := c.values[s]; ok {
			e.Type, e.Cmds = v.e.Type, v.e.Cmds
		}
		need += n.storeBytes(&e)
	}
	if need <= n.logRoom {
		return true
	}
	return n.deferOrForce()
}

// deferOrForce counts a deferred election, unless the node has deferred
// for deferralMaxTicks without hearing from a leader: then it reports
// true, and the node goes on as if it had the room.
func (n *Node) deferOrForce() bool {
	if n.deferringSince < 0 {
		n.deferringSince = n.now
	} else if n.now-n.deferringSince >= n.deferralMaxTicks() && !TestingDeferForever {
		return true
	}
	n.electionsDeferred++
	return false
}

// reproposalBytes is the ring space the entries above the commit index
// would take once re-proposed, counted until it passes limit.
func (n *Node) reproposalBytes(limit int64) int64 {
	var need int64
	for s := n.commit + 1; s <= n.log.last() && need <= limit; s++ {
		if e := n.log.get(s); e != nil {
			need += n.storeBytes(e) // its own value: a re-ballot (reballot.go)
		}
	}
	return need
}
