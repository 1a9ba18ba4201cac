package server

import (
	"fmt"
	"testing"
	"time"

	"synod/kv/proto"
)

// TestFatalFrameAnswersInflightFirst holds fatal's contract: requests read
// before a frame that ends the connection (here a header whose reserved
// byte is set, and one naming another tenant) finish and are answered,
// then the fatal frame's error is written, last, and the connection
// closes. Planted (testingFatalDropsInflight, the old way): the error
// comes at once and the requests still in flight are never answered
// (found by an outside client: 20 pipelined PUTs applied, none answered).
func TestFatalFrameAnswersInflightFirst(t *testing.T) {
	const n = 16
	type bad struct {
		name  string
		frame func(id uint64) []byte
		want  proto.Status
	}
	bads := []bad{
		{"reserved byte set", func(id uint64) []byte {
			b := proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: id, Key: []byte("k")})
			b[7] = 1
			return b
		}, proto.StatusBadRequest},
		{"another tenant", func(id uint64) []byte {
			return proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 2, ID: id, Key: []byte("k")})
		}, proto.StatusUnauthorized},
	}
	for _, b := range bads {
		for _, planted := range []bool{false, true} {
			testingFatalDropsInflight = planted
			ok, errorAt := fatalAfterPipelined(t, n, b.frame, b.want)
			testingFatalDropsInflight = false
			t.Logf("fatal frame (%s) behind %d requests in flight: planted=%v answered=%d error_at=%d", b.name, n, planted, ok, errorAt)
			switch {
			case !planted && (ok != n || errorAt != n):
				t.Fatalf("%s: %d of %d requests answered, the error at position %d; want all, then the error", b.name, ok, n, errorAt)
			case planted && ok == n:
				t.Fatalf("%s, planted: every request answered; the check misses answers dropped by a fatal frame", b.name)
			}
		}
	}
}

// fatalAfterPipelined sends n GETs that wait in the backend, then the
// frame bad(id) makes; once the server's reader has met it, it releases
// the GETs and reads until the connection closes. It returns how many
// GETs were answered OK and at which position the error came (-1: none).
func fatalAfterPipelined(t *testing.T, n int, bad func(id uint64) []byte, want proto.Status) (ok, errorAt int) {
	t.Helper()
	be := &echoBackend{gate: make(chan struct{})}
	s, addr := start(t, be, Config{})
	defer s.Close()
	c := dialRaw(t, addr)
	c.hello(tokenA)
	sc := onlyConn(t, s)
	var frames []byte
	for i := 0; i < n; i++ {
		frames = proto.AppendRequest(frames, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: uint64(2 + i), Key: []byte(fmt.Sprint(i))})
	}
	const badID = 999
	c.send(append(frames, bad(badID)...))
	for deadline := time.Now().Add(10 * time.Second); !sc.fatalWaiting.Load(); {
		if time.Now().After(deadline) {
			t.Fatal("the server's reader never met the fatal frame")
		}
		time.Sleep(time.Millisecond)
	}
	released := make(chan struct{})
	defer close(released)
	go func() {
		for i := 0; i < n; i++ {
			select {
			case be.gate <- struct{}{}:
			case <-released:
				return
			}
		}
	}()
	errorAt = -1
	for pos := 0; ; pos++ {
		r, err := c.recv()
		if err != nil {
			return ok, errorAt
		}
		switch {
		case r.ID == badID && r.Status == want:
			errorAt = pos
		case r.ID >= 2 && r.ID < uint64(2+n) && r.Status == proto.StatusOK:
			ok++
		default:
			t.Fatalf("answer %d: id %d status %v (%s)", pos, r.ID, r.Status, r.Message)
		}
	}
}
