package raftpath

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/rs/zerolog"

	"synod/internal/kvmodel"
	"synod/kv/client"
	"synod/kv/proto"
	"synod/kv/server"
	"synod/tenants"
)

const (
	testToken       = "raftpath-test-token"
	testTick        = 10 * time.Millisecond
	testOpTimeout   = 5 * time.Second
	testWaitMax     = 20 * time.Second
	testCheckTimout = time.Minute
)

// testNode is one in-process node with its client server.
type testNode struct {
	id       uint64
	dir      string
	raftAddr string
	cliAddr  string
	n        *Node
	srv      *server.Server
}

type testCluster struct {
	t     *testing.T
	peers []Peer
	nodes []*testNode
	reg   *tenants.Registry
	snapN uint64
	keepN uint64
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func newTestCluster(t *testing.T, size int, snapEntries, keep uint64) *testCluster {
	t.Helper()
	reg, err := tenants.NewRegistry([]tenants.Spec{{ID: 1, Name: "t1", Token: testToken}})
	if err != nil {
		t.Fatal(err)
	}
	c := &testCluster{t: t, reg: reg, snapN: snapEntries, keepN: keep}
	root := t.TempDir()
	for i := 1; i <= size; i++ {
		tn := &testNode{id: uint64(i), dir: filepath.Join(root, fmt.Sprint(i)), raftAddr: freeAddr(t), cliAddr: freeAddr(t)}
		c.nodes = append(c.nodes, tn)
		c.peers = append(c.peers, Peer{ID: tn.id, Addr: tn.raftAddr, ClientAddr: tn.cliAddr})
	}
	for _, tn := range c.nodes {
		c.start(tn)
	}
	t.Cleanup(func() {
		for _, tn := range c.nodes {
			c.stop(tn)
		}
	})
	return c
}

func (c *testCluster) start(tn *testNode) {
	c.t.Helper()
	n, err := Open(Config{ID: tn.id, Peers: c.peers, DataDir: tn.dir, Tick: testTick, ElectionTicks: 10,
		HeartbeatTicks: 1, SnapshotEntries: c.snapN, KeepEntries: c.keepN, Log: zerolog.Nop()})
	if err != nil {
		c.t.Fatalf("open node %d: %v", tn.id, err)
	}
	ln, err := net.Listen("tcp", tn.cliAddr)
	if err != nil {
		c.t.Fatal(err)
	}
	tn.n = n
	tn.srv = server.New(server.Config{RequestTimeout: testOpTimeout}, c.reg, NewBackend(n), zerolog.Nop())
	go tn.srv.Serve(ln)
}

func (c *testCluster) stop(tn *testNode) {
	if tn.n == nil {
		return
	}
	tn.srv.Close()
	if err := tn.n.Close(); err != nil {
		c.t.Errorf("close node %d: %v", tn.id, err)
	}
	tn.n = nil
}

func (c *testCluster) endpoints() []string {
	var eps []string
	for _, tn := range c.nodes {
		eps = append(eps, tn.cliAddr)
	}
	return eps
}

func (c *testCluster) leader() *testNode {
	c.t.Helper()
	deadline := time.Now().Add(testWaitMax)
	for time.Now().Before(deadline) {
		for _, tn := range c.nodes {
			if tn.n != nil && tn.n.IsLeader() {
				return tn
			}
		}
		time.Sleep(testTick)
	}
	c.t.Fatal("no leader elected")
	return nil
}

func (c *testCluster) dial() *client.Client {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testWaitMax)
	defer cancel()
	cl, err := client.Dial(ctx, c.endpoints(), testToken, client.Options{RetriesMax: 60,
		BackoffBase: 2 * time.Millisecond, BackoffMax: 50 * time.Millisecond, DialTimeout: 300 * time.Millisecond,
		RequestTimeout: testOpTimeout})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

func TestClusterCommitsAndReads(t *testing.T) {
	c := newTestCluster(t, 3, 0, 0)
	c.leader()
	cl := c.dial()
	ctx := context.Background()
	for i := range 50 {
		if err := cl.Put(ctx, fmt.Appendf(nil, "k%d", i), fmt.Appendf(nil, "v%d", i)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	for i := range 50 {
		v, err := cl.Get(ctx, fmt.Appendf(nil, "k%d", i))
		if err != nil || string(v) != fmt.Sprintf("v%d", i) {
			t.Fatalf("get k%d = %q, %v", i, v, err)
		}
	}
	if _, err := cl.Get(ctx, []byte("absent")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get absent: %v, want not found", err)
	}
	if err := cl.CAS(ctx, []byte("k1"), []byte("wrong"), []byte("x")); !errors.Is(err, client.ErrCASMismatch) {
		t.Fatalf("cas with a wrong expectation: %v", err)
	}
	st, err := cl.Status(ctx)
	if err != nil || st.LeaderID == 0 || len(st.Members) != 3 {
		t.Fatalf("status %+v, %v", st, err)
	}
	// A follower refuses writes and linearizable reads, naming the leader.
	lead := c.leader()
	for _, tn := range c.nodes {
		if tn == lead {
			continue
		}
		be := NewBackend(tn.n)
		for _, req := range []*proto.Request{
			{Op: proto.OpPut, Tenant: 1, ClientID: 9, Seq: 1, FirstUnacked: 1, Key: []byte("x"), Value: []byte("y")},
			{Op: proto.OpGet, Tenant: 1, Key: []byte("k1")},
		} {
			resp := be.Do(ctx, 1, req)
			if resp.Status != proto.StatusNotLeader || resp.Leader != lead.cliAddr {
				t.Fatalf("follower %d answered %v %v leader %q, want NOT_LEADER naming %s", tn.id, req.Op, resp.Status, resp.Leader, lead.cliAddr)
			}
		}
		// A stale-ok read is served locally.
		if resp := be.Do(ctx, 1, &proto.Request{Op: proto.OpGet, Flags: proto.FlagStaleOK, Tenant: 1, Key: []byte("k1")}); resp.Status != proto.StatusOK && resp.Status != proto.StatusNotFound {
			t.Fatalf("stale read on follower: %v", resp.Status)
		}
	}
	// Every replica applies the same writes.
	want := lead.n.Applied()
	for _, tn := range c.nodes {
		waitApplied(t, tn, want)
		v, ok, err := tn.n.SM().Get(1, []byte("k49"))
		if err != nil || !ok || string(v) != "v49" {
			t.Fatalf("node %d holds k49=%q ok=%v err=%v", tn.id, v, ok, err)
		}
	}
}

func waitApplied(t *testing.T, tn *testNode, idx uint64) {
	t.Helper()
	deadline := time.Now().Add(testWaitMax)
	for tn.n.Applied() < idx {
		if time.Now().After(deadline) {
			t.Fatalf("node %d applied %d, want %d", tn.id, tn.n.Applied(), idx)
		}
		time.Sleep(testTick)
	}
}

// TestLeaderKillRestartLinearizable runs clients while the leader is
// stopped, checks a new leader takes over, restarts the old leader (which
// must catch up, by snapshot since the log was compacted), and checks the
// porcupine history and that no acknowledged write was lost.
func TestLeaderKillRestartLinearizable(t *testing.T) {
	c := newTestCluster(t, 3, 40, 5)
	c.leader()
	h := &history{start: time.Now()}
	var (
		wg      sync.WaitGroup
		stop    atomic.Bool
		ackedMu sync.Mutex
		acked   []string
	)
	const workers, sharedKeys = 4, 4
	for w := range workers {
		cl := c.dial()
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for n := 0; !stop.Load(); n++ {
				key := fmt.Sprintf("s%d", rng.IntN(sharedKeys))
				ctx, cancel := context.WithTimeout(context.Background(), testOpTimeout)
				call := h.now()
				if rng.IntN(2) == 0 {
					val := fmt.Sprintf("w%d-%d", w, n)
					err := cl.Put(ctx, []byte(key), []byte(val))
					ret := h.now()
					if err != nil {
						ret = pendingReturn
					}
					h.add(w, kvmodel.Input{Put: true, Key: key, Value: val}, call, ret, kvmodel.Output{})
					uk := fmt.Sprintf("u%d-%d", w, n)
					if cl.Put(ctx, []byte(uk), []byte("1")) == nil {
						ackedMu.Lock()
						acked = append(acked, uk)
						ackedMu.Unlock()
					}
				} else {
					v, err := cl.Get(ctx, []byte(key))
					ret := h.now()
					switch {
					case err == nil:
						h.add(w, kvmodel.Input{Key: key}, call, ret, kvmodel.Output{Found: true, Value: string(v)})
					case errors.Is(err, client.ErrNotFound):
						h.add(w, kvmodel.Input{Key: key}, call, ret, kvmodel.Output{})
					}
				}
				cancel()
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	old := c.leader()
	oldChanges := totalLeaderChanges(c)
	c.stop(old)
	time.Sleep(300 * time.Millisecond)
	newLead := c.leader()
	if newLead == old {
		t.Fatal("the stopped node is still the leader")
	}
	time.Sleep(700 * time.Millisecond) // writes under the new leader compact its log past the old node
	c.start(old)
	time.Sleep(500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	lead := c.leader()
	waitApplied(t, old, lead.n.Applied())
	if old.n.SnapshotsRestored() == 0 {
		t.Errorf("the restarted node caught up without a snapshot; the test meant to exercise MsgSnap")
	}
	// The leader compacted its log (else there was no snapshot to send):
	// SnapshotsTaken counts it and the time it took.
	if n, took := lead.n.SnapshotsTaken(); n == 0 || took <= 0 {
		t.Errorf("the leader compacted its log but SnapshotsTaken says %d snapshots in %v", n, took)
	}
	if totalLeaderChanges(c) <= oldChanges {
		t.Errorf("no leader change counted")
	}

	res := h.check(testCheckTimout)
	if res != porcupine.Ok {
		t.Fatalf("history of %d operations is not linearizable: %v", len(h.ops), res)
	}
	cl := c.dial()
	for _, k := range acked {
		if _, err := cl.Get(context.Background(), []byte(k)); err != nil {
			t.Fatalf("acknowledged write %s lost: %v", k, err)
		}
		// The restarted node holds it too.
		if _, ok, err := old.n.SM().Get(1, []byte(k)); !ok || err != nil {
			t.Fatalf("restarted node %d lacks acknowledged write %s (ok=%v err=%v)", old.id, k, ok, err)
		}
	}
	fmt.Printf("raftpath: leader kill+restart: ops=%d acked-unique=%d linearizable=yes lost=0\n", len(h.ops), len(acked))
}

func totalLeaderChanges(c *testCluster) uint64 {
	var n uint64
	for _, tn := range c.nodes {
		if tn.n != nil {
			n += tn.n.LeaderChanges()
		}
	}
	return n
}

// TestRestartRecoversFromWAL stops every node and starts them again: the
// data must come back from WAL + state machine.
func TestRestartRecoversFromWAL(t *testing.T) {
	c := newTestCluster(t, 3, 30, 5)
	c.leader()
	cl := c.dial()
	ctx := context.Background()
	for i := range 100 {
		if err := cl.Put(ctx, fmt.Appendf(nil, "k%d", i), fmt.Appendf(nil, "v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	cl.Close()
	for _, tn := range c.nodes {
		c.stop(tn)
	}
	for _, tn := range c.nodes {
		c.start(tn)
	}
	c.leader()
	cl = c.dial()
	for i := range 100 {
		v, err := cl.Get(ctx, fmt.Appendf(nil, "k%d", i))
		if err != nil || string(v) != fmt.Sprintf("v%d", i) {
			t.Fatalf("after restart get k%d = %q, %v", i, v, err)
		}
	}
}

// --- linearizability history (model: internal/kvmodel, as e2e's) ---

// pendingReturn marks a write whose outcome the client never learned.
const pendingReturn = math.MaxInt64

type history struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
}

func (h *history) now() int64 { return int64(time.Since(h.start)) }

func (h *history) add(client int, in kvmodel.Input, call, ret int64, out kvmodel.Output) {
	h.mu.Lock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	h.mu.Unlock()
}

func (h *history) check(timeout time.Duration) porcupine.CheckResult {
	h.mu.Lock()
	defer h.mu.Unlock()
	return porcupine.CheckOperationsTimeout(kvmodel.Model, h.ops, timeout)
}

// TestCheckerCatchesStaleRead plants a stale read in a history and shows
// the checker rejects it.
func TestCheckerCatchesStaleRead(t *testing.T) {
	h := &history{}
	h.add(0, kvmodel.Input{Put: true, Key: "a", Value: "1"}, 0, 10, kvmodel.Output{})
	h.add(1, kvmodel.Input{Put: true, Key: "a", Value: "2"}, 20, 30, kvmodel.Output{})
	h.add(2, kvmodel.Input{Key: "a"}, 40, 50, kvmodel.Output{Found: true, Value: "1"}) // stale
	if h.check(time.Second) == porcupine.Ok {
		t.Fatal("a stale read passed the checker")
	}
	h.ops = h.ops[:2]
	h.add(2, kvmodel.Input{Key: "a"}, 40, 50, kvmodel.Output{Found: true, Value: "2"})
	if h.check(time.Second) != porcupine.Ok {
		t.Fatal("a correct history failed the checker")
	}
}
