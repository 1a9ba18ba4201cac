package accel

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// recordWorkload records a leader and a follower trace with GenerateTraces.
func recordWorkload(t testing.TB, seed int64, inputs int) (leader, follower []byte) {
	var lb, fb bytes.Buffer
	if err := GenerateTraces(&lb, &fb, seed, inputs); err != nil {
		t.Fatal(err)
	}
	return lb.Bytes(), fb.Bytes()
}

func TestTraceRoundTripAndReplay(t *testing.T) {
	lt, ft := recordWorkload(t, 1, 20_000)
	for name, tr := range map[string][]byte{"leader": lt, "follower": ft} {
		spec, evs, err := ReadTrace(bytes.NewReader(tr))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var again bytes.Buffer
		if err := WriteTrace(&again, spec, evs); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again.Bytes(), tr) {
			t.Fatalf("%s: re-encoded trace differs", name)
		}
		res, err := Replay(bytes.NewReader(tr))
		if err != nil {
			t.Fatal(err)
		}
		if res.Mismatches != 0 || res.Inputs == 0 || res.Outputs == 0 {
			t.Fatalf("%s replay: %+v", name, res)
		}
		t.Logf("%s trace: %d inputs, %d outputs, mismatches=0", name, res.Inputs, res.Outputs)
	}
}

// TestReplayCatchesDivergence plants a divergence (one recorded output
// altered, then one dropped) and checks Replay reports it.
func TestReplayCatchesDivergence(t *testing.T) {
	lt, _ := recordWorkload(t, 2, 5000)
	spec, evs, err := ReadTrace(bytes.NewReader(lt))
	if err != nil {
		t.Fatal(err)
	}
	i := -1
	for j, e := range evs {
		if e.Kind == OutCommit {
			i = j
			break
		}
	}
	if i < 0 {
		t.Fatal("workload made no commit")
	}
	for _, plant := range []func([]Event) []Event{
		func(es []Event) []Event { es[i].Slot++; return es },
		func(es []Event) []Event { return append(es[:i:i], es[i+1:]...) },
	} {
		mod := plant(append([]Event(nil), evs...))
		var buf bytes.Buffer
		if err := WriteTrace(&buf, spec, mod); err != nil {
			t.Fatal(err)
		}
		res, err := Replay(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if res.Mismatches == 0 {
			t.Fatalf("planted divergence not caught: %+v", res)
		}
	}
}

func TestReadTraceRejects(t *testing.T) {
	lt, _ := recordWorkload(t, 3, 100)
	cases := map[string][]byte{
		"empty":       nil,
		"short head":  lt[:10],
		"bad magic":   append([]byte("XXXXXXXX"), lt[8:]...),
		"torn record": lt[:len(lt)-1],
	}
	badKind := bytes.Clone(lt)
	badKind[TraceHeaderBytes+8] = 200
	cases["bad kind"] = badKind
	badSeq := bytes.Clone(lt)
	badSeq[TraceHeaderBytes] = 9
	cases["bad seq"] = badSeq
	badSpec := bytes.Clone(lt)
	badSpec[16] = 3 // WindowSlots not a power of two
	cases["bad spec"] = badSpec
	for name, data := range cases {
		if _, _, err := ReadTrace(bytes.NewReader(data)); !errors.Is(err, ErrBadTrace) {
			t.Errorf("%s: err %v, want ErrBadTrace", name, err)
		}
	}
}

func FuzzReadTrace(f *testing.F) {
	lt, ft := recordWorkload(f, 4, 40)
	f.Add(lt)
	f.Add(ft)
	f.Add(lt[:TraceHeaderBytes])
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, evs, err := ReadTrace(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrBadTrace) {
				t.Fatalf("error not wrapping ErrBadTrace: %v", err)
			}
			return
		}
		var again bytes.Buffer
		if err := WriteTrace(&again, spec, evs); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again.Bytes(), data) {
			t.Fatalf("accepted trace does not round-trip")
		}
		if _, err := Replay(bytes.NewReader(data)); err != nil {
			t.Fatalf("replay of an accepted trace: %v", err)
		}
	})
}

// TestWriteSeedCorpus regenerates testdata/fuzz/FuzzReadTrace when
// ACCEL_WRITE_CORPUS=1 (the committed files are what `go test` runs).
func TestWriteSeedCorpus(t *testing.T) {
	if os.Getenv("ACCEL_WRITE_CORPUS") != "1" {
		t.Skip("set ACCEL_WRITE_CORPUS=1 to regenerate the seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzReadTrace")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lt, ft := recordWorkload(t, 5, 30)
	for name, data := range map[string][]byte{"leader": lt, "follower": ft, "header-only": lt[:TraceHeaderBytes], "torn": lt[:TraceHeaderBytes+30]} {
		body := "go test fuzz v1\n[]byte(" + quoteBytes(data) + ")\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func quoteBytes(b []byte) string {
	var s bytes.Buffer
	s.WriteByte('"')
	for _, c := range b {
		s.WriteString(`\x`)
		s.WriteByte("0123456789abcdef"[c>>4])
		s.WriteByte("0123456789abcdef"[c&15])
	}
	s.WriteByte('"')
	return s.String()
}
