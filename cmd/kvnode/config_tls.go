package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"
)

// TLSConfig is the [tls] table: TLS on the client port (crypto/tls). With
// cert_file and key_file set the client port speaks only TLS; the binary
// protocol runs unchanged inside it and HELLO's token still authenticates
// the tenant. client_ca_file adds mutual TLS: a client must present a
// certificate that one of those CAs issued, or the handshake fails before
// any frame is read. The consensus and admin ports are not affected, and
// neither is kvnode --dev, which writes no [tls] table.
//
// Clients verify a node against the host of the address they dial, and a
// follower redirects them to the leader's client_addr, so every node's
// certificate should name the host of its own client_addr (or the clients
// fix one name: kvctl --tls-server-name, tls.Config.ServerName).
type TLSConfig struct {
	// CertFile is the server certificate in PEM, leaf first, then any
	// intermediates.
	CertFile string `toml:"cert_file"`
	// KeyFile is the certificate's private key in PEM (PKCS #1, PKCS #8 or
	// SEC 1).
	KeyFile string `toml:"key_file"`
	// ClientCAFile, when set, requires and verifies client certificates
	// against the CA certificates (PEM) it holds.
	ClientCAFile string `toml:"client_ca_file"`
	// MinVersion is the lowest TLS version accepted: "1.3" (default) or
	// "1.2".
	MinVersion string `toml:"min_version"`
}

// Limits and defaults of the [tls] table.
const (
	// tlsFileBytesMax bounds each PEM file read; a certificate chain or a
	// CA bundle is a few KiB to a few hundred.
	tlsFileBytesMax = 1 << 20
	// tlsMinVersionDefault: TLS 1.3 unless the operator allows 1.2 for
	// older clients.
	tlsMinVersionDefault = tls.VersionTLS13
)

// tlsVersions are the accepted spellings of min_version.
var tlsVersions = map[string]uint16{"1.2": tls.VersionTLS12, "1.3": tls.VersionTLS13}

// validate loads and checks the files, so that a node with a bad [tls]
// table fails at start with the key named, not at the first client.
func (c *TLSConfig) validate() error {
	_, err := c.serverConfig(time.Now())
	return err
}

// enabled reports whether the client port serves TLS.
func (c *TLSConfig) enabled() bool { return c.CertFile != "" || c.KeyFile != "" }

// mode names the client port's security for the start-up log: "off",
// "tls" or "mtls".
func (c *TLSConfig) mode() string {
	switch {
	case !c.enabled():
		return "off"
	case c.ClientCAFile != "":
		return "mtls"
	}
	return "tls"
}

// listener wraps ln, the client listener, in TLS when the table sets a
// certificate (and returns ln itself when it does not). It reads the files
// again: a certificate renewed since the config was validated is the one
// served. On error it closes ln.
func (c *TLSConfig) listener(ln net.Listener) (net.Listener, error) {
	conf, err := c.serverConfig(time.Now())
	if err != nil {
		ln.Close()
		return nil, err
	}
	if conf == nil {
		return ln, nil
	}
	return tls.NewListener(ln, conf), nil
}

// serverConfig loads the files and returns the client port's TLS config;
// nil (and no error) when TLS is off. now dates the expiry check.
func (c *TLSConfig) serverConfig(now time.Time) (*tls.Config, error) {
	if !c.enabled() {
		switch {
		case c.ClientCAFile != "":
			return nil, errors.New("tls.client_ca_file: needs tls.cert_file and tls.key_file (mutual TLS is TLS with client certificates)")
		case c.MinVersion != "":
			return nil, errors.New("tls.min_version: needs tls.cert_file and tls.key_file")
		}
		return nil, nil
	}
	if c.CertFile == "" {
		return nil, errors.New("tls.cert_file: must be set together with tls.key_file")
	}
	if c.KeyFile == "" {
		return nil, errors.New("tls.key_file: must be set together with tls.cert_file")
	}
	minVersion := uint16(tlsMinVersionDefault)
	if c.MinVersion != "" {
		v, ok := tlsVersions[c.MinVersion]
		if !ok {
			return nil, fmt.Errorf("tls.min_version: %q is not one of \"1.2\", \"1.3\"", c.MinVersion)
		}
		minVersion = v
	}
	certPEM, err := readTLSFile("tls.cert_file", c.CertFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := readTLSFile("tls.key_file", c.KeyFile)
	if err != nil {
		return nil, err
	}
	certs, err := parseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("tls.cert_file: %s: %v", c.CertFile, err)
	}
	leaf := certs[0]
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("tls.cert_file: %s: certificate %q expired at %v", c.CertFile, leaf.Subject.CommonName, leaf.NotAfter.UTC())
	}
	if len(leaf.ExtKeyUsage) > 0 && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) &&
		!slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny) {
		return nil, fmt.Errorf("tls.cert_file: %s: certificate %q is not for servers (its extended key usage lacks serverAuth)", c.CertFile, leaf.Subject.CommonName)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("tls.key_file: %s: %v (it must hold the PEM private key of tls.cert_file %s)", c.KeyFile, err, c.CertFile)
	}
	conf := &tls.Config{MinVersion: minVersion, Certificates: []tls.Certificate{pair}}
	if c.ClientCAFile != "" {
		caPEM, err := readTLSFile("tls.client_ca_file", c.ClientCAFile)
		if err != nil {
			return nil, err
		}
		cas, err := parseCertsPEM(caPEM)
		if err != nil {
			return nil, fmt.Errorf("tls.client_ca_file: %s: %v", c.ClientCAFile, err)
		}
		pool := x509.NewCertPool()
		for _, ca := range cas {
			pool.AddCert(ca)
		}
		conf.ClientAuth, conf.ClientCAs = tls.RequireAndVerifyClientCert, pool
	}
	return conf, nil
}

// readTLSFile reads a PEM file of at most tlsFileBytesMax; errors name key.
func readTLSFile(key, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %s is not a regular file", key, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, tlsFileBytesMax+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	if len(b) > tlsFileBytesMax {
		return nil, fmt.Errorf("%s: %s is over %d bytes", key, path, tlsFileBytesMax)
	}
	return b, nil
}

// parseCertsPEM returns every CERTIFICATE block of b, in order; other
// blocks (a private key in the same file) are skipped. At least one is
// required.
func parseCertsPEM(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %v", len(out)+1, err)
		}
		out = append(out, cert)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate found")
	}
	return out, nil
}
