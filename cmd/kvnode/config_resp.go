package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/resp"
	"synod/kv/server"
	"synod/tenants"
)

// RESPConfig is the Redis protocol endpoint (kv/resp, docs/resp.md). It
// is embedded in Config, so its keys are top-level ones:
//
//	resp_listen = "127.0.0.1:7031"
//
// The endpoint lives under the client port's [limits] (one set of
// connection caps and response budgets for both protocols) and its
// [tls] (with a [tls] table it serves only TLS, like the client port).
type RESPConfig struct {
	// RESPListen serves RESP2/RESP3 on this TCP address; "" (the default)
	// serves none.
	RESPListen string `toml:"resp_listen"`
	// RESPLeaderCAFile is used only with [tls]: a follower proxies RESP
	// commands to the leader's client port over TLS and checks the
	// leader's certificate (against the host of its client_addr) with
	// the CA certificates in this PEM file. Default: the certificates of
	// tls.cert_file (a cluster whose nodes share one certificate, or whose
	// cert_file carries its CA) and the system roots. With
	// tls.client_ca_file the follower presents its own certificate.
	RESPLeaderCAFile string `toml:"resp_leader_ca_file"`
}

// validateRESP checks the endpoint's keys (parseConfig calls it).
func (c *Config) validateRESP() error {
	if c.RESPListen == "" {
		if c.RESPLeaderCAFile != "" {
			return errors.New("resp_leader_ca_file: needs resp_listen")
		}
		return nil
	}
	if _, _, err := net.SplitHostPort(c.RESPListen); err != nil {
		return fmt.Errorf("resp_listen: %q is not host:port: %v", c.RESPListen, err)
	}
	for _, other := range []struct{ key, addr string }{{"client_listen", c.ClientListen}, {"admin_listen", c.AdminListen}} {
		if other.addr != "" && other.addr == c.RESPListen {
			return fmt.Errorf("resp_listen: %q is also %s", c.RESPListen, other.key)
		}
	}
	if c.RESPLeaderCAFile != "" && !c.TLS.enabled() {
		return errors.New("resp_leader_ca_file: needs a [tls] table (without one the proxy to the leader is plain TCP)")
	}
	_, err := c.respProxyTLS()
	return err
}

// respProxyTLS is the TLS config of a follower's proxy connections to the
// leader's client port: nil when the client port is plain TCP.
func (c *Config) respProxyTLS() (*tls.Config, error) {
	if !c.TLS.enabled() {
		return nil, nil
	}
	srv, err := c.TLS.serverConfig(time.Now())
	if err != nil {
		return nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	key, path := "tls.cert_file", c.TLS.CertFile
	if c.RESPLeaderCAFile != "" {
		key, path = "resp_leader_ca_file", c.RESPLeaderCAFile
	}
	pemBytes, err := readTLSFile(key, path)
	if err != nil {
		return nil, err
	}
	certs, err := parseCertsPEM(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %v", key, path, err)
	}
	for _, cert := range certs {
		pool.AddCert(cert)
	}
	conf := &tls.Config{RootCAs: pool, MinVersion: srv.MinVersion}
	if c.TLS.ClientCAFile != "" {
		// The leader requires client certificates: present this node's.
		conf.Certificates = srv.Certificates
	}
	return conf, nil
}

// serveRESP starts the RESP endpoint when resp_listen is set (nil, nil
// when it is not): its connections are hosted by srv, the client server
// (the same caps, budgets, timeouts and admission), and execute on be.
// srv.Close closes its listener and connections; close the returned
// server after that.
func (c *Config) serveRESP(srv *server.Server, reg *tenants.Registry, be server.Backend, log zerolog.Logger) (*resp.Server, error) {
	if c.RESPListen == "" {
		return nil, nil
	}
	proxyTLS, err := c.respProxyTLS()
	if err != nil {
		return nil, err
	}
	var peers []string
	for _, p := range c.Peers {
		peers = append(peers, p.ClientAddr)
	}
	rlog := log.With().Str("loop", "resp").Logger()
	rs := resp.New(srv, reg, be, resp.Config{NodeID: c.NodeID, Peers: peers, ProxyTLS: proxyTLS, Log: rlog})
	ln, err := net.Listen("tcp", c.RESPListen)
	if err == nil {
		ln, err = c.TLS.listener(ln) // TLS when [tls] sets a certificate, as on the client port
	}
	if err != nil {
		rs.Close()
		return nil, fmt.Errorf("listening for RESP clients on %s: %w", c.RESPListen, err)
	}
	go func() {
		if err := rs.Serve(ln); err != nil && !errors.Is(err, server.ErrServerClosed) {
			rlog.Error().Err(err).Msg("RESP server stopped")
		}
	}()
	return rs, nil
}

// closeRESP closes rs when the endpoint runs.
func closeRESP(rs *resp.Server) {
	if rs != nil {
		rs.Close()
	}
}
