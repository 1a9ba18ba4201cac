package replica

import (
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/paxos"
	"synod/tenants"
)

// TestProposeQueueBytesBound: the writes waiting to be proposed hold at
// most proposeQueueBytesMax envelope bytes, byte by byte at the bound; an
// empty queue takes one write of any size; bytes given back fit again.
func TestProposeQueueBytesBound(t *testing.T) {
	var r Replica
	if !r.reserveQueued(proposeQueueBytesMax - 10) {
		t.Fatal("below the bound: refused")
	}
	if r.reserveQueued(11) {
		t.Fatal("one byte past the bound: taken")
	}
	if !r.reserveQueued(10) {
		t.Fatal("exactly at the bound: refused")
	}
	if r.reserveQueued(1) {
		t.Fatal("one byte past the bound: taken")
	}
	if got := r.queuedBytes.Load(); got != proposeQueueBytesMax {
		t.Fatalf("queued %d bytes after refusals, want %d", got, proposeQueueBytesMax)
	}
	r.dequeued(&proposal{env: make([]byte, 10)}, 0)
	if !r.reserveQueued(10) {
		t.Fatal("10 bytes after 10 were taken by the loop: refused")
	}
	r.queuedBytes.Store(0)
	if !r.reserveQueued(3 * proposeQueueBytesMax) {
		t.Fatal("an empty queue refused a write larger than the bound")
	}
	if r.reserveQueued(1) {
		t.Fatal("a write behind one larger than the bound: taken")
	}
}

// TestSideQueueBytesBound: the messages waiting for one peer's side
// channel hold at most sideQueueBytesMax bytes (past it they are dropped
// and counted, as past sideQueueMsgsMax), byte by byte at the bound; an
// empty queue takes one message of any size.
func TestSideQueueBytesBound(t *testing.T) {
	s, err := newSideChannel("127.0.0.1:0", map[paxos.NodeID]string{2: "127.0.0.1:9"}, nil, func([]byte) bool { return true }, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer s.close() // never started: nothing drains the queue
	p := s.peers[2]
	queued := func() (msgs int, bytes int64) { return len(p.queue), p.queued.Load() }
	s.send(2, make([]byte, sideQueueBytesMax-10))
	s.send(2, make([]byte, 11))
	if m, b := queued(); m != 1 || b != sideQueueBytesMax-10 || s.dropped.Load() != 1 {
		t.Fatalf("one byte past the bound: %d messages, %d bytes, %d dropped; want 1, %d, 1", m, b, s.dropped.Load(), sideQueueBytesMax-10)
	}
	s.send(2, make([]byte, 10))
	if m, b := queued(); m != 2 || b != sideQueueBytesMax {
		t.Fatalf("exactly at the bound: %d messages, %d bytes", m, b)
	}
	p.take(<-p.queue)
	p.take(<-p.queue)
	s.send(2, make([]byte, 3*sideQueueBytesMax))
	if m, b := queued(); m != 1 || b != 3*sideQueueBytesMax {
		t.Fatalf("an empty queue and a message past the bound: %d messages, %d bytes", m, b)
	}
	s.send(2, make([]byte, 1))
	if m, _ := queued(); m != 1 || s.dropped.Load() != 2 {
		t.Fatalf("behind a message past the bound: %d messages, %d dropped", m, s.dropped.Load())
	}
	p.take(<-p.queue)
	for range sideQueueMsgsMax + 1 {
		s.send(2, []byte{1})
	}
	if m, b := queued(); m != sideQueueMsgsMax || b != sideQueueMsgsMax {
		t.Fatalf("past the message bound: %d messages, %d bytes; want %d of each", m, b, sideQueueMsgsMax)
	}
}

// TestTenantQueueBytesShare: each tenant's scheduler queue gets its share
// of proposeQueueBytesMax, at most tenants.TenantQueueBytesMax, so the
// queues together hold at most the node's bound (plus one write each).
func TestTenantQueueBytesShare(t *testing.T) {
	for _, n := range []int{0, 1, 4, 5, 64, 4096} {
		b := tenantQueueBytesMax(n)
		if b > tenants.TenantQueueBytesMax || b <= 0 || max(n, 1)*b > proposeQueueBytesMax {
			t.Errorf("%d tenants: %d bytes each (%d in all), want at most %d each and %d in all", n, b, n*b, tenants.TenantQueueBytesMax, proposeQueueBytesMax)
		}
	}
}

// TestQueuedBytesGivenBack: on a cluster with and without the tenant
// scheduler, writes of large values (through the side channel) leave no
// bytes counted in the propose queue or in any side-channel send queue
// once they are answered: every path that takes bytes gives them back (a
// leak would make the bounds refuse everything in time).
func TestQueuedBytesGivenBack(t *testing.T) {
	for _, drr := range []bool{false, true} {
		c := newTestClusterWith(t, func(tc *testCluster) { tc.drr = drr })
		big := string(make([]byte, 200<<10))
		for i := range 20 {
			c.put(fmt.Sprintf("big%d", i), big)
		}
		l := c.leader()
		c.waitApplied(1, c.nodes[l].r.Applied())
		c.waitApplied(2, c.nodes[l].r.Applied())
		c.waitApplied(3, c.nodes[l].r.Applied())
		var queued, side int64
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			queued, side = 0, 0
			for _, nd := range c.nodes {
				queued += nd.r.queuedBytes.Load()
				nd.r.side.peersMu.Lock()
				for _, p := range nd.r.side.peers {
					side += p.queued.Load()
				}
				nd.r.side.peersMu.Unlock()
			}
			if (queued == 0 && side == 0) || time.Now().After(deadline) {
				break
			}
		}
		if counterValue(c.nodes[l].r.metrics.SideSent) == 0 {
			t.Fatalf("drr=%v: no message went over the side channel", drr)
		}
		if queued != 0 || side != 0 {
			t.Errorf("drr=%v: after every write was answered, %d bytes counted in propose queues and %d in side-channel send queues, want 0", drr, queued, side)
		}
	}
}
