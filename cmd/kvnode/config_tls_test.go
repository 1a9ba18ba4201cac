package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"synod/internal/tlstest"
)

// tlsFiles are PEM files for the [tls] tests, made fresh per test.
type tlsFiles struct {
	serverCA          *tlstest.CA
	clientCA          *tlstest.CA
	cert, key         string // server certificate for 127.0.0.1 and its key
	otherKey          string // the key of another certificate
	clientCAFile      string
	clientCert        *tlstest.Leaf
	expiredCert       string // expired, with expiredKey
	expiredKey        string
	clientOnlyCert    string // extended key usage clientAuth only, with clientOnlyKey
	clientOnlyKey     string
	garbage, keyOnly  string // not PEM at all; a PEM key and no certificate
	missing, emptyDir string
}

func newTLSFiles(t *testing.T) *tlsFiles {
	t.Helper()
	dir := t.TempDir()
	f := &tlsFiles{serverCA: tlstest.NewCA(t, "server CA"), clientCA: tlstest.NewCA(t, "client CA")}
	f.cert, f.key = f.serverCA.Server(t, "127.0.0.1").WriteFiles(t, dir, "server")
	_, f.otherKey = f.serverCA.Server(t, "127.0.0.1").WriteFiles(t, dir, "other")
	f.clientCAFile = tlstest.WriteFile(t, dir, "client-ca.crt", f.clientCA.PEM)
	f.clientCert = f.clientCA.Client(t, "app")
	f.expiredCert, f.expiredKey = f.serverCA.ServerValid(t, time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour), "127.0.0.1").WriteFiles(t, dir, "expired")
	f.clientOnlyCert, f.clientOnlyKey = f.serverCA.Client(t, "not-a-server").WriteFiles(t, dir, "client-only")
	f.garbage = tlstest.WriteFile(t, dir, "garbage.pem", []byte("not a certificate\n"))
	f.keyOnly = f.key
	f.missing = dir + "/no-such-file.pem"
	f.emptyDir = dir
	return f
}

// withTLS is the example config with table appended as its [tls] table.
func withTLS(t *testing.T, table string) string {
	t.Helper()
	base := readExample(t)
	if strings.Contains(base, "\n[tls]") {
		t.Fatal("the example config has a [tls] table of its own; these tests append theirs")
	}
	return base + "\n[tls]\n" + table
}

func TestTLSConfigAccepted(t *testing.T) {
	f := newTLSFiles(t)
	for _, tc := range []struct {
		name, table string
		mode        string
		minVersion  uint16
	}{
		{"no table", "", "off", 0},
		{"server cert", fmt.Sprintf("cert_file = %q\nkey_file = %q\n", f.cert, f.key), "tls", tls.VersionTLS13},
		{"mutual TLS, 1.2 allowed", fmt.Sprintf("cert_file = %q\nkey_file = %q\nclient_ca_file = %q\nmin_version = \"1.2\"\n", f.cert, f.key, f.clientCAFile), "mtls", tls.VersionTLS12},
		{"explicit 1.3", fmt.Sprintf("cert_file = %q\nkey_file = %q\nmin_version = \"1.3\"\n", f.cert, f.key), "tls", tls.VersionTLS13},
	} {
		c, err := parseConfig([]byte(withTLS(t, tc.table)))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.TLS.mode() != tc.mode {
			t.Fatalf("%s: mode %q, want %q", tc.name, c.TLS.mode(), tc.mode)
		}
		conf, err := c.TLS.serverConfig(time.Now())
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if tc.mode == "off" {
			if conf != nil {
				t.Fatalf("%s: a TLS config without a [tls] table", tc.name)
			}
			continue
		}
		if conf.MinVersion != tc.minVersion || len(conf.Certificates) != 1 {
			t.Fatalf("%s: min version %x, %d certificates", tc.name, conf.MinVersion, len(conf.Certificates))
		}
		if want := tc.mode == "mtls"; (conf.ClientAuth == tls.RequireAndVerifyClientCert) != want || (conf.ClientCAs != nil) != want {
			t.Fatalf("%s: client auth %v with CAs %v, want required: %v", tc.name, conf.ClientAuth, conf.ClientCAs != nil, want)
		}
	}
}

func TestTLSConfigRejected(t *testing.T) {
	f := newTLSFiles(t)
	pair := func(cert, key string) string { return fmt.Sprintf("cert_file = %q\nkey_file = %q\n", cert, key) }
	for _, tc := range []struct {
		name, table string
		want        []string // every one must appear in the error
	}{
		{"unknown key", "certfile = \"/x\"\n", []string{"tls.certfile"}},
		{"cert without key", fmt.Sprintf("cert_file = %q\n", f.cert), []string{"tls.key_file", "together"}},
		{"key without cert", fmt.Sprintf("key_file = %q\n", f.key), []string{"tls.cert_file", "together"}},
		{"missing key file", pair(f.cert, f.missing), []string{"tls.key_file", "no such file"}},
		{"missing cert file", pair(f.missing, f.key), []string{"tls.cert_file", "no such file"}},
		{"cert and key mismatched", pair(f.cert, f.otherKey), []string{"tls.key_file", "does not match", f.otherKey}},
		{"key where the cert belongs", pair(f.keyOnly, f.key), []string{"tls.cert_file", "no PEM certificate"}},
		{"garbage key", pair(f.cert, f.garbage), []string{"tls.key_file"}},
		{"directory as cert", pair(f.emptyDir, f.key), []string{"tls.cert_file", "not a regular file"}},
		{"expired cert", pair(f.expiredCert, f.expiredKey), []string{"tls.cert_file", "expired"}},
		{"client-only cert", pair(f.clientOnlyCert, f.clientOnlyKey), []string{"tls.cert_file", "serverAuth"}},
		{"unknown version", pair(f.cert, f.key) + "min_version = \"1.1\"\n", []string{"tls.min_version", "1.1"}},
		{"version as a number", pair(f.cert, f.key) + "min_version = 1.3\n", []string{"line"}},
		{"missing client CA", pair(f.cert, f.key) + fmt.Sprintf("client_ca_file = %q\n", f.missing), []string{"tls.client_ca_file", "no such file"}},
		{"garbage client CA", pair(f.cert, f.key) + fmt.Sprintf("client_ca_file = %q\n", f.garbage), []string{"tls.client_ca_file", "no PEM certificate"}},
		{"client CA without a cert", fmt.Sprintf("client_ca_file = %q\n", f.clientCAFile), []string{"tls.client_ca_file", "needs tls.cert_file"}},
		{"min version without a cert", "min_version = \"1.2\"\n", []string{"tls.min_version", "needs tls.cert_file"}},
	} {
		_, err := parseConfig([]byte(withTLS(t, tc.table)))
		if err == nil {
			t.Fatalf("%s: accepted", tc.name)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%s: error %q does not mention %q", tc.name, err, w)
			}
		}
		t.Logf("%s: %v", tc.name, err)
	}
}

// TestDevConfigIsPlainTCP: kvnode --dev writes no [tls] table.
func TestDevConfigIsPlainTCP(t *testing.T) {
	c, err := parseConfig([]byte(devConfig(devPortDefault, 1, "/tmp/x", "/dev/shm/x.pmem", "shm", strings.Repeat("ab", 32))))
	if err != nil {
		t.Fatal(err)
	}
	if c.TLS.mode() != "off" {
		t.Fatalf("dev config serves TLS (%s)", c.TLS.mode())
	}
}

// handshakeOnce accepts one connection on ln and returns the server side's
// handshake error.
func handshakeOnce(ln net.Listener) <-chan error {
	out := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			out <- err
			return
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(30 * time.Second))
		tc, ok := nc.(*tls.Conn)
		if !ok {
			out <- fmt.Errorf("accepted a %T, want *tls.Conn", nc)
			return
		}
		out <- tc.Handshake()
	}()
	return out
}

// TestTLSListener: the client listener kvnode wraps serves TLS with the
// configured certificate and, with client_ca_file, refuses a client
// without a certificate from that CA.
func TestTLSListener(t *testing.T) {
	f := newTLSFiles(t)
	c, err := parseConfig([]byte(withTLS(t, fmt.Sprintf("cert_file = %q\nkey_file = %q\nclient_ca_file = %q\n", f.cert, f.key, f.clientCAFile))))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := c.TLS.listener(raw)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dial := func(certs ...tls.Certificate) (*tls.Conn, error) {
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 30 * time.Second},
			Config: &tls.Config{RootCAs: f.serverCA.Pool(), Certificates: certs}}
		nc, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			return nil, err
		}
		return nc.(*tls.Conn), nil
	}

	srvErr := handshakeOnce(ln)
	cc, err := dial(f.clientCert.TLS)
	if err != nil {
		t.Fatalf("client with a certificate: %v", err)
	}
	if err := <-srvErr; err != nil {
		t.Fatalf("server side, client with a certificate: %v", err)
	}
	if st := cc.ConnectionState(); st.Version != tls.VersionTLS13 || len(st.PeerCertificates) == 0 {
		t.Fatalf("version %x, %d peer certificates; want TLS 1.3 with the server's", st.Version, len(st.PeerCertificates))
	}
	cc.Close()

	// Without a certificate: under TLS 1.3 the client may finish its side
	// first; the server's side must fail either way.
	srvErr = handshakeOnce(ln)
	if cc, err := dial(); err == nil {
		defer cc.Close()
	}
	if err := <-srvErr; err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("server side, client without a certificate: %v, want a certificate error", err)
	}

	// A plain listener stays plain without a [tls] table.
	c, err = parseConfig([]byte(readExample(t)))
	if err != nil {
		t.Fatal(err)
	}
	raw2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln2, err := c.TLS.listener(raw2)
	if err != nil || ln2 != raw2 {
		t.Fatalf("listener without [tls]: %v, %T; want the TCP listener itself", err, ln2)
	}
	ln2.Close()
}
