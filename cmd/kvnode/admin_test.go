package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"synod/afxdp"
	"synod/kv/replica"
	"synod/kv/sm"
	"synod/paxos"
	"synod/pmem"
)

// newSoloReplica starts a one-member replica on the in-memory network.
func newSoloReplica(t *testing.T) *replica.Replica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	addr := netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", port))
	dir := t.TempDir()
	plog, _, err := replica.OpenPMemLog(pmem.Options{Path: filepath.Join(dir, "log"), SizeBytes: 4 << 20, Mode: pmem.ModeMsync, ClusterID: 1, NodeID: 1})
	if err != nil {
		t.Fatal(err)
	}
	store, err := sm.Open(filepath.Join(dir, "sm"), sm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := replica.New(replica.Config{
		ID: 1, ClusterID: 1, Peers: []replica.Peer{{ID: 1, ConsensusAddr: addr, ClientAddr: "c:1"}},
		Tick: time.Millisecond, ElectionTicks: 50, HeartbeatTicks: 5, LeaseTicks: 30, DriftTicks: 2,
		Cores: replica.Unpinned, Log: zerolog.Nop(), Accel: &replica.AccelConfig{},
	}, afxdp.NewMemNetwork().Listen(addr), plog, store)
	if err != nil {
		t.Fatal(err)
	}
	r.Start()
	t.Cleanup(func() { r.Close(); store.Close() })
	return r
}

func TestAdminEndpoints(t *testing.T) {
	r := newSoloReplica(t)
	reg := prometheus.NewRegistry()
	for _, on := range []bool{false, true} {
		srv := httptest.NewServer(adminMux(r, reg, r.Faults(), on))
		resp, err := http.PostForm(srv.URL+"/debug/faults", url.Values{"block": {"2,3"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if on != (resp.StatusCode == http.StatusOK) {
			t.Fatalf("fault_injection=%v: POST /debug/faults answered %s", on, resp.Status)
		}
		resp, err = http.Get(srv.URL + "/status")
		if err != nil {
			t.Fatal(err)
		}
		var st nodeStatus
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if st.ID != 1 || st.Durability != "msync" || st.Accel == nil {
			t.Fatalf("status: %+v", st)
		}
		if on && (len(st.Blocked) != 2 || st.Blocked[0] != 2) {
			t.Fatalf("blocked peers not reported: %+v", st.Blocked)
		}
		if !on && len(st.Blocked) != 0 {
			t.Fatalf("faults applied with fault_injection off: %+v", st.Blocked)
		}
		resp, err = http.Get(srv.URL + "/debug/pprof/")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("pprof: %v %v", resp.Status, err)
		}
		resp.Body.Close()
		resp, err = http.Get(srv.URL + "/metrics")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("metrics: %v %v", resp.Status, err)
		}
		resp.Body.Close()
		srv.Close()
	}
	r.Faults().HealAll()
	// A one-member group elects itself.
	deadline := time.Now().Add(10 * time.Second)
	for r.Status().Role != paxos.RoleLeader {
		if time.Now().After(deadline) {
			t.Fatal("a one-member group did not elect itself")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !strings.Contains(r.Mode(), "msync") {
		t.Fatal(r.Mode())
	}
}
