package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"synod/internal/kvmodel"
	"synod/kv/client"
)

// Workload of the leader-kill checks (loopback and namespace clusters).
const (
	killWorkers        = 4
	killSharedKeys     = 8
	killOpTimeout      = 8 * time.Second
	killClientRetries  = 60
	killClientBackoff  = 100 * time.Millisecond
	killProbeAttempts  = 200
	killFinalReadLimit = 20 * time.Second
)

// leaderKills configures one run of leaderKillWorkload.
type leaderKills struct {
	rounds       int
	seed         uint64        // second PCG seed of every worker's generator
	loadPerRound time.Duration // load before each kill
	// restart starts a killed node again and waits until it serves.
	restart func(nd *node)
	// describe is appended to a node's id in the per-round log line
	// ("" for nothing).
	describe func(nd *node) string
	// paused, if set, runs before each kill with every client paused
	// between operations (no operation in flight) on the leader about to
	// be killed; the load then resumes for loadPerRound/5 before the kill.
	paused func(leader *node)
}

// leaderKillRun is what leaderKillWorkload leaves for its caller's checks.
type leaderKillRun struct {
	h     *history
	kills int
	acked int // unique puts acknowledged (each read back at the end)
	lost  int // acknowledged unique puts that did not read back
}

// leaderKillWorkload runs killWorkers clients that put and get shared keys
// and put unique keys while, lk.rounds times, the leader is SIGKILLed, a
// new leader must serve a write (recorded in the history too), and the
// killed node restarts and catches up. Then every shared key is read into
// the history and every acknowledged unique put must read back (each one
// that does not is a t.Errorf and counts in lost). The caller checks the
// history. It fails t when a round cannot complete.
func leaderKillWorkload(t *testing.T, c *cluster, lk leaderKills) leaderKillRun {
	h := newHistory()
	stop := make(chan struct{})
	var (
		wg      sync.WaitGroup
		ackedMu sync.Mutex
		acked   []string // unique keys whose put was acknowledged
		opsDone atomic.Int64
		gate    sync.RWMutex // clients hold it for reading per operation
	)
	for w := 0; w < killWorkers; w++ {
		cl := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), lk.seed))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				gate.RLock()
				ctx, cancel := ctxTimeout(killOpTimeout)
				switch x := rng.IntN(10); {
				case x < 4: // put on a shared key
					in := kvmodel.Input{Put: true, Key: fmt.Sprintf("k%d", rng.IntN(killSharedKeys)), Value: fmt.Sprintf("w%d-%d", w, n)}
					call := h.now()
					err := cl.Put(ctx, []byte(in.Key), []byte(in.Value))
					ret := h.now()
					if err != nil {
						ret = pendingReturn // outcome unknown
					}
					h.add(w, in, call, ret, kvmodel.Output{})
				case x < 8: // linearizable get on a shared key
					in := kvmodel.Input{Key: fmt.Sprintf("k%d", rng.IntN(killSharedKeys))}
					call := h.now()
					v, err := cl.Get(ctx, []byte(in.Key))
					ret := h.now()
					switch {
					case err == nil:
						h.add(w, in, call, ret, kvmodel.Output{Found: true, Value: string(v)})
					case errors.Is(err, client.ErrNotFound):
						h.add(w, in, call, ret, kvmodel.Output{})
					} // other errors: the read had no effect; drop it
				default: // put on a key of its own, read back at the end
					in := kvmodel.Input{Put: true, Key: fmt.Sprintf("u/%d/%d", w, n), Value: "1"}
					call := h.now()
					err := cl.Put(ctx, []byte(in.Key), []byte(in.Value))
					ret := h.now()
					if err != nil {
						ret = pendingReturn
					} else {
						ackedMu.Lock()
						acked = append(acked, in.Key)
						ackedMu.Unlock()
					}
					h.add(w, in, call, ret, kvmodel.Output{})
				}
				cancel()
				gate.RUnlock()
				opsDone.Add(1)
			}
		}()
	}
	// Stop the workers on every exit path (t.Fatal included) before the
	// deferred client closes run.
	stopped := false
	stopWorkers := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopWorkers()

	probe := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer probe.Close()
	kills := 0
	for round := 1; round <= lk.rounds; round++ {
		l := c.leader()
		before := opsDone.Load()
		time.Sleep(lk.loadPerRound)
		if lk.paused != nil {
			gate.Lock()
			lk.paused(l)
			gate.Unlock()
			time.Sleep(lk.loadPerRound / 5) // load resumes before the kill
		}
		c.kill(l)
		kills++
		nl := c.leader(l)
		// A new leader serves writes (recorded in the history too).
		in := kvmodel.Input{Put: true, Key: fmt.Sprintf("probe%d", round), Value: "p"}
		ok := probeWrite(h, in, func(ctx context.Context) error {
			return probe.Put(ctx, []byte(in.Key), []byte(in.Value))
		})
		if !ok {
			t.Fatalf("round %d: no write succeeded after killing node %d (new leader %d)", round, l.id, nl.id)
		}
		lk.restart(l)
		st, err := c.status(nl)
		if err != nil {
			t.Fatalf("round %d: status of the new leader: %v", round, err)
		}
		c.waitCaughtUp(l, st.Commit)
		t.Logf("round %d: killed leader %d%s, new leader %d%s, node %d caught up to %d; %d ops this round",
			round, l.id, lk.describe(l), nl.id, lk.describe(nl), l.id, st.Commit, opsDone.Load()-before)
	}
	time.Sleep(lk.loadPerRound)
	stopWorkers()

	// Final linearizable reads of every shared key join the history, then
	// every acknowledged unique write must read back.
	final := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer final.Close()
	deadline := time.Now().Add(killFinalReadLimit)
	for k := 0; k < killSharedKeys; k++ {
		in := kvmodel.Input{Key: fmt.Sprintf("k%d", k)}
		for {
			ctx, cancel := ctxTimeout(killOpTimeout)
			call := h.now()
			v, err := final.Get(ctx, []byte(in.Key))
			ret := h.now()
			cancel()
			if err == nil {
				h.add(killWorkers+1, in, call, ret, kvmodel.Output{Found: true, Value: string(v)})
				break
			}
			if errors.Is(err, client.ErrNotFound) {
				h.add(killWorkers+1, in, call, ret, kvmodel.Output{})
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("final read of %s: %v", in.Key, err)
			}
		}
	}
	lost := lostWrites(t, final, acked)
	return leaderKillRun{h: h, kills: kills, acked: len(acked), lost: lost}
}

// lostWrites reads every key of acked through cl and counts (and reports
// with t.Errorf) those that do not read back.
func lostWrites(t *testing.T, cl *client.Client, acked []string) int {
	t.Helper()
	lost := 0
	for _, k := range acked {
		ctx, cancel := ctxTimeout(killOpTimeout)
		_, err := cl.Get(ctx, []byte(k))
		cancel()
		if err != nil {
			lost++
			t.Errorf("acknowledged write of %s lost: %v", k, err)
		}
	}
	return lost
}

// dialClient connects a client to eps with the leader-kill workload's
// timeouts and retries times.
func dialClient(t testing.TB, eps []string, token string, retries int) *client.Client {
	t.Helper()
	ctx, cancel := ctxTimeout(10 * time.Second)
	defer cancel()
	cl, err := client.Dial(ctx, eps, token, client.Options{
		RetriesMax: retries, BackoffBase: 2 * time.Millisecond, BackoffMax: killClientBackoff,
		DialTimeout: 500 * time.Millisecond, RequestTimeout: killOpTimeout,
	})
	if err != nil {
		t.Fatalf("dial %v: %v", eps, err)
	}
	return cl
}
