package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
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
	"synod/tenants"
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
	plog, _, err := replica.OpenPMemLog(pmem.Options{Path: filepath.Join(dir, "log"), SizeBytes: 16 << 20, Mode: pmem.ModeMsync, ClusterID: 1, NodeID: 1})
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
		if err != nil || resp.StatusCode != http.StatusNotFound {
			t.Fatalf("pprof without [admin] pprof: %v %v", resp.Status, err)
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

const testAdminToken = "0123456789abcdef0123456789abcdef"

// adminDo sends method path to srv with the Authorization header auth
// ("" for none) and returns the status code.
func adminDo(t *testing.T, srv *httptest.Server, method, path, auth string) int {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(url.Values{"block": {"2"}}.Encode())
	}
	req, err := http.NewRequest(method, srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("%s %s: 401 without WWW-Authenticate", method, path)
	}
	return resp.StatusCode
}

// TestAdminTokenRequired: with [admin] token set, every admin path but
// /healthz answers 401 without the token (or with a wrong one), and
// /debug/faults changes nothing.
func TestAdminTokenRequired(t *testing.T) {
	r := newSoloReplica(t)
	cfg := &Config{AdminListen: "0.0.0.0:7021", FaultInjection: true, Admin: AdminConfig{Token: testAdminToken, PProf: true}}
	if err := cfg.validateAdmin(); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(cfg.adminHandler(adminMux(r, prometheus.NewRegistry(), r.Faults(), true), zerolog.Nop()))
	defer srv.Close()
	paths := []struct{ method, path string }{
		{http.MethodGet, "/status"}, {http.MethodGet, "/metrics"}, {http.MethodGet, "/debug/pprof/"},
		{http.MethodGet, "/debug/pprof/cmdline"}, {http.MethodGet, "/debug/pprof/heap"}, {http.MethodPost, "/debug/faults"},
		{http.MethodGet, "/nowhere"}, {http.MethodPost, "/healthz"},
	}
	for _, p := range paths {
		for _, auth := range []string{"", "Bearer wrong-token-0123456789abcdef", "Basic " + testAdminToken, "Bearer " + testAdminToken + "x",
			"Bearer", testAdminToken} {
			if code := adminDo(t, srv, p.method, p.path, auth); code != http.StatusUnauthorized {
				t.Fatalf("%s %s with Authorization %q: %d, want 401", p.method, p.path, auth, code)
			}
		}
	}
	if b := r.Faults().Blocked(); len(b) != 0 {
		t.Fatalf("an unauthenticated POST /debug/faults blocked %v", b)
	}
	if code := adminDo(t, srv, http.MethodGet, "/healthz", ""); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	for _, p := range paths[:6] {
		for _, auth := range []string{"Bearer " + testAdminToken, "bearer " + testAdminToken} {
			if code := adminDo(t, srv, p.method, p.path, auth); code != http.StatusOK {
				t.Fatalf("%s %s with the token: %d", p.method, p.path, code)
			}
		}
	}
	if b := r.Faults().Blocked(); len(b) != 1 || b[0] != 2 {
		t.Fatalf("an authenticated POST /debug/faults: blocked %v", b)
	}
	r.Faults().HealAll()
}

// TestAdminPProfOffByDefault: without [admin] pprof there is no
// /debug/pprof/ (profile, heap, cmdline); a loopback admin address without
// a token serves the rest unauthenticated.
func TestAdminPProfOffByDefault(t *testing.T) {
	r := newSoloReplica(t)
	cfg, err := parseConfig([]byte(readExample(t)))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Admin.PProf || cfg.Admin.token != "" {
		t.Fatalf("[admin] defaults: %+v", cfg.Admin)
	}
	srv := httptest.NewServer(cfg.adminHandler(adminMux(r, prometheus.NewRegistry(), r.Faults(), false), zerolog.Nop()))
	defer srv.Close()
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/heap", "/debug/pprof/profile?seconds=1", "/debug/pprof/trace?seconds=1"} {
		if code := adminDo(t, srv, http.MethodGet, p, ""); code != http.StatusNotFound {
			t.Fatalf("%s with pprof off: %d, want 404", p, code)
		}
	}
	if code := adminDo(t, srv, http.MethodPost, "/debug/faults", ""); code != http.StatusNotFound {
		t.Fatalf("/debug/faults with fault_injection off: %d, want 404", code)
	}
	for _, p := range []string{"/status", "/metrics", "/healthz"} {
		if code := adminDo(t, srv, http.MethodGet, p, ""); code != http.StatusOK {
			t.Fatalf("%s on loopback without a token: %d", p, code)
		}
	}
}

// TestAdminConfigValidation: a non-loopback admin_listen needs a token; the
// error names the key.
func TestAdminConfigValidation(t *testing.T) {
	base := readExample(t)
	const listen = `admin_listen = "127.0.0.1:7021"`
	if !strings.Contains(base, listen) {
		t.Fatalf("the example config has no %s", listen)
	}
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(tokenFile, []byte("  "+testAdminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr, admin string
		want        string // "" for valid
	}{
		{"0.0.0.0:7021", "", "admin.token"},
		{":7021", "", "admin.token"},
		{"10.1.2.3:7021", "", "admin.token"},
		{"[::]:7021", "", "admin.token"},
		{"node1.example:7021", "", "admin.token"},
		{"127.0.0.1:7021", "", ""},
		{"127.0.0.5:7021", "", ""},
		{"[::1]:7021", "", ""},
		{"localhost:7021", "", ""},
		{"0.0.0.0:7021", "token = \"" + testAdminToken + "\"\n", ""},
		{"0.0.0.0:7021", "token_file = \"" + tokenFile + "\"\n", ""},
		{"0.0.0.0:7021", "token = \"short\"\n", "admin.token"},
		{"0.0.0.0:7021", "token = \"has a space in it, 0123456789\"\n", "admin.token"},
		{"127.0.0.1:7021", "token = \"" + testAdminToken + "\"\ntoken_file = \"" + tokenFile + "\"\n", "token or token_file"},
		{"0.0.0.0:7021", "token_file = \"/nonexistent/admin-token\"\n", "admin.token_file"},
		{"127.0.0.1:7021", "prof = true\n", "admin.prof"},
	} {
		text := strings.Replace(base, listen, fmt.Sprintf("admin_listen = %q", tc.addr), 1)
		if tc.admin != "" {
			text += "\n[admin]\n" + tc.admin
		}
		c, err := parseConfig([]byte(text))
		switch {
		case tc.want == "" && err != nil:
			t.Fatalf("%s %q: %v", tc.addr, tc.admin, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Fatalf("%s %q: got %v, want an error naming %s", tc.addr, tc.admin, err, tc.want)
		case err == nil && tc.admin != "" && c.Admin.token != testAdminToken:
			t.Fatalf("%s %q: resolved token %q", tc.addr, tc.admin, c.Admin.token)
		}
	}
}

// TestClientSharesConfig: [[tenants]] clients_max sets a tenant's share of
// the exactly-once table; the others split what is left, up to the default.
func TestClientSharesConfig(t *testing.T) {
	base := readExample(t)
	const prio = "priority = \"standard\""
	for _, tc := range []struct {
		share  string
		want   map[tenants.ID]int
		errKey string
	}{
		{"", map[tenants.ID]int{1: sm.ClientsPerTenantDefault, 2: sm.ClientsPerTenantDefault}, ""},
		{"clients_max = 64", map[tenants.ID]int{1: 64, 2: sm.ClientsPerTenantDefault}, ""},
		{"clients_max = 16000", map[tenants.ID]int{1: 16000, 2: sm.ClientsTotalMax - 16000}, ""},
		{"clients_max = 8", nil, "tenants[0].clients_max"},
		{fmt.Sprintf("clients_max = %d", sm.ClientsPerTenantMax+1), nil, "tenants[0].clients_max"},
		{fmt.Sprintf("clients_max = %d", sm.ClientsTotalMax), nil, "tenants.clients_max"},
	} {
		c, err := parseConfig([]byte(strings.Replace(base, prio, prio+"\n"+tc.share, 1)))
		if tc.errKey != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errKey) {
				t.Fatalf("%q: got %v, want an error naming %s", tc.share, err, tc.errKey)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.share, err)
		}
		got := c.smOptions().ClientsMax
		if len(got) != len(tc.want) {
			t.Fatalf("%q: shares %v, want %v", tc.share, got, tc.want)
		}
		for id, n := range tc.want {
			if got[id] != n {
				t.Fatalf("%q: shares %v, want %v", tc.share, got, tc.want)
			}
		}
		// The state machine takes them.
		s, err := sm.Open(t.TempDir(), c.smOptions())
		if err != nil {
			t.Fatalf("%q: %v", tc.share, err)
		}
		s.Close()
	}
}
