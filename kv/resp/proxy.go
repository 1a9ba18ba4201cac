package resp

import (
	"context"
	"crypto/tls"
	"errors"
	"slices"
	"sync"
	"time"

	"synod/kv/client"
	"synod/kv/proto"
	"synod/tenants"
)

// The proxy: a follower forwards what it cannot serve itself to the
// leader over the binary protocol, with one kv/client per tenant (each a
// pipelined connection to the leader, following NOT_LEADER answers and
// retrying connection failures with back-off). The forwarded request
// keeps its write identity, so the follower's own attempt and the
// proxy's retries apply a write at most once.
//
// Why a proxy rather than "-MOVED" errors: only Redis Cluster clients
// follow MOVED (redis-cli -c, go-redis's ClusterClient, redis-benchmark
// --cluster), and only after CLUSTER SLOTS/SHARDS told them a slot map;
// a plain client (redis-cli, redis-benchmark, redis.NewClient) shows the
// error to its user. With the proxy every client works against every
// node, and a client whose node dies reconnects to any other.

// Limits of the proxy.
const (
	// proxyRetriesMax bounds the kv/client retries of one forwarded
	// request (redirects, connection failures, THROTTLED waits); the
	// request's context (the server's request_timeout) bounds them too.
	proxyRetriesMax = 20
	// proxyDialTimeout bounds one connection attempt to a member.
	proxyDialTimeout = time.Second
	// proxyBackoffMax caps the back-off between retries.
	proxyBackoffMax = 200 * time.Millisecond
)

type proxy struct {
	peers []string
	tls   *tls.Config

	mu      sync.Mutex
	closed  bool
	clients map[tenants.ID]*client.Client // Invariant: at most one per registered tenant
}

func newProxy(peers []string, tlsConf *tls.Config) *proxy {
	return &proxy{peers: slices.Clone(peers), tls: tlsConf, clients: map[tenants.ID]*client.Client{}}
}

// forward sends req to the leader as tenant spec; leader is the leader's
// client address when the local NOT_LEADER answer named it. room (when
// set) is asked before the answer's body is read (kv/client Room).
func (p *proxy) forward(ctx context.Context, spec tenants.Spec, leader string, req *proto.Request, room client.Room) *proto.Response {
	cl, err := p.client(spec, leader)
	if err != nil {
		return responseOf(err)
	}
	resp, err := cl.ForwardWithin(ctx, req, room)
	if err != nil {
		return responseOf(err)
	}
	return resp
}

// client returns the tenant's client, creating one (leader first, then
// every peer) when it has none. Creating one does not dial: the client
// dials on its first request, once per member however many requests wait
// (kv/client's one connection per endpoint), so concurrent first commands
// of a tenant share one client and one connection instead of each dialling
// a client of its own.
func (p *proxy) client(spec tenants.Spec, leader string) (*client.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if cl := p.clients[spec.ID]; cl != nil {
		return cl, nil
	}
	eps := make([]string, 0, len(p.peers)+1)
	if leader != "" {
		eps = append(eps, leader)
	}
	for _, a := range p.peers {
		if a != leader {
			eps = append(eps, a)
		}
	}
	if len(eps) == 0 {
		return nil, errors.New("no leader known and no peers configured")
	}
	cl, err := client.New(eps, spec.Token, client.Options{
		RetriesMax: proxyRetriesMax, DialTimeout: proxyDialTimeout, BackoffMax: proxyBackoffMax, TLS: p.tls,
	})
	if err != nil {
		return nil, err
	}
	p.clients[spec.ID] = cl
	return cl, nil
}

func (p *proxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, cl := range p.clients {
		cl.Close()
	}
	clear(p.clients)
}

// responseOf turns a kv/client error back into the response it stands
// for.
func responseOf(err error) *proto.Response {
	var se *client.StatusError
	var te *client.ThrottledError
	switch {
	case errors.As(err, &te):
		r := proto.Errorf(proto.StatusThrottled, "%s", te.Message)
		r.RetryAfter = te.RetryAfter
		return r
	case errors.As(err, &se):
		r := proto.Errorf(se.Status, "%s", se.Message)
		r.Leader, r.Value, r.HasValue, r.FailedOp = se.Leader, se.Current, se.HasCurrent, se.FailedOp
		return r
	case errors.Is(err, client.ErrUnauthorized):
		return proto.Errorf(proto.StatusUnauthorized, "leader: %v", err)
	}
	return proto.Errorf(proto.StatusUnavailable, "forwarding to the leader: %v", err)
}
