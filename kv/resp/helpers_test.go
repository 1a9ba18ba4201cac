package resp

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"synod/kv/local"
	"synod/kv/proto"
	"synod/kv/server"
	"synod/kv/sm"
	"synod/tenants"
)

// Tenants of the in-process servers.
var (
	specAlpha = tenants.Spec{ID: 1, Name: "alpha", Token: "alpha-token-0001"}
	specBravo = tenants.Spec{ID: 2, Name: "bravo", Token: "bravo-token-0002"}
	// specSlow can do 3 operations, then one every 100 s: the shaper
	// throttles it.
	specSlow = tenants.Spec{ID: 3, Name: "slow", Token: "slow-token-00003", OpsPerSec: 0.01, OpsBurst: 3}
)

// testServer is a RESP endpoint on loopback over a single state machine
// (kv/local), under a kv/server with cfg's limits and a shaper.
type testServer struct {
	addr string
	host *server.Server
	resp *Server
	be   server.Backend
	reg  *tenants.Registry
}

type shaperAdmitter struct{ s *tenants.Shaper }

func (a shaperAdmitter) Admit(id tenants.ID, op proto.Opcode, n int) (bool, time.Duration) {
	return a.s.Admit(id, uint8(op), n)
}

func startServer(t testing.TB, cfg server.Config, wrap func(server.Backend) server.Backend) *testServer {
	t.Helper()
	reg, err := tenants.NewRegistry([]tenants.Spec{specAlpha, specBravo, specSlow})
	if err != nil {
		t.Fatal(err)
	}
	store, err := sm.Open(filepath.Join(t.TempDir(), "sm"), sm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var be server.Backend = local.New(store, "127.0.0.1:1")
	if wrap != nil {
		be = wrap(be)
	}
	if cfg.Admitter == nil {
		cfg.Admitter = shaperAdmitter{tenants.NewShaper(reg, time.Now, nil)}
	}
	host := server.New(cfg, reg, be, zerolog.Nop())
	rs := New(host, reg, be, Config{NodeID: 1, Log: zerolog.Nop()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go rs.Serve(ln)
	t.Cleanup(func() {
		host.Close()
		rs.Close()
		store.Close()
	})
	return &testServer{addr: ln.Addr().String(), host: host, resp: rs, be: be, reg: reg}
}

// goRedis is a go-redis client of ts as the tenant of token.
func goRedis(t testing.TB, addr, token string, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: addr, Password: token, MaxRetries: -1, DialTimeout: 2 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
