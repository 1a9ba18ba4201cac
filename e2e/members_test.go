package e2e

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"synod/internal/kvmodel"
	"synod/kv/client"
)

// Membership harness settings (bounds and pacing, not speed assertions).
const (
	memberLoadStep   = 400 * time.Millisecond // load between two steps of a scenario
	memberCmdTimeout = "60s"                  // kvctl --timeout of one membership command
	memberCheckLimit = 3 * time.Minute        // porcupine
	memberClusterID  = 11
	memberPmemPrefix = "synod-e2e-members-"
)

// memberLoad is the client load of the membership scenarios: killWorkers
// clients put and get shared keys (into a porcupine history) and put keys
// of their own (each acknowledged one must read back at the end), against
// every endpoint of the cluster, until stop.
type memberLoad struct {
	t       *testing.T
	h       *history
	stopC   chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	acked   []string
	ops     atomic.Int64
	clients []*client.Client
}

func startMemberLoad(t *testing.T, eps []string) *memberLoad {
	l := &memberLoad{t: t, h: newHistory(), stopC: make(chan struct{})}
	for w := 0; w < killWorkers; w++ {
		cl := dialClient(t, eps, tenantA.token, killClientRetries)
		l.clients = append(l.clients, cl)
		l.wg.Add(1)
		go l.worker(w, cl)
	}
	t.Cleanup(l.stop)
	return l
}

func (l *memberLoad) worker(w int, cl *client.Client) {
	defer l.wg.Done()
	rng := rand.New(rand.NewPCG(uint64(w), 7))
	for n := 0; ; n++ {
		select {
		case <-l.stopC:
			return
		default:
		}
		ctx, cancel := ctxTimeout(killOpTimeout)
		switch x := rng.IntN(10); {
		case x < 4:
			in := kvmodel.Input{Put: true, Key: fmt.Sprintf("k%d", rng.IntN(killSharedKeys)), Value: fmt.Sprintf("w%d-%d", w, n)}
			call := l.h.now()
			err := cl.Put(ctx, []byte(in.Key), []byte(in.Value))
			ret := l.h.now()
			if err != nil {
				ret = pendingReturn
			}
			l.h.add(w, in, call, ret, kvmodel.Output{})
		case x < 8:
			in := kvmodel.Input{Key: fmt.Sprintf("k%d", rng.IntN(killSharedKeys))}
			call := l.h.now()
			v, err := cl.Get(ctx, []byte(in.Key))
			ret := l.h.now()
			switch {
			case err == nil:
				l.h.add(w, in, call, ret, kvmodel.Output{Found: true, Value: string(v)})
			case errors.Is(err, client.ErrNotFound):
				l.h.add(w, in, call, ret, kvmodel.Output{})
			}
		default:
			in := kvmodel.Input{Put: true, Key: fmt.Sprintf("u/%d/%d", w, n), Value: "1"}
			call := l.h.now()
			err := cl.Put(ctx, []byte(in.Key), []byte(in.Value))
			ret := l.h.now()
			if err != nil {
				ret = pendingReturn
			} else {
				l.mu.Lock()
				l.acked = append(l.acked, in.Key)
				l.mu.Unlock()
			}
			l.h.add(w, in, call, ret, kvmodel.Output{})
		}
		cancel()
		l.ops.Add(1)
	}
}

func (l *memberLoad) stop() {
	select {
	case <-l.stopC:
		return
	default:
	}
	close(l.stopC)
	l.wg.Wait()
	for _, cl := range l.clients {
		cl.Close()
	}
}

// finish stops the load, reads every shared key into the history through
// eps and every acknowledged own key back; it returns whether the history
// is linearizable and how many acknowledged writes were lost.
func (l *memberLoad) finish(eps []string) (linearizable bool, lost int) {
	t := l.t
	l.stop()
	final := dialClient(t, eps, tenantA.token, killClientRetries)
	defer final.Close()
	deadline := time.Now().Add(killFinalReadLimit)
	for k := 0; k < killSharedKeys; k++ {
		in := kvmodel.Input{Key: fmt.Sprintf("k%d", k)}
		for {
			ctx, cancel := ctxTimeout(killOpTimeout)
			call := l.h.now()
			v, err := final.Get(ctx, []byte(in.Key))
			ret := l.h.now()
			cancel()
			if err == nil {
				l.h.add(killWorkers+1, in, call, ret, kvmodel.Output{Found: true, Value: string(v)})
				break
			}
			if errors.Is(err, client.ErrNotFound) {
				l.h.add(killWorkers+1, in, call, ret, kvmodel.Output{})
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("final read of %s: %v", in.Key, err)
			}
		}
	}
	lost = lostWrites(t, final, l.acked)
	res := l.h.check(memberCheckLimit)
	if res != porcupine.Ok {
		path, err := l.h.visualize(memberCheckLimit)
		t.Errorf("history of %d ops is not linearizable (porcupine: %v); view: %s (%v)", len(l.h.ops), res, path, err)
	}
	return res == porcupine.Ok, lost
}

// newMemberCluster writes the configs of an n-node cluster whose nodes
// hold an [admin] token (the membership commands need it) and starts it.
func newMemberCluster(t *testing.T, n int) *cluster {
	c := newAdminTokenCluster(t, n, memberClusterID, e2eClusterSecret, memberPmemPrefix)
	for _, nd := range c.nodes {
		c.start(nd)
	}
	return c
}

// prepareNode adds node id to c with fresh ports and writes its config
// (every node of c as a peer, itself included); it starts nothing. The
// configs of the nodes already there are left as they are: they name only
// the bootstrap peers, as an operator's would.
func (c *cluster) prepareNode(id int) *node {
	t := c.t
	nd := &node{id: id, adminToken: backupAdminToken,
		client:    fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		consensus: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		admin:     fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	c.nodes = append(c.nodes, nd)
	mode := "msync"
	if c.pdir != c.dir {
		mode = "shm"
	}
	top := fmt.Sprintf("fault_injection = true\naccel = %q\n", nodeAccel(nd.id))
	c.writeConfig(nd, memberClusterID, mode, top, fmt.Sprintf("[admin]\ntoken = %q\n", backupAdminToken), []tenant{tenantA, tenantB})
	return nd
}

// startJoining starts nd with kvnode --join (an empty data dir).
func (c *cluster) startJoining(nd *node) {
	c.t.Helper()
	c.launch(nd, exec.Command(kvnodeBin, "--config", nd.cfgPath, "--join"))
}

// wipe deletes nd's data: its state machine and acceptor log.
func (c *cluster) wipe(nd *node) {
	c.t.Helper()
	for _, p := range []string{filepath.Join(c.dir, fmt.Sprintf("data%d", nd.id)), filepath.Join(c.pdir, fmt.Sprintf("n%d.pmem", nd.id))} {
		if err := os.RemoveAll(p); err != nil {
			c.t.Fatal(err)
		}
	}
}

// kvctlMember runs `kvctl member ARGS` (the real binary) through the given
// nodes' client endpoints with the admin token, and fails the test unless
// it succeeds. It returns the command's output.
func (c *cluster) kvctlMember(bin string, via []*node, args ...string) string {
	c.t.Helper()
	full := append([]string{"member"}, args...)
	full = append(full, "--endpoints", strings.Join(c.endpoints(via...), ","), "--token", tenantA.token,
		"--admin-token", backupAdminToken, "--timeout", memberCmdTimeout)
	out, err := runTool(c.t.(*testing.T), bin, full...)
	if err != nil {
		c.t.Fatalf("kvctl %s: %v\n%s", strings.Join(full, " "), err, out)
	}
	c.t.Logf("kvctl member %s:\n%s", strings.Join(args, " "), out)
	return out
}

var memberRow = regexp.MustCompile(`(?m)^(\d+)\s+(voter|learner)`)

// parseMembers returns the voters and learners of a `kvctl member` table.
func parseMembers(out string) (voters, learners []int) {
	for _, m := range memberRow.FindAllStringSubmatch(out, -1) {
		id, _ := strconv.Atoi(m[1])
		if m[2] == "voter" {
			voters = append(voters, id)
		} else {
			learners = append(learners, id)
		}
	}
	return voters, learners
}

// wantMembers fails the test unless `kvctl member list` through via shows
// exactly voters and no learner.
func (c *cluster) wantMembers(bin string, via []*node, voters []int) {
	c.t.Helper()
	out := c.kvctlMember(bin, via, "list")
	v, l := parseMembers(out)
	if !slices.Equal(v, voters) || len(l) != 0 {
		c.t.Fatalf("kvctl member list: voters %v learners %v, want voters %v\n%s", v, l, voters, out)
	}
}

// TestReplaceDeadNode is the operator's headline scenario, under load: a
// 3-node cluster loses node 3 for good (SIGKILL, data deleted); a fresh
// node 4 is started with --join, added with `kvctl member add` (a
// learner), promoted with `kvctl member promote --wait` once it has caught
// up, and node 3 is removed with `kvctl member remove 3`, while clients
// keep writing and reading. Nothing acknowledged is lost and the history
// is linearizable. Then the whole cluster restarts (the configs of nodes 1
// and 2 still name node 3): the membership committed in the log (1, 2, 4)
// is the one in force, and the cluster serves. Last, `kvctl member
// transfer-leadership` hands leadership to another voter (the rolling
// restart's first step).
func TestReplaceDeadNode(t *testing.T) {
	kvctl := kvctlBinary(t)
	c := newMemberCluster(t, 3)
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	n4 := c.prepareNode(4)
	c.leader()
	load := startMemberLoad(t, c.endpoints(n1, n2, n3, n4))
	time.Sleep(memberLoadStep)

	c.kill(n3)
	c.wipe(n3)
	c.startJoining(n4)
	time.Sleep(memberLoadStep)
	c.kvctlMember(kvctl, []*node{n1, n2}, "add", "4", n4.consensus, n4.client)
	time.Sleep(memberLoadStep)
	c.kvctlMember(kvctl, []*node{n1, n2}, "promote", "4", "--wait")
	c.kvctlMember(kvctl, []*node{n1, n2, n4}, "remove", "3")
	time.Sleep(memberLoadStep)
	c.wantMembers(kvctl, []*node{n1, n2, n4}, []int{1, 2, 4})

	lin, lost := load.finish(c.endpoints(n1, n2, n4))
	fmt.Printf("e2e replace: added=1 removed=1 ops=%d linearizable=%v lost=%d\n", len(load.h.ops), lin, lost)
	if lost != 0 {
		t.Fatalf("%d acknowledged writes lost", lost)
	}
	if t.Failed() {
		return
	}

	// A whole-cluster restart keeps the committed membership.
	for _, nd := range []*node{n1, n2, n4} {
		if err := c.term(nd); err != nil {
			t.Fatal(err)
		}
	}
	for _, nd := range []*node{n1, n2, n4} {
		c.start(nd)
	}
	c.leader()
	c.wantMembers(kvctl, []*node{n1, n2, n4}, []int{1, 2, 4})
	probe := dialClient(t, c.endpoints(n1, n2, n4), tenantA.token, killClientRetries)
	defer probe.Close()
	ctx, cancel := ctxTimeout(killOpTimeout)
	defer cancel()
	if err := probe.Put(ctx, []byte("after-restart"), []byte("1")); err != nil {
		t.Fatalf("a write after the whole-cluster restart: %v", err)
	}
	if lost := lostWrites(t, probe, load.acked); lost != 0 {
		t.Fatalf("%d acknowledged writes lost across the restart", lost)
	}
	fmt.Printf("e2e restart after membership change: members=1,2,4 kept=true\n")

	// Rolling restart: hand leadership to another voter first.
	l := c.leader()
	to := n4
	if l == n4 {
		to = n1
	}
	out := c.kvctlMember(kvctl, []*node{n1, n2, n4}, "transfer-leadership", "--to", strconv.Itoa(to.id))
	if !strings.HasPrefix(out, fmt.Sprintf("leader %d,", to.id)) {
		t.Fatalf("after transfer-leadership --to %d:\n%s", to.id, out)
	}
	// The listing is the new leader's: its own row has its commit index,
	// not "?" (the old leader, now a follower, knows nobody's).
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == strconv.Itoa(to.id) && strings.Contains(line, "(leader)") && strings.Contains(line, "?") {
			t.Fatalf("after transfer-leadership --to %d, the new leader's row is unknown:\n%s", to.id, out)
		}
	}
	if nl := c.leader(); nl != to {
		t.Fatalf("node %d leads after the transfer to %d", nl.id, to.id)
	}
	c.accelTotals() // fails the test on an accel commit mismatch
}

// TestGrowShrinkUnderLeaderKills grows a 3-node cluster to 5 and back to 3
// under load, with the leader SIGKILLed (and restarted) between the
// changes: add 4, promote 4, add 5, promote 5, kill the leader, remove 5,
// kill the leader, remove 4. Every change goes through the real kvctl.
// Nothing acknowledged is lost and the history is linearizable.
func TestGrowShrinkUnderLeaderKills(t *testing.T) {
	kvctl := kvctlBinary(t)
	c := newMemberCluster(t, 3)
	n4, n5 := c.prepareNode(4), c.prepareNode(5)
	c.leader()
	all := c.nodes
	load := startMemberLoad(t, c.endpoints(all...))
	time.Sleep(memberLoadStep)

	changes, kills := 0, 0
	running := func() []*node {
		var out []*node
		for _, nd := range all {
			if nd.running() {
				out = append(out, nd)
			}
		}
		return out
	}
	member := func(args ...string) {
		c.kvctlMember(kvctl, running(), args...)
		changes++
		time.Sleep(memberLoadStep)
	}
	killLeader := func() {
		l := c.leader()
		c.kill(l)
		kills++
		nl := c.leader(l)
		c.start(l) // same data: it follows the log's membership
		st, err := c.status(nl)
		if err != nil {
			t.Fatal(err)
		}
		c.waitCaughtUp(l, st.Commit)
		t.Logf("killed leader %d, new leader %d, node %d caught up to %d", l.id, nl.id, l.id, st.Commit)
		time.Sleep(memberLoadStep)
	}
	for _, nd := range []*node{n4, n5} {
		c.startJoining(nd)
		member("add", strconv.Itoa(nd.id), nd.consensus, nd.client)
		member("promote", strconv.Itoa(nd.id), "--wait")
	}
	c.wantMembers(kvctl, running(), []int{1, 2, 3, 4, 5})
	killLeader()
	member("remove", "5")
	killLeader()
	member("remove", "4")
	c.wantMembers(kvctl, running(), []int{1, 2, 3})

	c.accelTotals() // fails the test on an accel commit mismatch
	lin, lost := load.finish(c.endpoints(c.nodes[:3]...))
	fmt.Printf("e2e membership: changes=%d kills=%d linearizable=%v lost=%d\n", changes, kills, lin, lost)
	if lost != 0 {
		t.Fatalf("%d acknowledged writes lost", lost)
	}
}
