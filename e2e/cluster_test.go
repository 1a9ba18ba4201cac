package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"synod/internal/childproc"
	"synod/internal/testport"
)

// kvnodeBin is the kvnode binary TestMain built.
var kvnodeBin string

func TestMain(m *testing.M) {
	if bin := os.Getenv("E2E_KVNODE"); bin != "" {
		// A prebuilt kvnode (e.g. to run the compiled test binary on
		// another machine).
		kvnodeBin = bin
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "synod-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	kvnodeBin = filepath.Join(dir, "kvnode")
	args := []string{"build", "-o", kvnodeBin}
	if os.Getenv("E2E_RACE") == "1" {
		args = append(args, "-race") // kvnode itself under the race detector
	}
	build := exec.Command("go", append(args, "./cmd/kvnode")...)
	build.Dir = ".."
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building kvnode: %v\n", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// binDir holds the binaries TestMain and plantedKvnode built.
var binDir string

var (
	plantOnce sync.Once
	plantBin  string
	plantErr  error
)

// plantedKvnode returns a kvnode built with the synod_plant tag (built once
// per test process), whose SYNOD_PLANT variable turns on planted bugs
// (cmd/kvnode/plant.go).
func plantedKvnode(t testing.TB) string {
	t.Helper()
	plantOnce.Do(func() {
		dir := binDir
		if dir == "" {
			dir = os.TempDir()
		}
		plantBin = filepath.Join(dir, "kvnode-planted")
		build := exec.Command("go", "build", "-tags", "synod_plant", "-o", plantBin, "./cmd/kvnode")
		build.Dir = ".."
		out, err := build.CombinedOutput()
		if err != nil {
			plantErr = fmt.Errorf("building the planted kvnode: %v\n%s", err, out)
		}
	})
	if plantErr != nil {
		t.Fatal(plantErr)
	}
	return plantBin
}

// Timeouts of the harness (not assertions about speed: a slow machine only
// makes the tests slower, up to these bounds).
const (
	startTimeout    = 30 * time.Second
	leaderTimeout   = 30 * time.Second
	catchUpTimeout  = 60 * time.Second
	statusTimeout   = 500 * time.Millisecond
	statusPollEvery = 20 * time.Millisecond
)

// e2eClusterSecret authenticates the consensus traffic of the test
// clusters (kv/replica/auth.go).
const e2eClusterSecret = "e2e0c3a7b9d1f2e4a6c8b0d2f4e6a8c0b1d3f5e7a9c1b3d5f7e9a1c3b5d7f9e1"

// tenant is one tenant in the generated configs.
type tenant struct {
	id    uint32
	name  string
	token string
	extra string // further TOML keys of its [[tenants]] table
}

var (
	tenantA = tenant{1, "alpha", "alpha-token-0001", ""}
	tenantB = tenant{2, "bravo", "bravo-token-0002", ""}
	// tenantC has a tiny ops budget: the shaper must throttle it.
	tenantC = tenant{3, "charlie", "charlie-token-0003", "ops_per_sec = 5.0\nops_burst = 5.0\n"}
	// tenantBulk is a bulk-priority tenant whose contract is far above what
	// a node can commit; tenantCrit a critical-priority one (the overload
	// attack).
	tenantBulk = tenant{4, "bulkload", "bulk-token-000004", "priority = \"bulk\"\nops_per_sec = 1000000.0\nops_burst = 1000000.0\n"}
	tenantCrit = tenant{5, "critical", "crit-token-000005", "priority = \"critical\"\n"}
)

type node struct {
	// rewrite renders nd's config again with the arguments of the last
	// writeConfig (after the cluster's secrets changed).
	rewrite   func()
	id        int
	cfgPath   string
	logPath   string
	client    string // client address
	resp      string // RESP (Redis protocol) address; "" for none (withRESP)
	consensus string
	admin     string
	// adminToken is the bearer token of nd's admin endpoint ("" for none:
	// a loopback admin address needs none).
	adminToken string
	cmd        *exec.Cmd
	done       chan struct{}
}

// cluster is a group of kvnode processes on loopback.
type cluster struct {
	t     testing.TB
	dir   string
	pdir  string
	nodes []*node
	// bin is the kvnode binary start runs ("" is kvnodeBin) and env the
	// extra environment of its processes (plantedCluster sets both).
	bin string
	env []string
	// consensus is extra [consensus] keys for every node (bigstore: its
	// snapshot_transfer).
	consensus string
	// secrets and accepted override a node's [security] cluster_secret
	// (default e2eClusterSecret) and accepted_secrets; writeConfig reads
	// them.
	secrets  map[int]string
	accepted map[int][]string
	// resp gives every node a resp_listen address (withRESP).
	resp bool
}

// secretOf is nd's cluster secret.
func (c *cluster) secretOf(nd *node) string {
	if s, ok := c.secrets[nd.id]; ok {
		return s
	}
	return e2eClusterSecret
}

// freePort finds a loopback port free for both TCP and UDP (the consensus
// address uses both). It prefers ports below the kernel's ephemeral range:
// a killed node must get its ports back on restart, and a port from the
// ephemeral range may meanwhile have become the source port of some
// outgoing connection.
func freePort(t testing.TB) int { return testport.Free(t) }

// portPickMin is the lowest port the dev cluster's block starts at
// (testport picks from the same floor).
const portPickMin = 20000

func newCluster(t testing.TB, n int) *cluster {
	t.Helper()
	return newClusterWith(t, n, "", nil)
}

// newClusterWith starts n nodes of kvnode binary bin ("" for kvnodeBin)
// with env added to their environment.
func newClusterWith(t testing.TB, n int, bin string, env []string, edits ...func(*cluster)) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), bin: bin, env: env}
	for _, edit := range edits {
		edit(c)
	}
	mode := c.pmemDir("synod-e2e-")
	for i := 1; i <= n; i++ {
		c.nodes = append(c.nodes, &node{
			id:        i,
			client:    fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			consensus: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			admin:     fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		})
		if c.resp {
			c.nodes[i-1].resp = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		}
	}
	for _, nd := range c.nodes {
		top := fmt.Sprintf("fault_injection = true\naccel = %q\n", nodeAccel(nd.id))
		c.writeConfig(nd, 11, mode, top, "", []tenant{tenantA, tenantB, tenantC, tenantBulk, tenantCrit})
	}
	t.Cleanup(func() { c.stopAll(true) })
	for _, nd := range c.nodes {
		c.start(nd)
	}
	return c
}

// loopbackNode is node id with client, consensus and admin addresses on
// loopback ports of its own (freePort).
func loopbackNode(t testing.TB, id int) *node {
	return &node{id: id, client: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		consensus: fmt.Sprintf("127.0.0.1:%d", freePort(t)), admin: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
}

// newSizedLogCluster starts three nodes in dir, serving tenantA, with
// acceptor logs of logBytes (pmem dirs named prefix*), config top-level
// keys top and tables tables (writeConfig), and waits for a leader.
func newSizedLogCluster(t *testing.T, dir, prefix string, clusterID int, top, tables string, logBytes int64) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: dir}
	mode := c.pmemDir(prefix)
	for i := 1; i <= 3; i++ {
		c.nodes = append(c.nodes, loopbackNode(t, i))
	}
	for _, nd := range c.nodes {
		c.writeConfig(nd, clusterID, mode, top, tables, []tenant{tenantA})
		setPMemSize(t, nd, logBytes)
	}
	t.Cleanup(func() { c.stopAll(true) })
	for _, nd := range c.nodes {
		c.start(nd)
	}
	c.leader()
	return c
}

// pmemDir picks where c's acceptor logs live and returns their pmem mode:
// a fresh directory under /dev/shm named prefix* ("shm"), or, with
// E2E_PMEM_MODE=msync or without /dev/shm, ordinary files in the test's
// temp dir ("msync"). It sets c.pdir; stopAll removes a /dev/shm one.
func (c *cluster) pmemDir(prefix string) string {
	c.pdir = c.dir
	if os.Getenv("E2E_PMEM_MODE") == "msync" {
		return "msync"
	}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", prefix); err == nil {
			c.pdir = d
			return "shm"
		}
	}
	return "msync"
}

// writeConfig writes nd's kvnode config (and sets nd.cfgPath, nd.logPath):
// the harness's consensus timing and a 64 MiB acceptor log in c.pdir with
// pmemMode, every node of c as a peer, tenants. top holds further
// top-level keys, tables further tables (before the peers); each is empty
// or ends in a newline.
func (c *cluster) writeConfig(nd *node, clusterID int, pmemMode, top, tables string, tenants []tenant) {
	c.t.Helper()
	nd.rewrite = func() { c.writeConfig(nd, clusterID, pmemMode, top, tables, tenants) }
	var b strings.Builder
	fmt.Fprintf(&b, "node_id = %d\ncluster_id = %d\ndata_dir = %q\n", nd.id, clusterID, filepath.Join(c.dir, fmt.Sprintf("data%d", nd.id)))
	fmt.Fprintf(&b, "client_listen = %q\nconsensus_listen = %q\nadmin_listen = %q\n", nd.client, nd.consensus, nd.admin)
	fmt.Fprintf(&b, "log_level = \"info\"\n%s", top)
	if nd.resp != "" {
		fmt.Fprintf(&b, "resp_listen = %q\n", nd.resp)
	}
	fmt.Fprintf(&b, "[pmem]\npath = %q\nsize_bytes = %d\nmode = %q\n", filepath.Join(c.pdir, fmt.Sprintf("n%d.pmem", nd.id)), 64<<20, pmemMode)
	fmt.Fprintf(&b, "[consensus]\ntick = \"1ms\"\nelection_ticks = 150\nheartbeat_ticks = 20\nlease_ticks = 100\ndrift_ticks = 10\n%s%s", c.consensus, snapshotTransferEnv(c.consensus))
	fmt.Fprintf(&b, "[security]\ncluster_secret = %q\n", c.secretOf(nd))
	if acc := c.accepted[nd.id]; len(acc) > 0 {
		quoted := make([]string, len(acc))
		for i, a := range acc {
			quoted[i] = strconv.Quote(a)
		}
		fmt.Fprintf(&b, "accepted_secrets = [%s]\n", strings.Join(quoted, ", "))
	}
	b.WriteString(tables)
	for _, p := range c.nodes {
		fmt.Fprintf(&b, "[[peers]]\nid = %d\nconsensus_addr = %q\nclient_addr = %q\n", p.id, p.consensus, p.client)
	}
	for _, tn := range tenants {
		fmt.Fprintf(&b, "[[tenants]]\nid = %d\nname = %q\ntoken = %q\n%s", tn.id, tn.name, tn.token, tn.extra)
	}
	nd.cfgPath = filepath.Join(c.dir, fmt.Sprintf("node%d.toml", nd.id))
	nd.logPath = filepath.Join(c.dir, fmt.Sprintf("node%d.log", nd.id))
	if err := os.WriteFile(nd.cfgPath, []byte(b.String()), 0o640); err != nil {
		c.t.Fatal(err)
	}
}

// stopAll is the clusters' cleanup: it kills every node, with checkRace
// fails the test on a race detector report in a node's log, shows the
// logs' tails when the test failed, and removes a /dev/shm pmem dir.
func (c *cluster) stopAll(checkRace bool) {
	t := c.t
	for _, nd := range c.nodes {
		c.kill(nd)
	}
	if checkRace {
		for _, nd := range c.nodes {
			if b, err := os.ReadFile(nd.logPath); err == nil && strings.Contains(string(b), "WARNING: DATA RACE") {
				t.Errorf("node %d: the race detector reported a data race (see its log below)", nd.id)
			}
		}
	}
	if keep := os.Getenv("E2E_KEEP_LOGS"); keep != "" {
		// A directory to keep every node's whole log in (debugging).
		for _, nd := range c.nodes {
			if b, err := os.ReadFile(nd.logPath); err == nil {
				os.MkdirAll(keep, 0o755)
				os.WriteFile(filepath.Join(keep, fmt.Sprintf("%s-node%d.log", t.Name(), nd.id)), b, 0o644)
			}
		}
	}
	if t.Failed() {
		for _, nd := range c.nodes {
			if b, err := os.ReadFile(nd.logPath); err == nil {
				rest, stalls := withoutStallLines(string(b))
				t.Logf("--- node%d.log (tail, %d stall warnings left out)\n%s", nd.id, stalls, tail(rest, failedLogTailBytes))
			}
		}
	}
	if c.pdir != c.dir {
		os.RemoveAll(c.pdir)
	}
}

// nodeAccel is node id's accel setting: by default mixed (nodes 1 and 2
// run the plane, node 3 does not); E2E_ACCEL=off or soft sets every node.
func nodeAccel(id int) string {
	switch m := os.Getenv("E2E_ACCEL"); m {
	case "off", "soft":
		return m
	}
	if id <= 2 {
		return "soft"
	}
	return "off"
}

// failedLogTailBytes is how much of each node's log a failed test
// prints, after withoutStallLines.
const failedLogTailBytes = 8000

// withoutStallLines drops the stall detector's warnings from a log and
// counts them: under load they are most of a log's tail and hid what
// came before them (CI of 2026-12-07: TestFullLogStaysLive failed on a
// phase whose events the 3,000-byte tails did not reach).
func withoutStallLines(s string) (string, int) {
	var b strings.Builder
	n := 0
	for _, line := range strings.SplitAfter(s, "\n") {
		if strings.Contains(line, `"message":"stall"`) {
			n++
			continue
		}
		b.WriteString(line)
	}
	return b.String(), n
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// start launches nd's process and waits until its admin endpoint answers.
func (c *cluster) start(nd *node) {
	c.t.Helper()
	bin := c.bin
	if bin == "" {
		bin = kvnodeBin
	}
	cmd := exec.Command(bin, "--config", nd.cfgPath)
	if len(c.env) > 0 {
		cmd.Env = append(os.Environ(), c.env...)
	}
	c.launch(nd, cmd)
}

// launch starts cmd as nd's process, its output appended to nd's log, and
// waits until nd's admin endpoint answers.
func (c *cluster) launch(nd *node, cmd *exec.Cmd) {
	c.t.Helper()
	logf, err := os.OpenFile(nd.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := childproc.Start(cmd); err != nil {
		logf.Close()
		c.t.Fatal(err)
	}
	nd.cmd, nd.done = cmd, make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(nd.done) }()
	deadline := time.Now().Add(startTimeout)
	for {
		if _, err := c.status(nd); err == nil {
			return
		}
		select {
		case <-nd.done:
			c.t.Fatalf("node %d exited during start-up", nd.id)
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node %d did not start within %v", nd.id, startTimeout)
		}
		time.Sleep(statusPollEvery)
	}
}

func (nd *node) running() bool {
	if nd.cmd == nil {
		return false
	}
	select {
	case <-nd.done:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL and waits for the process to go.
func (c *cluster) kill(nd *node) {
	if !nd.running() {
		return
	}
	nd.cmd.Process.Signal(syscall.SIGKILL)
	<-nd.done
}

// term sends SIGTERM and waits for a clean exit.
func (c *cluster) term(nd *node) error {
	if !nd.running() {
		return nil
	}
	nd.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-nd.done:
	case <-time.After(startTimeout):
		c.kill(nd)
		return fmt.Errorf("node %d ignored SIGTERM", nd.id)
	}
	if code := nd.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("node %d exited with %d after SIGTERM", nd.id, code)
	}
	return nil
}

// restartAll stops every node with SIGTERM (each must exit 0), starts
// them all again on their configs and waits for a leader.
func (c *cluster) restartAll() {
	c.t.Helper()
	for _, nd := range c.nodes {
		if err := c.term(nd); err != nil {
			c.t.Fatal(err)
		}
	}
	for _, nd := range c.nodes {
		c.start(nd)
	}
	c.leader()
}

// nodeStatus mirrors kvnode's /status JSON.
type nodeStatus struct {
	ID         uint64    `json:"id"`
	Role       string    `json:"role"`
	Leader     uint64    `json:"leader"`
	Promised   [2]uint64 `json:"promised"`
	Commit     uint64    `json:"commit"`
	Applied    uint64    `json:"applied"`
	LeaseValid bool      `json:"lease_valid"`
	Durability string    `json:"durability"`
	Stuck      bool      `json:"stuck"`
	// The rest is shown when a wait fails (no leader): why none leads.
	LastSlot          uint64  `json:"last_slot"`
	FirstSlot         uint64  `json:"first_slot"`
	LoopIdleMs        float64 `json:"loop_idle_ms"`
	CommitWaitMs      float64 `json:"commit_wait_ms"`
	ElectionsDeferred uint64  `json:"elections_deferred"`
	PreCheckRefusals  uint64  `json:"precheck_refusals"`
	Accel             *struct {
		Commits    int    `json:"commits"`
		Mismatches int    `json:"mismatches"`
		HandUps    uint64 `json:"handups"`
		First      string `json:"first_mismatch"`
	} `json:"accel"`
}

// accelTotals sums the accel check over the running nodes that run the
// plane, and fails the test on any mismatch.
func (c *cluster) accelTotals() (commits, mismatches int, handups uint64) {
	c.t.Helper()
	for _, nd := range c.nodes {
		if !nd.running() {
			continue
		}
		st, err := c.status(nd)
		if err != nil || st.Accel == nil {
			continue
		}
		commits += st.Accel.Commits
		mismatches += st.Accel.Mismatches
		handups += st.Accel.HandUps
		if st.Accel.Mismatches != 0 {
			c.t.Errorf("node %d: accel commit mismatch: %s", nd.id, st.Accel.First)
		}
	}
	return
}

var httpClient = &http.Client{Timeout: statusTimeout}

func (c *cluster) status(nd *node) (*nodeStatus, error) {
	req, err := nd.adminRequest(http.MethodGet, "/status", nil)
	if err != nil {
		return nil, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var st nodeStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, err
	}
	return &st, nil
}

// other returns the first of c's nodes that is not nd (a follower, when
// nd is the leader), running or not.
func (c *cluster) other(nd *node) *node {
	for _, o := range c.nodes {
		if o != nd {
			return o
		}
	}
	c.t.Fatal("a cluster of one node has no other")
	return nil
}

// leader waits for a running node (not in except) that leads with a valid
// lease.
func (c *cluster) leader(except ...*node) *node {
	c.t.Helper()
	deadline := time.Now().Add(leaderTimeout)
	for time.Now().Before(deadline) {
	next:
		for _, nd := range c.nodes {
			for _, x := range except {
				if x == nd {
					continue next
				}
			}
			if !nd.running() {
				continue
			}
			if st, err := c.status(nd); err == nil && st.Role == "leader" && st.LeaseValid {
				return nd
			}
		}
		time.Sleep(statusPollEvery)
	}
	for _, nd := range c.nodes {
		if nd.running() {
			st, err := c.status(nd)
			c.t.Logf("node %d when no leader appeared: %+v (err %v)", nd.id, st, err)
		}
	}
	c.t.Fatalf("no leader within %v", leaderTimeout)
	return nil
}

// waitCaughtUp waits until nd has applied at least slot.
func (c *cluster) waitCaughtUp(nd *node, slot uint64) {
	c.t.Helper()
	deadline := time.Now().Add(catchUpTimeout)
	for time.Now().Before(deadline) {
		if st, err := c.status(nd); err == nil && st.Applied >= slot {
			return
		}
		time.Sleep(statusPollEvery)
	}
	st, _ := c.status(nd)
	c.t.Fatalf("node %d did not catch up to slot %d within %v (status %+v)", nd.id, slot, catchUpTimeout, st)
}

// block makes nd drop all consensus traffic to and from peers (empty heals).
func (c *cluster) block(nd *node, peers ...*node) {
	c.t.Helper()
	var ids []string
	for _, p := range peers {
		ids = append(ids, fmt.Sprint(p.id))
	}
	c.fault(nd, url.Values{"block": {strings.Join(ids, ",")}})
}

// fault posts form to nd's /debug/faults (block, delay_persist,
// delay_apply) and fails the test unless it is taken.
func (c *cluster) fault(nd *node, form url.Values) {
	c.t.Helper()
	req, err := nd.adminRequest(http.MethodPost, "/debug/faults", form)
	if err != nil {
		c.t.Fatal(err)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("POST /debug/faults %s on node %d: %s", form.Encode(), nd.id, resp.Status)
	}
}

// adminRequest is a request to nd's admin endpoint, with its token when it
// has one; form, when not nil, is the POST body.
func (nd *node) adminRequest(method, path string, form url.Values) (*http.Request, error) {
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, "http://"+nd.admin+path, body)
	if err != nil {
		return nil, err
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if nd.adminToken != "" {
		req.Header.Set("Authorization", "Bearer "+nd.adminToken)
	}
	return req, nil
}

func (c *cluster) endpoints(nodes ...*node) []string {
	if len(nodes) == 0 {
		nodes = c.nodes
	}
	var eps []string
	for _, nd := range nodes {
		eps = append(eps, nd.client)
	}
	return eps
}

func ctxTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// snapshotTransferEnv is a [consensus] snapshot_transfer line for every
// node when E2E_SNAPSHOT_TRANSFER is set ("delta": run the pause, restart
// and kill suites with delta catch-ups), nothing otherwise or where the
// test's own keys (consensus) name it.
func snapshotTransferEnv(consensus string) string {
	if v := os.Getenv("E2E_SNAPSHOT_TRANSFER"); v != "" && !strings.Contains(consensus, "snapshot_transfer") {
		return fmt.Sprintf("snapshot_transfer = %q\n", v)
	}
	return ""
}
