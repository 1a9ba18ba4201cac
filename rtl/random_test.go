package rtl

import (
	"bufio"
	"math/rand/v2"
	"os"
	"testing"

	"synod/accel"
	"synod/paxos"
)

// randomTrace records n inputs of seed-driven random stimulus through the
// Go model into path. The stimulus is drawn from small domains around the
// interesting edges (the window's ends, tags that alias one row, ballots
// just above and below the registers, empty and unknown members, tenant
// indexes past the table, rates and bursts past their clamps, heartbeats
// from the future), so every check of every engine is taken both ways.
func randomTrace(t testing.TB, spec accel.Spec, seed uint64, n int, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	p, err := accel.New(spec, accel.WithTrace(w))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	W := uint64(spec.WindowSlots)
	ballots := []paxos.Ballot{{}, {Round: 1, Node: 1}, {Round: 1, Node: 2}, {Round: 2, Node: 1},
		{Round: 2, Node: 3}, {Round: 7, Node: 5}, {Round: 1 << 63, Node: 2}}
	var (
		now    uint64
		base   paxos.Slot = 1
		ballot            = ballots[1]
		armed  []paxos.Slot
	)
	nodeID := func() paxos.NodeID {
		// Mostly members (1..Replicas), sometimes 0 or a stranger.
		switch r := rng.IntN(10); {
		case r == 0:
			return 0
		case r == 1:
			return paxos.NodeID(spec.Replicas + 1 + rng.IntN(3))
		default:
			return paxos.NodeID(1 + rng.IntN(spec.Replicas))
		}
	}
	pickBallot := func() paxos.Ballot {
		if rng.IntN(3) > 0 {
			return ballot
		}
		return ballots[rng.IntN(len(ballots))]
	}
	pickSlot := func() paxos.Slot {
		switch r := rng.IntN(12); {
		case r < 5 && len(armed) > 0:
			return armed[rng.IntN(len(armed))]
		case r == 5:
			return base + paxos.Slot(W) - 1 + paxos.Slot(rng.IntN(3)) // the top edge
		case r == 6:
			return base - paxos.Slot(rng.IntN(3)) // the bottom edge
		case r == 7:
			return base + paxos.Slot(uint64(rng.IntN(4))*W+uint64(rng.IntN(4))) // aliases
		case r == 8:
			return paxos.Slot(rng.Uint64()) // anywhere, wrap-around included
		default:
			return base + paxos.Slot(rng.IntN(int(min(W, 64))))
		}
	}
	big := func() uint64 {
		switch rng.IntN(6) {
		case 0:
			return 0
		case 1:
			return rng.Uint64()
		case 2:
			return 1<<32 + uint64(rng.IntN(3)) - 1 // the rate clamp
		case 3:
			return 1<<40 + uint64(rng.IntN(3)) - 1 // the burst clamp
		default:
			return uint64(1 + rng.IntN(5000))
		}
	}
	var out []accel.Event
	for i := 0; i < n; i++ {
		// Time mostly creeps forward, sometimes jumps past every timer, and
		// sometimes an input carries an older time (the plane keeps the max).
		switch r := rng.IntN(100); {
		case r < 60:
			now += uint64(rng.IntN(300))
		case r < 62:
			now += uint64(spec.ElectionTicks) + uint64(rng.IntN(int(spec.LeaseTicks)))
		}
		at := now
		if rng.IntN(20) == 0 && now > 1000 {
			at = now - uint64(rng.IntN(1000))
		}
		e := accel.Event{Now: at}
		switch r := rng.IntN(1000); {
		case r < 120:
			e.Kind = accel.InTick
		case r < 135:
			e.Kind, e.Flags = accel.InSetRole, uint8(rng.IntN(4)) // 3 is invalid
			if rng.IntN(3) > 0 {
				e.Flags = uint8(rng.IntN(3))
			}
		case r < 145:
			e.Kind = accel.InSetBallot
			e.Ballot = ballots[rng.IntN(len(ballots))]
			ballot = e.Ballot
		case r < 155:
			e.Kind, e.Ballot = accel.InSetPromised, ballots[rng.IntN(len(ballots))]
		case r < 160:
			e.Kind, e.Len = accel.InSetQuorum, uint32(rng.IntN(spec.Replicas+2))
			if rng.IntN(50) == 0 {
				e.Len = rng.Uint32()
			}
		case r < 175:
			e.Kind, e.Index = accel.InSetMember, uint16(rng.IntN(spec.Replicas+2))
			e.Node = paxos.NodeID(rng.IntN(spec.Replicas + 3))
			if rng.IntN(50) == 0 {
				e.Index = uint16(rng.Uint32())
			}
		case r < 180:
			e.Kind, e.Index = accel.InSetSelf, uint16(rng.IntN(spec.Replicas+1))
		case r < 195:
			e.Kind = accel.InSetWindowBase
			switch rng.IntN(8) {
			case 0:
				e.Slot = paxos.Slot(rng.Uint64())
			case 1:
				e.Slot = paxos.Slot(^uint64(0) - uint64(rng.IntN(int(2*W)))) // base+W wraps
			default:
				e.Slot = base + paxos.Slot(rng.IntN(8))
			}
			base = e.Slot
		case r < 215:
			e.Kind = accel.InSetTenantOps
			if rng.IntN(2) == 0 {
				e.Kind = accel.InSetTenantBytes
			}
			e.Index = uint16(rng.IntN(spec.TenantsMax + 2))
			e.Value, e.Value2 = big(), big()
			if rng.IntN(2) == 0 {
				e.Value, e.Value2 = uint64(1+rng.IntN(2000)), uint64(rng.IntN(50))
			}
		case r < 370:
			e.Kind = accel.InAdmit
			e.Index = uint16(rng.IntN(spec.TenantsMax + 1))
			e.Len = uint32(rng.IntN(3000))
			if rng.IntN(30) == 0 {
				e.Len = rng.Uint32()
			}
		case r < 520:
			e.Kind, e.Slot, e.Ballot = accel.InArm, pickSlot(), pickBallot()
			if len(armed) < 32 {
				armed = append(armed, e.Slot)
			} else {
				armed[rng.IntN(len(armed))] = e.Slot
			}
		case r < 760:
			e.Kind, e.Slot, e.Ballot, e.Node = accel.InAccepted, pickSlot(), pickBallot(), nodeID()
		case r < 860:
			e.Kind, e.Slot, e.Ballot, e.Node = accel.InAccept, pickSlot(), pickBallot(), nodeID()
			e.Len = uint32(rng.IntN(4096))
			if rng.IntN(10) == 0 {
				e.Flags = accel.FlagWALFailed
			}
		case r < 930:
			e.Kind, e.Ballot, e.Node = accel.InHeartbeat, pickBallot(), nodeID()
			e.Value = now - uint64(rng.IntN(100))
		default:
			e.Kind, e.Ballot, e.Node = accel.InHeartbeatAck, pickBallot(), nodeID()
			e.Value = now - uint64(rng.IntN(int(spec.LeaseTicks)))
			if rng.IntN(20) == 0 {
				e.Value = now + uint64(1+rng.IntN(100)) // from the future
			}
		}
		out = p.Apply(out[:0], e)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
