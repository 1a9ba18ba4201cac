package paxossim

import (
	"slices"

	"synod/paxos"
)

// rate scales a per-tick fault rate by Options.Intensity.
func (s *sim) rate(ppm uint32) uint32 {
	if s.opts.Intensity <= 1 {
		return ppm
	}
	return uint32(min(uint64(ppm)*uint64(s.opts.Intensity), 1_000_000))
}

// faultStep injects this tick's faults.
func (s *sim) faultStep(tick int64) {
	f := s.faults
	if f.Has(FaultCrash) && s.r.ppm(s.rate(crashPerTickPPM)) {
		var ups []*simNode
		for _, sn := range s.nodes {
			if sn.up() {
				ups = append(ups, sn)
			}
		}
		down := len(s.nodes) - len(ups)
		// Mostly keep a majority up so the run makes progress; sometimes
		// take the majority down too.
		if len(ups) > 0 && (down < (len(s.nodes)-1)/2 || s.r.chance(1, 10)) {
			victim := ups[s.r.intn(len(ups))]
			if f.Has(FaultPersist) && victim.n.Status().Role == paxos.RoleLeader && s.r.chance(1, crashAfterSendOdds) {
				victim.crashAfterSend = true
			} else if s.r.chance(1, 3) {
				victim.crashMidReady = true
			} else {
				s.crash(victim, s.r.between(downTicksMin, downTicksMax))
			}
		}
	}
	if f.Has(FaultCrash) && s.r.ppm(s.rate(totalCrashPerTickPPM)) {
		// Every node at once: only durable state can carry committed
		// entries across this.
		down := s.r.between(downTicksMin, downTicksMax/2)
		s.tracef("all nodes crash")
		s.result.Counts.TotalCrashes++
		for _, sn := range s.nodes {
			if sn.up() {
				s.crash(sn, down)
			}
		}
	}
	if f.Has(FaultLease) {
		s.leaseFaults()
	}
	if f.Has(FaultPersist) && f.Has(FaultCrash) {
		s.crashInFlight()
	}
	for _, sn := range s.nodes {
		if !sn.up() && tick >= sn.downUntil {
			s.tracef("node %d: restart", sn.id)
			s.start(sn)
		}
	}
	if s.partitionUntil != 0 && tick >= s.partitionUntil || s.oneWayUntil != 0 && tick >= s.oneWayUntil {
		s.tracef("network: heal")
		s.net.heal()
		s.partitionUntil, s.oneWayUntil = 0, 0
	}
	if f.Has(FaultPartition) && !s.net.partitioned() && s.r.ppm(s.rate(partitionPerTickPPM)) {
		ids := make([]paxos.NodeID, len(s.nodes))
		for i, sn := range s.nodes {
			ids[i] = sn.id
		}
		s.r.r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		k := 1 + s.r.intn(len(ids)-1)
		s.net.partition(ids[:k], ids[k:])
		s.partitionUntil = tick + s.r.between(partitionTicksMin, partitionTicksMax)
		s.result.FaultCount++
		s.result.Counts.Partitions++
		s.tracef("network: partition %v | %v until %d", ids[:k], ids[k:], s.partitionUntil)
	}
	if f.Has(FaultOneWay) && !s.net.partitioned() && s.r.ppm(s.rate(partitionPerTickPPM)) {
		links := 1 + s.r.intn(len(s.nodes))
		for range links {
			a := s.nodes[s.r.intn(len(s.nodes))].id
			b := s.nodes[s.r.intn(len(s.nodes))].id
			if a != b {
				s.net.block(a, b)
				s.tracef("network: block %d -> %d", a, b)
			}
		}
		s.oneWayUntil = tick + s.r.between(partitionTicksMin, partitionTicksMax)
		s.result.FaultCount++
		s.result.Counts.OneWays++
	}
}

// leaseFaults injects this tick's lease-stress faults: a node (the leader
// half the time) stops for LeaseTicks-2..LeaseTicks+3 ticks, or crashes
// and restarts within LeaseTicks.
func (s *sim) leaseFaults() {
	var ups []*simNode
	var leader *simNode
	for _, sn := range s.nodes {
		if sn.up() && !sn.paused() {
			ups = append(ups, sn)
			if sn.n.Status().Role == paxos.RoleLeader {
				leader = sn
			}
		}
	}
	if len(ups) == 0 {
		return
	}
	pick := func() *simNode {
		if leader != nil && s.r.chance(1, 2) {
			return leader
		}
		return ups[s.r.intn(len(ups))]
	}
	if s.r.ppm(s.rate(leasePausePerTick)) {
		sn := pick()
		d := s.r.between(leaseTicks-2, leaseTicks+3)
		sn.pausedUntil = s.now + d*microsPerTick + s.r.between(0, microsPerTick-1)
		s.result.FaultCount++
		s.result.Counts.Pauses++
		s.tracef("node %d: pause for ~%d ticks", sn.id, d)
	}
	if s.r.ppm(s.rate(leaseRestartPerTick)) {
		s.crash(pick(), s.r.between(1, leaseTicks))
	}
}

// leaseStressDelay is the extra delay, in micro-ticks, of a heartbeat ack
// under lease stress: held back to arrive close to the lease's end.
func (s *sim) leaseStressDelay(m *paxos.Message) int64 {
	if !s.faults.Has(FaultLease) || s.liveness || m.Type != paxos.MsgHeartbeatResp || !s.r.ppm(leaseAckLatePPM) {
		return 0
	}
	return s.r.between((leaseTicks-2)*microsPerTick, (leaseTicks+1)*microsPerTick)
}

// maintenance is the application's periodic work: snapshots.
func (s *sim) maintenance(tick int64) {
	for _, sn := range s.nodes {
		if !sn.up() || tick < sn.nextCompact {
			continue
		}
		if s.faults.Has(FaultSnapshot) {
			sn.nextCompact = tick + s.r.between(compactTicksMin, compactTicksMax)
		} else {
			sn.nextCompact = tick + 4*compactTicksMax
		}
		if sn.app.applied == 0 {
			continue
		}
		s.compact(sn)
	}
}

func (s *sim) compact(sn *simNode) {
	data := sn.app.encode()
	slot := sn.app.applied
	if err := sn.n.Compact(slot); err != nil {
		s.tracef("node %d: compact at %d refused: %v", sn.id, slot, err)
		return
	}
	// The application's snapshot is durable once Compact accepted it; its
	// members are those in force at the snapshot's slot, which the node
	// agrees with.
	meta, err := sn.n.SnapshotMetaAt(slot)
	if err != nil || !slices.Equal(meta.Members, sn.app.members) || !slices.Equal(meta.Learners, sn.app.learners) {
		s.chk.violate("node %d: snapshot metadata at %d: %+v, %v; the application's members are %v", sn.id, slot, meta, err, sn.app.members)
	}
	sn.store.saveSnapshot(paxos.SnapshotMeta{Slot: slot, Members: slices.Clone(sn.app.members), Learners: slices.Clone(sn.app.learners)}, data)
	sn.store.truncate(slot)
	s.result.Counts.Compactions++
	s.process(sn)
}
