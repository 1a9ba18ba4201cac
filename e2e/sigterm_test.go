package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestSIGTERMKeepsAckedWrites stops every node with SIGTERM (a clean exit,
// code 0), restarts them all and reads back every acknowledged write.
func TestSIGTERMKeepsAckedWrites(t *testing.T) {
	c := newCluster(t, 3)
	cl := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	const n = 200
	ctx, cancel := ctxTimeout(killFinalReadLimit)
	defer cancel()
	for i := 0; i < n; i++ {
		if err := cl.Put(ctx, []byte(fmt.Sprintf("t%03d", i)), []byte(fmt.Sprint(i))); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	cl.Close()
	c.restartAll()
	cl = dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer cl.Close()
	for i := 0; i < n; i++ {
		v, err := cl.Get(ctx, []byte(fmt.Sprintf("t%03d", i)))
		if err != nil || string(v) != fmt.Sprint(i) {
			t.Fatalf("after SIGTERM and restart, t%03d = %q, %v", i, v, err)
		}
	}
}

// TestSIGTERMLeaderUnderLoad stops the leader with SIGTERM while clients
// write, three times: each node exits cleanly (code 0), restarts, and every
// acknowledged write reads back at the end.
func TestSIGTERMLeaderUnderLoad(t *testing.T) {
	c := newCluster(t, 3)
	stop := make(chan struct{})
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		acked []string
	)
	for w := 0; w < 2; w++ {
		cl := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("term/%d/%d", w, n)
				ctx, cancel := ctxTimeout(killOpTimeout)
				if err := cl.Put(ctx, []byte(k), []byte("1")); err == nil {
					mu.Lock()
					acked = append(acked, k)
					mu.Unlock()
				}
				cancel()
			}
		}()
	}
	for round := 0; round < 3; round++ {
		l := c.leader()
		time.Sleep(killLoadPerRound)
		if err := c.term(l); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		nl := c.leader(l)
		c.start(l)
		if st, err := c.status(nl); err == nil {
			c.waitCaughtUp(l, st.Commit)
		}
	}
	close(stop)
	wg.Wait()
	cl := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer cl.Close()
	lost := lostWrites(t, cl, acked)
	if len(acked) == 0 {
		t.Fatal("no write was acknowledged")
	}
	fmt.Printf("e2e: sigterm leader restarts=3 acked=%d lost=%d\n", len(acked), lost)
}
