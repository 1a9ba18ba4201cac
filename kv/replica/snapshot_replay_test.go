package replica

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"synod/paxos"
)

// TestSnapRequestReplayedToAnotherMember: a sealed snapshot request that
// node 1 sent to node 2, captured on the way and replayed to node 3, is
// refused there (the request names its server; the seal does not, and
// node 3 never saw that counter), and counted as an authentication
// refusal, while node 2 served it. With the check planted away
// (testingSnapRequestUnaddressed) node 3 serves the replay: the whole
// store, to whoever holds a copy of another member's request.
func TestSnapRequestReplayedToAnotherMember(t *testing.T) {
	for _, planted := range []bool{false, true} {
		testingSnapRequestUnaddressed = planted
		servedTo2, servedTo3, refused := snapRequestReplay(t)
		testingSnapRequestUnaddressed = false
		fmt.Printf("snapshot request replay: planted=%v served_to_addressee=%v replay_to_other_served=%v refused_counted=%v\n",
			planted, servedTo2, servedTo3, refused)
		if !servedTo2 {
			t.Fatalf("planted=%v: node 2 did not serve the request addressed to it", planted)
		}
		if !planted && (servedTo3 || !refused) {
			t.Errorf("a request to node 2 replayed to node 3: served=%v refusal counted=%v; want refused and counted", servedTo3, refused)
		}
		if planted && !servedTo3 {
			t.Errorf("planted (requests unaddressed): node 3 refused the replay; the check does not tell the bug apart")
		}
	}
}

// snapRequestReplay starts an authenticated cluster, has a member 1
// (sealing as node 1) ask node 2 for a snapshot, replays the same sealed
// bytes to node 3, and reports whether each answered with a snapshot
// header and whether node 3 counted a refusal.
func snapRequestReplay(t *testing.T) (servedTo2, servedTo3, refused bool) {
	c := newTestClusterWith(t, func(c *testCluster) { c.snapEvery = 20; c.secret = secretA })
	for i := range 30 {
		c.put(fmt.Sprintf("k%d", i), "v")
	}
	addr := func(id paxos.NodeID) string {
		for _, p := range c.peers {
			if p.ID == id {
				return p.ConsensusAddr.String()
			}
		}
		t.Fatalf("no node %d", id)
		return ""
	}
	one := mustAuth(t, 9, 1, secretA)
	var magic [4]byte
	binary.LittleEndian.PutUint32(magic[:], snapshotConnMagic)

	// The request on its way to node 2: sealed once, its bytes kept.
	c2, err := net.DialTimeout("tcp", addr(2), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.Write(magic[:]); err != nil {
		t.Fatal(err)
	}
	sc2 := newSnapConn(c2, nil, one)
	if err := sc2.write(appendSnapRequest(nil, 77, 1, 2, 0)); err != nil {
		t.Fatal(err)
	}
	captured := append([]byte(nil), sc2.wbuf...)
	servedTo2 = snapAnswerIsHeader(sc2)

	before := counterValue(c.nodes[3].r.metrics.AuthRefused)
	c3, err := net.DialTimeout("tcp", addr(3), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if _, err := c3.Write(append(magic[:], captured...)); err != nil {
		t.Fatal(err)
	}
	servedTo3 = snapAnswerIsHeader(newSnapConn(c3, nil, one))
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if refused = counterValue(c.nodes[3].r.metrics.AuthRefused) > before; refused {
			break
		}
	}
	return servedTo2, servedTo3, refused
}

// snapAnswerIsHeader reads the server's first answer: true for a snapshot
// header, false for a refusal, a closed connection or anything else.
func snapAnswerIsHeader(sc *snapConn) bool {
	sc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := sc.read()
	if err != nil {
		return false
	}
	f, err := decodeSnapFrame(b)
	return err == nil && f.kind == snapFrameHeader
}
