package e2e

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"synod/internal/childproc"
)

// devPortsFree reports whether the dev cluster's twelve ports at base are
// free for TCP and UDP.
func devPortsFree(base int) bool {
	for _, off := range []int{1, 2, 3, 11, 12, 13, 21, 22, 23, 31, 32, 33} {
		p := base + off
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p})
		ln.Close()
		if err != nil {
			return false
		}
		uc.Close()
	}
	return true
}

// devBasePort picks a free block of loopback ports for `kvnode --dev
// --dev-port` (devPortsFree), trying up to 50 random bases.
func devBasePort(t *testing.T) int {
	t.Helper()
	for i := 0; i < 50; i++ {
		if b := portPickMin + rand.IntN(10000); devPortsFree(b) {
			return b
		}
	}
	t.Fatal("no free port block for the dev cluster")
	return 0
}

// devRun is a running `kvnode --dev` and what it printed.
type devRun struct {
	cmd              *exec.Cmd
	lines            chan string // the rest of its stdout
	dataDir, pmemDir string
	token            string
	endpoints        []string
}

// startDev starts `kvnode --dev` on a free port block and waits until it
// reports the cluster up and how to connect.
func startDev(t *testing.T) *devRun {
	t.Helper()
	base := devBasePort(t)
	d := &devRun{cmd: exec.Command(kvnodeBin, "--dev", "--dev-port", fmt.Sprint(base)), lines: make(chan string, 64)}
	out, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	d.cmd.Stderr = os.Stderr
	if err := childproc.Start(d.cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.cmd.Process.Kill() })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			d.lines <- sc.Text()
		}
		close(d.lines)
	}()
	up := false
	timeout := time.After(startTimeout + leaderTimeout)
	for !up || d.token == "" {
		select {
		case l, ok := <-d.lines:
			if !ok {
				t.Fatal("kvnode --dev exited before the cluster was up")
			}
			switch f := strings.Fields(l); {
			case strings.HasPrefix(l, "synod dev cluster is up"):
				up = true
			case len(f) >= 2 && f[0] == "data:":
				d.dataDir = f[1]
				if i := slices.Index(f, "in"); i > 0 && i+1 < len(f) && f[i-1] == "logs" {
					d.pmemDir = f[i+1]
				}
			case strings.Contains(l, "kvctl --endpoints") && strings.HasSuffix(l, "put hello world"):
				for i := range f {
					switch f[i] {
					case "--endpoints":
						d.endpoints = strings.Split(f[i+1], ",")
					case "--token":
						d.token = f[i+1]
					}
				}
			}
		case <-timeout:
			t.Fatal("kvnode --dev did not report a cluster")
		}
	}
	return d
}

// TestDevMode runs the README's main job, `kvnode --dev`: it prints how to
// connect, the printed endpoints and token work, and Ctrl-C (SIGINT) stops
// the cluster and removes its temporary data.
func TestDevMode(t *testing.T) {
	d := startDev(t)
	cmd, lines, dataDir, token, endpoints := d.cmd, d.lines, d.dataDir, d.token, d.endpoints
	if len(endpoints) != 3 || dataDir == "" {
		t.Fatalf("connect info: endpoints %v data %q", endpoints, dataDir)
	}
	cl := dialClient(t, endpoints, token, killClientRetries)
	ctx, cancel := ctxTimeout(killOpTimeout)
	defer cancel()
	if err := cl.Put(ctx, []byte("hello"), []byte("world")); err != nil {
		t.Fatal(err)
	}
	if v, err := cl.Get(ctx, []byte("hello")); err != nil || string(v) != "world" {
		t.Fatalf("get hello: %q %v", v, err)
	}
	cl.Close()

	cmd.Process.Signal(syscall.SIGINT)
	for range lines {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("kvnode --dev after SIGINT: %v", err)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Fatalf("dev data %s not removed (%v)", dataDir, err)
	}
}

// TestDevModeNodesDieWithIt: the three kvnodes `kvnode --dev` starts die
// with it even when it is killed without a chance to clean up (SIGKILL),
// instead of serving on as orphans (internal/childproc).
func TestDevModeNodesDieWithIt(t *testing.T) {
	d := startDev(t)
	for _, dir := range []string{d.dataDir, d.pmemDir} { // SIGKILL leaves them
		if dir != "" {
			t.Cleanup(func() { os.RemoveAll(dir) })
		}
	}
	kids := childPids(d.cmd.Process.Pid)
	if len(kids) != 3 {
		t.Fatalf("kvnode --dev (pid %d) has children %v, want 3 nodes", d.cmd.Process.Pid, kids)
	}
	d.cmd.Process.Kill()
	d.cmd.Wait()
	var alive []int
	for _, pid := range kids {
		if !childproc.Gone(pid, devChildGoneWait) {
			alive = append(alive, pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	fmt.Printf("e2e dev sigkill: nodes=%d orphans=%d\n", len(kids), len(alive))
	if len(alive) > 0 {
		t.Fatalf("nodes %v outlived kvnode --dev", alive)
	}
}

// devChildGoneWait bounds how long an orphaned dev node may take to die.
const devChildGoneWait = 5 * time.Second

// childPids lists the processes whose parent is ppid (from /proc).
func childPids(ppid int) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		rest := string(b)[strings.LastIndexByte(string(b), ')')+1:]
		if f := strings.Fields(rest); len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestDevModeRestartsACrashedNode: `kvnode --dev` supervises its nodes, as
// the README's "kill -9 a node" says: a node SIGKILLed is started again
// from its data and acceptor log, and the cluster serves what was written
// before and after; a node that cannot start (its config made garbage)
// exits devRestartsMax times within a minute and the dev cluster stops,
// its data kept, instead of restarting it forever. (Before, the first
// exit of any node stopped the whole cluster.)
func TestDevModeRestartsACrashedNode(t *testing.T) {
	const restartsMax = 5 // kvnode's devRestartsMax
	d := startDev(t)
	t.Cleanup(func() {
		os.RemoveAll(d.dataDir)
		if d.pmemDir != "" {
			os.RemoveAll(d.pmemDir)
		}
	})
	cl := dialClient(t, d.endpoints, d.token, killClientRetries)
	defer cl.Close()
	put := func(k, v string) {
		t.Helper()
		ctx, cancel := ctxTimeout(killOpTimeout)
		defer cancel()
		if err := cl.Put(ctx, []byte(k), []byte(v)); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	get := func(k, want string) {
		t.Helper()
		ctx, cancel := ctxTimeout(killOpTimeout)
		defer cancel()
		if v, err := cl.Get(ctx, []byte(k)); err != nil || string(v) != want {
			t.Fatalf("get %s: %q, %v; want %q", k, v, err, want)
		}
	}
	put("before", "1")

	kids := childPids(d.cmd.Process.Pid)
	if len(kids) != 3 {
		t.Fatalf("kvnode --dev has children %v, want 3 nodes", kids)
	}
	victim := kids[rand.IntN(len(kids))]
	node, cfg, ok := devNodeOf(victim)
	if !ok {
		t.Fatalf("pid %d is no dev node", victim)
	}
	syscall.Kill(victim, syscall.SIGKILL)
	newPid := awaitDevLine(t, d.lines, fmt.Sprintf("node %d started again (pid ", node))
	if pid, err := strconv.Atoi(strings.TrimSuffix(newPid, ")")); err != nil || pid == victim || !slices.Contains(childPids(d.cmd.Process.Pid), pid) {
		t.Fatalf("node %d restarted as %q (killed pid %d; children %v)", node, newPid, victim, childPids(d.cmd.Process.Pid))
	}
	put("after", "2")
	get("before", "1")
	get("after", "2")

	// A node that cannot start: its config made garbage, then killed.
	if err := os.WriteFile(cfg, []byte("this is not toml = = =\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	now := childPids(d.cmd.Process.Pid)
	for _, pid := range now {
		if n, _, ok := devNodeOf(pid); ok && n == node {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	restarted := 0
	deadline := time.After(time.Minute)
	for done := false; !done; {
		select {
		case l, ok := <-d.lines:
			if !ok {
				done = true
				break
			}
			if strings.HasPrefix(l, fmt.Sprintf("node %d exited", node)) {
				restarted++
			}
		case <-deadline:
			t.Fatalf("kvnode --dev still running a minute after node %d's config was broken (%d exits seen)", node, restarted)
		}
	}
	d.cmd.Wait()
	if _, err := os.Stat(d.dataDir); err != nil {
		t.Fatalf("the dev data was not kept after a node could not start: %v", err)
	}
	fmt.Printf("e2e dev restart: killed node %d restarted, reads_ok=2; broken config: restarts=%d, then the cluster stopped\n", node, restarted)
	// The SIGKILL's restart a moment before counts within the same
	// minute: restartsMax-1 more, then the exit that stops the cluster.
	if restarted != restartsMax-1 {
		t.Fatalf("node %d was started again %d times after its config broke, want %d (%d within a minute with the first)", node, restarted, restartsMax-1, restartsMax)
	}
}

// devNodeOf is the dev node number and config path of process pid, from
// its command line (--config DIR/nodeN.toml); false for a process gone
// (or a zombie) or not a dev node.
func devNodeOf(pid int) (int, string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, "", false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	for i, a := range args {
		if a == "--config" && i+1 < len(args) {
			base := strings.TrimSuffix(args[i+1][strings.LastIndexByte(args[i+1], '/')+1:], ".toml")
			if n, err := strconv.Atoi(strings.TrimPrefix(base, "node")); err == nil {
				return n, args[i+1], true
			}
		}
	}
	return 0, "", false
}

// awaitDevLine waits for a line of kvnode --dev's output that starts with
// prefix and returns the rest of it.
func awaitDevLine(t *testing.T, lines <-chan string, prefix string) string {
	t.Helper()
	deadline := time.After(startTimeout + leaderTimeout)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("kvnode --dev exited before printing %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return strings.TrimPrefix(l, prefix)
			}
		case <-deadline:
			t.Fatalf("kvnode --dev did not print %q", prefix)
		}
	}
}
