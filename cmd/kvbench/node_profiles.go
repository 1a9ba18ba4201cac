package main

// Node CPU profiles (--node-profiles): the embedded nodes serve
// /debug/pprof/ ([admin] pprof = true) and, during the recorded part of
// the tail and overload scenarios, kvbench takes one CPU profile of every
// node at once and writes it under --out/profiles/<path>/. What a stage
// histogram says is slow, a profile of the same seconds says what the
// cores were doing: how the two-core machine's CPU splits between the
// leader, the followers and kvbench itself (--cpuprofile).

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

const (
	// nodeProfileSecondsMax bounds one profile's length (the phase's
	// recorded part, at most this).
	nodeProfileSecondsMax = 60
	// nodeProfileBytesMax bounds one profile file.
	nodeProfileBytesMax = 64 << 20
	// nodeProfileSlack is how long past its length a profile may take to
	// arrive before kvbench gives up on it.
	nodeProfileSlack = 10 * time.Second
)

// nodeProfiles is one phase's profiles being taken.
type nodeProfiles struct {
	wg    sync.WaitGroup
	mu    sync.Mutex
	files []string
	errs  []string
}

// startNodeProfiles profiles every node of c for the recorded part of a
// phase (after warmup, for d) when o.NodeProfiles is set; nil otherwise.
// wait returns the files written and the nodes that gave none.
func startNodeProfiles(ctx context.Context, o *Options, c *cluster, scenario string, warmup, d time.Duration) *nodeProfiles {
	if !o.NodeProfiles || len(c.admins) == 0 {
		return nil
	}
	secs := min(max(int(d/time.Second), 1), nodeProfileSecondsMax)
	dir := filepath.Join(o.OutDir, "profiles", c.path.Name)
	np := &nodeProfiles{}
	for i, addr := range c.admins {
		np.wg.Add(1)
		go func() {
			defer np.wg.Done()
			t := time.NewTimer(warmup)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			file := filepath.Join(dir, fmt.Sprintf("%s-node%d.pprof", scenario, i+1))
			err := fetchProfile(ctx, addr, secs, file)
			np.mu.Lock()
			defer np.mu.Unlock()
			if err != nil {
				np.errs = append(np.errs, fmt.Sprintf("node%d: %v", i+1, err))
				return
			}
			np.files = append(np.files, file)
		}()
	}
	return np
}

// wait waits for the profiles (nil-safe).
func (np *nodeProfiles) wait() (files, errs []string) {
	if np == nil {
		return nil, nil
	}
	np.wg.Wait()
	return np.files, np.errs
}

// fetchProfile writes admin's CPU profile of the next secs seconds to file.
func fetchProfile(ctx context.Context, admin string, secs int, file string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+nodeProfileSlack)
	defer cancel()
	resp, err := adminGet(ctx, admin, fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs)) // metrics_scrape.go
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := os.MkdirAll(filepath.Dir(file), 0o750); err != nil {
		return err
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, io.LimitReader(resp.Body, nodeProfileBytesMax+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > nodeProfileBytesMax {
		err = fmt.Errorf("profile over %d bytes", nodeProfileBytesMax)
	}
	return err
}

// writeProfileList lists the node profiles each phase wrote, and the nodes
// that gave none.
func writeProfileList(w io.Writer, r *Report) {
	for _, p := range r.Paths {
		for _, s := range allScenarios {
			ph := p.Phases[s]
			if ph == nil || len(ph.NodeProfiles)+len(ph.NodeProfileErrors) == 0 {
				continue
			}
			fmt.Fprintf(w, "  %s %s: %d node CPU profile(s) in %s (`go tool pprof -top KVNODE FILE`)\n",
				p.Name, s, len(ph.NodeProfiles), filepath.Dir(firstOr(ph.NodeProfiles, "-")))
			for _, e := range ph.NodeProfileErrors {
				fmt.Fprintf(w, "    no profile: %s\n", e)
			}
		}
	}
}

func firstOr(s []string, def string) string {
	if len(s) == 0 {
		return def
	}
	return s[0]
}
