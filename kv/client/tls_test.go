package client

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/internal/tlstest"
	"synod/kv/proto"
	"synod/kv/server"
	"synod/tenants"
)

// tlsDialTimeout is generous: the tests assert outcomes, not speed, and a
// handshake on a loaded 2-core machine may take a while.
const tlsDialTimeout = 10 * time.Second

// startTLSServer serves be on loopback through a TLS listener with conf,
// as kvnode does with a [tls] table.
func startTLSServer(t testing.TB, be server.Backend, conf *tls.Config) string {
	t.Helper()
	reg, err := tenants.NewRegistry([]tenants.Spec{{ID: 3, Name: "t", Token: token}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := server.New(server.Config{}, reg, be, zerolog.Nop())
	go s.Serve(tls.NewListener(ln, conf))
	t.Cleanup(func() { s.Close() })
	return ln.Addr().String()
}

// sniRecorder records the server name each TLS client asked for.
type sniRecorder struct {
	mu    sync.Mutex
	names []string
}

func (r *sniRecorder) hook(hi *tls.ClientHelloInfo) (*tls.Config, error) {
	r.mu.Lock()
	r.names = append(r.names, hi.ServerName)
	r.mu.Unlock()
	return nil, nil // the listener's own config
}

func (r *sniRecorder) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.names) == 0 {
		return "<no handshake>"
	}
	return r.names[len(r.names)-1]
}

// putGet writes and reads back one key through c.
func putGet(t *testing.T, c *Client, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), tlsDialTimeout)
	defer cancel()
	if err := c.Put(ctx, []byte(key), []byte("v-"+key)); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	if v, err := c.Get(ctx, []byte(key)); err != nil || string(v) != "v-"+key {
		t.Fatalf("get %s: %q %v", key, v, err)
	}
}

// wantConnError checks that a Dial failed as a transport failure whose
// message contains every one of want.
func wantConnError(t *testing.T, what string, c *Client, err error, want ...string) {
	t.Helper()
	if err == nil {
		c.Close()
		t.Fatalf("%s: connected, want a connection error", what)
	}
	if !errors.Is(err, ErrConnection) {
		t.Fatalf("%s: %v, want ErrConnection", what, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: %q does not mention %q", what, err, w)
		}
	}
	t.Logf("%s: %v", what, err)
}

// TestTLS: a TLS client verifies the server against its CA and the
// endpoint's host name, works through the Dial hook, and still
// authenticates with its token; a plaintext client and a TLS server (and
// the reverse) fail at once with a connection error, not a hang.
func TestTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "synod test CA")
	srvCert := ca.Server(t, "127.0.0.1", "kv.test")
	lb := localBackend(t)
	var calls atomic.Int64
	be := funcBackend(func(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
		calls.Add(1)
		return lb.Do(ctx, tenant, req)
	})
	sni := &sniRecorder{}
	addr := startTLSServer(t, be, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{srvCert.TLS},
		GetConfigForClient: sni.hook})
	ctx := context.Background()

	// Plaintext HELLO to a TLS port: the server drops it; the client says
	// why it may have, and nothing reached the backend.
	c, err := Dial(ctx, []string{addr}, token, Options{DialTimeout: tlsDialTimeout})
	wantConnError(t, "plain client, TLS server", c, err, "require TLS")
	if calls.Load() != 0 {
		t.Fatalf("a plaintext client got %d requests to the backend", calls.Load())
	}

	// TLS with the right CA: ServerName comes from the endpoint (an IP
	// here, checked against the IP SAN and not sent as SNI).
	conf := &tls.Config{RootCAs: ca.Pool()}
	c = dial(t, []string{addr}, Options{TLS: conf, DialTimeout: tlsDialTimeout})
	if c.Tenant() != 3 {
		t.Fatalf("tenant %d over TLS", c.Tenant())
	}
	putGet(t, c, "over-tls")
	if got := sni.last(); got != "" {
		t.Fatalf("SNI %q for an IP endpoint, want none", got)
	}
	if conf.ServerName != "" {
		t.Fatalf("the caller's tls.Config was modified: ServerName %q", conf.ServerName)
	}

	// A host-name endpoint through the Dial hook: the hook picks the
	// socket, the endpoint's host is the SNI and the name verified.
	_, port, _ := net.SplitHostPort(addr)
	var hooked atomic.Int64
	viaHook := Options{TLS: conf, DialTimeout: tlsDialTimeout, Dial: func(ctx context.Context, a string) (net.Conn, error) {
		hooked.Add(1)
		if a != "kv.test:"+port {
			return nil, errors.New("unexpected address " + a)
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}}
	c = dial(t, []string{"kv.test:" + port}, viaHook)
	putGet(t, c, "via-hook")
	if hooked.Load() == 0 || sni.last() != "kv.test" {
		t.Fatalf("dial hook used %d times, SNI %q; want the hook and SNI kv.test", hooked.Load(), sni.last())
	}

	// An explicit ServerName wins over the endpoint's host.
	c = dial(t, []string{addr}, Options{TLS: &tls.Config{RootCAs: ca.Pool(), ServerName: "kv.test"}, DialTimeout: tlsDialTimeout})
	putGet(t, c, "server-name")
	if sni.last() != "kv.test" {
		t.Fatalf("SNI %q, want kv.test", sni.last())
	}
	c, err = Dial(ctx, []string{addr}, token, Options{TLS: &tls.Config{RootCAs: ca.Pool(), ServerName: "elsewhere.test"}, DialTimeout: tlsDialTimeout})
	wantConnError(t, "wrong server name", c, err, "TLS handshake", "certificate")

	// A server certificate from a CA the client does not trust.
	other := tlstest.NewCA(t, "some other CA")
	c, err = Dial(ctx, []string{addr}, token, Options{TLS: &tls.Config{RootCAs: other.Pool()}, DialTimeout: tlsDialTimeout})
	wantConnError(t, "untrusted CA", c, err, "TLS handshake", "certificate")

	// TLS does not replace the token.
	if _, err := Dial(ctx, []string{addr}, "not-the-token", Options{TLS: conf, DialTimeout: tlsDialTimeout}); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("bad token over TLS: %v, want ErrUnauthorized", err)
	}

	// A TLS client to a plaintext server.
	plain := startServer(t, lb)
	c, err = Dial(ctx, []string{plain}, token, Options{TLS: conf, DialTimeout: tlsDialTimeout})
	wantConnError(t, "TLS client, plain server", c, err, "TLS handshake")
}

// TestMutualTLS: a server that requires client certificates refuses a
// client without one and a client whose certificate another CA issued,
// and serves a client with a certificate from its client CA; under TLS
// 1.2 (the refusal comes in the handshake) and 1.3 (it comes after the
// client's side of the handshake is done, on the first read).
func TestMutualTLS(t *testing.T) {
	serverCA := tlstest.NewCA(t, "server CA")
	clientCA := tlstest.NewCA(t, "client CA")
	rogueCA := tlstest.NewCA(t, "rogue CA")
	srvCert := serverCA.Server(t, "127.0.0.1")
	good := clientCA.Client(t, "tenant-3-app")
	rogue := rogueCA.Client(t, "tenant-3-app")
	lb := localBackend(t)
	for _, v := range []struct {
		name    string
		version uint16
	}{{"TLS1.2", tls.VersionTLS12}, {"TLS1.3", tls.VersionTLS13}} {
		t.Run(v.name, func(t *testing.T) {
			addr := startTLSServer(t, lb, &tls.Config{
				MinVersion: v.version, MaxVersion: v.version,
				Certificates: []tls.Certificate{srvCert.TLS},
				ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: clientCA.Pool(),
			})
			ctx := context.Background()
			opts := func(certs ...tls.Certificate) Options {
				return Options{TLS: &tls.Config{RootCAs: serverCA.Pool(), Certificates: certs}, DialTimeout: tlsDialTimeout}
			}
			c, err := Dial(ctx, []string{addr}, token, opts())
			wantConnError(t, "no client certificate", c, err)
			// Go's client offers only a certificate the server's CA list
			// names; force the rogue one so the server must verify it.
			rogueOpts := opts()
			rogueOpts.TLS.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &rogue.TLS, nil }
			c, err = Dial(ctx, []string{addr}, token, rogueOpts)
			wantConnError(t, "client certificate from another CA", c, err)
			c, err = Dial(ctx, []string{addr}, token, Options{DialTimeout: tlsDialTimeout})
			wantConnError(t, "plaintext client", c, err)

			c = dial(t, []string{addr}, opts(good.TLS))
			putGet(t, c, "mtls-"+v.name)
			if _, err := Dial(ctx, []string{addr}, "not-the-token", opts(good.TLS)); !errors.Is(err, ErrUnauthorized) {
				t.Fatalf("bad token with a good certificate: %v, want ErrUnauthorized", err)
			}
		})
	}
}
