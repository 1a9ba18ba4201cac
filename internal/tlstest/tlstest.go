// Package tlstest makes throwaway certificate authorities and certificates
// for tests of synod's TLS client port (kv/client, cmd/kvctl, cmd/kvnode,
// e2e). Nothing here is for production: keys are ECDSA P-256 generated in
// memory, certificates are valid from an hour ago for one day, and every
// failure ends the test.
//
// Generating them in the test keeps private keys out of the repository
// and out of reach of expiry: a committed fixture would fail the suite on
// the day it expires.
package tlstest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Validity of every certificate made here.
const (
	notBeforeSkew = time.Hour      // backdated so that a clock a little behind still accepts it
	validFor      = 24 * time.Hour // long enough for any test run
)

// CA is a self-signed certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// PEM is the CA certificate, PEM-encoded (what a --tls-ca file holds).
	PEM []byte
}

// Leaf is a certificate issued by a CA, with its key.
type Leaf struct {
	Cert    *x509.Certificate
	CertPEM []byte // the leaf certificate, PEM
	KeyPEM  []byte // its private key, PKCS #8 PEM
	// TLS is the pair ready for tls.Config.Certificates.
	TLS tls.Certificate
}

// NewCA makes a self-signed CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := template(t, name)
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatalf("tlstest: creating CA %s: %v", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("tlstest: parsing CA %s: %v", name, err)
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool is a cert pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Server issues a server certificate for hosts (IP addresses become IP
// SANs, anything else a DNS SAN).
func (ca *CA) Server(t testing.TB, hosts ...string) *Leaf {
	t.Helper()
	return ca.ServerValid(t, time.Time{}, time.Time{}, hosts...)
}

// ServerValid is Server with the validity period given (a zero time keeps
// the default), e.g. to make an expired certificate.
func (ca *CA) ServerValid(t testing.TB, notBefore, notAfter time.Time, hosts ...string) *Leaf {
	t.Helper()
	tmpl := template(t, "synod test server")
	if !notBefore.IsZero() {
		tmpl.NotBefore = notBefore
	}
	if !notAfter.IsZero() {
		tmpl.NotAfter = notAfter
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	return ca.issue(t, tmpl)
}

// Client issues a client certificate (for mutual TLS) with common name name.
func (ca *CA) Client(t testing.TB, name string) *Leaf {
	t.Helper()
	tmpl := template(t, name)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.issue(t, tmpl)
}

func (ca *CA) issue(t testing.TB, tmpl *x509.Certificate) *Leaf {
	t.Helper()
	key := newKey(t)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatalf("tlstest: issuing %s: %v", tmpl.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("tlstest: encoding a key: %v", err)
	}
	l := &Leaf{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	if l.TLS, err = tls.X509KeyPair(l.CertPEM, l.KeyPEM); err != nil {
		t.Fatalf("tlstest: pairing %s: %v", tmpl.Subject.CommonName, err)
	}
	if l.Cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatalf("tlstest: parsing %s: %v", tmpl.Subject.CommonName, err)
	}
	return l
}

// WriteFiles writes the leaf to dir/name.crt and dir/name.key and returns
// the two paths.
func (l *Leaf) WriteFiles(t testing.TB, dir, name string) (certFile, keyFile string) {
	t.Helper()
	return WriteFile(t, dir, name+".crt", l.CertPEM), WriteFile(t, dir, name+".key", l.KeyPEM)
}

// WriteFile writes b to dir/name (mode 0600) and returns the path.
func WriteFile(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatalf("tlstest: %v", err)
	}
	return p
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("tlstest: generating a key: %v", err)
	}
	return key
}

func template(t testing.TB, cn string) *x509.Certificate {
	t.Helper()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatalf("tlstest: drawing a serial: %v", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"synod tests"}},
		NotBefore:    now.Add(-notBeforeSkew),
		NotAfter:     now.Add(validFor),
	}
}
