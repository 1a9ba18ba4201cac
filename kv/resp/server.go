// Package resp serves the Redis protocol (RESP2, and RESP3 after HELLO 3)
// beside synod's binary protocol, so that Redis tools and client libraries
// (redis-cli, redis-benchmark, go-redis) work against a synod cluster
// unchanged, with synod's guarantees:
//
//   - Authentication: AUTH <token>, AUTH <tenant> <token> or HELLO <2|3>
//     AUTH <tenant|default> <token> maps a token to its tenant exactly as
//     the binary HELLO does (tenants.Registry, constant-time compares).
//     Nothing but AUTH, HELLO ... AUTH and QUIT is served before it. The
//     tenant's keyspace, contract (shaper: THROTTLED answers
//     "-BUSY retry-after-ms N ...") and limits apply unchanged.
//   - Limits: a RESP connection is a hosted connection of the binary
//     protocol's server (kv/server.ServeHosted): the same connection caps,
//     pre-authentication pool, response budgets, admission and log
//     limits, the same timeouts (handshake, idle, frame, write), and the
//     same TLS (the listener kvnode hands over).
//   - Order: commands of one connection run one after another, in order,
//     as Redis runs them (a pipelined SET then GET sees the SET; writes of
//     one connection become visible in the order they were sent), while
//     up to proto.InflightPerConnMax of them are read ahead (pipelining);
//     past that the connection is not read (TCP back-pressure), exactly
//     like the binary protocol's in-flight bound.
//   - Redirection: a follower proxies whatever it cannot serve itself (a
//     write, a linearizable read) to the leader over the binary protocol
//     (kv/client), keeping the command's write identity, so any client
//     can talk to any node; READONLY lets a connection read stale values
//     from the node it is connected to.
//   - Writes: every write carries a write identity (a random client id
//     per connection, one sequence number per write), so that the proxy's
//     retries of one command (a leader change mid-command) apply it at
//     most once. A RESP client that retries a command after an unknown
//     outcome sends a new command, which may apply again: RESP writes are
//     at-least-once under client retries; the binary protocol (kv/client)
//     is exactly-once. See docs/resp.md.
//
// Commands: docs/resp.md lists them; the table is commands.go.
package resp

import (
	"crypto/tls"
	"errors"
	"github.com/prometheus/client_golang/prometheus"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/server"
	"synod/tenants"
)

// Config configures a Server.
type Config struct {
	// NodeID is this node's id (INFO).
	NodeID uint64
	// Peers are the client (binary protocol) addresses of every member,
	// this node's included: where the proxy looks for the leader when no
	// NOT_LEADER answer names it.
	Peers []string
	// ProxyTLS, when not nil, makes the proxy's connections to the
	// leader's client port TLS with this config (the client port serves
	// only TLS when the node has a [tls] table).
	ProxyTLS *tls.Config
	// Log is the server's logger.
	Log zerolog.Logger
}

// Server serves RESP connections on listeners handed to Serve. Create it
// with New.
type Server struct {
	host  *server.Server
	reg   *tenants.Registry
	be    server.Backend
	cfg   Config
	proxy *proxy
	scans *cursorTable
	start time.Time

	connIDs atomic.Uint64
	stats   counters
	latency prometheus.Histogram // command latency (metrics.go)

	mu     sync.Mutex
	closed bool
}

// counters are the server's figures (INFO stats).
type counters struct {
	connsTotal    atomic.Uint64 // connections accepted
	conns         atomic.Int64  // connections open
	commands      atomic.Uint64 // commands executed
	proxied       atomic.Uint64 // backend requests forwarded to the leader
	errors        atomic.Uint64 // error replies
	authFailures  atomic.Uint64 // AUTH or HELLO AUTH with a wrong token
	protocolError atomic.Uint64 // connections closed on a protocol error
}

// New returns a RESP server whose connections live under host's limits
// (caps, budgets, timeouts, admission), authenticate against reg and
// execute on be, the same backend as host's.
func New(host *server.Server, reg *tenants.Registry, be server.Backend, cfg Config) *Server {
	s := &Server{host: host, reg: reg, be: be, cfg: cfg, start: time.Now(), scans: newCursorTable(), latency: newLatency()}
	s.proxy = newProxy(cfg.Peers, cfg.ProxyTLS)
	return s
}

// Serve accepts RESP connections on ln until ln fails or the host server
// is closed (then it returns server.ErrServerClosed). It takes ownership
// of ln; the host's Close closes it and every RESP connection.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		ln.Close()
		return server.ErrServerClosed
	}
	return s.host.ServeHosted(ln, s.serveConn)
}

// Close releases the proxy's connections to the leader. Close the host
// server first: that closes the listeners and the connections.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.proxy.close()
	return nil
}

// ErrClosed is returned by calls after Close.
var ErrClosed = errors.New("resp: closed")
