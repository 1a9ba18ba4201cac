package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Authenticated consensus with real processes: nodes that do not share a
// cluster secret do not form a cluster (and say why, in a rate-limited log
// line), and a cluster rotates its secret under load, node by node, with
// no downtime and nothing lost.

var (
	secretX = strings.Repeat("1a", 32)
	secretY = strings.Repeat("2b", 32)
	secretZ = strings.Repeat("3c", 32)
)

const (
	mismatchWatch         = 3 * time.Second
	authLogLinesPerSecMax = 2 // the refusal line is rate-limited to one a second
)

// TestMismatchedSecretsDoNotForm: three nodes, each with its own secret,
// never elect a leader; each refuses the others' packets and logs so, at
// most about once a second. Then two of them share a secret: those two
// form a cluster, and the third still cannot join it.
func TestMismatchedSecretsDoNotForm(t *testing.T) {
	c := newClusterWith(t, 3, "", nil, func(c *cluster) {
		c.secrets = map[int]string{1: secretX, 2: secretY, 3: secretZ}
	})
	deadline := time.Now().Add(mismatchWatch)
	for time.Now().Before(deadline) {
		for _, nd := range c.nodes {
			if st, err := c.status(nd); err == nil && st.Role == "leader" {
				t.Fatalf("node %d became leader although no two nodes share a secret", nd.id)
			}
		}
		time.Sleep(statusPollEvery)
	}
	for _, nd := range c.nodes {
		lines := strings.Count(readLog(nd), "failed authentication")
		if lines == 0 {
			t.Errorf("node %d never logged that it refused packets failing authentication", nd.id)
		}
		if max := int(mismatchWatch/time.Second+1) * authLogLinesPerSecMax; lines > max {
			t.Errorf("node %d logged %d refusal lines in %v: not rate-limited", nd.id, lines, mismatchWatch)
		}
	}
	// Nodes 1 and 2 now share secret X: they form a cluster; node 3
	// (secret Z) stays out.
	c.secrets[2] = secretX
	c.kill(c.nodes[1])
	c.nodes[1].rewrite()
	c.start(c.nodes[1])
	l := c.leader()
	if l.id == 3 {
		t.Fatal("node 3, with another secret, leads")
	}
	cl := dialClient(t, c.endpoints(c.nodes[0], c.nodes[1]), tenantA.token, killClientRetries)
	defer cl.Close()
	ctx, cancel := ctxTimeout(killOpTimeout)
	defer cancel()
	if err := cl.Put(ctx, []byte("formed"), []byte("1")); err != nil {
		t.Fatalf("the two nodes that share a secret cannot serve a write: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	if st, err := c.status(c.nodes[2]); err == nil && (st.Leader == uint64(l.id) || st.Applied > 0) {
		t.Fatalf("node 3, with another secret, follows the cluster: %+v", st)
	}
	fmt.Printf("e2e auth: mismatched secrets formed=false; shared pair formed=true leader=%d outsider_applied=0\n", l.id)
}

// TestSecretRotationUnderLoad rotates the cluster secret from X to Y while
// clients write and read, restarting one node at a time (SIGTERM, new
// config, start) in three rounds: accept Y beside X, seal with Y and still
// accept X, then Y alone. The cluster keeps serving throughout, the history
// is linearizable and nothing acknowledged is lost.
func TestSecretRotationUnderLoad(t *testing.T) {
	c := newClusterWith(t, 3, "", nil, func(c *cluster) {
		c.secrets = map[int]string{1: secretX, 2: secretX, 3: secretX}
		c.accepted = map[int][]string{}
	})
	c.leader()
	h := newHistory()
	load := startChains(t, h, c.endpoints(), 0)
	defer load.halt()
	steps := []struct {
		name     string
		secret   string
		accepted []string
	}{
		{"accept Y beside X", secretX, []string{secretY}},
		{"seal with Y, accept X", secretY, []string{secretX}},
		{"Y alone", secretY, nil},
	}
	restarts := 0
	for _, step := range steps {
		for _, nd := range c.nodes {
			time.Sleep(300 * time.Millisecond)
			c.secrets[nd.id] = step.secret
			c.accepted[nd.id] = step.accepted
			if err := c.term(nd); err != nil {
				t.Fatalf("%s: node %d: %v", step.name, nd.id, err)
			}
			nd.rewrite()
			c.start(nd)
			restarts++
			c.leader()
		}
		t.Logf("rotation step %q done; %d chain ops so far", step.name, load.ops.Load())
	}
	time.Sleep(300 * time.Millisecond)
	load.halt()
	c.leader()
	final := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer final.Close()
	lost := load.finalCheck(final)
	wrong := load.wrongAnswers()
	for _, w := range wrong {
		t.Errorf("wrong answer: %s", w)
	}
	disagree, at := load.replicasAgree(c)
	for _, d := range disagree {
		t.Errorf("replicas disagree at applied slot %d: %s", at, d)
	}
	res := h.check(restartCheckTimeout)
	fmt.Printf("e2e auth rotation: steps=%d restarts=%d ops=%d wrong_answers=%d linearizable=%v lost=%d replicas_disagree=%d\n",
		len(steps), restarts, load.ops.Load(), len(wrong), res == porcupine.Ok, lost, len(disagree))
	if res != porcupine.Ok {
		t.Errorf("history of %d ops is not linearizable", len(h.ops))
	}
	for _, nd := range c.nodes {
		if strings.Count(readLog(nd), "failed authentication") > 0 {
			t.Errorf("node %d refused packets during a rotation that should never refuse any", nd.id)
		}
	}
}
