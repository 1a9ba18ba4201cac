package main

// The overload scenario's victims in a process of their own.
//
// A victim tenant is another service than the flood's: in production its
// requests leave another process, usually another machine. Run inside
// kvbench beside the flood's generator (20,000 requests a second and as
// many THROTTLED answers on this 2-core VM), the victims' requests waited
// for the generator's own goroutines before they were sent: its schedule
// lag reached 58 ms, and a victim's P99 at the client was 112 ms while the
// nodes served it in under 20 ms. So by default kvbench runs the victims
// in a child (`kvbench victims`), which the kernel schedules as it would
// any other client process; --victims-inline keeps them in kvbench's
// process, as before, to compare.
//
// Parent and child speak JSON lines over the child's stdin and stdout:
// the parent sends a victimSpec, the child dials the cluster, writes the
// victims' keys and answers victimReady; then for each victimPhase the
// parent sends, the child runs the victims' load once and answers a
// victimRun. The child exits when its stdin closes. Each line is bounded
// (victimLineBytesMax) and checked.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"synod/bench/load"
	"synod/kv/client"
)

// victimLineBytesMax bounds one line between kvbench and its victims'
// child: a run's answer holds a few histograms of about 50,000 counts.
const victimLineBytesMax = 64 << 20

// victimSpec is what the child needs to run the victims' load.
type victimSpec struct {
	Endpoints   []string      `json:"endpoints"`
	CritToken   string        `json:"crit_token"`
	StdToken    string        `json:"std_token"`
	Rate        float64       `json:"rate"` // both victims together
	ReadRatio   float64       `json:"read_ratio"`
	ValueBytes  int           `json:"value_bytes"`
	Warmup      time.Duration `json:"warmup_ns"`
	Duration    time.Duration `json:"duration_ns"`
	Concurrency int           `json:"concurrency"`
	Seed        uint64        `json:"seed"`
}

// victimReady is the child's answer to its spec.
type victimReady struct {
	Error string `json:"error,omitempty"`
}

// victimPhase asks the child for one run of the victims' load.
type victimPhase struct {
	Name string `json:"name"` // "quiet" or "flood": only for its messages
}

// victimRun is one run's answer: the load's figures and the requests
// that ended THROTTLED, by report tenant.
type victimRun struct {
	Error     string                          `json:"error,omitempty"`
	Result    load.WireResult                 `json:"result"`
	Throttled [overloadTenantsCount + 1]int64 `json:"throttled"`
}

// victimsMain is `kvbench victims`: the child's side.
func victimsMain(in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), victimLineBytesMax)
	enc := json.NewEncoder(out)
	if !sc.Scan() {
		return fmt.Errorf("victims: no spec: %v", sc.Err())
	}
	var spec victimSpec
	if err := json.Unmarshal(sc.Bytes(), &spec); err != nil {
		return fmt.Errorf("victims: spec: %w", err)
	}
	if err := spec.check(); err != nil {
		return enc.Encode(victimReady{Error: err.Error()})
	}
	ctx := context.Background()
	o := &Options{ReadRatio: spec.ReadRatio}
	value := victimValue(spec.ValueBytes)
	crit, err := dialTenant(ctx, spec.Endpoints, spec.CritToken, client.RetriesMaxDefault)
	if err != nil {
		return enc.Encode(victimReady{Error: fmt.Sprintf("dialing the critical victim: %v", err)})
	}
	defer crit.Close()
	std, err := dialTenant(ctx, spec.Endpoints, spec.StdToken, client.RetriesMaxDefault)
	if err != nil {
		return enc.Encode(victimReady{Error: fmt.Sprintf("dialing the standard victim: %v", err)})
	}
	defer std.Close()
	for _, cl := range []*client.Client{crit, std} {
		if err := writeVictimKeys(ctx, cl, value); err != nil {
			return enc.Encode(victimReady{Error: err.Error()})
		}
	}
	if err := enc.Encode(victimReady{}); err != nil {
		return err
	}
	cfg := load.Config{Rate: spec.Rate, Warmup: spec.Warmup, Duration: spec.Duration, Concurrency: spec.Concurrency,
		Seed: spec.Seed, DrainTimeout: 2 * opTimeout}
	for sc.Scan() {
		var ph victimPhase
		if err := json.Unmarshal(sc.Bytes(), &ph); err != nil {
			return fmt.Errorf("victims: phase: %w", err)
		}
		var thr throttleCounts
		res := load.Run(ctx, cfg, thr.counted(victimPick(o, crit, std, value)))
		run := victimRun{Result: res.Wire()}
		for i := range thr {
			run.Throttled[i] = thr[i].Load()
		}
		if err := enc.Encode(run); err != nil {
			return err
		}
	}
	return sc.Err()
}

// check says what is wrong with a spec the parent sent.
func (s *victimSpec) check() error {
	switch {
	case len(s.Endpoints) == 0:
		return errors.New("no endpoints")
	case s.Rate <= 0 || s.Rate > rateMax:
		return fmt.Errorf("rate %v outside (0, %d]", s.Rate, rateMax)
	case s.ReadRatio < 0 || s.ReadRatio > 1:
		return fmt.Errorf("read ratio %v outside [0, 1]", s.ReadRatio)
	case s.ValueBytes < 1 || s.ValueBytes > valueBytesMax:
		return fmt.Errorf("value bytes %d outside 1..%d", s.ValueBytes, valueBytesMax)
	case s.Duration <= 0 || s.Warmup < 0:
		return fmt.Errorf("duration %v, warm-up %v", s.Duration, s.Warmup)
	case s.Concurrency < 1 || s.Concurrency > concurrencyMax:
		return fmt.Errorf("concurrency %d outside 1..%d", s.Concurrency, concurrencyMax)
	}
	return nil
}

// victimValue is the victims' PUT value of n bytes.
func victimValue(n int) []byte {
	value := make([]byte, n)
	for i := range value {
		value[i] = byte('0' + i%10)
	}
	return value
}

// victimProc is a running victims' child, seen from kvbench.
type victimProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	sc    *bufio.Scanner
	enc   *json.Encoder
	spec  victimSpec
}

// startVictims starts the child, sends it spec and waits until it has
// dialed and written the victims' keys.
func startVictims(spec victimSpec) (*victimProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "victims")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the victims' process: %w", err)
	}
	p := &victimProc{cmd: cmd, stdin: stdin, sc: bufio.NewScanner(stdout), enc: json.NewEncoder(stdin), spec: spec}
	p.sc.Buffer(make([]byte, 64<<10), victimLineBytesMax)
	if err := p.enc.Encode(spec); err != nil {
		p.close()
		return nil, fmt.Errorf("victims' process: sending its spec: %w", err)
	}
	var ready victimReady
	if err := p.read(&ready); err != nil {
		p.close()
		return nil, err
	}
	if ready.Error != "" {
		p.close()
		return nil, fmt.Errorf("victims' process: %s", ready.Error)
	}
	return p, nil
}

// read decodes the child's next line into v.
func (p *victimProc) read(v any) error {
	if !p.sc.Scan() {
		err := p.sc.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("victims' process: %w", err)
	}
	if err := json.Unmarshal(p.sc.Bytes(), v); err != nil {
		return fmt.Errorf("victims' process: its answer: %w", err)
	}
	return nil
}

// run has the child run the victims' load once (about warm-up + duration)
// and returns its figures. progress, when set, is called with the
// fraction of the run's schedule gone by, as load.Run's would be.
//
// The child cannot see ctx: when ctx ends first, the child is killed, and
// run returns ctx's error.
func (p *victimProc) run(ctx context.Context, name string, progress func(float64)) (*load.Result, *throttleCounts, error) {
	if err := p.enc.Encode(victimPhase{Name: name}); err != nil {
		return nil, nil, fmt.Errorf("victims' process: %s: %w", name, err)
	}
	stopKill := context.AfterFunc(ctx, func() { p.cmd.Process.Kill() })
	defer stopKill()
	if progress != nil {
		stop := progressTicker(progress, p.spec.Warmup+p.spec.Duration)
		defer stop()
	}
	var out victimRun
	err := p.read(&out)
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	if err != nil {
		return nil, nil, err
	}
	if out.Error != "" {
		return nil, nil, fmt.Errorf("victims' process: %s: %s", name, out.Error)
	}
	res, err := load.FromWire(out.Result)
	if err != nil {
		return nil, nil, fmt.Errorf("victims' process: %s: %w", name, err)
	}
	var thr throttleCounts
	for i, n := range out.Throttled {
		if n < 0 {
			return nil, nil, fmt.Errorf("victims' process: %s: a negative THROTTLED count", name)
		}
		thr[i].Store(n)
	}
	return res, &thr, nil
}

// close ends the child: its stdin closes and it exits; killed if it has
// not within victimExitWait.
func (p *victimProc) close() {
	p.stdin.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(victimExitWait):
		p.cmd.Process.Kill()
		<-done
	}
}

// victimExitWait is how long a victims' child may take to exit once its
// stdin is closed (its clients close their connections).
const victimExitWait = 5 * time.Second
