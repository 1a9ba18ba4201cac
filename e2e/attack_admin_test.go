package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"testing"
	"time"

	"synod/kv/client"
	"synod/kv/proto"
	"synod/kv/sm"
	"synod/tenants"
)

// Attacks on the admin port (item 8 of the hostile-input review: no
// authentication, pprof always on, /debug/faults partitions the cluster)
// and on the exactly-once table (item 7: one tenant flooding fresh client
// ids evicted another tenant's entry, and the victim's retried PUT was
// applied twice).
func init() { attackSets = append(attackSets, adminAttacks) }

// adminTestToken is the [admin] token of the token-protected node.
const adminTestToken = "e2e-admin-token-0123456789abcdef"

func adminAttacks() []attack {
	return []attack{
		{"admin: pprof (heap, cmdline, profile) is not served by default", func(t *testing.T, c *cluster, cl *client.Client) string {
			for _, nd := range c.nodes {
				for _, p := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/cmdline", "/debug/pprof/profile?seconds=1", "/debug/pprof/goroutine?debug=2"} {
					code, err := adminCall(nd, http.MethodGet, p, "", nil)
					if err != nil {
						return fmt.Sprintf("node %d: GET %s: %v", nd.id, p, err)
					}
					if code != http.StatusNotFound {
						return fmt.Sprintf("node %d: GET %s answered %d without [admin] pprof, want 404", nd.id, p, code)
					}
				}
			}
			return ""
		}},
		{"admin: a node with admin.token refuses /status, /metrics, pprof and /debug/faults without it", func(t *testing.T, c *cluster, cl *client.Client) string {
			return tokenNodeAttack(t)
		}},
		{"exactly-once: another tenant floods 4600 fresh client ids before the victim retries its PUT", func(t *testing.T, c *cluster, cl *client.Client) string {
			return victimRetry(t, c, cl, tenantB.token, 4600, proto.StatusOK)
		}},
		{"exactly-once: the victim's own tenant floods past its share; the retry is refused, never applied", func(t *testing.T, c *cluster, cl *client.Client) string {
			// Past its share (and the eviction batch) every older client of
			// the tenant, the victim among them, is evicted.
			n := sm.ClientsPerTenantDefault + sm.ClientsPerTenantDefault/16 + 100
			return victimRetry(t, c, cl, tenantA.token, n, proto.StatusSequenceStale)
		}},
	}
}

// adminCall sends method path to nd's admin endpoint with the
// Authorization header auth ("" for none) and returns the status code.
func adminCall(nd *node, method, path, auth string, form url.Values) (int, error) {
	req, err := nd.adminRequest(method, path, form)
	if err != nil {
		return 0, err
	}
	req.Header.Del("Authorization")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// tokenNodeAttack starts a one-node cluster whose admin endpoint has a
// token (and pprof and fault injection on), and tries it without the
// token.
func tokenNodeAttack(t *testing.T) string {
	tc := &cluster{t: t, dir: t.TempDir()}
	mode := tc.pmemDir("synod-e2e-admin-")
	nd := &node{id: 1, client: fmt.Sprintf("127.0.0.1:%d", freePort(t)), consensus: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		admin: fmt.Sprintf("127.0.0.1:%d", freePort(t)), adminToken: adminTestToken}
	tc.nodes = []*node{nd}
	tc.writeConfig(nd, 12, mode, "fault_injection = true\n", fmt.Sprintf("[admin]\ntoken = %q\npprof = true\n", adminTestToken), []tenant{tenantA})
	defer tc.stopAll(true)
	tc.start(nd) // polls /status with the token

	bearer := "Bearer " + adminTestToken
	calls := []struct {
		method, path string
		form         url.Values
	}{
		{http.MethodGet, "/status", nil},
		{http.MethodGet, "/metrics", nil},
		{http.MethodGet, "/debug/pprof/", nil},
		{http.MethodGet, "/debug/pprof/heap", nil},
		{http.MethodGet, "/debug/pprof/cmdline", nil},
		{http.MethodGet, "/snapshot", nil}, // every tenant's data
		{http.MethodPost, "/debug/faults", url.Values{"block": {"2,3"}}},
	}
	for _, call := range calls {
		for _, auth := range []string{"", "Bearer not-the-admin-token-0123456789", "Basic " + adminTestToken, adminTestToken} {
			code, err := adminCall(nd, call.method, call.path, auth, call.form)
			if err != nil {
				return fmt.Sprintf("%s %s: %v", call.method, call.path, err)
			}
			if code != http.StatusUnauthorized {
				return fmt.Sprintf("%s %s with Authorization %q answered %d, want 401", call.method, call.path, auth, code)
			}
		}
	}
	// Nothing was blocked by the refused POSTs.
	if blocked, err := blockedPeers(nd, bearer); err != nil || len(blocked) != 0 {
		return fmt.Sprintf("after refused POST /debug/faults: blocked %v (%v)", blocked, err)
	}
	// The liveness path needs no token; everything else works with it.
	if code, err := adminCall(nd, http.MethodGet, "/healthz", "", nil); err != nil || code != http.StatusOK {
		return fmt.Sprintf("GET /healthz: %d %v", code, err)
	}
	for _, call := range calls {
		code, err := adminCall(nd, call.method, call.path, bearer, call.form)
		// A backup is streamed only by the leader: the lone node may
		// still be electing itself (409 until then).
		for deadline := time.Now().Add(10 * time.Second); err == nil && code == http.StatusConflict && call.path == "/snapshot" && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			code, err = adminCall(nd, call.method, call.path, bearer, call.form)
		}
		if err != nil || code != http.StatusOK {
			return fmt.Sprintf("%s %s with the token: %d %v", call.method, call.path, code, err)
		}
	}
	if blocked, err := blockedPeers(nd, bearer); err != nil || len(blocked) != 2 {
		return fmt.Sprintf("an authorised POST /debug/faults did not apply: blocked %v (%v)", blocked, err)
	}
	return ""
}

// blockedPeers reads the blocked peers from nd's /status.
func blockedPeers(nd *node, auth string) ([]uint64, error) {
	req, err := nd.adminRequest(http.MethodGet, "/status", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", auth)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var st struct {
		Blocked []uint64 `json:"blocked"`
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, err
	}
	return st.Blocked, nil
}

// Bounds of the exactly-once attacks.
const (
	floodWindow       = 128 // writes in flight on the flooding connection (< InflightPerConnMax)
	floodTimeout      = 90 * time.Second
	victimCallTimeout = 30 * time.Second
)

// victimRetry: a victim of tenant A writes key = "first" as (client V,
// seq 1); the key is then overwritten with "second"; a tenant (floodToken)
// writes from n fresh client ids; then V retries its write with the same
// (client, seq). The retry must be answered want (OK: remembered; or
// SEQUENCE_STALE: evicted and refused) and must not apply again.
func victimRetry(t *testing.T, c *cluster, cl *client.Client, floodToken string, n int, want proto.Status) string {
	key := []byte(fmt.Sprintf("victim/exactly-once/%d", rand.Uint64()))
	victim := &proto.Request{Op: proto.OpPut, ClientID: rand.Uint64() | 1, Seq: 1, FirstUnacked: 1, Key: key, Value: []byte("first")}
	if st, err := sendToLeader(c, tenantA.token, victim); err != nil || st != proto.StatusOK {
		return fmt.Sprintf("setting up: the victim's write answered %v %v", st, err)
	}
	ctx, cancel := ctxTimeout(victimCallTimeout)
	defer cancel()
	if err := cl.Put(ctx, key, []byte("second")); err != nil {
		return fmt.Sprintf("setting up: overwriting the victim's key: %v", err)
	}
	start := time.Now()
	if err := flood(c, floodToken, n); err != nil {
		return fmt.Sprintf("flooding: %v", err)
	}
	t.Logf("flooded %d fresh client ids in %v", n, time.Since(start).Round(time.Millisecond))
	st, err := sendToLeader(c, tenantA.token, victim)
	if err != nil {
		return fmt.Sprintf("the victim's retry: %v", err)
	}
	v, err := cl.Get(ctx, key)
	switch {
	case err != nil:
		return fmt.Sprintf("reading the victim's key: %v", err)
	case string(v) != "second":
		return fmt.Sprintf("the victim's retried PUT was applied twice (answered %v): key = %q, want \"second\"", st, v)
	case st != want:
		return fmt.Sprintf("the victim's retry answered %v, want %v", st, want)
	}
	return ""
}

// sendToLeader sends req (a write with its exactly-once identity set) to
// the leader on a fresh connection of the token's tenant, resending it
// unchanged (a retry) after NOT_LEADER, UNAVAILABLE, THROTTLED or a
// connection failure, and returns the final status.
func sendToLeader(c *cluster, token string, req *proto.Request) (proto.Status, error) {
	deadline := time.Now().Add(victimCallTimeout)
	var last error
	for time.Now().Before(deadline) {
		p, err := dialProbe(c.leader().client, token)
		if err != nil {
			last = err
			time.Sleep(50 * time.Millisecond)
			continue
		}
		r := *req
		r.ID, r.Tenant = 2, tenants.ID(p.tenant)
		p.nc.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = p.nc.Write(proto.AppendRequest(nil, &r))
		var resp *proto.Response
		if err == nil {
			resp, err = p.read()
		}
		p.close()
		switch {
		case err != nil:
			last = err
		case resp.Status == proto.StatusNotLeader || resp.Status == proto.StatusUnavailable || resp.Status == proto.StatusThrottled:
			last = fmt.Errorf("%v: %s", resp.Status, resp.Message)
		default:
			return resp.Status, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0, fmt.Errorf("no answer within %v: %v", victimCallTimeout, last)
}

// flood makes n PUTs of the token's tenant acknowledged, each from a client
// id never used before, pipelined floodWindow at a time on one connection
// to the leader (a new one after any failure).
func flood(c *cluster, token string, n int) error {
	deadline := time.Now().Add(floodTimeout)
	base := rand.Uint64() >> 1
	sent, ok := uint64(0), 0
	var p *probeConn
	defer func() {
		if p != nil {
			p.close()
		}
	}()
	for ok < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d writes acknowledged within %v", ok, n, floodTimeout)
		}
		if p == nil {
			var err error
			if p, err = dialProbe(c.leader().client, token); err != nil {
				p = nil
				time.Sleep(50 * time.Millisecond)
				continue
			}
		}
		w := min(floodWindow, n-ok)
		var frames []byte
		for i := 0; i < w; i++ {
			sent++
			frames = proto.AppendRequest(frames, &proto.Request{Op: proto.OpPut, Tenant: tenants.ID(p.tenant), ID: sent,
				ClientID: base + sent, Seq: 1, FirstUnacked: 1, Key: []byte("flood"), Value: []byte("x")})
		}
		p.nc.SetDeadline(time.Now().Add(20 * time.Second))
		_, err := p.nc.Write(frames)
		retryLater := false
		for i := 0; i < w && err == nil; i++ {
			var resp *proto.Response
			if resp, err = p.read(); err != nil {
				break // a transport failure: reconnect below
			}
			switch resp.Status {
			case proto.StatusOK:
				ok++
			case proto.StatusNotLeader, proto.StatusUnavailable, proto.StatusThrottled:
				retryLater = true
			default:
				return fmt.Errorf("a flood write answered %v: %s", resp.Status, resp.Message)
			}
		}
		if err != nil || retryLater {
			p.close()
			p = nil
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}
