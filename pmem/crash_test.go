package pmem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The crash test re-executes the test binary as a child that appends and
// persists in a loop, reporting each persisted slot on stdout; the parent
// SIGKILLs it at a random moment, reopens the log and checks it.
const (
	crashChildEnv     = "PMEM_CRASH_CHILD" // set to the log path in the child
	crashModeEnv      = "PMEM_CRASH_MODE"
	crashSeedEnv      = "PMEM_CRASH_SEED"
	crashKills        = 240
	crashRegionBytes  = 256 << 10 // small, so the children wrap the ring
	crashBallotNode   = 7
	crashLiveSlots    = 20 // the child truncates below next-crashLiveSlots
	crashPayloadBytes = 700
	crashFirstReport  = 10 * time.Second // a child silent for this long is a failure
)

func TestMain(m *testing.M) {
	if path := os.Getenv(crashChildEnv); path != "" {
		os.Exit(crashChild(path))
	}
	os.Exit(m.Run())
}

// crashChild appends batches of 1-4 records with consecutive slots after
// the largest slot in the log, persists each batch and then writes its
// slots (8 bytes each) to stdout, until it is killed.
func crashChild(path string) int {
	seed, _ := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	rng := rand.New(rand.NewPCG(seed, 99))
	l, _, err := Open(Options{Path: path, SizeBytes: crashRegionBytes, Mode: Mode(os.Getenv(crashModeEnv)),
		ClusterID: testCluster, NodeID: testNode})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		return 2
	}
	next := uint64(0)
	err = l.Iterate(0, func(r Record) error { next = max(next, r.Slot+1); return nil })
	if err != nil {
		fmt.Fprintln(os.Stderr, "child iterate:", err)
		return 2
	}
	next = max(next, l.TruncatedBelow()) // below it an append would be invisible
	gen := l.Generation()
	out := make([]byte, 0, 4*8)
	for {
		k := 1 + rng.IntN(4)
		recs := make([]Record, k)
		for i := range recs {
			s := next + uint64(i)
			recs[i] = Record{Type: RecordEntry, Slot: s, Ballot: Ballot{gen, crashBallotNode},
				Payload: pattern(s, gen, rng.IntN(crashPayloadBytes))}
		}
		if used, ring := l.Space(); used > ring/2 && next > crashLiveSlots {
			if err := l.TruncateBelow(next - crashLiveSlots); err != nil {
				fmt.Fprintln(os.Stderr, "child truncate:", err)
				return 2
			}
		}
		if err := l.Append(recs); err != nil {
			fmt.Fprintln(os.Stderr, "child append:", err)
			return 2
		}
		if err := l.Persist(); err != nil {
			fmt.Fprintln(os.Stderr, "child persist:", err)
			return 2
		}
		out = out[:0]
		for _, r := range recs {
			out = binary.LittleEndian.AppendUint64(out, r.Slot)
		}
		if _, err := os.Stdout.Write(out); err != nil {
			return 2
		}
		next += uint64(k)
	}
}

type crashTally struct {
	kills, persisted, lost, corrupt int
	killsInOpen, cuts               int
	byMode                          map[Mode]int
}

func TestCrashKill(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test forks hundreds of processes")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	paths := map[Mode]string{
		ModeShm:   filepath.Join(shmDir(t), "crash.log"),
		ModeMsync: filepath.Join(t.TempDir(), "crash.log"),
	}
	reported := map[Mode]map[uint64]bool{ModeShm: {}, ModeMsync: {}}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	tally := crashTally{byMode: map[Mode]int{}}
	for tally.kills < crashKills {
		mode := ModeShm
		if tally.kills%6 == 5 {
			mode = ModeMsync // slower: one in six
		}
		slots, inOpen := crashOnce(t, exe, paths[mode], mode, rng)
		tally.kills++
		tally.byMode[mode]++
		if inOpen {
			tally.killsInOpen++
		}
		for _, s := range slots {
			reported[mode][s] = true
		}
		tally.persisted += len(slots)
		crashCheck(t, paths[mode], mode, reported[mode], &tally)
	}
	fmt.Printf("pmem crash: kills=%d persisted=%d lost=%d corrupt=%d\n",
		tally.kills, tally.persisted, tally.lost, tally.corrupt)
	fmt.Printf("pmem crash: SIGKILL (process crash) in shm=%d msync=%d children, %d killed before reporting a slot, %d reopens cut a torn tail; a SIGKILL is a process crash only (power loss: TestPowerLoss, simulated); shm does not survive power loss\n",
		tally.byMode[ModeShm], tally.byMode[ModeMsync], tally.killsInOpen, tally.cuts)
	if tally.lost != 0 || tally.corrupt != 0 {
		t.Fatalf("lost=%d corrupt=%d", tally.lost, tally.corrupt)
	}
	if tally.persisted < crashKills {
		t.Fatalf("children persisted only %d slots in %d lives: the kills landed too early to test anything", tally.persisted, tally.kills)
	}
}

// crashOnce runs one child and kills it: usually a few milliseconds after
// its first report, sometimes at a random moment from its start (during
// Open and recovery). It returns the slots the child reported persisted.
func crashOnce(t *testing.T, exe, path string, mode Mode, rng *rand.Rand) (slots []uint64, killedEarly bool) {
	t.Helper()
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+path, crashModeEnv+"="+string(mode),
		crashSeedEnv+"="+strconv.FormatUint(rng.Uint64(), 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := make(chan struct{})
	done := make(chan []byte)
	go func() {
		var buf bytes.Buffer
		b := make([]byte, 4096)
		signalled := false
		for {
			n, err := stdout.Read(b)
			buf.Write(b[:n])
			if n > 0 && !signalled {
				close(first)
				signalled = true
			}
			if err != nil {
				if !signalled {
					close(first)
				}
				done <- buf.Bytes()
				return
			}
		}
	}()
	if rng.IntN(8) == 0 {
		time.Sleep(time.Duration(rng.IntN(8000)) * time.Microsecond)
	} else {
		select {
		case <-first:
		case <-time.After(crashFirstReport):
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child reported nothing in %v; stderr: %s", crashFirstReport, stderr.String())
		}
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	out := <-done
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() {
		t.Fatalf("child ended by itself (%v) instead of SIGKILL; stderr: %s", err, stderr.String())
	}
	if len(out)%8 != 0 {
		t.Fatalf("child report of %d bytes is not whole slots", len(out))
	}
	for i := 0; i+8 <= len(out); i += 8 {
		slots = append(slots, binary.LittleEndian.Uint64(out[i:]))
	}
	return slots, len(slots) == 0
}

// crashCheck reopens the log: every reported slot at or above the
// truncation point must be present and intact; every record returned must
// be intact and in the order the children wrote them (strictly increasing
// slots, since each child starts after the largest slot it found), which
// also shows that nothing written after a cut came back.
func crashCheck(t *testing.T, path string, mode Mode, reported map[uint64]bool, tally *crashTally) {
	t.Helper()
	v, err := crashVerify(path, mode, reported)
	if err != nil {
		t.Fatalf("reopen after kill %d: %v", tally.kills, err)
	}
	tally.lost += v.lost
	tally.corrupt += v.corrupt
	if v.cut {
		tally.cuts++
	}
	for _, p := range v.problems {
		t.Errorf("kill %d: %s", tally.kills, p)
	}
}

type crashVerdict struct {
	lost, corrupt int
	cut           bool
	problems      []string
}

// crashVerify is crashCheck's checker; it prunes reported slots below the
// truncation point.
func crashVerify(path string, mode Mode, reported map[uint64]bool) (crashVerdict, error) {
	var v crashVerdict
	l, rec, err := Open(Options{Path: path, Mode: mode, ClusterID: testCluster, NodeID: testNode})
	if errors.Is(err, os.ErrNotExist) {
		return v, nil // killed before it created the file
	}
	if err != nil {
		return v, err
	}
	defer l.Close()
	v.cut = rec.CutReason != ""
	low := l.TruncatedBelow()
	seen := map[uint64]bool{}
	prev, any := uint64(0), false
	err = l.Iterate(0, func(r Record) error {
		if any && r.Slot <= prev {
			v.corrupt++
			v.problems = append(v.problems, fmt.Sprintf("slot %d after slot %d", r.Slot, prev))
		}
		if r.Type != RecordEntry || r.Ballot.Node != crashBallotNode ||
			!bytes.Equal(r.Payload, pattern(r.Slot, r.Ballot.Round, len(r.Payload))) {
			v.corrupt++
			v.problems = append(v.problems, fmt.Sprintf("slot %d corrupt", r.Slot))
		}
		prev, any = r.Slot, true
		seen[r.Slot] = true
		return nil
	})
	if err != nil {
		return v, err
	}
	for s := range reported {
		switch {
		case s < low:
			delete(reported, s)
		case !seen[s]:
			v.lost++
			v.problems = append(v.problems, fmt.Sprintf("persisted slot %d (truncation point %d) lost", s, low))
		}
	}
	return v, nil
}

// The crash checker catches what it is there to catch: a lost slot, a
// record out of order (one resurrected from beyond a cut) and a corrupt
// payload.
func TestCrashCheckerCatchesPlantedBugs(t *testing.T) {
	path := filepath.Join(shmDir(t), "log")
	l, _ := mustOpen(t, testOpts(path, crashRegionBytes))
	rec := func(slot uint64, payload []byte) Record {
		return Record{Type: RecordEntry, Slot: slot, Ballot: Ballot{1, crashBallotNode}, Payload: payload}
	}
	recs := []Record{
		rec(1, pattern(1, 1, 40)),
		rec(9, pattern(9, 1, 40)),
		rec(5, pattern(5, 1, 40)),          // out of order
		rec(10, []byte("not the pattern")), // corrupt
	}
	if err := l.Append(recs); err != nil {
		t.Fatal(err)
	}
	l.Close()
	v, err := crashVerify(path, ModeShm, map[uint64]bool{1: true, 9: true, 5: true, 10: true, 11: true})
	if err != nil {
		t.Fatal(err)
	}
	if v.lost != 1 || v.corrupt != 2 {
		t.Fatalf("planted 1 lost slot and 2 corrupt records, checker found lost=%d corrupt=%d: %v", v.lost, v.corrupt, v.problems)
	}
}
