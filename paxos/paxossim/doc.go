// Package paxossim is a seeded, deterministic simulator for the paxos
// package, in the style of TigerBeetle's VOPR: one 64-bit seed decides every
// choice the simulation makes (node count, fault profile, message delays,
// drops, duplicates, partitions, crashes, clock drift, client operations), so
// a failing seed replays exactly.
//
// A run has two phases. In the fault phase the network drops, duplicates,
// delays and reorders messages, partitions the group (symmetrically and one
// way), nodes crash and restart with only what the Ready contract made
// durable, node clocks drift within the configured bound, membership changes
// and snapshots happen, and several clients write and read concurrently. In
// the liveness phase every fault heals, and every pending client operation
// must complete, and every replica must catch up, within a bounded number of
// ticks.
//
// Safety checks run all the time: at most one value chosen per slot, every
// replica applies the same entry and reaches the same state at every slot,
// committed entries are delivered gapless and in order, the leader reports
// at most one Committed AckEvent per (slot, ballot), no leader sends an
// Accept above a ConfChange it has not committed, the lease oracle
// (lease.go: a leader's lease is always backed, in simulated real time, by
// refusal windows that block every phase 1 until it ends, and no lease
// read is answered after a higher ballot committed), the voter-quorum
// oracle (check_quorum.go: every slot a leader commits, and every entry a
// node applies, was durably accepted under one ballot by a majority of the
// voters of the membership governing that slot, a leader's own vote only
// once its write completed, learners never), and at the end every
// client history is checked for linearizability with porcupine against a KV
// model.
//
// Fault kinds include lease stress (heartbeat acks held back close to the
// lease's end, node pauses of about LeaseTicks during which inputs queue
// and after which the owed ticks come first, restarts within LeaseTicks),
// and Options.MembershipHeavy runs many quick remove/add cycles, fresh node
// ids among them, under partitions and crashes (TestSimulationMembershipHeavy,
// 500 seeds in the default run). planted_test.go turns on each planted bug
// of the paxos package's test hooks and requires a safety oracle to catch it.
//
// Running it:
//
//	go test ./paxos/paxossim                        # 2000 seeds, prints the summary line
//	go test ./paxos/paxossim -run 'TestSimulation$' -seed=12345 -v   # replay one seed with its trace
//	go test ./paxos/paxossim -run 'TestSimulation$' -seeds=20000 -ticks=1000
//	go test ./paxos/paxossim -run 'TestSimulation$' -long -timeout 60m
//	go test ./paxos/paxossim -run 'TestSimulation$' -faults=crash,partition
//	go run ./paxos/paxossim/cmd/paxossim -seeds 2000   # standalone
//
// A failing seed prints the command that replays it. Crashed nodes keep
// only their durableStore: what Ready.Promised and Ready.Accepted made
// durable, the leader's own writes (Ready.OwnAccepted) that completed
// before the crash, and the application's durable copy (either its whole
// state after every apply, or only its last snapshot, chosen per seed).
//
// A leader's own writes run in parallel with its sends (ownpersist.go):
// each completes after a seed-chosen delay, out of order with the Accepts
// and with each other, and only then is the node told
// (OwnAcceptedDurable); a crash loses the writes in flight (on some seeds
// one survives unreported). FaultPersist stalls some writes past an
// election timeout and crashes leaders right after their sends and while a
// write is in flight. The checker requires every own vote a leader counts
// to be in its durable store; planted_test.go shows that a leader counting
// its vote early (paxos.TestingVoteBeforePersist) is caught by that oracle
// and, end to end, by two values committed in one slot.
//
// The simulator is a test tool: it is used by its tests and by
// cmd/paxossim, never by production code.
package paxossim
