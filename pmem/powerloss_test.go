package pmem

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// The power-loss test is the in-process counterpart of the SIGKILL test,
// after pebble's crashable filesystem: a hook on every persist keeps a copy
// of what is durable ("media"), and a power loss at a random persist (or
// between operations) leaves media plus a random subset of the 8-byte
// words written since (caches and page writeback may have pushed any of
// them out early). The log reopens on that image and must hold every
// acknowledged record and ballot. It models dax at its finest grain (8-byte
// atomicity, any line persisted early); msync persists whole pages, a
// superset.
const (
	powerLosses          = 400
	powerLossRegionBytes = 128 << 10
	powerLossOpsMax      = 120 // operations before a forced power loss
	powerLossPerPersist  = 30  // one persist in this many loses power
)

type powerLoss struct{}

type powerLossSim struct {
	rng    *rand.Rand
	media  []byte // the durable bytes of the region
	armed  bool
	region *region // the region of the latest persist
	// dropOneIn > 0 plants a bug: one persist in that many does nothing.
	dropOneIn int
}

func (s *powerLossSim) hook(r *region, off, n int64) {
	s.region = r
	if s.armed && s.rng.IntN(powerLossPerPersist) == 0 {
		panic(powerLoss{})
	}
	if n <= 0 || s.media == nil { // nil: the first format, before tracking starts
		return
	}
	if s.dropOneIn > 0 && s.rng.IntN(s.dropOneIn) == 0 {
		return
	}
	start := off &^ (lineBytes - 1)
	end := min((off+n+lineBytes-1)&^(lineBytes-1), int64(len(r.mem)))
	copy(s.media[start:end], r.mem[start:end])
}

// crash ends the region's life. One time in four it is a process crash:
// the file keeps every store (the page cache survives) but media does not
// change, so what recovery then finds must be persisted by recovery itself
// before a later power loss. Otherwise it is a power loss: media plus each
// word written since its last persist with probability p becomes the file.
func (s *powerLossSim) crash(r *region) {
	if s.rng.IntN(4) == 0 {
		_ = r.close()
		return
	}
	p := []float64{0, 0.1, 0.5, 0.9, 1}[s.rng.IntN(5)]
	img := bytes.Clone(s.media)
	for i := 0; i+8 <= len(img); i += 8 {
		if !bytes.Equal(r.mem[i:i+8], img[i:i+8]) && s.rng.Float64() < p {
			copy(img[i:i+8], r.mem[i:i+8])
		}
	}
	copy(r.mem, img)
	s.media = img
	_ = r.close()
}

// try runs fn and reports whether power was lost during it.
func try(fn func()) (lost bool) {
	defer func() {
		if e := recover(); e != nil {
			if _, ok := e.(powerLoss); !ok {
				panic(e)
			}
			lost = true
		}
	}()
	fn()
	return false
}

type powerLossResult struct {
	persisted, lost, corrupt, crashesInOpen int
	problems                                []string
}

func (r *powerLossResult) problem(format string, args ...any) {
	if len(r.problems) < 20 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

// runPowerLoss drives a random workload through powerLosses crashes and
// checks each recovery. An Open refused after a crash counts as corrupt
// and ends the run.
func runPowerLoss(t *testing.T, seed uint64, dropOneIn int) powerLossResult {
	path := filepath.Join(shmDir(t), "log")
	opts := testOpts(path, powerLossRegionBytes)
	sim := &powerLossSim{rng: rand.New(rand.NewPCG(seed, 8)), dropOneIn: dropOneIn}
	persistHook = sim.hook
	defer func() { persistHook = nil }()

	l, _ := mustOpen(t, opts)
	sim.media = bytes.Clone(l.r.mem)
	var res powerLossResult
	var (
		acked            = map[uint64]bool{} // slots whose Persist returned
		promised         Ballot              // last SetPromised that returned
		promisedInflight *Ballot             // a SetPromised power was lost in
		trunc            uint64
		truncInflight    uint64
		next             uint64
		round            uint64
	)
	for crash := 0; crash < powerLosses; crash++ {
		sim.armed = true
		// Run operations until the power goes.
		lostPower := false
		for op := 0; op < powerLossOpsMax && !lostPower; op++ {
			switch k := sim.rng.IntN(10); {
			case k < 7:
				gen := l.Generation()
				var recs []Record
				for range 1 + sim.rng.IntN(4) {
					recs = append(recs, Record{Type: RecordEntry, Slot: next, Ballot: Ballot{gen, 1},
						Payload: pattern(next, gen, sim.rng.IntN(1200))})
					next++
				}
				if err := l.Append(recs); errors.Is(err, ErrFull) {
					next -= uint64(len(recs)) // later operations persist and truncate
					continue
				} else if err != nil {
					t.Fatalf("append: %v", err)
				}
				if k < 5 {
					lostPower = try(func() {
						if err := l.Persist(); err != nil {
							t.Fatal(err)
						}
					})
					if !lostPower {
						for _, r := range recs {
							acked[r.Slot] = true
						}
						res.persisted += len(recs)
					}
				}
			case k < 8:
				round++
				b := Ballot{round, 2}
				promisedInflight = &b
				lostPower = try(func() {
					if err := l.SetPromised(b); err != nil {
						t.Fatal(err)
					}
				})
				if !lostPower {
					promised, promisedInflight = b, nil
				}
			default:
				used, ring := l.Space()
				if used < ring/3 || next < 10 {
					continue
				}
				truncInflight = next - 10
				lostPower = try(func() {
					if err := l.TruncateBelow(truncInflight); err != nil {
						t.Fatal(err)
					}
				})
				if !lostPower {
					trunc = truncInflight
				}
			}
		}
		sim.crash(l.r)

		// Reboot; power may go during recovery too.
		var rec Recovery
		for {
			var err error
			if !try(func() { l, rec, err = Open(testOpts(path, 0)) }) {
				if err != nil {
					res.corrupt++
					res.problem("power loss %d: reopen: %v", crash, err)
					return res
				}
				break
			}
			res.crashesInOpen++
			sim.crash(sim.region)
		}
		sim.armed = false

		got := l.Promised()
		if got != promised && (promisedInflight == nil || got != *promisedInflight) {
			res.corrupt++
			res.problem("power loss %d: promised %v, acknowledged %v, in flight %v", crash, got, promised, promisedInflight)
		}
		promised, promisedInflight = got, nil
		low := l.TruncatedBelow()
		if low != trunc && low != truncInflight {
			res.corrupt++
			res.problem("power loss %d: truncation point %d, acknowledged %d, in flight %d", crash, low, trunc, truncInflight)
		}
		trunc, truncInflight = low, low
		seen := map[uint64]bool{}
		var prev uint64
		any := false
		err := l.Iterate(0, func(r Record) error {
			if (any && r.Slot <= prev) || !bytes.Equal(r.Payload, pattern(r.Slot, r.Ballot.Round, len(r.Payload))) {
				res.corrupt++
				res.problem("power loss %d: slot %d (after %d) out of order or corrupt", crash, r.Slot, prev)
			}
			prev, any = r.Slot, true
			seen[r.Slot] = true
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for s := range acked {
			switch {
			case s < low:
				delete(acked, s)
			case !seen[s]:
				res.lost++
				res.problem("power loss %d: acknowledged slot %d lost (recovery %+v)", crash, s, rec)
			}
		}
		// Continue above every slot in the log and above the truncation
		// point (below it an append would be invisible).
		next = low
		if any {
			next = max(next, prev+1)
		}
	}
	l.Close()
	return res
}

// TestPowerLoss runs powerLossSeeds seeds (PMEM_POWERLOSS_SEEDS=n runs
// n; a failure names its seed, and PMEM_POWERLOSS_SEED=s replays one).
func TestPowerLoss(t *testing.T) {
	seeds := []uint64{7, 8, 9}
	if v := os.Getenv("PMEM_POWERLOSS_SEEDS"); v != "" {
		n, _ := strconv.Atoi(v)
		seeds = seeds[:0]
		for i := range n {
			seeds = append(seeds, uint64(1000+i))
		}
	}
	if v := os.Getenv("PMEM_POWERLOSS_SEED"); v != "" {
		s, _ := strconv.ParseUint(v, 10, 64)
		seeds = []uint64{s}
	}
	var total powerLossResult
	for _, seed := range seeds {
		res := runPowerLoss(t, seed, 0)
		for _, p := range res.problems {
			t.Errorf("seed %d (replay: PMEM_POWERLOSS_SEED=%d go test -run TestPowerLoss ./pmem): %s", seed, seed, p)
		}
		if res.persisted < powerLosses {
			t.Errorf("seed %d: only %d records persisted across %d power losses", seed, res.persisted, powerLosses)
		}
		total.persisted += res.persisted
		total.lost += res.lost
		total.corrupt += res.corrupt
		total.crashesInOpen += res.crashesInOpen
	}
	fmt.Printf("pmem powerloss: crashes=%d persisted=%d lost=%d corrupt=%d (seeds=%d, %d crashes during recovery; simulated media, 8-byte grain)\n",
		powerLosses*len(seeds), total.persisted, total.lost, total.corrupt, len(seeds), total.crashesInOpen)
}

// The checker catches a log that drops persists: a planted bug in the
// simulated media (one persist in five never reaches it).
func TestPowerLossCheckerCatchesDroppedPersists(t *testing.T) {
	res := runPowerLoss(t, 9, 5)
	if res.lost+res.corrupt == 0 {
		t.Fatalf("dropped persists went unnoticed: %d records persisted, lost=0 corrupt=0", res.persisted)
	}
	t.Logf("planted bug caught: lost=%d corrupt=%d, first: %s", res.lost, res.corrupt, res.problems[0])
}
