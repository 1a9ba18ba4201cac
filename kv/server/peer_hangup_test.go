package server

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"synod/kv/proto"
)

// hangupConns is how many of one tenant's connections the hang-up test
// paces at once: their frames share the tenant's turns, so the last
// connection's next turn is several refusedPaceMax ahead.
const hangupConns = 8

// pacedConnsLeave paces hangupConns of tenant A's connections (each
// pipelines a run of refusals and more, its answers unread), closes them
// all, and returns how long the server took to count none of them.
func pacedConnsLeave(t *testing.T) time.Duration {
	t.Helper()
	be := &refuseAll{retryAfter: refusedPaceMax}
	s, addr := start(t, be, Config{})
	// Every connection says HELLO before any is refused, so none starts
	// paced (the tenant's mark would pace a later one from its first
	// frame); then each pipelines a run of refusals and more.
	var conns []*rawConn
	for range hangupConns {
		c := dialRaw(t, addr)
		c.hello(tokenA)
		conns = append(conns, c)
	}
	for i, c := range conns {
		var frames []byte
		// The reader reads up to a pipeline's depth ahead of the run:
		// the frames past that wait their turns.
		for j := range refusedRunPacedMin + proto.InflightPerConnMax + 32 {
			frames = proto.AppendRequest(frames, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: uint64(i*1000 + j + 1), Key: []byte("no")})
		}
		c.send(frames)
	}
	for s.Stats().FramesPaced < 2*hangupConns {
		time.Sleep(time.Millisecond)
	}
	// Every connection is in its paced run, its next frames waiting for
	// their turns.
	closed := time.Now()
	for _, c := range conns {
		c.nc.Close()
	}
	for s.Stats().ConnsAuthenticated > 0 {
		if time.Since(closed) > 20*time.Second {
			t.Fatalf("%d closed connections still counted after 20 s", s.Stats().ConnsAuthenticated)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(closed)
}

// TestPacedConnectionHangUpLeaves: a paced connection whose peer closes
// stops counting (against its tenant's and the node's connection caps)
// within about paceHangupCheck, not when its reader's turn comes. Planted
// (testingPaceIgnoresHangup): the readers sleep out their turns, shared
// by hangupConns connections, and the last leaves several refusedPaceMax
// later: caught.
func TestPacedConnectionHangUpLeaves(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the hang-up check is Linux's POLLRDHUP")
	}
	left := pacedConnsLeave(t)
	testingPaceIgnoresHangup.Store(true)
	planted := pacedConnsLeave(t)
	testingPaceIgnoresHangup.Store(false)
	fmt.Printf("paced hang-up: conns=%d left_after=%v planted_left_after=%v\n", hangupConns, left.Round(time.Millisecond), planted.Round(time.Millisecond))
	if planted < 2*refusedPaceMax {
		t.Fatalf("planted: the closed paced connections left after %v, under two paces (%v): the test does not show the wait it is about", planted, 2*refusedPaceMax)
	}
	if left*2 > planted {
		t.Errorf("closed paced connections left after %v, planted without the hang-up check %v: want under half", left, planted)
	}
}
