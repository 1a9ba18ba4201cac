package replica

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"synod/afxdp"
	"synod/paxos"
)

// TestMisaddressedDatagramsCounted: a datagram a member sealed for another
// node, replayed to this one, passes the seal and the replay window here
// (the seal does not name the receiver, and the sender's counter runs
// across all its receivers) and is dropped by its payload's destination.
// Those drops count as authentication refusals, as the replayed side-channel
// frames and snapshot requests do (an outside tester found them only in
// synod_inbound_dropped_total, where an operator watching refusals would
// not look). Each kind is sent sealed with node 1's own sealer, so it is
// fresh at node 2: a paxos message, an accel frame and a disk report, all
// addressed to node 3.
func TestMisaddressedDatagramsCounted(t *testing.T) {
	c := newTestClusterWith(t, func(c *testCluster) { c.secret = secretA })
	c.put("k", "v")
	one := c.nodes[1].r.cfg.Auth
	payloads := [][]byte{
		paxos.AppendMessage(nil, &paxos.Message{Type: paxos.MsgHeartbeat, From: 1, To: 3}),
		appendAccelFrame(nil, &accelFrame{kind: accelFrameHeartbeat, cluster: c.nodes[1].r.cfg.ClusterID, from: 1, to: 3}),
		appendDiskReport(nil, c.nodes[1].r.cfg.ClusterID, 3, DiskSpace{Node: 1, FreeBytes: 1 << 30}),
	}
	attacker := c.net.Listen(netip.MustParseAddrPort("127.0.0.1:9"))
	defer attacker.Close()
	two := c.nodes[2].r
	refusedBefore := counterValue(two.metrics.AuthRefused)
	droppedBefore := counterValue(two.metrics.InboundDropped)
	const rounds = 5
	for range rounds {
		for _, p := range payloads {
			b := one.SealDatagram(p)
			if _, err := attacker.WriteBatch([]afxdp.Packet{{Buf: b, N: len(b), Addr: c.peers[1].ConsensusAddr}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := float64(rounds * len(payloads))
	var refused, dropped float64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		refused = counterValue(two.metrics.AuthRefused) - refusedBefore
		dropped = counterValue(two.metrics.InboundDropped) - droppedBefore
		if refused >= want {
			break
		}
	}
	fmt.Printf("misaddressed datagrams: sent=%.0f refused=%.0f dropped=%.0f\n", want, refused, dropped)
	if refused < want || dropped < want {
		t.Errorf("node 2 counted %.0f refusals and %.0f drops for %.0f datagrams a member sealed for node 3, want each counted in both", refused, dropped, want)
	}
	c.put("k2", "v2") // the cluster still serves
}
