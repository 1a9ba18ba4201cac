package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/afxdp"
	"synod/kv/backup"
	"synod/kv/proto"
	"synod/kv/replica"
	"synod/kv/sm"
	"synod/paxos"
	"synod/pmem"
)

// soloNode is a one-member replica with its state machine, leading.
type soloNode struct {
	r  *replica.Replica
	sm *sm.SM
	be *replica.Backend
}

// startSolo starts a one-member replica of clusterID from dataDir/sm and
// pmemPath (created when missing) and waits until it leads.
func startSolo(t *testing.T, clusterID uint64, dataDir, pmemPath string) *soloNode {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	plog, _, err := replica.OpenPMemLog(pmem.Options{Path: pmemPath, SizeBytes: 16 << 20, Mode: pmem.ModeMsync, ClusterID: clusterID, NodeID: 1})
	if err != nil {
		t.Fatal(err)
	}
	store, err := sm.Open(filepath.Join(dataDir, smDirName), sm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := replica.New(replica.Config{
		ID: 1, ClusterID: clusterID, Peers: []replica.Peer{{ID: 1, ConsensusAddr: addr, ClientAddr: "c:1"}},
		Tick: time.Millisecond, ElectionTicks: 50, HeartbeatTicks: 5, LeaseTicks: 30, DriftTicks: 2,
		Cores: replica.Unpinned, Log: zerolog.Nop(),
	}, afxdp.NewMemNetwork().Listen(addr), plog, store)
	if err != nil {
		t.Fatal(err)
	}
	r.Start()
	n := &soloNode{r: r, sm: store, be: replica.NewBackend(r, store)}
	t.Cleanup(n.stop)
	deadline := time.Now().Add(10 * time.Second)
	for r.Status().Role != paxos.RoleLeader {
		if time.Now().After(deadline) {
			t.Fatal("a one-member group did not elect itself")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return n
}

func (n *soloNode) stop() {
	n.r.Close()
	n.sm.Close()
}

var soloSeq uint64

func (n *soloNode) put(t *testing.T, k, v string) {
	t.Helper()
	soloSeq++
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp := n.be.Do(ctx, 1, &proto.Request{Op: proto.OpPut, Tenant: 1, ClientID: 42, Seq: soloSeq, FirstUnacked: soloSeq, Key: []byte(k), Value: []byte(v)})
	if resp.Status != proto.StatusOK {
		t.Fatalf("put %s: %v %s", k, resp.Status, resp.Message)
	}
}

func (n *soloNode) get(t *testing.T, k string) (string, proto.Status) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp := n.be.Do(ctx, 1, &proto.Request{Op: proto.OpGet, Tenant: 1, Key: []byte(k)})
	return string(resp.Value), resp.Status
}

// restoreConfig writes a one-member config of clusterID for the restore
// tests and returns its path.
func restoreConfig(t *testing.T, dir string, clusterID uint64) string {
	t.Helper()
	cfg := fmt.Sprintf(`node_id = 1
cluster_id = %d
data_dir = %q
client_listen = "127.0.0.1:1"
consensus_listen = "127.0.0.1:2"
[pmem]
path = %q
size_bytes = %d
mode = "msync"
[[peers]]
id = 1
consensus_addr = "127.0.0.1:2"
client_addr = "127.0.0.1:1"
[[tenants]]
id = 1
name = "t"
token = "restore-test-token"
`, clusterID, filepath.Join(dir, "data"), filepath.Join(dir, "pmem", "n1.pmem"), 16<<20)
	path := filepath.Join(dir, "node1.toml")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSnapshotEndpointAndRestore takes a backup from a live one-member
// cluster through GET /snapshot, restores it into a new cluster with
// another cluster id, and starts that: every write acknowledged before the
// request is there, and the new cluster serves writes.
func TestSnapshotEndpointAndRestore(t *testing.T) {
	src := startSolo(t, 7, t.TempDir(), filepath.Join(t.TempDir(), "src.pmem"))
	for i := 0; i < 50; i++ {
		src.put(t, fmt.Sprint("k", i), fmt.Sprint("v", i))
	}
	// A membership record of the old cluster, with addresses the new
	// one does not have: the restore must not carry it over.
	if err := src.sm.SetMembership([]sm.Member{{ID: 1, ConsensusAddr: "10.9.9.9:1", ClientAddr: "old:1"}, {ID: 2, ConsensusAddr: "10.9.9.9:2", ClientAddr: "old:2"}}); err != nil {
		t.Fatal(err)
	}
	h := snapshotHandler(src.r, src.sm, 7, zerolog.Nop())
	srv := httptest.NewServer(h)
	defer srv.Close()
	if resp, err := http.Post(srv.URL, "text/plain", nil); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /snapshot: %v %v", resp.Status, err)
	}
	resp, err := http.Get(srv.URL)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /snapshot: %v %v", resp.Status, err)
	}
	file := filepath.Join(t.TempDir(), "b.backup")
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, body, 0o600); err != nil {
		t.Fatal(err)
	}
	info, err := backup.VerifyFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if info.ClusterID != 7 || info.Slot < 50 || fmt.Sprint(info.Members) != "[1]" || resp.Header.Get(headerSnapshotSlot) != fmt.Sprint(info.Slot) {
		t.Fatalf("backup %+v, header slot %q", info, resp.Header.Get(headerSnapshotSlot))
	}
	src.stop()

	dir := t.TempDir()
	var out bytes.Buffer
	// Refusals that create nothing.
	sameCfg := restoreConfig(t, filepath.Join(dir, "same"), 7)
	if err := runRestore([]string{"--from", file, "--config", sameCfg}, &out); err == nil || !strings.Contains(err.Error(), "needs a new id") {
		t.Fatalf("restore with the old cluster id: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "same", "data")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused restore left a data_dir: %v", err)
	}
	cfg := restoreConfig(t, dir, 8)
	if err := runRestore([]string{"--from", file, "--config", cfg, "--cluster-id", "9"}, &out); err == nil || !strings.Contains(err.Error(), "--cluster-id 9") {
		t.Fatalf("restore with a --cluster-id the config does not have: %v", err)
	}
	damaged := filepath.Join(t.TempDir(), "damaged.backup")
	flipped := bytes.Clone(body)
	flipped[len(flipped)/2] ^= 1
	os.WriteFile(damaged, flipped, 0o600)
	if err := runRestore([]string{"--from", damaged, "--config", cfg}, &out); !errors.Is(err, backup.ErrChecksum) {
		t.Fatalf("restore of a damaged file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused restore left a data_dir: %v", err)
	}

	// The restore.
	if err := runRestore([]string{"--from", file, "--config", cfg, "--cluster-id", "8"}, &out); err != nil {
		t.Fatalf("restore: %v\n%s", err, out.String())
	}
	t.Logf("kvnode restore printed:\n%s", out.String())
	// Once more into the same place: refused, nothing overwritten.
	if err := runRestore([]string{"--from", file, "--config", cfg}, &out); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("second restore into the same data_dir: %v", err)
	}
	os.RemoveAll(filepath.Join(dir, "data"))
	if err := runRestore([]string{"--from", file, "--config", cfg}, &out); err == nil || !strings.Contains(err.Error(), "acceptor log") {
		t.Fatalf("restore over an existing acceptor log: %v", err)
	}
	os.Remove(filepath.Join(dir, "pmem", "n1.pmem"))
	if err := runRestore([]string{"--from", file, "--config", cfg}, &out); err != nil {
		t.Fatal(err)
	}

	// The acceptor log is the new cluster's: the old id does not open it.
	if _, _, err := replica.OpenPMemLog(pmem.Options{Path: filepath.Join(dir, "pmem", "n1.pmem"), Mode: pmem.ModeMsync, ClusterID: 7, NodeID: 1}); err == nil {
		t.Fatal("the restored acceptor log opened under the old cluster id")
	}
	dst := startSolo(t, 8, filepath.Join(dir, "data"), filepath.Join(dir, "pmem", "n1.pmem"))
	// The restored membership is the new config's, not the backup's.
	if rec, ok, err := dst.sm.Membership(); err != nil || !ok || len(rec.Members) != 1 ||
		rec.Members[0] != (sm.Member{ID: 1, ConsensusAddr: "127.0.0.1:2", ClientAddr: "127.0.0.1:1"}) {
		t.Fatalf("restored membership %+v (%v %v), want the config's one peer", rec, ok, err)
	}
	if st := dst.r.Status(); fmt.Sprint(st.Members) != "[1]" {
		t.Fatalf("restored node's voters %v, want [1]", st.Members)
	}
	if got := uint64(dst.r.Applied()); got < info.Slot {
		t.Fatalf("restored node applied %d, backup slot %d", got, info.Slot)
	}
	for i := 0; i < 50; i++ {
		if v, st := dst.get(t, fmt.Sprint("k", i)); st != proto.StatusOK || v != fmt.Sprint("v", i) {
			t.Fatalf("k%d after the restore: %q %v", i, v, st)
		}
	}
	dst.put(t, "new", "write")
	if v, st := dst.get(t, "new"); st != proto.StatusOK || v != "write" {
		t.Fatalf("a write on the restored cluster: %q %v", v, st)
	}
}

// TestSnapshotEndpointNotLeader: a node that does not lead answers 409 (and
// never streams a snapshot that could miss acknowledged writes).
func TestSnapshotEndpointNotLeader(t *testing.T) {
	n := startSolo(t, 7, t.TempDir(), filepath.Join(t.TempDir(), "p.pmem"))
	n.r.Close() // stopped: no read barrier
	srv := httptest.NewServer(snapshotHandler(n.r, n.sm, 7, zerolog.Nop()))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatal("a stopped node streamed a snapshot")
	}
}
