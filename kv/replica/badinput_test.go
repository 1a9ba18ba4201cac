package replica

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"synod/afxdp"
)

// TestBadInputIsDropped sends garbage datagrams and bad side-channel frames
// to every node: they are counted and dropped, and the group goes on.
func TestBadInputIsDropped(t *testing.T) {
	c := newTestCluster(t, 3, 0)
	c.put("before", "1")
	evil := c.net.Listen(netip.MustParseAddrPort("127.0.0.1:9"))
	defer evil.Close()
	var pkts []afxdp.Packet
	for _, b := range [][]byte{{}, {0xff}, []byte("not a paxos message"), make([]byte, 1400)} {
		for _, p := range c.peers {
			pkts = append(pkts, afxdp.Packet{Buf: b, N: len(b), Addr: p.ConsensusAddr})
		}
	}
	if _, err := evil.WriteBatch(pkts); err != nil {
		t.Fatal(err)
	}
	for _, p := range c.peers {
		conn, err := net.Dial("tcp", p.ConsensusAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		var hdr [4]byte
		binary.LittleEndian.PutUint32(hdr[:], 16)
		conn.Write(append(hdr[:], []byte("sixteen bytes!!!")...)) // a frame that is no message
		binary.LittleEndian.PutUint32(hdr[:], sideFrameBytesMax+1)
		conn.Write(hdr[:]) // too large: the receiver closes the connection
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err == nil {
			t.Fatal("side channel answered garbage")
		}
		conn.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		dropped := 0.0
		for _, n := range c.nodes {
			dropped += counterValue(n.r.metrics.InboundDropped)
		}
		if dropped >= float64(len(pkts)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dropped %v of %d bad inputs", dropped, len(pkts))
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := 0; i < 10; i++ {
		c.put(fmt.Sprintf("after%d", i), "1")
	}
}
