package e2e

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"synod/afxdp"
	"synod/afxdp/netns"
)

// The AF_XDP clusters run every kvnode in its own network namespace
// (afxdp/netns.NewLAN: namespaces <name>-0..2, interface "synod0" with
// 10.199.<subnet>.1..3/24, bridged in <name>-hub), started with
// `ip netns exec <ns> kvnode`.
//
// How the test process reaches them: one more veth pair, from the root
// namespace into the hub's bridge, with 10.199.<subnet>.254/24 on the root
// end (nsHostIf). That is the simplest robust route: the client, the
// /status polling and every other harness helper (cluster.leader,
// waitCaughtUp, dialClient) work unchanged over plain TCP, no goroutine
// ever has to enter a namespace, and the root end disappears with the hub
// namespace even if the test process dies before its cleanup runs. Only
// TCP (client, admin, side channel) and ARP cross that link; consensus
// datagrams stay between the node namespaces, where the AF_XDP sockets are.

// Limits of the namespace clusters.
const (
	// nsSubnetBase..+nsSubnetSpan-1 are the third octets used here; the
	// afxdp package's own tests stay below 100.
	nsSubnetBase = 100
	nsSubnetSpan = 150
	// Fixed ports: each node has a namespace of its own.
	nsClientPort    = 7001
	nsConsensusPort = 7011
	nsAdminPort     = 7021
	// nsAdminToken guards the namespace nodes' admin endpoints, which
	// listen on LAN addresses.
	nsAdminToken = "e2e-namespace-admin-token"
	// nsHostOctet is the root namespace's address on the LAN.
	nsHostOctet = 254
	// nsFrameCount is the UMEM size of each AF_XDP node (2048-byte
	// frames: 2 MiB locked per node).
	nsFrameCount = 1024
)

// Rounds and pacing of the namespace leader-kill checks (the loopback
// test's workload, leaderKillWorkload, with fewer rounds: each namespace
// cluster runs on the same two shared cores).
const (
	nsKillsDefault      = 5
	nsMixedKillsDefault = 3
	nsLoadPerRound      = 300 * time.Millisecond
	nsCheckTimeout      = 2 * time.Minute
)

// nsCluster is a cluster whose nodes run in namespaces of one LAN.
type nsCluster struct {
	*cluster
	lan    *netns.LAN
	subnet int
	kinds  []string // transport kind per node, in node order
}

// needNamespaces skips the test (fails it when CI=true) unless this
// process can build namespaces.
func needNamespaces(t testing.TB) {
	t.Helper()
	if err := netns.Available(); err != nil {
		skipOrFail(t, err)
	}
}

func skipOrFail(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true but: %v", err)
	}
	t.Skipf("skipped: %v", err)
}

// nsSubnet picks a third octet for this process's k-th LAN, so that two
// test processes running at once rarely collide on the root's route.
func nsSubnet(k int) int {
	return nsSubnetBase + (os.Getpid()*3+k)%nsSubnetSpan
}

// newNSCluster builds a LAN named name with one node per entry of kinds
// ("afxdp" or "udp"), the root-namespace link to it, and starts the nodes.
// Everything is removed by t.Cleanup, also on failure.
func newNSCluster(t testing.TB, name string, subnet int, kinds []string) *nsCluster {
	t.Helper()
	needNamespaces(t)
	full := fmt.Sprintf("synod-e2e-%d-%s", os.Getpid(), name)
	lan, err := netns.NewLAN(full, subnet, len(kinds))
	if err != nil {
		skipOrFail(t, fmt.Errorf("cannot build namespaces: %w", err))
	}
	t.Cleanup(func() {
		if err := lan.Close(); err != nil {
			t.Errorf("removing namespaces: %v", err)
		}
	})
	hostIf := fmt.Sprintf("se%d-%d", os.Getpid()%1_000_000, subnet)
	host := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 199, byte(subnet), nsHostOctet}), 24)
	removeHost, err := lan.AddHostLink(hostIf, host)
	if err != nil {
		t.Fatal(err)
	}
	// Usually already gone with the hub namespace; make sure.
	t.Cleanup(func() { removeHost() })
	for i, k := range kinds {
		if k == afxdp.TransportAFXDP {
			if err := probeXDP(lan.NS[i]); err != nil {
				skipOrFail(t, fmt.Errorf("AF_XDP unavailable in namespace %s: %w", lan.NS[i], err))
			}
		}
	}

	c := &cluster{t: t, dir: t.TempDir()}
	mode := c.pmemDir("synod-e2e-ns-")
	// E2E_XDP_POLL (busy|adaptive) and E2E_XDP_SPIN_MICROS tune the
	// AF_XDP nodes' poll loops (for the latency benchmark).
	xdpPoll, xdpSpin := afxdp.PollAdaptive, os.Getenv("E2E_XDP_SPIN_MICROS")
	if p := os.Getenv("E2E_XDP_POLL"); p != "" {
		xdpPoll = p
	}
	if xdpSpin != "" {
		if n, err := strconv.Atoi(xdpSpin); err != nil || n < 0 {
			t.Fatalf("E2E_XDP_SPIN_MICROS=%q: want a non-negative integer", xdpSpin)
		}
	}
	// E2E_XDP_ATTACH (native|generic|auto, default auto).
	xdpAttach := afxdp.AttachAuto
	if a := os.Getenv("E2E_XDP_ATTACH"); a != "" {
		xdpAttach = a
	}
	// E2E_XDP_RX_CPU_BASE=k pins AF_XDP node i's receive loop to CPU k+i
	// (dedicated cores; the default leaves them unpinned).
	rxBase := -1
	if v := os.Getenv("E2E_XDP_RX_CPU_BASE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			t.Fatalf("E2E_XDP_RX_CPU_BASE=%q: want a CPU number", v)
		}
		rxBase = n
	}
	nc := &nsCluster{cluster: c, lan: lan, subnet: subnet, kinds: kinds}
	for i := range kinds {
		a := lan.Addr4[i]
		c.nodes = append(c.nodes, &node{
			id:        i + 1,
			client:    netip.AddrPortFrom(a, nsClientPort).String(),
			consensus: netip.AddrPortFrom(a, nsConsensusPort).String(),
			admin:     netip.AddrPortFrom(a, nsAdminPort).String(),
			// The admin address is not loopback, so kvnode requires a
			// token on it.
			adminToken: nsAdminToken,
		})
	}
	for i, nd := range c.nodes {
		var b strings.Builder
		fmt.Fprintf(&b, "[admin]\ntoken = %q\n", nsAdminToken)
		fmt.Fprintf(&b, "[transport]\nkind = %q\n", kinds[i])
		if kinds[i] == afxdp.TransportAFXDP {
			// Adaptive polling, unpinned by default: the cores are
			// shared with everything else on the machine.
			fmt.Fprintf(&b, "interface = %q\npoll = %q\nframe_count = %d\nattach = %q\n", lan.If[i], xdpPoll, nsFrameCount, xdpAttach)
			if xdpSpin != "" {
				fmt.Fprintf(&b, "spin_micros = %s\n", xdpSpin)
			}
			if rxBase >= 0 {
				fmt.Fprintf(&b, "[cores]\nrx = %d\n", rxBase+i)
			}
		}
		c.writeConfig(nd, 12, mode, "", b.String(), []tenant{tenantA, tenantB})
	}
	// Registered after lan.Close, so it runs before it: the processes go
	// before their namespaces.
	t.Cleanup(func() { c.stopAll(false) })
	for _, nd := range c.nodes {
		nc.start(nd)
	}
	return nc
}

// probeXDP opens and closes an AF_XDP socket on the node's interface, so
// that a machine without AF_XDP skips (or fails under CI) with the reason
// instead of failing inside kvnode.
func probeXDP(ns string) error {
	return netns.Run(ns, func() error {
		x, err := afxdp.NewXDP(afxdp.Config{Interface: "synod0", Port: nsConsensusPort, FrameCount: nsFrameCount})
		if err != nil {
			return err
		}
		return x.Close()
	})
}

// ns is the namespace node nd runs in.
func (nc *nsCluster) ns(nd *node) string { return nc.lan.NS[nd.id-1] }

// start launches nd inside its namespace (`ip netns exec` execs kvnode in
// place, so nd.cmd's pid is kvnode's and cluster.kill's SIGKILL reaches
// it), waits for its admin endpoint, and checks from its log that it runs
// the transport it was configured with.
func (nc *nsCluster) start(nd *node) {
	c := nc.cluster
	c.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", nc.ns(nd), kvnodeBin, "--config", nd.cfgPath)
	c.launch(nd, cmd)
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", cmd.Process.Pid)); err == nil && filepath.Base(exe) != filepath.Base(kvnodeBin) {
		c.t.Fatalf("node %d: pid %d runs %s, not kvnode: SIGKILL would miss it", nd.id, cmd.Process.Pid, exe)
	}
	if got := servingTransport(nd.logPath); got != nc.kinds[nd.id-1] {
		c.t.Fatalf("node %d serves with transport %q, configured %q", nd.id, got, nc.kinds[nd.id-1])
	}
	if nc.kinds[nd.id-1] == afxdp.TransportAFXDP {
		c.t.Logf("node %d: AF_XDP, XDP attach %s", nd.id, nc.attachMode(nd))
	}
}

// attachMode says how the XDP program sits on nd's interface, as ip(8)
// shows it: "native" (xdp), "generic" (xdpgeneric), or what ip printed.
func (nc *nsCluster) attachMode(nd *node) string {
	out, err := exec.Command("ip", "-n", nc.ns(nd), "link", "show", "dev", nc.lan.If[nd.id-1]).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("unknown (%v)", err)
	}
	for _, f := range strings.Fields(string(out)) {
		switch f {
		case "xdp", "xdpdrv":
			return "native"
		case "xdpgeneric":
			return "generic"
		}
	}
	return "none shown by ip link"
}

// servingTransport is the transport named by the last "kvnode serving" log
// line in path ("" if none).
func servingTransport(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	got := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `"kvnode serving"`) {
			continue
		}
		if i := strings.Index(line, `"transport":"`); i >= 0 {
			rest := line[i+len(`"transport":"`):]
			if j := strings.IndexByte(rest, '"'); j >= 0 {
				got = rest[:j]
			}
		}
	}
	return got
}

// kernelUDP is the kernel UDP stack's datagram count (in + out) in node
// nd's namespace (/proc/net/snmp, Udp InDatagrams + OutDatagrams). An
// AF_XDP node's consensus traffic bypasses it; a udp node's does not.
func (nc *nsCluster) kernelUDP(nd *node) (uint64, error) {
	return netns.KernelUDPDatagrams(nc.ns(nd))
}

// killRun is the outcome of one leader-kill workload.
type killRun struct {
	kills, ops, lost int
	linearizable     bool
	commit           uint64 // commit index at the end
}

// runLeaderKills is leaderKillWorkload on a namespace cluster (restarts
// inside the node's namespace, transport kinds in the round log), then the
// history check. It fails t on any violation.
func runLeaderKills(t *testing.T, nc *nsCluster, rounds int) killRun {
	c := nc.cluster
	r := leaderKillWorkload(t, c, leaderKills{
		rounds:       rounds,
		seed:         43,
		loadPerRound: nsLoadPerRound,
		restart:      nc.start,
		describe:     func(nd *node) string { return " (" + nc.kinds[nd.id-1] + ")" },
	})
	var commit uint64
	if st, err := c.status(c.leader()); err == nil {
		commit = st.Commit
	}
	res := r.h.check(nsCheckTimeout)
	if res != porcupine.Ok {
		t.Errorf("history of %d ops is not linearizable (porcupine: %v)", len(r.h.ops), res)
	}
	if r.acked == 0 {
		t.Errorf("no unique write was acknowledged: the workload did not run")
	}
	return killRun{kills: r.kills, ops: len(r.h.ops), lost: r.lost, linearizable: res == porcupine.Ok, commit: commit}
}

// checkBypass asserts that each AF_XDP node's consensus traffic bypassed
// the kernel UDP stack. Every commit costs each node at least one
// consensus datagram, so a node whose consensus went through the kernel
// counts at least the commit index there (a udp node must: that checks
// the probe). An AF_XDP node may count some (sent through its shadow
// socket while a neighbour's MAC is unknown, or received there in the
// moment between bind and XDP attach after a restart: tens per restart
// measured), but less than half the commit index.
func (nc *nsCluster) checkBypass(t *testing.T, commit uint64) string {
	t.Helper()
	var parts []string
	counts := make([]uint64, len(nc.nodes))
	for i, nd := range nc.nodes {
		n, err := nc.kernelUDP(nd)
		if err != nil {
			t.Errorf("node %d: %v", nd.id, err)
			return ""
		}
		counts[i] = n
		parts = append(parts, fmt.Sprintf("%d:%s=%d", nd.id, nc.kinds[i], n))
	}
	for _, v := range bypassViolations(nc.kinds, counts, commit) {
		t.Error(v)
	}
	return strings.Join(parts, " ")
}

// bypassViolations applies checkBypass's rule to per-node transport kinds
// and kernel UDP datagram counts.
func bypassViolations(kinds []string, counts []uint64, commit uint64) []string {
	var out []string
	for i, n := range counts {
		switch kinds[i] {
		case afxdp.TransportAFXDP:
			if n*2 >= commit {
				out = append(out, fmt.Sprintf("node %d (afxdp): %d kernel UDP datagrams for commit index %d: consensus did not bypass the kernel", i+1, n, commit))
			}
		case afxdp.TransportUDP:
			if n < commit {
				out = append(out, fmt.Sprintf("node %d (udp): only %d kernel UDP datagrams for commit index %d: the probe is broken", i+1, n, commit))
			}
		}
	}
	return out
}

func killsFromEnv(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// TestAFXDPClusterLeaderKill is the end-to-end check on a 3-node cluster
// whose nodes all run transport kind "afxdp", each in its own namespace:
// clients under load, the leader SIGKILLed and restarted round after round
// (E2E_AFXDP_KILLS, default 5), a new leader serving writes, the killed
// node catching up, a linearizable history, no acknowledged write lost.
func TestAFXDPClusterLeaderKill(t *testing.T) {
	rounds := killsFromEnv(t, "E2E_AFXDP_KILLS", nsKillsDefault)
	kinds := []string{afxdp.TransportAFXDP, afxdp.TransportAFXDP, afxdp.TransportAFXDP}
	nc := newNSCluster(t, "xdp", nsSubnet(0), kinds)
	nsKillCheck(t, nc, rounds, "e2e afxdp: nodes=3")
}

// TestAFXDPMixedCluster runs the same checks, shorter (E2E_MIXED_KILLS,
// default 3), on a heterogeneous cluster: nodes 1 and 2 on AF_XDP, node 3
// on kernel UDP. AF_XDP nodes verify full UDP checksums; the udp node's
// interface has transmit checksum offload off (netns.NewLAN), as a real
// NIC would put full checksums on the wire.
func TestAFXDPMixedCluster(t *testing.T) {
	rounds := killsFromEnv(t, "E2E_MIXED_KILLS", nsMixedKillsDefault)
	kinds := []string{afxdp.TransportAFXDP, afxdp.TransportAFXDP, afxdp.TransportUDP}
	nc := newNSCluster(t, "mix", nsSubnet(1), kinds)
	nsKillCheck(t, nc, rounds, "e2e afxdp-mixed: nodes=3 afxdp=2 udp=1")
}

// nsKillCheck runs rounds of runLeaderKills on nc, checks the kernel
// bypass, prints the summary line (head, then kills, ops, linearizable,
// lost) and fails t unless every round ran, the history is linearizable
// and no acknowledged write was lost.
func nsKillCheck(t *testing.T, nc *nsCluster, rounds int, head string) {
	t.Helper()
	r := runLeaderKills(t, nc, rounds)
	bypass := nc.checkBypass(t, r.commit)
	t.Logf("kernel UDP datagrams per namespace: %s (commit index %d)", bypass, r.commit)
	fmt.Printf("%s kills=%d ops=%d linearizable=%v lost=%d\n", head, r.kills, r.ops, r.linearizable, r.lost)
	if r.lost != 0 || !r.linearizable || r.kills < rounds {
		t.Fatalf("kills=%d/%d linearizable=%v lost=%d", r.kills, rounds, r.linearizable, r.lost)
	}
}
