package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// Environment variables for the TLS flags (--tls-insecure has none, so
// that turning verification off is never left behind in a shell profile).
const (
	envTLSCA         = "SYNOD_TLS_CA"
	envTLSCert       = "SYNOD_TLS_CERT"
	envTLSKey        = "SYNOD_TLS_KEY"
	envTLSServerName = "SYNOD_TLS_SERVER_NAME"
	// tlsFileBytesMax bounds each PEM file kvctl reads.
	tlsFileBytesMax = 1 << 20
)

// tlsFlags are the --tls* flags. Any of them turns TLS on; without them
// kvctl speaks plain TCP (what kvnode --dev serves).
type tlsFlags struct {
	on         bool
	ca         string
	cert, key  string
	serverName string
	insecure   bool
}

// register adds the flags to cmd and its subcommands.
func (f *tlsFlags) register(cmd *cobra.Command) {
	fs := cmd.PersistentFlags()
	fs.BoolVar(&f.on, "tls", false, "connect over TLS, verifying servers against the system roots unless --tls-ca is given (implied by the other --tls flags)")
	fs.StringVar(&f.ca, "tls-ca", "", "PEM file of the CA certificate(s) that issued the servers' certificates (env "+envTLSCA+")")
	fs.StringVar(&f.cert, "tls-cert", "", "PEM file of a client certificate, for servers that require mutual TLS; needs --tls-key (env "+envTLSCert+")")
	fs.StringVar(&f.key, "tls-key", "", "PEM file of the --tls-cert certificate's private key (env "+envTLSKey+")")
	fs.StringVar(&f.serverName, "tls-server-name", "", "name to verify every server's certificate against, instead of the host of the address dialled (env "+envTLSServerName+")")
	fs.BoolVar(&f.insecure, "tls-insecure", false, "TESTS ONLY: do not verify the server's certificate; anyone on the path can impersonate the cluster and read the token")
}

// fromEnv fills the flags not given from the environment.
func (f *tlsFlags) fromEnv() {
	for _, x := range []struct {
		v   *string
		env string
	}{{&f.ca, envTLSCA}, {&f.cert, envTLSCert}, {&f.key, envTLSKey}, {&f.serverName, envTLSServerName}} {
		if *x.v == "" {
			*x.v = os.Getenv(x.env)
		}
	}
}

// config is the client's TLS config: nil (plain TCP) unless a --tls flag
// (or its environment variable) is set.
func (f *tlsFlags) config() (*tls.Config, error) {
	f.fromEnv()
	if !f.on && f.ca == "" && f.cert == "" && f.key == "" && f.serverName == "" && !f.insecure {
		return nil, nil
	}
	conf := &tls.Config{ServerName: f.serverName, InsecureSkipVerify: f.insecure}
	if f.insecure && f.ca != "" {
		return nil, errors.New("--tls-insecure and --tls-ca: give one (--tls-insecure verifies nothing)")
	}
	if f.ca != "" {
		b, err := readPEMFile(f.ca)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--tls-ca: %s holds no PEM certificate", f.ca)
		}
		conf.RootCAs = pool
	}
	switch {
	case f.cert != "" && f.key == "":
		return nil, errors.New("--tls-cert: needs --tls-key (the certificate's private key)")
	case f.cert == "" && f.key != "":
		return nil, errors.New("--tls-key: needs --tls-cert")
	case f.cert != "":
		certPEM, err := readPEMFile(f.cert)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert: %w", err)
		}
		keyPEM, err := readPEMFile(f.key)
		if err != nil {
			return nil, fmt.Errorf("--tls-key: %w", err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key: %s and %s: %v", f.cert, f.key, err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	return conf, nil
}

// readPEMFile reads a file of at most tlsFileBytesMax bytes.
func readPEMFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, tlsFileBytesMax+1))
	if err != nil {
		return nil, err
	}
	if len(b) > tlsFileBytesMax {
		return nil, fmt.Errorf("%s is over %d bytes", path, tlsFileBytesMax)
	}
	return b, nil
}
