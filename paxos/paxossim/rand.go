package paxossim

import "math/rand/v2"

// simRand is the simulation's single source of randomness: a PCG seeded
// from the run's seed. Everything random goes through it, in an order that
// depends only on the seed, so runs replay exactly.
type simRand struct{ r *rand.Rand }

func newSimRand(seed uint64) *simRand {
	return &simRand{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// ppm returns true with probability p parts per million.
func (s *simRand) ppm(p uint32) bool {
	if p == 0 {
		return false
	}
	return s.r.Uint32N(1_000_000) < p
}

// between returns a value in [lo, hi].
func (s *simRand) between(lo, hi int64) int64 {
	if hi <= lo {
		return lo
	}
	return lo + s.r.Int64N(hi-lo+1)
}

// intn returns a value in [0, n).
func (s *simRand) intn(n int) int { return s.r.IntN(n) }

// chance returns true with probability num/den.
func (s *simRand) chance(num, den int) bool { return s.r.IntN(den) < num }

func (s *simRand) u64() uint64 { return s.r.Uint64() }
