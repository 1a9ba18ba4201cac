package accel

import (
	"io"
	"math/rand"

	"synod/paxos"
	"synod/pmem"
)

// okWAL is a WAL that accepts everything and keeps nothing; failEvery
// makes every n-th append fail (0: never), so traces include WAL hand-ups.
type okWAL struct {
	n, failEvery int
}

func (w *okWAL) Append([]pmem.Record) error {
	w.n++
	if w.failEvery > 0 && w.n%w.failEvery == 0 {
		return io.ErrShortWrite
	}
	return nil
}
func (w *okWAL) Persist() error                { return nil }
func (w *okWAL) SetPromised(pmem.Ballot) error { return nil }

// GenerateTraces drives a leader plane and a follower plane (DefaultSpec
// with a 64-slot window, seeded) through a random but reproducible
// workload of about inputs inputs — arms and acks (reordered, duplicated,
// stale, out of window, from strangers), accepts (stale, out of window,
// WAL failures), heartbeats, window moves, ballot changes and shaper
// admissions — and writes the two traces. It is the random-stimulus source
// for the RTL co-simulation: the same seed gives the same bytes.
func GenerateTraces(leaderW, followerW io.Writer, seed int64, inputs int) error {
	spec := DefaultSpec()
	spec.WindowSlots = 64
	spec.Seed = uint32(seed)
	var now uint64
	clock := func() uint64 { return now }
	lp, err := New(spec, WithTrace(leaderW), WithClock(clock))
	if err != nil {
		return err
	}
	fp, err := New(spec, WithTrace(followerW), WithClock(clock), WithWAL(&okWAL{failEvery: 97}))
	if err != nil {
		return err
	}
	for i := 0; i < spec.Replicas; i++ {
		lp.SetMember(nil, i, paxos.NodeID(i+1))
		fp.SetMember(nil, i, paxos.NodeID(i+1))
	}
	lp.SetSelf(nil, 0)
	fp.SetSelf(nil, 1)
	lp.SetTenant(nil, 3, 1000, 5, 100_000, 4096)
	rng := rand.New(rand.NewSource(seed))
	ballot := paxos.Ballot{Round: 1, Node: 1}
	lp.SetBallot(nil, ballot)
	lp.SetRole(nil, RoleLeader)
	fp.SetPromised(nil, ballot)
	fp.SetRole(nil, RoleFollower)
	next := paxos.Slot(1)
	for i := 0; i < inputs; i++ {
		now += uint64(rng.Intn(500))
		switch r := rng.Intn(100); {
		case r < 3:
			lp.Tick(nil, now)
			fp.Tick(nil, now)
		case r < 25:
			lp.Arm(nil, next, ballot)
			fp.OnAccept(nil, next, ballot, 1, []byte{byte(i)})
			next++
		case r < 70:
			s := next - paxos.Slot(rng.Intn(70)) // some out of window, some never armed
			lp.OnAccepted(nil, s, ballot, paxos.NodeID(1+rng.Intn(6)))
		case r < 80:
			lp.Admit(rng.Intn(5), rng.Intn(3000))
		case r < 85:
			lp.OnHeartbeatAck(nil, paxos.NodeID(2+rng.Intn(4)), ballot, now-uint64(rng.Intn(1000)))
			fp.OnHeartbeat(nil, 1, ballot, now)
		case r < 88:
			if next > 32 {
				lp.SetWindowBase(nil, next-32)
				fp.SetWindowBase(nil, next-32)
			}
		case r < 89:
			ballot = paxos.Ballot{Round: ballot.Round + 1, Node: ballot.Node}
			lp.SetBallot(nil, ballot)
			fp.SetPromised(nil, ballot)
		default:
			fp.OnAccept(nil, next+paxos.Slot(rng.Intn(100)), paxos.Ballot{Round: ballot.Round - uint64(rng.Intn(2)), Node: 1}, 1, nil)
		}
	}
	if err := lp.Close(); err != nil {
		return err
	}
	return fp.Close()
}
