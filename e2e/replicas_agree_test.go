package e2e

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"synod/kv/client"
)

// Replica agreement: after a chain load halts, every node's state machine
// must hold the same value for every chain's key once they have applied
// the same slot. The chains' own checks see only what the leader answers;
// a follower whose state machine diverged shows here before it ever leads
// (once in CI, 2026-12-07, a node that led after a restart answered from a
// key 259 acknowledged writes old).

// agreeWaitMax bounds the wait for every node to reach the same applied
// slot after the load halted.
const agreeWaitMax = 20 * time.Second

// replicasAgree waits until every node of c reports the same applied slot,
// then reads each chain's key from each node (STALE_OK: a node's own state
// machine) and returns the disagreements, and the slot they were read at.
func (l *chainLoad) replicasAgree(c *cluster) (disagree []string, slot uint64) {
	deadline := time.Now().Add(agreeWaitMax)
	for {
		var applied []uint64
		for _, nd := range c.nodes {
			if st, err := c.status(nd); err == nil {
				applied = append(applied, st.Applied)
			}
		}
		if len(applied) == len(c.nodes) && slices.Min(applied) == slices.Max(applied) {
			slot = applied[0]
			break
		}
		if time.Now().After(deadline) {
			return []string{fmt.Sprintf("the nodes never reached the same applied slot within %v: %v", agreeWaitMax, applied)}, 0
		}
		time.Sleep(statusPollEvery)
	}
	held := map[string]map[string]string{} // node -> key -> value
	for _, nd := range c.nodes {
		name := fmt.Sprintf("node %d", nd.id)
		held[name] = map[string]string{}
		ctx, cancel := ctxTimeout(probeWrongTimeout)
		cl, err := client.Dial(ctx, c.endpoints(nd), tenantA.token, client.Options{RetriesMax: 1, RequestTimeout: probeWrongTimeout})
		if err != nil {
			cancel()
			disagree = append(disagree, fmt.Sprintf("%s: dial: %v", name, err))
			continue
		}
		for _, ch := range l.chains {
			v, err := cl.GetStale(ctx, []byte(ch.key))
			switch {
			case err == nil:
				held[name][ch.key] = fmt.Sprintf("%q", v)
			case errors.Is(err, client.ErrNotFound):
				held[name][ch.key] = "absent"
			default:
				held[name][ch.key] = "error: " + err.Error()
			}
		}
		cl.Close()
		cancel()
	}
	return append(disagree, disagreements(held)...), slot
}

// disagreements lists every key whose value differs between nodes, from
// held (node -> key -> value).
func disagreements(held map[string]map[string]string) []string {
	var nodes []string
	keys := map[string]bool{}
	for n, kv := range held {
		nodes = append(nodes, n)
		for k := range kv {
			keys[k] = true
		}
	}
	slices.Sort(nodes)
	var out []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		var vals []string
		same := true
		for _, n := range nodes {
			v, ok := held[n][k]
			if !ok {
				v = "(not read)"
			}
			if len(vals) > 0 && v != held[nodes[0]][k] {
				same = false
			}
			vals = append(vals, n+" "+v)
		}
		if !same {
			out = append(out, fmt.Sprintf("%s differs: %v", k, vals))
		}
	}
	return out
}

// TestDisagreementsCatchesPlantedDivergence: the agreement check's
// comparison finds one node's value planted different, and nothing in
// agreeing states.
func TestDisagreementsCatchesPlantedDivergence(t *testing.T) {
	held := map[string]map[string]string{
		"node 1": {"chain/0": `"c0-9"`, "chain/1": "absent"},
		"node 2": {"chain/0": `"c0-9"`, "chain/1": "absent"},
		"node 3": {"chain/0": `"c0-9"`, "chain/1": "absent"},
	}
	if d := disagreements(held); len(d) != 0 {
		t.Fatalf("agreeing states reported: %v", d)
	}
	held["node 2"]["chain/0"] = `"c0-3"` // planted: one node's key behind
	d := disagreements(held)
	if len(d) != 1 {
		t.Fatalf("planted divergence: %v, want one disagreement", d)
	}
	delete(held["node 3"], "chain/1") // a key one node was not read for
	if d := disagreements(held); len(d) != 2 {
		t.Fatalf("a key not read on one node: %v, want it reported too", d)
	}
	fmt.Printf("replica agreement check: planted divergence caught=%v\n", len(d) == 1)
}
