package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"synod/internal/childproc"
	"synod/internal/kvmodel"
)

// The RESP endpoint (kv/resp) driven by clients nobody here wrote:
// go-redis against a 3-node cluster (every command, pipelining, AUTH
// failures, THROTTLED, leader kills with retries, and the leader-kill
// linearizability workload with CAS through the custom command), and
// redis-cli against kvnode --dev.

// withRESP gives every node of a cluster a resp_listen address.
func withRESP(c *cluster) { c.resp = true }

// respAddrs lists the RESP addresses of nodes (every node by default).
func (c *cluster) respAddrs(nodes ...*node) []string {
	if len(nodes) == 0 {
		nodes = c.nodes
	}
	var out []string
	for _, nd := range nodes {
		out = append(out, nd.resp)
	}
	return out
}

// Client settings of the RESP tests.
const (
	respDialTimeout = 500 * time.Millisecond
	respOpTimeout   = 8 * time.Second
	// respRetries, respBackoffMax: go-redis's own retries in the
	// leader-kill test with retries (connection failures, TRYAGAIN).
	respRetries    = 20
	respBackoffMax = 200 * time.Millisecond
)

// failoverDialer dials the first of addrs that answers, starting from the
// one that answered last: a go-redis client whose node dies reconnects to
// another node (every node serves every command: followers proxy).
func failoverDialer(addrs []string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var last atomic.Int64
	return func(ctx context.Context, _, _ string) (net.Conn, error) {
		var errs []error
		start := int(last.Load())
		for i := range addrs {
			j := (start + i) % len(addrs)
			d := net.Dialer{Timeout: respDialTimeout}
			nc, err := d.DialContext(ctx, "tcp", addrs[j])
			if err == nil {
				last.Store(int64(j))
				return nc, nil
			}
			errs = append(errs, err)
		}
		return nil, errors.Join(errs...)
	}
}

// respClient is a go-redis client of addrs (failing over between them)
// as the tenant of token; retries < 0 turns go-redis's retries off.
func respClient(t testing.TB, addrs []string, token string, retries int) *redis.Client {
	t.Helper()
	rc := redis.NewClient(&redis.Options{
		Addr: addrs[0], Dialer: failoverDialer(addrs), Password: token,
		MaxRetries: retries, MinRetryBackoff: 5 * time.Millisecond, MaxRetryBackoff: respBackoffMax,
		DialTimeout: respDialTimeout, ReadTimeout: respOpTimeout, WriteTimeout: respOpTimeout,
		PoolSize: 4,
	})
	t.Cleanup(func() { rc.Close() })
	return rc
}

// TestRESPGoRedis drives the RESP endpoint of a 3-node cluster with
// go-redis: every command on the leader and on a follower (which
// proxies), pipelining with read-your-writes order, AUTH failures,
// THROTTLED as -BUSY, and READONLY stale reads on a follower.
func TestRESPGoRedis(t *testing.T) {
	c := newClusterWith(t, 3, "", nil, withRESP)
	l := c.leader()
	f := c.other(l)
	for _, target := range []struct {
		name string
		nd   *node
	}{{"leader", l}, {"follower", f}} {
		t.Run("commands-on-"+target.name, func(t *testing.T) {
			rc := respClient(t, []string{target.nd.resp}, tenantA.token, -1)
			ctx, cancel := ctxTimeout(time.Minute)
			defer cancel()
			p := target.name + ":"
			check := func(what string, err error) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			}
			check("PING", rc.Ping(ctx).Err())
			check("SET", rc.Set(ctx, p+"a", "1", 0).Err())
			if v, err := rc.Get(ctx, p+"a").Result(); err != nil || v != "1" {
				t.Fatalf("GET: %q %v", v, err)
			}
			if _, err := rc.Get(ctx, p+"none").Result(); !errors.Is(err, redis.Nil) {
				t.Fatalf("GET of an absent key: %v", err)
			}
			if ok, err := rc.SetNX(ctx, p+"a", "x", 0).Result(); err != nil || ok {
				t.Fatalf("SETNX on a present key: %v %v", ok, err)
			}
			if ok, err := rc.SetXX(ctx, p+"a", "2", 0).Result(); err != nil || !ok {
				t.Fatalf("SET XX: %v %v", ok, err)
			}
			if v, err := rc.SetArgs(ctx, p+"a", "3", redis.SetArgs{Get: true}).Result(); err != nil || v != "2" {
				t.Fatalf("SET GET: %q %v", v, err)
			}
			if v, err := rc.GetSet(ctx, p+"a", "4").Result(); err != nil || v != "3" {
				t.Fatalf("GETSET: %q %v", v, err)
			}
			if err := rc.Set(ctx, p+"e", "x", time.Second).Err(); err == nil || !strings.Contains(err.Error(), "expiry") {
				t.Fatalf("SET EX: %v", err)
			}
			check("MSET", rc.MSet(ctx, p+"m1", "1", p+"m2", "2").Err())
			if vs, err := rc.MGet(ctx, p+"m1", p+"m2", p+"none").Result(); err != nil || vs[0] != "1" || vs[1] != "2" || vs[2] != nil {
				t.Fatalf("MGET: %v %v", vs, err)
			}
			if n, err := rc.Exists(ctx, p+"m1", p+"none").Result(); err != nil || n != 1 {
				t.Fatalf("EXISTS: %d %v", n, err)
			}
			if n, err := rc.IncrBy(ctx, p+"n", 5).Result(); err != nil || n != 5 {
				t.Fatalf("INCRBY: %d %v", n, err)
			}
			if n, err := rc.Incr(ctx, p+"n").Result(); err != nil || n != 6 {
				t.Fatalf("INCR: %d %v", n, err)
			}
			if n, err := rc.Decr(ctx, p+"n").Result(); err != nil || n != 5 {
				t.Fatalf("DECR: %d %v", n, err)
			}
			if n, err := rc.Do(ctx, "CAS", p+"a", "4", "5").Int(); err != nil || n != 1 {
				t.Fatalf("CAS: %d %v", n, err)
			}
			if n, err := rc.Do(ctx, "CAS", p+"a", "4", "6").Int(); err != nil || n != 0 {
				t.Fatalf("CAS mismatch: %d %v", n, err)
			}
			if v, err := rc.GetDel(ctx, p+"a").Result(); err != nil || v != "5" {
				t.Fatalf("GETDEL: %q %v", v, err)
			}
			if n, err := rc.Del(ctx, p+"m1", p+"m2", p+"none").Result(); err != nil || n != 2 {
				t.Fatalf("DEL: %d %v", n, err)
			}
			keys, _, err := rc.Scan(ctx, 0, p+"*", 100).Result()
			if err != nil || len(keys) != 1 || keys[0] != p+"n" {
				t.Fatalf("SCAN MATCH %s*: %v %v", p, keys, err)
			}
			info, err := rc.Info(ctx, "replication").Result()
			role := "role:slave"
			if target.nd == l {
				role = "role:master"
			}
			if err != nil || !strings.Contains(info, role) || !strings.Contains(info, fmt.Sprintf("synod_leader_id:%d", l.id)) {
				t.Fatalf("INFO replication on the %s: %q %v", target.name, info, err)
			}
			check("SELECT 0", rc.Do(ctx, "SELECT", "0").Err())
			check("CLIENT SETNAME", rc.Do(ctx, "CLIENT", "SETNAME", "e2e").Err())
			if _, err := rc.Command(ctx).Result(); err != nil {
				t.Fatalf("COMMAND: %v", err)
			}
			if err := rc.Do(ctx, "NOSUCHCOMMAND").Err(); err == nil || !strings.Contains(err.Error(), "unknown command") {
				t.Fatalf("unknown command: %v", err)
			}

			// Pipelining: 512 SET/GET pairs in one round trip; each GET
			// sees the SET before it (commands run in order).
			pipe := rc.Pipeline()
			var gets []*redis.StringCmd
			for i := range 256 {
				k := fmt.Sprintf("%spipe%d", p, i%16)
				pipe.Set(ctx, k, strconv.Itoa(i), 0)
				gets = append(gets, pipe.Get(ctx, k))
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatalf("pipeline: %v", err)
			}
			for i, g := range gets {
				if v, err := g.Result(); err != nil || v != strconv.Itoa(i) {
					t.Fatalf("pipelined GET %d: %q %v (a GET did not see the SET before it)", i, v, err)
				}
			}
		})
	}

	t.Run("auth-failures", func(t *testing.T) {
		ctx, cancel := ctxTimeout(30 * time.Second)
		defer cancel()
		bad := respClient(t, []string{f.resp}, "not-a-token-at-all", -1)
		if err := bad.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Fatalf("PING with a wrong token: %v", err)
		}
		wrongUser := redis.NewClient(&redis.Options{Addr: f.resp, Username: tenantB.name, Password: tenantA.token, MaxRetries: -1})
		defer wrongUser.Close()
		if err := wrongUser.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Fatalf("AUTH as bravo with alpha's token: %v", err)
		}
		named := redis.NewClient(&redis.Options{Addr: f.resp, Username: tenantA.name, Password: tenantA.token, MaxRetries: -1})
		defer named.Close()
		if err := named.Ping(ctx).Err(); err != nil {
			t.Fatalf("AUTH alpha <alpha's token>: %v", err)
		}
		// Nothing but AUTH before AUTH.
		nc, err := net.DialTimeout("tcp", f.resp, respDialTimeout)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(nc, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*1\r\n$4\r\nPING\r\n")
		buf := make([]byte, 256)
		got := ""
		for !strings.Contains(got, "NOAUTH") || strings.Count(got, "\r\n") < 2 {
			n, err := nc.Read(buf)
			if err != nil {
				t.Fatalf("reading the answers before AUTH: %v (got %q)", err, got)
			}
			got += string(buf[:n])
		}
		if strings.Count(got, "-NOAUTH") != 2 {
			t.Fatalf("commands before AUTH answered %q", got)
		}
		// Tenants are isolated: bravo does not see alpha's keys.
		rb := respClient(t, []string{l.resp}, tenantB.token, -1)
		if _, err := rb.Get(ctx, "leader:n").Result(); !errors.Is(err, redis.Nil) {
			t.Fatalf("bravo read alpha's key: %v", err)
		}
	})

	t.Run("throttled", func(t *testing.T) {
		// charlie's contract is 5 ops/s: a burst of INCRs is shaped, and
		// the shaped ones answer -BUSY retry-after-ms N.
		ctx, cancel := ctxTimeout(30 * time.Second)
		defer cancel()
		// RESP2 without CLIENT SETINFO: go-redis's connection set-up then
		// spends none of charlie's burst.
		rc := redis.NewClient(&redis.Options{Addr: l.resp, Password: tenantC.token, Protocol: 2, DisableIdentity: true,
			MaxRetries: -1, DialTimeout: respDialTimeout, ReadTimeout: respOpTimeout})
		defer rc.Close()
		busy, ok := 0, 0
		for range 30 {
			err := rc.Incr(ctx, "shaped").Err()
			switch {
			case err == nil:
				ok++
			case strings.HasPrefix(err.Error(), "BUSY retry-after-ms "):
				busy++
				f := strings.Fields(err.Error())
				if ms, perr := strconv.Atoi(f[2]); perr != nil || ms < 1 {
					t.Fatalf("BUSY without a retry-after: %q", err)
				}
			default:
				t.Fatalf("INCR as charlie: %v", err)
			}
		}
		if busy == 0 || ok == 0 {
			t.Fatalf("charlie: %d INCRs done, %d BUSY: want both", ok, busy)
		}
		t.Logf("charlie: %d INCRs done, %d answered BUSY", ok, busy)
	})

	t.Run("readonly-follower", func(t *testing.T) {
		ctx, cancel := ctxTimeout(30 * time.Second)
		defer cancel()
		w := respClient(t, []string{l.resp}, tenantA.token, -1)
		if err := w.Set(ctx, "stale", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		ro := redis.NewClient(&redis.Options{Addr: f.resp, Password: tenantA.token, MaxRetries: -1, PoolSize: 1,
			OnConnect: func(ctx context.Context, cn *redis.Conn) error { return cn.ReadOnly(ctx).Err() }})
		defer ro.Close()
		deadline := time.Now().Add(catchUpTimeout)
		for {
			v, err := ro.Get(ctx, "stale").Result()
			if err == nil && v == "v" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the follower never served the write: %q %v", v, err)
			}
			time.Sleep(statusPollEvery)
		}
	})
	// The endpoint's figures are on /metrics (kv/resp/metrics.go): the
	// follower executed commands, forwarded writes to the leader and
	// answered errors, and each command it executed has its latency.
	t.Run("metrics", func(t *testing.T) {
		commands := metricValue(f, "synod_resp_commands_total")
		for name, v := range map[string]float64{
			"synod_resp_commands_total": commands, "synod_resp_proxied_total": metricValue(f, "synod_resp_proxied_total"),
			"synod_resp_error_replies_total": metricValue(f, "synod_resp_error_replies_total"),
			"synod_resp_conns_total":         metricValue(f, "synod_resp_conns_total"),
		} {
			if v <= 0 {
				t.Errorf("%s on the follower: %v, want > 0", name, v)
			}
		}
		if n := metricValue(f, "synod_resp_command_latency_seconds_count"); n != commands {
			t.Errorf("the follower timed %v commands of %v executed", n, commands)
		}
		fmt.Printf("e2e resp metrics: follower commands=%.0f proxied=%.0f errors=%.0f latency_count=%.0f\n", commands,
			metricValue(f, "synod_resp_proxied_total"), metricValue(f, "synod_resp_error_replies_total"),
			metricValue(f, "synod_resp_command_latency_seconds_count"))
	})
}

// TestRESPLeaderKillRetries kills the leader under go-redis clients that
// fail over between nodes and let go-redis retry: every acknowledged SET
// reads back, and the counter the clients INCR holds at least every
// acknowledged increment. It may hold more: go-redis retries an INCR
// whose answer a killed node never sent, and the retry is a new command
// (RESP writes are at-least-once under client retries; the summary line
// counts those duplicates), but at most one per attempt go-redis makes.
func TestRESPLeaderKillRetries(t *testing.T) {
	c := newClusterWith(t, 3, "", nil, withRESP)
	const workers, rounds = 3, 3
	var (
		wg              sync.WaitGroup
		stop            = make(chan struct{})
		mu              sync.Mutex
		acked           []string
		incrOK, incrAll atomic.Int64
		failures        atomic.Int64
	)
	for w := range workers {
		rc := respClient(t, c.respAddrs(), tenantA.token, respRetries)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := ctxTimeout(respOpTimeout)
				k := fmt.Sprintf("r/%d/%d", w, n)
				if err := rc.Set(ctx, k, "1", 0).Err(); err == nil {
					mu.Lock()
					acked = append(acked, k)
					mu.Unlock()
				} else {
					failures.Add(1)
				}
				incrAll.Add(1)
				if err := rc.Incr(ctx, "r/counter").Err(); err == nil {
					incrOK.Add(1)
				} else {
					failures.Add(1)
				}
				cancel()
			}
		}()
	}
	for round := 1; round <= rounds; round++ {
		l := c.leader()
		time.Sleep(killLoadPerRound)
		c.kill(l)
		nl := c.leader(l)
		c.start(l)
		st, err := c.status(nl)
		if err != nil {
			t.Fatal(err)
		}
		c.waitCaughtUp(l, st.Commit)
		t.Logf("round %d: killed leader %d, new leader %d", round, l.id, nl.id)
	}
	time.Sleep(killLoadPerRound)
	close(stop)
	wg.Wait()
	rc := respClient(t, c.respAddrs(), tenantA.token, respRetries)
	ctx, cancel := ctxTimeout(time.Minute)
	defer cancel()
	lost := 0
	for _, k := range acked {
		if err := rc.Get(ctx, k).Err(); err != nil {
			lost++
			t.Errorf("acknowledged SET %s: %v", k, err)
		}
	}
	n, err := rc.Get(ctx, "r/counter").Int64()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("e2e resp retries: kills=%d sets=%d lost=%d incr_acked=%d counter=%d duplicates=%d failures=%d\n",
		rounds, len(acked), lost, incrOK.Load(), n, n-incrOK.Load(), failures.Load())
	if len(acked) == 0 || incrOK.Load() == 0 {
		t.Fatal("no write was acknowledged")
	}
	if n < incrOK.Load() || n > incrAll.Load()*(respRetries+1) {
		t.Fatalf("counter %d outside [acknowledged %d, attempts at most %d]", n, incrOK.Load(), incrAll.Load()*(respRetries+1))
	}
}

// TestRESPLeaderKillLinearizable runs the leader-kill workload through
// the RESP endpoint with go-redis (its retries off: an error is an
// unknown outcome): puts and gets of shared keys, CAS through the custom
// CAS command (SET NX for the first write of a chain), and puts of unique
// keys, while the leader is SIGKILLed and restarted. The history must be
// linearizable and every acknowledged put must read back.
func TestRESPLeaderKillLinearizable(t *testing.T) {
	rounds := 5
	if s := os.Getenv("E2E_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("E2E_KILLS=%q", s)
		}
		rounds = n
	}
	c := newClusterWith(t, 3, "", nil, withRESP)
	h := newHistory()
	stop := make(chan struct{})
	var (
		wg      sync.WaitGroup
		ackedMu sync.Mutex
		acked   []string
	)
	for w := range killWorkers {
		rc := respClient(t, c.respAddrs(), tenantA.token, -1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 77))
			seen := map[string]string{} // the value this worker last read or wrote per key
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := ctxTimeout(killOpTimeout)
				key := fmt.Sprintf("k%d", rng.IntN(killSharedKeys))
				val := fmt.Sprintf("w%d-%d", w, n)
				switch x := rng.IntN(10); {
				case x < 3: // SET
					in := kvmodel.Input{Put: true, Key: key, Value: val}
					call := h.now()
					err := rc.Set(ctx, key, val, 0).Err()
					ret := h.now()
					if err != nil {
						ret = pendingReturn
					} else {
						seen[key] = val
					}
					h.add(w, in, call, ret, kvmodel.Output{})
				case x < 6: // GET
					in := kvmodel.Input{Key: key}
					call := h.now()
					v, err := rc.Get(ctx, key).Result()
					ret := h.now()
					switch {
					case err == nil:
						h.add(w, in, call, ret, kvmodel.Output{Found: true, Value: v})
						seen[key] = v
					case errors.Is(err, redis.Nil):
						h.add(w, in, call, ret, kvmodel.Output{})
						delete(seen, key)
					}
				case x < 8: // CAS from the last value seen (SET NX when none)
					cur, ok := seen[key]
					in := kvmodel.Input{CAS: true, Key: key, Value: val, Expect: cur, ExpectAbsent: !ok}
					call := h.now()
					var swapped bool
					var err error
					if ok {
						var r int
						r, err = rc.Do(ctx, "CAS", key, cur, val).Int()
						swapped = r == 1
					} else {
						swapped, err = rc.SetNX(ctx, key, val, 0).Result()
					}
					ret := h.now()
					out := kvmodel.Output{Mismatch: !swapped}
					if err != nil {
						ret, out = pendingReturn, kvmodel.Output{Unknown: true}
					} else if swapped {
						seen[key] = val
					}
					h.add(w, in, call, ret, out)
				default: // SET of a key of its own, read back at the end
					in := kvmodel.Input{Put: true, Key: fmt.Sprintf("u/%d/%d", w, n), Value: "1"}
					call := h.now()
					err := rc.Set(ctx, in.Key, in.Value, 0).Err()
					ret := h.now()
					if err != nil {
						ret = pendingReturn
					} else {
						ackedMu.Lock()
						acked = append(acked, in.Key)
						ackedMu.Unlock()
					}
					h.add(w, in, call, ret, kvmodel.Output{})
				}
				cancel()
			}
		}()
	}
	stopped := false
	stopWorkers := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopWorkers()

	probe := respClient(t, c.respAddrs(), tenantA.token, -1)
	kills := 0
	for round := 1; round <= rounds; round++ {
		l := c.leader()
		time.Sleep(killLoadPerRound)
		c.kill(l)
		kills++
		nl := c.leader(l)
		in := kvmodel.Input{Put: true, Key: fmt.Sprintf("probe%d", round), Value: "p"}
		ok := probeWrite(h, in, func(ctx context.Context) error {
			return probe.Set(ctx, in.Key, in.Value, 0).Err()
		})
		if !ok {
			t.Fatalf("round %d: no RESP write succeeded after killing node %d (new leader %d)", round, l.id, nl.id)
		}
		c.start(l)
		st, err := c.status(nl)
		if err != nil {
			t.Fatalf("round %d: status of the new leader: %v", round, err)
		}
		c.waitCaughtUp(l, st.Commit)
		t.Logf("round %d: killed leader %d, new leader %d, node %d caught up to %d", round, l.id, nl.id, l.id, st.Commit)
	}
	time.Sleep(killLoadPerRound)
	stopWorkers()

	final := respClient(t, c.respAddrs(), tenantA.token, respRetries)
	deadline := time.Now().Add(killFinalReadLimit)
	for k := range killSharedKeys {
		in := kvmodel.Input{Key: fmt.Sprintf("k%d", k)}
		for {
			ctx, cancel := ctxTimeout(killOpTimeout)
			call := h.now()
			v, err := final.Get(ctx, in.Key).Result()
			ret := h.now()
			cancel()
			if err == nil {
				h.add(killWorkers+1, in, call, ret, kvmodel.Output{Found: true, Value: v})
				break
			}
			if errors.Is(err, redis.Nil) {
				h.add(killWorkers+1, in, call, ret, kvmodel.Output{})
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("final read of %s: %v", in.Key, err)
			}
		}
	}
	lost := 0
	for _, k := range acked {
		ctx, cancel := ctxTimeout(killOpTimeout)
		err := final.Get(ctx, k).Err()
		cancel()
		if err != nil {
			lost++
			t.Errorf("acknowledged RESP SET of %s lost: %v", k, err)
		}
	}
	res := h.check(killCheckTimeout)
	lin := res == porcupine.Ok
	fmt.Printf("e2e resp: kills=%d ops=%d linearizable=%v lost=%d\n", kills, len(h.ops), lin, lost)
	if !lin {
		path, err := h.visualize(killCheckTimeout)
		t.Fatalf("history of %d ops is not linearizable (porcupine: %v); view: %s (%v)", len(h.ops), res, path, err)
	}
	if lost != 0 {
		t.Fatalf("%d acknowledged writes lost", lost)
	}
}

// needRedisTool returns the path of redis-cli or redis-benchmark,
// skipping the test when it is missing, or failing it under CI=true
// (scripts/test.sh installs redis-tools).
func needRedisTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not installed (CI=true): run scripts/test.sh or apt-get install redis-tools", name)
		}
		t.Skipf("%s not installed: apt-get install -y redis-tools", name)
	}
	return p
}

// TestRESPRedisCLI runs redis-cli against kvnode --dev, as the README
// shows: the RESP port it prints, PING (refused before AUTH), AUTH, SET,
// GET and SCAN, typed into one interactive session and as one-shot
// commands against a follower.
func TestRESPRedisCLI(t *testing.T) {
	cli := needRedisTool(t, "redis-cli")
	base := devBasePort(t)
	cmd := exec.Command(kvnodeBin, "--dev", "--dev-port", fmt.Sprint(base))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := childproc.Start(cmd); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(startTimeout):
			cmd.Process.Kill()
		}
	}()
	lines := make(chan string, 64)
	go func() {
		buf := make([]byte, 4096)
		var acc string
		for {
			n, err := out.Read(buf)
			acc += string(buf[:n])
			for {
				i := strings.IndexByte(acc, '\n')
				if i < 0 {
					break
				}
				lines <- acc[:i]
				acc = acc[i+1:]
			}
			if err != nil {
				close(lines)
				return
			}
		}
	}()
	port, token := "", ""
	timeout := time.After(startTimeout + leaderTimeout)
	for port == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("kvnode --dev exited before it printed the RESP port")
			}
			// "  redis-cli -p PORT AUTH TOKEN"
			if f := strings.Fields(l); len(f) == 5 && f[0] == "redis-cli" && f[1] == "-p" && f[3] == "AUTH" {
				port, token = f[2], f[4]
			}
		case <-timeout:
			t.Fatal("kvnode --dev did not print a redis-cli line")
		}
	}
	go func() {
		for range lines {
		}
	}()
	run := func(stdin string, args ...string) string {
		t.Helper()
		c := exec.Command(cli, append([]string{"-p", port}, args...)...)
		c.Stdin = strings.NewReader(stdin)
		b, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("redis-cli %v: %v\n%s", args, err, b)
		}
		return string(b)
	}
	if got := run("", "PING"); !strings.Contains(got, "NOAUTH") {
		t.Fatalf("PING before AUTH: %q", got)
	}
	if got := run("", "AUTH", token); strings.TrimSpace(got) != "OK" {
		t.Fatalf("redis-cli -p %s AUTH %s: %q", port, token, got)
	}
	if got := run("", "AUTH", "wrong-token"); !strings.Contains(got, "WRONGPASS") {
		t.Fatalf("AUTH with a wrong token: %q", got)
	}
	session := run("AUTH " + token + "\nPING\nSET hello world\nGET hello\nSET user:1 a\nSET user:2 b\nSCAN 0 MATCH user:* COUNT 100\n")
	want := []string{"OK", "PONG", "OK", "world", "OK", "OK", "0", "user:1", "user:2"}
	if got := strings.Fields(session); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("redis-cli session answered\n%s\nwant %v", session, want)
	}
	// A follower (port+1 or port+2: one of them is) serves the same.
	next, _ := strconv.Atoi(port)
	for _, p := range []int{next + 1, next + 2} {
		c := exec.Command(cli, "-p", strconv.Itoa(p), "-a", token, "--no-auth-warning", "GET", "hello")
		if b, err := c.CombinedOutput(); err != nil || strings.TrimSpace(string(b)) != "world" {
			t.Fatalf("redis-cli -p %d GET hello: %q %v", p, b, err)
		}
		c = exec.Command(cli, "-p", strconv.Itoa(p), "-a", token, "--no-auth-warning", "--scan", "--pattern", "user:*")
		if b, err := c.CombinedOutput(); err != nil || strings.Join(strings.Fields(string(b)), " ") != "user:1 user:2" {
			t.Fatalf("redis-cli -p %d --scan: %q %v", p, b, err)
		}
	}
	fmt.Printf("e2e resp redis-cli: dev_port=%s commands=ok\n", port)
}

// TestRESPTLS: with a [tls] table the RESP port serves only TLS, like the
// client port: go-redis with the CA connects to a follower, whose proxy
// reaches the leader over TLS (resp_leader_ca_file), and a plaintext
// client gets nothing.
func TestRESPTLS(t *testing.T) {
	p := newTLSPKI(t)
	c := &cluster{t: t, dir: t.TempDir(), resp: true}
	mode := c.pmemDir("synod-e2e-resptls-")
	for i := 1; i <= 3; i++ {
		c.nodes = append(c.nodes, &node{id: i,
			client:    fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			resp:      fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			consensus: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			admin:     fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		})
	}
	top := fmt.Sprintf("resp_leader_ca_file = %q\n", p.caFile)
	tables := fmt.Sprintf("[tls]\ncert_file = %q\nkey_file = %q\n", p.certFile, p.keyFile)
	for _, nd := range c.nodes {
		c.writeConfig(nd, 11, mode, top, tables, []tenant{tenantA})
	}
	t.Cleanup(func() { c.stopAll(true) })
	for _, nd := range c.nodes {
		c.start(nd)
	}
	l := c.leader()
	var f *node
	for _, nd := range c.nodes {
		if nd != l {
			f = nd
		}
	}
	ctx, cancel := ctxTimeout(time.Minute)
	defer cancel()
	rc := redis.NewClient(&redis.Options{Addr: f.resp, Password: tenantA.token, TLSConfig: p.clientTLS(), MaxRetries: -1,
		DialTimeout: tlsDialTimeout, ReadTimeout: tlsOpTimeout, WriteTimeout: tlsOpTimeout})
	defer rc.Close()
	if err := rc.Set(ctx, "tls", "yes", 0).Err(); err != nil {
		t.Fatalf("SET over TLS through follower %d: %v", f.id, err)
	}
	if v, err := rc.Get(ctx, "tls").Result(); err != nil || v != "yes" {
		t.Fatalf("GET over TLS: %q %v", v, err)
	}
	plain := redis.NewClient(&redis.Options{Addr: f.resp, Password: tenantA.token, MaxRetries: -1, DialTimeout: tlsDialTimeout,
		ReadTimeout: tlsOpTimeout})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("a plaintext RESP client was served by a TLS node")
	}
}
