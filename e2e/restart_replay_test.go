package e2e

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"synod/internal/siphash"
	"synod/kv/replica"
	"synod/paxos"
)

// restartReplayPackets is how many captured packets the test replays.
const restartReplayPackets = 32

// TestRestartRefusesCapturedPackets: consensus packets a node accepted
// before a crash are refused after its restart (found by an outside
// attacker: 222 datagrams captured from a member's traffic, replayed the
// moment the follower was back, all accepted). The test plays an insider
// who captured a sender's last packets to the receiver: it seals them
// itself from docs/protocol.md's layout (the cluster secret, the sender's
// incarnation and the counters the receiver's floors file recorded), with
// the sender paused so that no fresher packet reaches the restarted
// receiver first. Planted (SYNOD_PLANT=no-auth-floors, a restart without
// floors): every replay is accepted.
func TestRestartRefusesCapturedPackets(t *testing.T) {
	refused := restartReplayRefused(t, false)
	planted := restartReplayRefused(t, true)
	fmt.Printf("e2e restart replay: replayed=%d refused=%d; planted (no floors): refused=%d caught=%v\n",
		restartReplayPackets, refused, planted, planted < restartReplayPackets)
	if refused < restartReplayPackets {
		t.Errorf("the restarted node refused %d of %d packets captured before its crash", refused, restartReplayPackets)
	}
	if planted >= restartReplayPackets {
		t.Errorf("planted (no floors): the restarted node refused all %d replays: the test cannot tell the floors' effect", restartReplayPackets)
	}
}

// restartReplayRefused runs the scenario on a fresh cluster and returns
// how many of the replays the restarted receiver's refusal counter grew by.
func restartReplayRefused(t *testing.T, planted bool) int {
	var c *cluster
	if planted {
		c = newClusterWith(t, 3, plantedKvnode(t), []string{"SYNOD_PLANT=no-auth-floors"})
	} else {
		c = newCluster(t, 3)
	}
	c.leader()
	sender, receiver := c.nodes[0], c.nodes[1]
	// The receiver's floors file is written every 100 ms: let it record
	// the sender's traffic.
	time.Sleep(time.Second)
	if err := sender.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer sender.cmd.Process.Signal(syscall.SIGCONT)
	time.Sleep(500 * time.Millisecond) // its packets in flight land, the receiver records them
	c.kill(receiver)
	floors := readFloors(t, c, receiver)
	var last replica.AuthFloor
	for _, f := range floors {
		if f.Sender == paxos.NodeID(sender.id) && f.Channel == 0 {
			last = f
		}
	}
	if last.Counter < restartReplayPackets {
		t.Fatalf("the receiver's floors record no datagrams of node %d: %+v", sender.id, floors)
	}
	c.start(receiver)
	before := metricValue(receiver, "synod_consensus_auth_refused_total")
	m := paxos.Message{Type: paxos.MsgHeartbeat, Cluster: e2eClusterID, From: paxos.NodeID(sender.id), To: paxos.NodeID(receiver.id),
		Ballot: paxos.Ballot{Round: 0, Node: paxos.NodeID(sender.id)}}
	payload := paxos.AppendMessage(nil, &m)
	for i := uint64(restartReplayPackets); i >= 1; i-- {
		sendDatagram(t, receiver.consensus, sealAsMember(mustHex(e2eClusterSecret), e2eClusterID, paxos.NodeID(sender.id), last.Incarnation, last.Counter+1-i, payload))
	}
	time.Sleep(300 * time.Millisecond)
	return int(metricValue(receiver, "synod_consensus_auth_refused_total") - before)
}

// readFloors reads nd's replay floors file (kvnode's data_dir/auth_floors).
func readFloors(t *testing.T, c *cluster, nd *node) []replica.AuthFloor {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.dir, fmt.Sprintf("data%d", nd.id), "auth_floors"))
	if err != nil {
		t.Fatalf("node %d's floors: %v", nd.id, err)
	}
	fs, _, err := replica.DecodeAuthFloorsFile(b)
	if err != nil {
		t.Fatalf("node %d's floors: %v", nd.id, err)
	}
	return fs
}

// sealAsMember seals payload as a datagram of sender, as
// docs/protocol.md "Authenticated consensus framing" lays it out.
func sealAsMember(secret []byte, cluster uint64, sender paxos.NodeID, incarnation, counter uint64, payload []byte) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("synod consensus mac v1"))
	var ids [16]byte
	binary.LittleEndian.PutUint64(ids[0:8], cluster)
	binary.LittleEndian.PutUint64(ids[8:16], uint64(sender))
	mac.Write(ids[:])
	var k [siphash.KeyBytes]byte
	copy(k[:], mac.Sum(nil))
	b := []byte{0xC5, 0, 0, 0}
	b = binary.LittleEndian.AppendUint64(b, cluster)
	b = binary.LittleEndian.AppendUint64(b, uint64(sender))
	b = binary.LittleEndian.AppendUint64(b, incarnation)
	b = binary.LittleEndian.AppendUint64(b, counter)
	b = append(b, payload...)
	return binary.LittleEndian.AppendUint64(b, siphash.NewKey(k).Sum64(b))
}
