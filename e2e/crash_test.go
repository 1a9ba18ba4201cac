package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestWholeClusterCrash SIGKILLs every node at once under load, twice.
// Pebble runs without a WAL, so each node loses its unflushed state; the
// acknowledged writes must come back from the PMem acceptor logs (phase 1
// of the next leader re-chooses them) and read back.
func TestWholeClusterCrash(t *testing.T) {
	c := newCluster(t, 3)
	var (
		mu    sync.Mutex
		acked []string
	)
	for round := 0; round < 2; round++ {
		c.leader()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := 0; w < 2; w++ {
			cl := dialClient(t, c.endpoints(), tenantA.token, 3)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer cl.Close()
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					k := fmt.Sprintf("crash/%d/%d/%d", round, w, n)
					ctx, cancel := ctxTimeout(2 * time.Second)
					if err := cl.Put(ctx, []byte(k), []byte("1")); err == nil {
						mu.Lock()
						acked = append(acked, k)
						mu.Unlock()
					}
					cancel()
				}
			}()
		}
		time.Sleep(2 * killLoadPerRound)
		for _, nd := range c.nodes {
			nd.cmd.Process.Kill() // all at once, before waiting for any
		}
		for _, nd := range c.nodes {
			c.kill(nd)
		}
		close(stop)
		wg.Wait()
		for _, nd := range c.nodes {
			c.start(nd)
		}
	}
	c.leader()
	cl := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer cl.Close()
	lost := lostWrites(t, cl, acked)
	if len(acked) == 0 {
		t.Fatal("no write was acknowledged")
	}
	fmt.Printf("e2e: whole-cluster crash rounds=2 acked=%d lost=%d\n", len(acked), lost)
}
