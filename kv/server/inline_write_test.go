package server

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"synod/kv/proto"
)

// onlyConn returns the server's one connection.
func onlyConn(t *testing.T, s *Server) *conn {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) != 1 {
		t.Fatalf("%d connections, want 1", len(s.conns))
	}
	for c := range s.conns {
		return c
	}
	return nil
}

// TestAnswersWrittenByTheirRequest holds writeInline's contract: while
// nothing waits for the writer goroutine, a request's answer is written
// by the request's own goroutine (no wake-up of the writer), and the
// client gets every answer once. Planted (testingNoInlineWrites, every
// answer through the writer), none is.
func TestAnswersWrittenByTheirRequest(t *testing.T) {
	const n = 50
	for _, planted := range []bool{false, true} {
		testingNoInlineWrites = planted
		s, addr := start(t, &echoBackend{}, Config{})
		c := dialRaw(t, addr)
		c.hello(tokenA)
		sc := onlyConn(t, s)
		for i := 0; i < n; i++ { // one at a time, the writer idle
			// The burst before may still hold the token for a moment
			// after its flush (the HELLO's, above all).
			for deadline := time.Now().Add(5 * time.Second); len(sc.wtoken) == 0 && time.Now().Before(deadline); {
				time.Sleep(100 * time.Microsecond)
			}
			c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: uint64(i + 2), Key: []byte(fmt.Sprint(i))}))
			r := c.mustRecv()
			if r.Status != proto.StatusOK || r.ID != uint64(i+2) || string(r.Value) != fmt.Sprintf("1:%d", i) {
				t.Fatalf("planted %v, GET %d: id %d status %v value %q", planted, i, r.ID, r.Status, r.Value)
			}
		}
		inline := sc.inlineWrites.Load()
		c.nc.Close()
		s.Close()
		testingNoInlineWrites = false
		t.Logf("inline writes: planted=%v answers=%d inline=%d", planted, n, inline)
		switch {
		case !planted && inline != n:
			t.Fatalf("%d of %d answers written by their request, want all", inline, n)
		case planted && inline != 0:
			t.Fatalf("planted: %d answers written inline", inline)
		}
	}
}

// TestInlineAndWriterAnswersMix: pipelined requests released at once
// race for the write token, some answers written by their request, the
// rest by the writer; every answer arrives exactly once, and after the
// client's end of stream the connection closes only behind the last one.
func TestInlineAndWriterAnswersMix(t *testing.T) {
	const n, rounds = proto.InflightPerConnMax, 8
	be := &echoBackend{gate: make(chan struct{})}
	s, addr := start(t, be, Config{})
	c := dialRaw(t, addr)
	c.hello(tokenA)
	seen := map[uint64]bool{}
	for round := 0; round < rounds; round++ {
		var frames []byte
		for i := 0; i < n; i++ {
			id := uint64(2 + round*n + i)
			frames = proto.AppendRequest(frames, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: id, Key: []byte(fmt.Sprint(id))})
		}
		c.send(frames)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // release them all, as an apply loop answers a slot
			defer wg.Done()
			for i := 0; i < n; i++ {
				be.gate <- struct{}{}
			}
		}()
		for i := 0; i < n; i++ {
			r := c.mustRecv()
			if r.Status != proto.StatusOK || seen[r.ID] || string(r.Value) != fmt.Sprintf("1:%d", r.ID) {
				t.Fatalf("round %d: id %d status %v value %q (seen before: %v)", round, r.ID, r.Status, r.Value, seen[r.ID])
			}
			seen[r.ID] = true
		}
		wg.Wait()
	}
	inline := onlyConn(t, s).inlineWrites.Load()
	t.Logf("inline writes: answers=%d inline=%d (the rest by the writer)", n*rounds, inline)
	// The last round again, closed by the client right after sending:
	// every answer, then the close.
	var frames []byte
	for i := 0; i < n; i++ {
		id := uint64(1_000_000 + i)
		frames = proto.AppendRequest(frames, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: id, Key: []byte(fmt.Sprint(id))})
	}
	c.send(frames)
	c.nc.(interface{ CloseWrite() error }).CloseWrite()
	go func() {
		for i := 0; i < n; i++ {
			be.gate <- struct{}{}
		}
	}()
	for i := 0; i < n; i++ {
		r := c.mustRecv()
		if r.Status != proto.StatusOK || seen[r.ID] {
			t.Fatalf("after end of stream: id %d status %v", r.ID, r.Status)
		}
		seen[r.ID] = true
	}
	c.expectClosed()
	s.Close()
}
