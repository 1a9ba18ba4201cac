package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"synod/kv/client"
)

// Backup harness settings (bounds, not speed assertions).
const (
	backupAdminToken  = "e2e-backup-admin-token-0123456789"
	backupSecret      = "e2e5d7f9e1a3c5b7d9f1e3a5c7b9d1f3e5a7c9b1d3f5e7a9c1b3d5f7e9a1c3b5d7"
	backupWritersN    = 4
	backupWriteBefore = 1500 * time.Millisecond // writes before the save starts
	backupWriteAfter  = 500 * time.Millisecond  // writes after it ended
	backupCmdTimeout  = 2 * time.Minute
)

// newAdminTokenCluster writes the configs of an n-node cluster whose admin
// endpoints need backupAdminToken, with cluster id clusterID and the
// cluster secret secret; it starts nothing.
func newAdminTokenCluster(t *testing.T, n, clusterID int, secret, prefix string) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), secrets: map[int]string{}}
	mode := c.pmemDir(prefix)
	for i := 1; i <= n; i++ {
		c.nodes = append(c.nodes, &node{id: i, adminToken: backupAdminToken,
			client:    fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			consensus: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			admin:     fmt.Sprintf("127.0.0.1:%d", freePort(t))})
		c.secrets[i] = secret
	}
	for _, nd := range c.nodes {
		top := fmt.Sprintf("fault_injection = true\naccel = %q\n", nodeAccel(nd.id))
		c.writeConfig(nd, clusterID, mode, top, fmt.Sprintf("[admin]\ntoken = %q\n", backupAdminToken), []tenant{tenantA, tenantB})
	}
	t.Cleanup(func() { c.stopAll(true) })
	return c
}

func (c *cluster) admins(first *node) string {
	eps := []string{first.admin}
	for _, nd := range c.nodes {
		if nd != first {
			eps = append(eps, nd.admin)
		}
	}
	return strings.Join(eps, ",")
}

// runTool runs bin with args and returns its combined output.
func runTool(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), backupCmdTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}

var slotLine = regexp.MustCompile(`(?m)^slot:\s+(\d+)$`)

// TestBackupRestoreNewCluster: kvctl snapshot save on a live 3-node
// cluster under writes; kvnode restore of every member of a new 3-node
// cluster (another cluster id and secret) from the file; the new cluster
// holds every write acknowledged before the save began (each writer's keys
// form a gap-free prefix that reaches at least its last acknowledged write
// then), its applied slot reaches the file's, and it serves writes. Then
// kvctl status on the new cluster: the leader's view shows its followers'
// real roles, slots and lag, and a stopped member unreachable.
func TestBackupRestoreNewCluster(t *testing.T) {
	kvctlBin := kvctlBinary(t)
	src := newAdminTokenCluster(t, 3, 11, e2eClusterSecret, "synod-e2e-backup-src-")
	for _, nd := range src.nodes {
		src.start(nd)
	}
	leader := src.leader()

	// Writers: each puts w<i>-<n> for n = 0, 1, 2, ... one at a time, so
	// its acknowledged writes are a prefix of its sequence.
	var (
		stop    atomic.Bool
		wg      sync.WaitGroup
		acked   [backupWritersN]atomic.Int64 // highest n acknowledged, -1 none
		started [backupWritersN]atomic.Int64 // highest n sent
		werr    atomic.Value
	)
	for w := 0; w < backupWritersN; w++ {
		acked[w].Store(-1)
		started[w].Store(-1)
		cl := dialClient(t, src.endpoints(), tenantA.token, killClientRetries)
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := int64(0); !stop.Load(); n++ {
				started[w].Store(n)
				ctx, cancel := ctxTimeout(killOpTimeout * 2)
				err := cl.Put(ctx, []byte(fmt.Sprintf("w%d-%06d", w, n)), []byte(fmt.Sprint(n)))
				cancel()
				if err != nil {
					werr.CompareAndSwap(nil, fmt.Errorf("writer %d, write %d: %w", w, n, err))
					return
				}
				acked[w].Store(n)
			}
		}()
	}
	time.Sleep(backupWriteBefore)

	// The save, through a follower first (409: it moves on to the leader).
	var ackedBefore [backupWritersN]int64
	for w := range ackedBefore {
		ackedBefore[w] = acked[w].Load()
	}
	st, err := src.status(leader)
	if err != nil {
		t.Fatal(err)
	}
	appliedBefore := st.Applied
	follower := src.other(leader)
	// The backup is an operator's: without the admin token, 401.
	if code, err := adminCall(leader, http.MethodGet, "/snapshot", "", nil); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("GET /snapshot without the admin token: %d %v", code, err)
	}
	file := filepath.Join(t.TempDir(), "cluster11.backup")
	out, err := runTool(t, kvctlBin, "snapshot", "save", file, "--admin", src.admins(follower), "--admin-token", backupAdminToken)
	if err != nil {
		t.Fatalf("kvctl snapshot save: %v\n%s", err, out)
	}
	var startedAfter [backupWritersN]int64
	for w := range startedAfter {
		startedAfter[w] = started[w].Load()
	}
	time.Sleep(backupWriteAfter)
	stop.Store(true)
	wg.Wait()
	if err := werr.Load(); err != nil {
		t.Fatal(err)
	}
	out, err = runTool(t, kvctlBin, "snapshot", "status", file)
	if err != nil || !strings.Contains(out, "cluster:    11") || !strings.Contains(out, "members:    [1 2 3]") {
		t.Fatalf("kvctl snapshot status: %v\n%s", err, out)
	}
	t.Logf("kvctl snapshot status:\n%s", out)
	m := slotLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no slot in:\n%s", out)
	}
	fileSlot, _ := strconv.ParseUint(m[1], 10, 64)
	if fileSlot < appliedBefore {
		t.Fatalf("the backup's slot %d is below the leader's applied slot %d when the save began", fileSlot, appliedBefore)
	}
	// The old cluster is done with.
	for _, nd := range src.nodes {
		src.kill(nd)
	}

	// The new cluster: other ports, cluster id and secret.
	dst := newAdminTokenCluster(t, 3, 12, backupSecret, "synod-e2e-backup-dst-")
	// A config that kept the old cluster id is refused, and creates nothing.
	n1 := dst.nodes[0]
	dst.writeConfig(n1, 11, pmemModeOf(dst), "", "", []tenant{tenantA})
	if out, err := runTool(t, kvnodeBin, "restore", "--from", file, "--config", n1.cfgPath); err == nil || !strings.Contains(out, "needs a new id") {
		t.Fatalf("restore with the old cluster id: %v\n%s", err, out)
	}
	dst.writeConfig(n1, 12, pmemModeOf(dst), fmt.Sprintf("fault_injection = true\naccel = %q\n", nodeAccel(1)),
		fmt.Sprintf("[admin]\ntoken = %q\n", backupAdminToken), []tenant{tenantA, tenantB})
	for _, nd := range dst.nodes {
		out, err := runTool(t, kvnodeBin, "restore", "--from", file, "--config", nd.cfgPath, "--cluster-id", "12")
		if err != nil {
			t.Fatalf("kvnode restore of node %d: %v\n%s", nd.id, err, out)
		}
		if nd.id == 1 {
			t.Logf("kvnode restore:\n%s", out)
		}
	}
	if out, err := runTool(t, kvnodeBin, "restore", "--from", file, "--config", n1.cfgPath); err == nil || !strings.Contains(out, "not empty") {
		t.Fatalf("a second restore into node 1's data_dir: %v\n%s", err, out)
	}
	for _, nd := range dst.nodes {
		dst.start(nd)
	}
	newLeader := dst.leader()
	if st, err := dst.status(newLeader); err != nil || st.Applied < fileSlot {
		t.Fatalf("the new leader's status %+v (%v): applied below the backup's slot %d", st, err, fileSlot)
	}

	// Every write acknowledged before the save is there; each writer's keys
	// are a prefix of its sequence (nothing after a gap).
	cl := dialClient(t, dst.endpoints(), tenantA.token, killClientRetries)
	defer cl.Close()
	ctx, cancel := ctxTimeout(killFinalReadLimit)
	defer cancel()
	total := 0
	for w := 0; w < backupWritersN; w++ {
		prefix := fmt.Sprintf("w%d-", w)
		keys := scanAll(t, ctx, cl, prefix)
		for i, k := range keys {
			if k != fmt.Sprintf("%s%06d", prefix, i) {
				t.Fatalf("writer %d: key %d is %q: a gap in an acknowledged sequence", w, i, k)
			}
		}
		last := int64(len(keys)) - 1
		if last < ackedBefore[w] {
			t.Fatalf("writer %d: the restored cluster holds writes 0..%d, but 0..%d were acknowledged before the save", w, last, ackedBefore[w])
		}
		if last > startedAfter[w] {
			t.Fatalf("writer %d: the restored cluster holds write %d, sent only after the save ended (%d)", w, last, startedAfter[w])
		}
		total += len(keys)
	}
	// It serves writes.
	for i := 0; i < 20; i++ {
		if err := cl.Put(ctx, []byte(fmt.Sprint("after-restore-", i)), []byte("x")); err != nil {
			t.Fatalf("write on the restored cluster: %v", err)
		}
	}
	if v, err := cl.Get(ctx, []byte("after-restore-19")); err != nil || string(v) != "x" {
		t.Fatalf("read back on the restored cluster: %q %v", v, err)
	}
	// Every check above is fatal, so reaching this line means nothing
	// acknowledged before the save is missing: lost=0.
	fmt.Printf("e2e backup: slot=%d applied_at_save_start=%d keys=%d restored=ok new_cluster_writes=ok lost=0\n",
		fileSlot, appliedBefore, total)
	t.Logf("acknowledged before the save, per writer: %v", ackedBefore)

	// kvctl status from the new leader's view.
	eps := strings.Join(dst.endpoints(), ",")
	statusOut := func() string {
		out, err := runTool(t, kvctlBin, "--endpoints", eps, "--token", tenantA.token, "status")
		if err != nil {
			t.Fatalf("kvctl status: %v\n%s", err, out)
		}
		return out
	}
	waitRows(t, "healthy cluster", statusOut, func(rows map[int][]string) error {
		for _, nd := range dst.nodes {
			r := rows[nd.id]
			want := "follower"
			if nd == newLeader {
				want = "leader"
			}
			if len(r) < 10 || r[2] != want || r[4] == "?" || r[len(r)-1] != "true" {
				return fmt.Errorf("node %d row %q (want role %s, a commit slot, reachable)", nd.id, r, want)
			}
		}
		return nil
	})
	var down *node
	for _, nd := range dst.nodes {
		if nd != newLeader {
			down = nd
		}
	}
	dst.kill(down)
	for i := 0; i < 20; i++ {
		if err := cl.Put(ctx, []byte(fmt.Sprint("after-kill-", i)), []byte("x")); err != nil {
			t.Fatalf("write with one member down: %v", err)
		}
	}
	rows := waitRows(t, "a stopped member", statusOut, func(rows map[int][]string) error {
		r := rows[down.id]
		if len(r) < 10 || r[len(r)-1] != "false" || r[2] != "?" || r[6] == "0" || r[6] == "?" {
			return fmt.Errorf("stopped node %d row %q (want unreachable, role ?, a lag in slots)", down.id, r)
		}
		return nil
	})
	t.Logf("status: stopped member %d: %q", down.id, rows[down.id])
}

// pmemModeOf is the pmem mode of c's acceptor logs (pmemDir chose it).
func pmemModeOf(c *cluster) string {
	if c.pdir != c.dir {
		return "shm"
	}
	return "msync"
}

// scanAll lists the keys starting with prefix.
func scanAll(t *testing.T, ctx context.Context, cl *client.Client, prefix string) []string {
	t.Helper()
	var keys []string
	start := []byte(prefix)
	end := []byte(prefix[:len(prefix)-1] + string(rune(prefix[len(prefix)-1]+1)))
	for {
		pairs, more, err := cl.Scan(ctx, start, end, 1000)
		if err != nil {
			t.Fatalf("scan %s: %v", prefix, err)
		}
		for _, p := range pairs {
			keys = append(keys, string(p.Key))
		}
		if !more || len(pairs) == 0 {
			return keys
		}
		start = append(bytes.Clone(pairs[len(pairs)-1].Key), 0)
	}
}

// waitRows runs kvctl status (out) until ok accepts its member rows (by
// node id: the fields of the row), or fails after leaderTimeout.
func waitRows(t *testing.T, what string, out func() string, ok func(map[int][]string) error) map[int][]string {
	t.Helper()
	deadline := time.Now().Add(leaderTimeout)
	for {
		text := out()
		rows := map[int][]string{}
		for _, line := range strings.Split(text, "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			if id, err := strconv.Atoi(f[0]); err == nil {
				// "12ms ago" is two fields: join it back.
				for i := 1; i < len(f); i++ {
					if f[i] == "ago" {
						f[i-1] += " ago"
						f = append(f[:i], f[i+1:]...)
						break
					}
				}
				rows[id] = f
			}
		}
		err := ok(rows)
		if err == nil {
			t.Logf("kvctl status, %s:\n%s", what, text)
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvctl status, %s: %v\n%s", what, err, text)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
