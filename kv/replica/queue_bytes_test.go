package replica

import (
	"testing"

	"github.com/rs/zerolog"

	"synod/paxos"
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
