package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"synod/internal/childproc"
	"synod/kv/client"
	"synod/kv/proto"
)

// Cluster limits.
const (
	leaderWaitMax   = 30 * time.Second
	stopWaitMax     = 10 * time.Second
	statusPollEvery = 20 * time.Millisecond
	statusTimeout   = 300 * time.Millisecond
	logTailBytes    = 1500
	// contractBytesPerOp sizes every tenant's bytes contract.
	contractBytesPerOp = 512
)

// cluster is a set of kvnode child processes on loopback, or an existing
// cluster (procs empty).
type cluster struct {
	path      Path
	dir       string
	shmDir    string
	endpoints []string
	// procs are the node processes, [i-1] for node i. Only the
	// goroutine that runs the path replaces one (a restart, under
	// procMu); other goroutines read them through pids.
	procs  []*nodeProc
	procMu sync.Mutex
	tokens []string
	// monitor is the token of kvbench's own tenant for STATUS polls: an
	// uncontracted tenant outside the workload, so polling never spends
	// a workload tenant's budget.
	monitor string
	// lan holds the namespaces of a netns path (nil on loopback).
	lan *lan
	// admins are the nodes' admin addresses (/metrics), [i-1] for node i;
	// empty for an existing cluster.
	admins []string
	// kvnode is the binary the nodes run (restarts use it again).
	kvnode string
	// benchToken, for an existing cluster, is the one token every
	// scenario tenant uses ("" on an embedded cluster: bench_tenants.go).
	benchToken string
}

type nodeProc struct {
	id   int
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func tenantToken(i int) string { return fmt.Sprintf("kvbench-tenant-%d", i) }

const monitorToken = "kvbench-monitor"

// nodeConfig renders kvnode's TOML for node i of path p; addrs[j-1] is
// node j's IP address (127.0.0.1 for all on loopback).
//
// benchClusterSecret authenticates the bench clusters' consensus traffic,
// as a production cluster's would be (the MAC is part of every path's cost).
const benchClusterSecret = "be0c3a7b9d1f2e4a6c8b0d2f4e6a8c0b1d3f5e7a9c1b3d5f7e9a1c3b5d7f9e1a"

func nodeConfig(o *Options, p Path, i int, dir, shmDir string, addrs []string) string {
	var b strings.Builder
	base := o.BasePort
	fmt.Fprintf(&b, "node_id = %d\ncluster_id = 11\ndata_dir = %q\n", i, filepath.Join(dir, fmt.Sprintf("node%d", i)))
	fmt.Fprintf(&b, "client_listen = \"%s:%d\"\nconsensus_listen = \"%s:%d\"\nlog_level = %q\n", addrs[i-1], base+i, addrs[i-1], base+20+i, nodeLogLevel())
	// The admin endpoint: kvbench scrapes /metrics (leader changes,
	// snapshots, shedding; nodestats.go). It always has a token, so the
	// namespace paths' non-loopback addresses are accepted too.
	fmt.Fprintf(&b, "admin_listen = \"%s:%d\"\n", addrs[i-1], base+adminPortOffset+i)
	if p.Replication == "raft" {
		fmt.Fprintf(&b, "replication = \"raft\"\n")
	}
	if p.Accel {
		// The accel plane model beside paxos (kvnode's accel = "soft").
		fmt.Fprintf(&b, "accel = \"soft\"\n")
	}
	if p.resp {
		top, _ := respConfig(o, i, addrs[i-1])
		b.WriteString(top)
	}
	fmt.Fprintln(&b)
	pmemDir, mode := dir, p.pmemMode
	if mode == "" {
		mode = "msync" // validated by kvnode, unused by raft
	}
	if mode == "shm" {
		pmemDir = shmDir
	}
	fmt.Fprintf(&b, "[pmem]\npath = %q\nsize_bytes = %d\nmode = %q\n\n", filepath.Join(pmemDir, fmt.Sprintf("node%d.pmem", i)), o.pmemBytes(), mode)
	kind := p.transport
	if kind == "" {
		kind = "udp"
	}
	fmt.Fprintf(&b, "[transport]\nkind = %q\n", kind)
	if kind == "afxdp" {
		// Adaptive polling, unpinned: the cores are shared with the
		// clients and the other replicas (as in the e2e AF_XDP tests).
		fmt.Fprintf(&b, "interface = %q\npoll = \"adaptive\"\nframe_count = %d\nattach = \"auto\"\n", lanIfName, lanFrameCount)
	}
	fmt.Fprintf(&b, "\n[consensus]\ntick = \"1ms\"\n")
	if o.SnapshotTransfer != "" {
		fmt.Fprintf(&b, "snapshot_transfer = %q\n", o.SnapshotTransfer)
	}
	fmt.Fprintln(&b)
	fmt.Fprintf(&b, "[security]\ncluster_secret = %q\n\n", benchClusterSecret)
	fmt.Fprintf(&b, "[admin]\ntoken = %q\n", benchAdminToken)
	if o.NodeProfiles {
		b.WriteString("pprof = true\n") // node_profiles.go
	}
	b.WriteString("\n")
	if p.Replication == "raft" {
		walDir := filepath.Join(dir, fmt.Sprintf("node%d", i), "raft")
		if p.walOnShm {
			walDir = filepath.Join(shmDir, fmt.Sprintf("node%d-raft", i))
		}
		fmt.Fprintf(&b, "[raft]\nwal_dir = %q\n\n", walDir)
	}
	for j := 1; j <= o.Nodes; j++ {
		fmt.Fprintf(&b, "[[peers]]\nid = %d\nconsensus_addr = \"%s:%d\"\nclient_addr = \"%s:%d\"\n\n", j, addrs[j-1], base+20+j, addrs[j-1], base+j)
	}
	share := o.Rate / float64(o.Tenants)
	for t := 1; t <= o.Tenants; t++ {
		// Contracts: victims get ContractFactor times their share of the
		// steady load; the noisy tenant (1) gets twice its share, so its
		// steady traffic fits and its bulk bursts do not. Bytes: 512 B per
		// contracted op, which a 64-PUT batch exceeds many times over.
		ops, prio := share*o.ContractFactor, "standard"
		if t == 1 {
			ops, prio = 2*share, "bulk"
		}
		fmt.Fprintf(&b, "[[tenants]]\nid = %d\nname = \"t%d\"\ntoken = %q\nops_per_sec = %.1f\nops_burst = %.1f\n",
			t, t, tenantToken(t), ops, max(ops, 10))
		fmt.Fprintf(&b, "bytes_per_sec = %.0f\nbytes_burst = %.0f\npriority = %q\n\n", ops*contractBytesPerOp, max(ops, 10)*contractBytesPerOp*4, prio)
	}
	// kvbench's monitor tenant: STATUS polls only, no contract.
	fmt.Fprintf(&b, "[[tenants]]\nid = %d\nname = \"kvbench-monitor\"\ntoken = %q\npriority = \"critical\"\n", o.Tenants+1, monitorToken)
	b.WriteString(benchTenantsConfig(o)) // the scenarios' own tenants (bench_tenants.go)
	b.WriteString(stallConfig(o, p, i))  // [stall]: traces under --out (stages.go)
	if p.resp {
		_, tables := respConfig(o, i, addrs[i-1])
		b.WriteString("\n" + tables)
	}
	return b.String()
}

// startCluster starts o.Nodes kvnode processes for p and waits for a
// leader.
func startCluster(ctx context.Context, o *Options, kvnode string, p Path) (*cluster, error) {
	root := o.DataDir
	dir, err := os.MkdirTemp(root, "kvbench-"+p.Name+"-")
	if err != nil {
		return nil, err
	}
	c := &cluster{path: p, dir: dir, monitor: monitorToken}
	if d, err := os.MkdirTemp("/dev/shm", "kvbench-"+p.Name+"-"); err == nil {
		c.shmDir = d
	} else if p.pmemMode == "shm" || p.walOnShm {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("no /dev/shm for the shm durability mode: %w", err)
	} else {
		c.shmDir = dir
	}
	for t := 1; t <= o.Tenants; t++ {
		c.tokens = append(c.tokens, tenantToken(t))
	}
	addrs := make([]string, o.Nodes)
	for i := range addrs {
		addrs[i] = "127.0.0.1"
	}
	if p.netns {
		l, err := newLAN(o.Nodes, p.transport, uint16(o.BasePort+21))
		if err != nil {
			c.stop()
			return nil, err
		}
		c.lan = l
		addrs = l.addrs()
	}
	c.kvnode = kvnode
	for i := 1; i <= o.Nodes; i++ {
		c.endpoints = append(c.endpoints, fmt.Sprintf("%s:%d", addrs[i-1], o.BasePort+i))
		c.admins = append(c.admins, fmt.Sprintf("%s:%d", addrs[i-1], o.BasePort+adminPortOffset+i))
		cfgPath := filepath.Join(dir, fmt.Sprintf("node%d.toml", i))
		if err := os.WriteFile(cfgPath, []byte(nodeConfig(o, p, i, dir, c.shmDir, addrs)), 0o640); err != nil {
			c.stop()
			return nil, err
		}
		np, err := c.startNode(i)
		if err != nil {
			c.stop()
			return nil, err
		}
		c.procs = append(c.procs, np)
	}
	if _, err := c.waitLeader(ctx, leaderWaitMax); err != nil {
		msg := c.failureText()
		c.stop()
		return nil, fmt.Errorf("%v%s", err, msg)
	}
	return c, nil
}

// startNode starts kvnode i (1-based) with its config in c.dir; its
// output is appended to its log, so a restarted node keeps the log of its
// first life.
func (c *cluster) startNode(i int) (*nodeProc, error) {
	cfgPath := filepath.Join(c.dir, fmt.Sprintf("node%d.toml", i))
	logPath := filepath.Join(c.dir, fmt.Sprintf("node%d.log", i))
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(c.kvnode, "--config", cfgPath)
	if c.lan != nil {
		cmd = c.lan.command(i, c.kvnode, "--config", cfgPath)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// The node dies with kvbench, even a kvbench killed without cleanup.
	if err := childproc.Start(cmd); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting kvnode %d: %w", i, err)
	}
	np := &nodeProc{id: i, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { np.err = cmd.Wait(); logf.Close(); close(np.done) }()
	return np, nil
}

// failureText returns the first error-looking line of the first node that
// exited (or of node 1's log).
func (c *cluster) failureText() string {
	for _, p := range c.procs {
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.log)
			return fmt.Sprintf(": node %d exited (%v): %s", p.id, p.err, firstLine(lastBytes(string(b), logTailBytes)))
		default:
		}
	}
	return ""
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndex(s, "kvnode: "); i >= 0 {
		s = s[i:]
	}
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// statusOf asks one node for its STATUS.
func statusOf(ctx context.Context, ep, token string) (*proto.ClusterStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	cl, err := client.Dial(ctx, []string{ep}, token, client.Options{RetriesMax: 1, DialTimeout: statusTimeout, RequestTimeout: statusTimeout})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return cl.StatusAt(ctx, ep)
}

// waitLeader polls until some node reports a leader (and returns its
// index in endpoints) or a node exits.
func (c *cluster) waitLeader(ctx context.Context, limit time.Duration) (int, error) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		for _, p := range c.procs {
			select {
			case <-p.done:
				return -1, fmt.Errorf("kvnode %d exited during start-up", p.id)
			default:
			}
		}
		for i, ep := range c.endpoints {
			st, err := statusOf(ctx, ep, c.monitor)
			if err == nil && st.LeaderID != 0 && st.Self == st.LeaderID {
				return i, nil
			}
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return -1, fmt.Errorf("no leader within %v", limit)
}

// leaderPID returns the process id of the node that leads now.
func (c *cluster) leaderPID(ctx context.Context) (int, error) {
	i, err := c.waitLeader(ctx, leaderWaitMax)
	if err != nil {
		return 0, err
	}
	if i >= len(c.procs) {
		return 0, errors.New("leader is not an embedded process")
	}
	return c.procs[i].cmd.Process.Pid, nil
}

// pids lists the node processes.
func (c *cluster) pids() []int {
	c.procMu.Lock()
	defer c.procMu.Unlock()
	var out []int
	for _, p := range c.procs {
		out = append(out, p.cmd.Process.Pid)
	}
	return out
}

// stop terminates the nodes and removes the data, then the namespaces
// (processes go before their namespaces).
func (c *cluster) stop() {
	for _, p := range c.procs {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(stopWaitMax)
	for _, p := range c.procs {
		select {
		case <-p.done:
		case <-deadline:
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	if c.dir != "" {
		keepLogs(c.dir)
		os.RemoveAll(c.dir)
	}
	if c.shmDir != "" && c.shmDir != c.dir {
		os.RemoveAll(c.shmDir)
	}
	if c.lan != nil {
		if err := c.lan.close(); err != nil {
			fmt.Fprintf(os.Stderr, "kvbench: removing namespaces: %v\n", err)
		}
		c.lan = nil
	}
}

// leaderWatch polls every node's STATUS and counts leader changes: each
// new (ballot round or raft term, node) pair that a node reports for
// itself as leader, after the first, is one change.
type leaderWatch struct {
	mu      sync.Mutex
	seen    map[proto.Ballot]bool
	changes int
	stop    chan struct{}
	done    chan struct{}
}

func watchLeaders(c *cluster) *leaderWatch {
	w := &leaderWatch{seen: map[proto.Ballot]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		// One long-lived client per node keeps polling cheap.
		clients := make([]*client.Client, len(c.endpoints))
		defer func() {
			for _, cl := range clients {
				if cl != nil {
					cl.Close()
				}
			}
		}()
		t := time.NewTicker(statusPollEvery)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			for i, ep := range c.endpoints {
				ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
				if clients[i] == nil {
					cl, err := client.Dial(ctx, []string{ep}, c.monitor, client.Options{RetriesMax: 1, DialTimeout: statusTimeout, RequestTimeout: statusTimeout})
					if err != nil {
						cancel()
						continue
					}
					clients[i] = cl
				}
				st, err := clients[i].StatusAt(ctx, ep)
				cancel()
				if err != nil {
					clients[i].Close()
					clients[i] = nil
					continue
				}
				// Only a node's claim about itself counts: followers may
				// lag or see a failed candidate's higher ballot.
				if st.LeaderID == 0 || st.LeaderID != st.Self {
					continue
				}
				b := proto.Ballot{Round: st.Ballot.Round, Node: st.Self}
				w.mu.Lock()
				if !w.seen[b] {
					if len(w.seen) > 0 {
						w.changes++
					}
					w.seen[b] = true
				}
				w.mu.Unlock()
			}
		}
	}()
	return w
}

// reset starts counting from the leaders seen so far.
func (w *leaderWatch) reset() {
	w.mu.Lock()
	w.changes = 0
	w.mu.Unlock()
}

func (w *leaderWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changes
}

func (w *leaderWatch) close() {
	close(w.stop)
	<-w.done
}

// logLevelEnv sets the nodes' log_level (default "warn": a node's info
// lines, one per snapshot and transfer, are for reading a run, not for
// every run).
const logLevelEnv = "KVBENCH_NODE_LOG_LEVEL"

func nodeLogLevel() string {
	if l := os.Getenv(logLevelEnv); l != "" {
		return l
	}
	return "warn"
}

// keepLogsEnv names a directory where a cluster's node logs are copied
// before its data directory is removed (to read what a node did in a
// run: its snapshot transfers, its leader changes).
const keepLogsEnv = "KVBENCH_KEEP_LOGS"

// keepLogs copies the node logs of the cluster in dir to $KVBENCH_KEEP_LOGS
// (when set) under the cluster directory's name; failures are reported,
// never fatal.
func keepLogs(dir string) {
	to := os.Getenv(keepLogsEnv)
	if to == "" {
		return
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "node*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err == nil {
			err = os.MkdirAll(to, 0o755)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(to, filepath.Base(dir)+"-"+filepath.Base(l)), b, 0o644)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "kvbench: keeping %s: %v\n", l, err)
		}
	}
}
