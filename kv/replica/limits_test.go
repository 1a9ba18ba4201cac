package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/client"
	"synod/kv/proto"
	"synod/kv/server"
	"synod/kv/sm"
	"synod/paxos"
	"synod/pmem"
	"synod/tenants"
)

// TestSizeChainArithmetic spells out the chain kv/proto documents, from
// the record up, with the encoders themselves: a PUT of the longest key
// and value encodes to a command of exactly CommandBytesMax, whose entry
// fills exactly one acceptor-log record of RecordBytesMax.
func TestSizeChainArithmetic(t *testing.T) {
	req := &proto.Request{Op: proto.OpPut, ClientID: 1, Seq: 1, FirstUnacked: 1,
		Key: bytes.Repeat([]byte("k"), proto.KeyBytesMax), Value: make([]byte, proto.ValueBytesMax)}
	if n := len(proto.AppendRequestBody(nil, req)); n != proto.RequestBodyBytesMax {
		t.Fatalf("the longest PUT has a %d-byte body, RequestBodyBytesMax is %d", n, proto.RequestBodyBytesMax)
	}
	cmd := sm.EncodeCommand(testTenant, req)
	if len(cmd) != CommandBytesMax {
		t.Fatalf("the longest PUT encodes to %d bytes, CommandBytesMax is %d", len(cmd), CommandBytesMax)
	}
	env := appendEnvelope(nil, proposalID{origin: 1, boot: 1, seq: 1}, cmd)
	entry := paxos.AppendEntry(nil, &paxos.Entry{Slot: 1, Ballot: paxos.Ballot{Round: 1, Node: 1}, Type: paxos.EntryNormal, Cmds: [][]byte{env}})
	if len(entry) != pmem.RecordPayloadBytesMax {
		t.Fatalf("its entry encodes to %d bytes, a record's payload holds %d", len(entry), pmem.RecordPayloadBytesMax)
	}
	t.Logf("record %d = header %d + entry %d (entry header %d + cmd length %d + envelope header %d + command %d (header %d + body %d))",
		pmem.RecordBytesMax, pmem.RecordBytesMax-pmem.RecordPayloadBytesMax, len(entry), paxos.EntryHeaderBytes, paxos.CmdLenBytes,
		envelopeHeaderBytes, len(cmd), proto.CommandHeaderBytes, proto.RequestBodyBytesMax)
}

// TestSizeBoundariesWholePath walks every size boundary of a write byte by
// byte through the whole path (Go client, server, replica, paxos batching,
// the acceptor logs of all three nodes, the follower fast path on the
// accel nodes): each request at or below its limit is acknowledged and
// reads back, each one byte or two above is TOO_LARGE and changes
// nothing, and no node stops. Before the chain was derived, a legal PUT
// (a 1-byte key and a value of 1,048,480 bytes) made every leader it
// reached exit with "pmem: record too large".
func TestSizeBoundariesWholePath(t *testing.T) {
	// Megabyte entries on two shared cores can stall a loop past a 100 ms
	// election timeout, and each leader change re-proposes the entries in
	// flight under a new ballot (new log records): a wider timeout and a
	// roomier log keep this test about sizes, not about the tail.
	c := newTestClusterOpts(t, 3, 0, 128<<20, 0, func(tc *testCluster) {
		tc.accelOn = map[paxos.NodeID]bool{1: true, 2: true}
		tc.electionTicks = 500
	})
	c.put("warm", "1")
	l := c.leader()
	cl := c.clientToAll()
	ctx := context.Background()

	type step struct {
		name string
		over int // bytes over the limit (<= 0: at or under)
		run  func(over int) error
		// check, for an acknowledged step, reads the result back.
		check func(over int) error
	}
	longKey := bytes.Repeat([]byte("k"), proto.KeyBytesMax)
	val := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	readBack := func(key, want []byte) error {
		got, err := cl.Get(ctx, key)
		if err != nil || !bytes.Equal(got, want) {
			return fmt.Errorf("read back %d bytes (%v), want %d", len(got), err, len(want))
		}
		return nil
	}
	// CAS and BATCH walk their frame length: each part within its own
	// limit, together at RequestBodyBytesMax + over.
	casKey := []byte("cas")
	expect := val(proto.ValueBytesMax/2, 'e')
	casBase := len(proto.AppendRequestBody(nil, &proto.Request{Op: proto.OpCAS, Key: casKey, ExpectPresent: true, Expect: expect}))
	batchBase := len(proto.AppendRequestBody(nil, &proto.Request{Op: proto.OpBatch, Ops: []proto.BatchOp{
		{Op: proto.OpPut, Key: []byte("b1"), Value: val(proto.ValueBytesMax/2, 'x')}, {Op: proto.OpPut, Key: []byte("b2")}}}))
	var steps []step
	for over := -2; over <= 2; over++ {
		steps = append(steps,
			step{"PUT longest key, value ValueBytesMax", over,
				func(over int) error { return cl.Put(ctx, longKey, val(proto.ValueBytesMax+over, byte('a'+over+2))) },
				func(over int) error { return readBack(longKey, val(proto.ValueBytesMax+over, byte('a'+over+2))) }},
			step{"PUT 1-byte key, value ValueBytesMax", over,
				func(over int) error { return cl.Put(ctx, []byte("s"), val(proto.ValueBytesMax+over, 'p')) },
				func(over int) error { return readBack([]byte("s"), val(proto.ValueBytesMax+over, 'p')) }},
			step{"CAS expect+value to RequestBodyBytesMax", over,
				func(over int) error {
					if err := cl.Put(ctx, casKey, expect); err != nil {
						return fmt.Errorf("setting up: %w", err)
					}
					return cl.CAS(ctx, casKey, expect, val(proto.RequestBodyBytesMax-casBase+over, 'c'))
				},
				func(over int) error { return readBack(casKey, val(proto.RequestBodyBytesMax-casBase+over, 'c')) }},
			step{"BATCH of two PUTs to RequestBodyBytesMax", over,
				func(over int) error {
					return cl.Batch(ctx, []proto.BatchOp{{Op: proto.OpPut, Key: []byte("b1"), Value: val(proto.ValueBytesMax/2, 'x')},
						{Op: proto.OpPut, Key: []byte("b2"), Value: val(proto.RequestBodyBytesMax-batchBase+over, 'y')}})
				},
				func(over int) error {
					return readBack([]byte("b2"), val(proto.RequestBodyBytesMax-batchBase+over, 'y'))
				}},
		)
	}
	steps = append(steps, step{"the PUT that killed leaders (1-byte key, 1,048,480-byte value)", 1048480 - proto.ValueBytesMax,
		func(int) error { return cl.Put(ctx, []byte("x"), val(1048480, 'z')) }, nil})

	acked, refused := 0, 0
	for _, st := range steps {
		err := st.run(st.over)
		switch {
		case st.over <= 0 && err != nil:
			t.Errorf("%s, %+d bytes: %v; want acknowledged", st.name, st.over, err)
		case st.over <= 0:
			acked++
			if err := st.check(st.over); err != nil {
				t.Errorf("%s, %+d bytes: %v", st.name, st.over, err)
			}
		case !errors.Is(err, client.ErrTooLarge):
			t.Errorf("%s, %+d bytes: %v; want TOO_LARGE", st.name, st.over, err)
		default:
			refused++
		}
	}
	// Several longest commands at once: paxos gives each its own slot and
	// every acceptor log takes them.
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cl.Put(ctx, []byte(fmt.Sprintf("burst%d", i)), val(proto.ValueBytesMax, byte(i))); err != nil {
				t.Errorf("burst write %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	for id, n := range c.nodes {
		select {
		case err := <-n.r.Fatal():
			t.Fatalf("node %d stopped: %v", id, err)
		default:
		}
		c.waitApplied(id, c.nodes[l].r.Applied())
	}
	// A leader change is not a failure here (megabyte entries on two
	// shared cores can outlast an election timeout; the tail work tracks
	// that): a node that exits, or a write lost or refused, is.
	changes := 0.0
	for _, n := range c.nodes {
		changes += counterValue(n.r.metrics.LeaderChanges)
	}
	t.Logf("size walk: acked=%d refused=%d, every node up; leader-change observations %v", acked, refused, changes)
}

// TestWriteRefusesOversizedCommand: the runtime's own check, below the
// server's, refuses a command one byte over CommandBytesMax before it is
// proposed.
func TestWriteRefusesOversizedCommand(t *testing.T) {
	c := newTestCluster(t, 1, 0)
	l := c.leader()
	_, err := c.nodes[l].r.Write(context.Background(), testTenant, make([]byte, CommandBytesMax+1))
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a %d-byte command: %v, want ErrTooLarge", CommandBytesMax+1, err)
	}
	if resp := c.nodes[l].be.errResponse(err); resp.Status != proto.StatusTooLarge {
		t.Fatalf("ErrTooLarge maps to %v", resp.Status)
	}
}

// clientToAll serves every node's Backend on a loopback port and returns a
// Go client that knows all of them (a NOT_LEADER names a test address that
// does not resolve, so the client moves on to the next endpoint).
func (c *testCluster) clientToAll() *client.Client {
	c.t.Helper()
	reg, err := tenants.NewRegistry([]tenants.Spec{{ID: testTenant, Name: "t", Token: "test-token-1"}})
	if err != nil {
		c.t.Fatal(err)
	}
	var eps []string
	for _, p := range c.peers {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			c.t.Fatal(err)
		}
		s := server.New(server.Config{}, reg, c.nodes[p.ID].be, zerolog.Nop())
		go s.Serve(ln)
		c.t.Cleanup(func() { s.Close() })
		eps = append(eps, ln.Addr().String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := client.Dial(ctx, eps, "test-token-1", client.Options{RequestTimeout: 30 * time.Second, RetriesMax: 50,
		BackoffMax: 100 * time.Millisecond, DialTimeout: 200 * time.Millisecond})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}
