package main

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"synod/internal/tlstest"
	"synod/kv/local"
	"synod/kv/server"
	"synod/kv/sm"
	"synod/tenants"
)

// startTLSStore serves a local store over TLS with conf, as kvnode does
// with a [tls] table.
func startTLSStore(t *testing.T, conf *tls.Config) string {
	t.Helper()
	s, err := sm.Open(t.TempDir(), sm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	reg, err := tenants.NewRegistry([]tenants.Spec{{ID: 1, Name: "t", Token: testToken}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Config{}, reg, local.New(s, ln.Addr().String()), zerolog.Nop())
	go srv.Serve(tls.NewListener(ln, conf))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// TestTLSFlags runs kvctl against a server that requires TLS with client
// certificates (mutual TLS), and against one with server TLS only.
func TestTLSFlags(t *testing.T) {
	dir := t.TempDir()
	serverCA := tlstest.NewCA(t, "server CA")
	clientCA := tlstest.NewCA(t, "client CA")
	caFile := tlstest.WriteFile(t, dir, "ca.crt", serverCA.PEM)
	otherCAFile := tlstest.WriteFile(t, dir, "other-ca.crt", tlstest.NewCA(t, "other CA").PEM)
	certFile, keyFile := clientCA.Client(t, "kvctl").WriteFiles(t, dir, "client")
	_, otherKey := clientCA.Client(t, "kvctl").WriteFiles(t, dir, "other-client")
	srvCert := serverCA.Server(t, "127.0.0.1", "kv.test")
	mtls := startTLSStore(t, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{srvCert.TLS},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCA.Pool()})
	serverOnly := startTLSStore(t, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{srvCert.TLS}})
	common := func(addr string, more ...string) []string {
		return append([]string{"--endpoints", addr, "--token", testToken, "--timeout", "30s"}, more...)
	}
	mtlsFlags := common(mtls, "--tls-ca", caFile, "--tls-cert", certFile, "--tls-key", keyFile)

	steps := []struct {
		name    string
		args    []string
		want    string
		wantErr []string
	}{
		{name: "mtls put", args: append([]string{"put", "a", "1"}, mtlsFlags...), want: "OK\n"},
		{name: "mtls get", args: append([]string{"get", "a"}, mtlsFlags...), want: "1\n"},
		{name: "plaintext to a TLS port", args: append([]string{"get", "a"}, common(mtls)...), wantErr: []string{"connection failed", "--tls-ca"}},
		{name: "no client certificate", args: append([]string{"get", "a"}, common(mtls, "--tls-ca", caFile)...), wantErr: []string{"connection failed"}},
		{name: "untrusted server", args: append([]string{"get", "a"}, common(mtls, "--tls-ca", otherCAFile, "--tls-cert", certFile, "--tls-key", keyFile)...),
			wantErr: []string{"TLS handshake", "certificate"}},
		{name: "cert without key", args: append([]string{"get", "a"}, common(mtls, "--tls-ca", caFile, "--tls-cert", certFile)...), wantErr: []string{"--tls-cert", "--tls-key"}},
		{name: "key without cert", args: append([]string{"get", "a"}, common(mtls, "--tls-ca", caFile, "--tls-key", keyFile)...), wantErr: []string{"--tls-key", "--tls-cert"}},
		{name: "cert and key mismatched", args: append([]string{"get", "a"}, common(mtls, "--tls-ca", caFile, "--tls-cert", certFile, "--tls-key", otherKey)...),
			wantErr: []string{"--tls-cert/--tls-key", "does not match"}},
		{name: "missing CA file", args: append([]string{"get", "a"}, common(mtls, "--tls-ca", dir+"/nope.crt")...), wantErr: []string{"--tls-ca", "no such file"}},
		{name: "CA file without a certificate", args: append([]string{"get", "a"}, common(mtls, "--tls-ca", keyFile)...), wantErr: []string{"--tls-ca", "no PEM certificate"}},
		{name: "insecure with a CA", args: append([]string{"get", "a"}, common(serverOnly, "--tls-ca", caFile, "--tls-insecure")...), wantErr: []string{"--tls-insecure"}},

		{name: "server TLS put", args: append([]string{"put", "b", "2"}, common(serverOnly, "--tls-ca", caFile)...), want: "OK\n"},
		{name: "server name", args: append([]string{"get", "b"}, common(serverOnly, "--tls-ca", caFile, "--tls-server-name", "kv.test")...), want: "2\n"},
		{name: "wrong server name", args: append([]string{"get", "b"}, common(serverOnly, "--tls-ca", caFile, "--tls-server-name", "elsewhere.test")...),
			wantErr: []string{"TLS handshake", "elsewhere.test"}},
		{name: "system roots only", args: append([]string{"get", "b"}, common(serverOnly, "--tls")...), wantErr: []string{"TLS handshake", "certificate"}},
		{name: "insecure (tests only)", args: append([]string{"get", "b"}, common(serverOnly, "--tls-insecure")...), want: "2\n"},
	}
	for _, s := range steps {
		out, err := kvctl(t, s.args...)
		if len(s.wantErr) > 0 {
			if err == nil {
				t.Fatalf("%s: succeeded (%q), want an error", s.name, out)
			}
			for _, w := range s.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("%s: error %q does not mention %q", s.name, err, w)
				}
			}
			t.Logf("%s: %v", s.name, err)
			continue
		}
		if err != nil || out != s.want {
			t.Fatalf("%s: %q %v, want %q", s.name, out, err, s.want)
		}
	}

	// The environment stands in for the flags.
	t.Setenv(envTLSCA, caFile)
	t.Setenv(envTLSCert, certFile)
	t.Setenv(envTLSKey, keyFile)
	if out, err := kvctl(t, append([]string{"get", "a"}, common(mtls)...)...); err != nil || out != "1\n" {
		t.Fatalf("TLS from the environment: %q %v", out, err)
	}
	if out, err := kvctl(t, append([]string{"status"}, common(mtls)...)...); err != nil || !strings.Contains(out, "leader:") {
		t.Fatalf("status over mutual TLS: %q %v", out, err)
	}
}
