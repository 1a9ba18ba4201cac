package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"synod/internal/tlstest"
	"synod/kv/client"
)

var (
	kvctlOnce sync.Once
	kvctlBin  string
	kvctlErr  error
)

// kvctlBinary returns a kvctl built once per test process, as TestMain
// builds kvnode.
func kvctlBinary(t testing.TB) string {
	t.Helper()
	kvctlOnce.Do(func() {
		dir := binDir
		if dir == "" {
			dir = os.TempDir() // E2E_KVNODE: no build dir of TestMain's
		}
		kvctlBin = filepath.Join(dir, "kvctl")
		build := exec.Command("go", "build", "-o", kvctlBin, "./cmd/kvctl")
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			kvctlErr = fmt.Errorf("building kvctl: %v\n%s", err, out)
		}
	})
	if kvctlErr != nil {
		t.Fatal(kvctlErr)
	}
	return kvctlBin
}

// TLS harness settings (bounds, not speed assertions).
const (
	tlsDialTimeout = 5 * time.Second // one TLS + HELLO handshake on a loaded machine
	tlsOpTimeout   = 30 * time.Second
	kvctlTimeout   = 60 * time.Second
)

// tlsPKI is the throwaway PKI of a TLS test: a server CA and one server
// certificate for 127.0.0.1 that every node serves (every client_addr is
// on 127.0.0.1, so redirects verify too), and a client CA with one client
// certificate; all written to files for the configs and kvctl.
type tlsPKI struct {
	serverCA, clientCA   *tlstest.CA
	client               *tlstest.Leaf
	caFile, clientCAFile string
	certFile, keyFile    string // the server's
	clientCert, clientKy string // the client's
}

func newTLSPKI(t *testing.T) *tlsPKI {
	t.Helper()
	dir := t.TempDir()
	p := &tlsPKI{serverCA: tlstest.NewCA(t, "e2e server CA"), clientCA: tlstest.NewCA(t, "e2e client CA")}
	p.caFile = tlstest.WriteFile(t, dir, "server-ca.crt", p.serverCA.PEM)
	p.clientCAFile = tlstest.WriteFile(t, dir, "client-ca.crt", p.clientCA.PEM)
	p.certFile, p.keyFile = p.serverCA.Server(t, "127.0.0.1").WriteFiles(t, dir, "node")
	p.client = p.clientCA.Client(t, "e2e-app")
	p.clientCert, p.clientKy = p.client.WriteFiles(t, dir, "client")
	return p
}

// clientTLS is a Go client TLS config trusting the server CA, presenting
// certs.
func (p *tlsPKI) clientTLS(certs ...tls.Certificate) *tls.Config {
	return &tls.Config{RootCAs: p.serverCA.Pool(), Certificates: certs}
}

// newClusterTables starts n kvnode processes (tenant A only) whose configs
// carry top-level keys top and further tables (see writeConfig).
func newClusterTables(t *testing.T, n int, top, tables string) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir()}
	mode := c.pmemDir("synod-e2e-tls-")
	for i := 1; i <= n; i++ {
		c.nodes = append(c.nodes, &node{
			id:        i,
			client:    fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			consensus: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			admin:     fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		})
	}
	for _, nd := range c.nodes {
		c.writeConfig(nd, 11, mode, top, tables, []tenant{tenantA})
	}
	t.Cleanup(func() { c.stopAll(true) })
	for _, nd := range c.nodes {
		c.start(nd)
	}
	return c
}

func dialTLS(ctx context.Context, eps []string, token string, conf *tls.Config) (*client.Client, error) {
	return client.Dial(ctx, eps, token, client.Options{
		TLS: conf, RetriesMax: killClientRetries, BackoffMax: killClientBackoff,
		DialTimeout: tlsDialTimeout, RequestTimeout: tlsOpTimeout,
	})
}

// wantDialRefused checks that a Dial failed with a connection error.
func wantDialRefused(t *testing.T, what string, cl *client.Client, err error) {
	t.Helper()
	if err == nil {
		cl.Close()
		t.Fatalf("%s: connected, want a connection error", what)
	}
	if !errors.Is(err, client.ErrConnection) {
		t.Fatalf("%s: %v, want a connection error", what, err)
	}
	t.Logf("%s refused: %v", what, err)
}

// TestTLSClientPort runs a 3-node Paxos cluster whose client ports require
// mutual TLS ([tls] cert_file, key_file, client_ca_file): the Go client
// with the CA and a client certificate writes and reads through a
// follower's redirect; a plaintext client, a client without a certificate
// and a bad token are refused; kvctl writes, reads and shows status over
// TLS. A 3-node Raft cluster with server TLS checks the other replication
// path's listener.
func TestTLSClientPort(t *testing.T) {
	p := newTLSPKI(t)
	tables := fmt.Sprintf("[tls]\ncert_file = %q\nkey_file = %q\nclient_ca_file = %q\n", p.certFile, p.keyFile, p.clientCAFile)
	c := newClusterTables(t, 3, "", tables)
	for _, nd := range c.nodes {
		// The admin port (what start waits for) opens just before the
		// "kvnode serving" line is logged.
		for deadline := time.Now().Add(startTimeout); ; time.Sleep(statusPollEvery) {
			b, err := os.ReadFile(nd.logPath)
			if err == nil && bytes.Contains(b, []byte(`"client_tls":"mtls"`)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d's start-up log does not say client_tls mtls (%v)", nd.id, err)
			}
		}
	}
	l := c.leader()
	// A follower first: its NOT_LEADER names the leader's client_addr, and
	// the client verifies the leader's certificate against that host.
	var eps []string
	for _, nd := range c.nodes {
		if nd != l {
			eps = append(eps, nd.client)
		}
	}
	eps = append(eps, l.client)

	ctx, cancel := ctxTimeout(tlsOpTimeout)
	defer cancel()
	cl, err := dialTLS(ctx, eps, tenantA.token, p.clientTLS(p.client.TLS))
	if err != nil {
		t.Fatalf("TLS client with a certificate: %v", err)
	}
	defer cl.Close()
	for i := range 20 {
		k, v := fmt.Sprintf("tls-%d", i), fmt.Sprintf("v%d", i)
		if err := cl.Put(ctx, []byte(k), []byte(v)); err != nil {
			t.Fatalf("put %s over TLS: %v", k, err)
		}
		if got, err := cl.Get(ctx, []byte(k)); err != nil || string(got) != v {
			t.Fatalf("get %s over TLS: %q %v", k, got, err)
		}
	}
	st, err := cl.Status(ctx)
	if err != nil || st.LeaderID != uint64(l.id) {
		t.Fatalf("status over TLS: %+v %v (leader is node %d)", st, err, l.id)
	}

	plain, err := client.Dial(ctx, eps, tenantA.token, client.Options{DialTimeout: tlsDialTimeout})
	wantDialRefused(t, "plaintext client", plain, err)
	noCert, err := dialTLS(ctx, eps, tenantA.token, p.clientTLS())
	wantDialRefused(t, "TLS client without a certificate", noCert, err)
	if bad, err := dialTLS(ctx, eps, "not-a-real-token", p.clientTLS(p.client.TLS)); !errors.Is(err, client.ErrUnauthorized) {
		if bad != nil {
			bad.Close()
		}
		t.Fatalf("bad token over mutual TLS: %v, want ErrUnauthorized", err)
	}

	// kvctl over mutual TLS.
	kvctl := func(args ...string) (string, error) {
		t.Helper()
		kctx, kcancel := ctxTimeout(kvctlTimeout)
		defer kcancel()
		base := []string{"--endpoints", strings.Join(eps, ","), "--token", tenantA.token, "--timeout", tlsOpTimeout.String(),
			"--tls-ca", p.caFile, "--tls-cert", p.clientCert, "--tls-key", p.clientKy}
		cmd := exec.CommandContext(kctx, kvctlBinary(t), append(base, args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if err != nil {
			err = fmt.Errorf("kvctl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.String(), err
	}
	if out, err := kvctl("put", "from-kvctl", "hello"); err != nil || out != "OK\n" {
		t.Fatalf("kvctl put over TLS: %q %v", out, err)
	}
	if v, err := cl.Get(ctx, []byte("from-kvctl")); err != nil || string(v) != "hello" {
		t.Fatalf("the Go client reads kvctl's write: %q %v", v, err)
	}
	if out, err := kvctl("get", "tls-7"); err != nil || out != "v7\n" {
		t.Fatalf("kvctl get over TLS: %q %v", out, err)
	}
	out, err := kvctl("status")
	if err != nil || !strings.Contains(out, fmt.Sprintf("leader:      %d (%s)", l.id, l.client)) {
		t.Fatalf("kvctl status over TLS:\n%s\n%v", out, err)
	}
	t.Logf("kvctl status over mutual TLS:\n%s", out)

	t.Run("raft", func(t *testing.T) {
		tables := fmt.Sprintf("[tls]\ncert_file = %q\nkey_file = %q\nmin_version = \"1.2\"\n", p.certFile, p.keyFile)
		rc := newClusterTables(t, 3, "replication = \"raft\"\n", tables)
		ctx, cancel := ctxTimeout(tlsOpTimeout)
		defer cancel()
		plain, err := client.Dial(ctx, rc.endpoints(), tenantA.token, client.Options{DialTimeout: tlsDialTimeout})
		wantDialRefused(t, "plaintext client (raft)", plain, err)
		// Raft elects on its own clock (and its /status has no lease for
		// c.leader to wait on): the put is retried until it has.
		cl, err := dialTLS(ctx, rc.endpoints(), tenantA.token, p.clientTLS())
		if err != nil {
			t.Fatalf("TLS client (raft): %v", err)
		}
		defer cl.Close()
		for {
			err := cl.Put(ctx, []byte("raft-tls"), []byte("ok"))
			if err == nil {
				break
			}
			if ctx.Err() != nil || !(errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrNotLeader) || errors.Is(err, client.ErrConnection)) {
				t.Fatalf("put over TLS (raft): %v", err)
			}
			t.Logf("put over TLS (raft), no leader yet: %v", err)
			time.Sleep(statusPollEvery)
		}
		if v, err := cl.Get(ctx, []byte("raft-tls")); err != nil || string(v) != "ok" {
			t.Fatalf("get over TLS (raft): %q %v", v, err)
		}
	})
}
