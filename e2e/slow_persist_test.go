package e2e

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"synod/kv/client"
)

// slowPersistDelay is the injected delay of the leader's persist: well
// past the harness's election timeout (150 ticks of 1 ms), so a leader
// whose heartbeats waited behind it would be replaced.
const slowPersistDelay = time.Second

// TestSlowLeaderPersist delays one persist on the leader (POST
// /debug/faults delay_persist) by more than the election timeout while
// writers keep going: the leader's own writes are persisted off the
// consensus loop (kv/replica persister.go), so it keeps sending
// heartbeats and renewing its lease and no follower campaigns; the writes
// wait (a leader delivers a slot only once its own copy is durable) and
// then every acknowledged one is there.
func TestSlowLeaderPersist(t *testing.T) {
	c := newCluster(t, 3)
	cl := warmClient(t, c)
	ld := c.leader()
	w := watchLeadership(t, c, ld)

	c.fault(ld, url.Values{"delay_persist": {slowPersistDelay.String()}})

	// Writers, each on its own keys, for twice the delay.
	const writers = 4
	var (
		mu      sync.Mutex
		acked   []string
		slowest time.Duration
		wg      sync.WaitGroup
	)
	until := time.Now().Add(2 * slowPersistDelay)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; time.Now().Before(until); i++ {
				k := fmt.Sprintf("slow%d-%d", w, i)
				start := time.Now()
				ctx, cancel := ctxTimeout(killOpTimeout)
				err := cl.Put(ctx, []byte(k), []byte(k))
				cancel()
				if err != nil {
					continue // outcome unknown: not counted as acknowledged
				}
				took := time.Since(start)
				mu.Lock()
				acked = append(acked, k)
				slowest = max(slowest, took)
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	changes := w.stop()

	lost := lostSelfKeyed(t, cl, acked)
	fmt.Printf("e2e slow persist: delay_ms=%d leader_changes=%d acked=%d lost=%d slowest_ack_ms=%d\n",
		slowPersistDelay.Milliseconds(), changes, len(acked), lost, slowest.Milliseconds())
	if changes != 0 {
		t.Errorf("the leader changed during a slow persist: %s", w)
	}
	if len(acked) == 0 {
		t.Fatal("no write was acknowledged")
	}
	// The delay was taken: a write waited for it (the leader delivers a
	// slot only once its own acceptance is durable), and the leader
	// logged it.
	if slowest < slowPersistDelay/2 {
		t.Errorf("the slowest write took %v: the injected delay of %v was not exercised", slowest, slowPersistDelay)
	}
	if b, err := os.ReadFile(ld.logPath); err == nil && !bytes.Contains(b, []byte("delaying this persist")) {
		t.Error("the leader did not log the injected persist delay")
	}
	c.accelTotals() // the plane agreed with software throughout
}

// lostSelfKeyed reads back every acknowledged key, whose value is the key
// itself, through cl, reports each one missing or wrong, and counts them.
func lostSelfKeyed(t *testing.T, cl *client.Client, acked []string) (lost int) {
	t.Helper()
	for _, k := range acked {
		ctx, cancel := ctxTimeout(killOpTimeout)
		v, err := cl.Get(ctx, []byte(k))
		cancel()
		if err != nil || !bytes.Equal(v, []byte(k)) {
			lost++
			t.Errorf("acknowledged write %s: read %q, %v", k, v, err)
		}
	}
	return lost
}

// leadershipWatch polls every node's view of the leader and its promised
// ballot until stopped (the slow persist and apply-stall drills).
type leadershipWatch struct {
	c       *cluster
	t       testing.TB
	ld      *node
	done    chan struct{}
	wg      sync.WaitGroup
	ballots map[[2]uint64]bool
	leaders map[uint64]bool
	role    string // ld's role when the watch stopped
}

// watchLeadership starts watching, ld leading now.
func watchLeadership(t testing.TB, c *cluster, ld *node) *leadershipWatch {
	t.Helper()
	before, err := c.status(ld)
	if err != nil {
		t.Fatal(err)
	}
	w := &leadershipWatch{c: c, t: t, ld: ld, done: make(chan struct{}),
		ballots: map[[2]uint64]bool{before.Promised: true}, leaders: map[uint64]bool{uint64(ld.id): true}}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for {
			select {
			case <-w.done:
				return
			case <-time.After(statusPollEvery):
			}
			for _, nd := range c.nodes {
				if st, err := c.status(nd); err == nil {
					if st.Promised != [2]uint64{} { // a node that has promised nothing yet
						w.ballots[st.Promised] = true
					}
					if st.Leader != 0 {
						w.leaders[st.Leader] = true
					}
				}
			}
		}
	}()
	return w
}

// stop ends the watch and counts the leader changes it saw: ballots
// beyond the first, and at least one if ld no longer leads or another
// node was named leader.
func (w *leadershipWatch) stop() int {
	w.t.Helper()
	close(w.done)
	w.wg.Wait()
	after, err := w.c.status(w.ld)
	if err != nil {
		w.t.Fatal(err)
	}
	w.role = after.Role
	changes := len(w.ballots) - 1
	if after.Role != "leader" || len(w.leaders) != 1 {
		changes = max(changes, len(w.leaders)-1, 1)
	}
	return changes
}

func (w *leadershipWatch) String() string {
	return fmt.Sprintf("ballots %v, leaders %v, node %d now %s", w.ballots, w.leaders, w.ld.id, w.role)
}

// warmClient dials c with the leader-kill workload's timeouts and writes
// once through it, so a leader is elected and serving; the client closes
// with the test.
func warmClient(t *testing.T, c *cluster) *client.Client {
	t.Helper()
	cl := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := ctxTimeout(killOpTimeout)
	defer cancel()
	if err := cl.Put(ctx, []byte("warm"), []byte("up")); err != nil {
		t.Fatal(err)
	}
	return cl
}
