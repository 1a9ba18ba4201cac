package e2e

import (
	"fmt"
	"testing"
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
	for _, nd := range c.nodes {
		if err := c.term(nd); err != nil {
			t.Fatal(err)
		}
	}
	for _, nd := range c.nodes {
		c.start(nd)
	}
	c.leader()
	cl = dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer cl.Close()
	for i := 0; i < n; i++ {
		v, err := cl.Get(ctx, []byte(fmt.Sprintf("t%03d", i)))
		if err != nil || string(v) != fmt.Sprint(i) {
			t.Fatalf("after SIGTERM and restart, t%03d = %q, %v", i, v, err)
		}
	}
}
