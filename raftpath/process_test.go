package raftpath

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"synod/kv/client"
)

// procCluster runs kvnode processes with replication = "raft".
type procCluster struct {
	t     *testing.T
	bin   string
	dir   string
	eps   []string
	cmds  []*exec.Cmd
	confs []string
}

func newProcCluster(t *testing.T, n int) *procCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("builds kvnode and starts processes")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "kvnode")
	build := exec.Command("go", "build", "-o", bin, "synod/cmd/kvnode")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("building kvnode: %v", err)
	}
	c := &procCluster{t: t, bin: bin, dir: dir, cmds: make([]*exec.Cmd, n)}
	raftAddrs := make([]string, n)
	for i := range n {
		c.eps = append(c.eps, freeAddr(t))
		raftAddrs[i] = freeAddr(t)
	}
	for i := range n {
		cfg := fmt.Sprintf("node_id = %d\ndata_dir = %q\nreplication = \"raft\"\nlog_level = \"warn\"\n\n", i+1, filepath.Join(dir, fmt.Sprint(i+1)))
		cfg += fmt.Sprintf("[pmem]\npath = %q\nmode = \"msync\"\n\n", filepath.Join(dir, fmt.Sprintf("unused%d.pmem", i+1)))
		cfg += "[consensus]\ntick = \"5ms\"\n\n[raft]\nsnapshot_entries = 50\n\n"
		for j := range n {
			cfg += fmt.Sprintf("[[peers]]\nid = %d\nconsensus_addr = %q\nclient_addr = %q\n\n", j+1, raftAddrs[j], c.eps[j])
		}
		cfg += fmt.Sprintf("[[tenants]]\nid = 1\nname = \"t\"\ntoken = %q\n", testToken)
		p := filepath.Join(dir, fmt.Sprintf("node%d.toml", i+1))
		if err := os.WriteFile(p, []byte(cfg), 0o640); err != nil {
			t.Fatal(err)
		}
		c.confs = append(c.confs, p)
	}
	for i := range n {
		c.start(i)
	}
	t.Cleanup(func() {
		for i := range c.cmds {
			c.kill(i)
		}
	})
	return c
}

func (c *procCluster) start(i int) {
	c.t.Helper()
	logf, err := os.OpenFile(filepath.Join(c.dir, fmt.Sprintf("node%d.log", i+1)), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o640)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(c.bin, "--config", c.confs[i])
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.cmds[i] = cmd
}

// kill sends SIGKILL: no flush, no clean close.
func (c *procCluster) kill(i int) {
	if c.cmds[i] == nil {
		return
	}
	c.cmds[i].Process.Signal(syscall.SIGKILL)
	c.cmds[i].Wait()
	c.cmds[i] = nil
}

func (c *procCluster) dial(eps []string) *client.Client {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testWaitMax)
	defer cancel()
	for {
		cl, err := client.Dial(ctx, eps, testToken, client.Options{RetriesMax: 60, BackoffBase: 5 * time.Millisecond,
			BackoffMax: 100 * time.Millisecond, DialTimeout: 300 * time.Millisecond, RequestTimeout: testOpTimeout})
		if err == nil {
			c.t.Cleanup(func() { cl.Close() })
			return cl
		}
		if ctx.Err() != nil {
			c.t.Fatalf("dial %v: %v", eps, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leader returns the index of the node that reports itself leader.
func (c *procCluster) leader(cl *client.Client) int {
	c.t.Helper()
	deadline := time.Now().Add(testWaitMax)
	for time.Now().Before(deadline) {
		for i, ep := range c.eps {
			if c.cmds[i] == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			st, err := cl.StatusAt(ctx, ep)
			cancel()
			if err == nil && st.LeaderID != 0 && st.LeaderID == st.Self {
				return i
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatal("no leader")
	return -1
}

func putN(t *testing.T, cl *client.Client, prefix string, n int) []string {
	t.Helper()
	var keys []string
	for i := range n {
		k := fmt.Sprintf("%s-%d", prefix, i)
		// A leader change mid-run answers NOT_LEADER/UNAVAILABLE until the
		// group settles; the put of k=k is idempotent, so retrying it until
		// testWaitMax is safe.
		deadline := time.Now().Add(testWaitMax)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), testOpTimeout)
			err := cl.Put(ctx, []byte(k), []byte(k))
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) || !(errors.Is(err, client.ErrNotLeader) || errors.Is(err, client.ErrUnavailable)) {
				t.Fatalf("put %s: %v", k, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		keys = append(keys, k)
	}
	return keys
}

func checkAll(t *testing.T, cl *client.Client, keys []string, stale bool) {
	t.Helper()
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), testOpTimeout)
		var v []byte
		var err error
		if stale {
			v, err = cl.GetStale(ctx, []byte(k))
		} else {
			v, err = cl.Get(ctx, []byte(k))
		}
		cancel()
		if err != nil || string(v) != k {
			t.Fatalf("acknowledged write %s: got %q, %v", k, v, err)
		}
	}
}

// TestKvnodeRaftSIGKILL runs kvnode with replication = "raft": the leader
// is SIGKILLed (no flush: its Pebble memtable is lost and must be replayed
// from the WAL), a new leader takes writes, the killed node restarts and
// catches up; then every node is SIGKILLed at once and restarted. No
// acknowledged write may be lost at any point.
func TestKvnodeRaftSIGKILL(t *testing.T) {
	c := newProcCluster(t, 3)
	cl := c.dial(c.eps)
	acked := putN(t, cl, "before", 120)
	old := c.leader(cl)
	c.kill(old)
	// Wait for the survivors to elect a leader before writing: on a loaded
	// 2-core machine the election can outlast the client's bounded retries.
	lead := c.leader(cl)
	acked = append(acked, putN(t, cl, "during", 120)...)
	if lead == old {
		t.Fatal("killed node still leads")
	}
	c.start(old)
	acked = append(acked, putN(t, cl, "after", 30)...)
	// The restarted node catches up: its own state (stale reads served
	// locally) holds every acknowledged write.
	solo := c.dial([]string{c.eps[old]})
	deadline := time.Now().Add(testWaitMax)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := solo.GetStale(ctx, []byte(acked[len(acked)-1]))
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarted node %d did not catch up: %v", old+1, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	checkAll(t, solo, acked, true)
	checkAll(t, cl, acked, false)

	for i := range c.cmds {
		c.kill(i)
	}
	for i := range c.cmds {
		c.start(i)
	}
	cl2 := c.dial(c.eps)
	c.leader(cl2)
	checkAll(t, cl2, acked, false)
	fmt.Printf("raftpath: kvnode SIGKILL leader, restart, SIGKILL all: acked=%d lost=0\n", len(acked))
}
