package e2e

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"synod/kv/client"
	"synod/kv/replica"
	"synod/paxos"
)

// Attacks on the consensus port from a socket that is not a cluster
// member (item 2 of the hostile-input review): forged paxos messages by
// datagram and by side channel, an absurd ballot, a garbage snapshot, a
// 255 MB side-channel frame, and replays sealed with the real secret but
// from an old incarnation. Each must be refused at its first packet: no
// leader change, no data change, every node up.
func init() { attackSets = append(attackSets, consensusAttacks) }

// e2eClusterID is the cluster id newCluster gives its nodes.
const e2eClusterID = 11

func consensusAttacks() []attack {
	forge := func(name string, msgs func(c *cluster, to *node) []paxos.Message) attack {
		return attack{name: name, run: func(t *testing.T, c *cluster, cl *client.Client) string {
			return c.unharmed(cl, func() {
				for _, nd := range c.nodes {
					for _, m := range msgs(c, nd) {
						sendDatagram(t, nd.consensus, paxos.AppendMessage(nil, &m))
						sendSideFrame(nd.consensus, paxos.AppendMessage(nil, &m))
					}
				}
			})
		}}
	}
	return []attack{
		forge("forged MsgSnapshot offering a follower a state far ahead", func(c *cluster, to *node) []paxos.Message {
			return []paxos.Message{{Type: paxos.MsgSnapshot, Cluster: e2eClusterID, From: otherID(to), To: paxos.NodeID(to.id),
				Ballot: paxos.Ballot{Round: 1 << 30, Node: otherID(to)}, Commit: 1 << 20,
				Snapshot: &paxos.SnapshotMeta{Slot: 1 << 20, Members: []paxos.NodeID{1, 2, 3}}}}
		}),
		forge("forged Accepts of an attacker's PUT", func(c *cluster, to *node) []paxos.Message {
			b := paxos.Ballot{Round: 1 << 20, Node: otherID(to)}
			return []paxos.Message{{Type: paxos.MsgAccept, Cluster: e2eClusterID, From: b.Node, To: paxos.NodeID(to.id), Ballot: b, Commit: 0,
				Entries: []paxos.Entry{{Slot: 1 << 10, Ballot: b, Type: paxos.EntryNormal, Cmds: [][]byte{[]byte("attacker")}}}}}
		}),
		forge("Prepares with round 2^62-1", func(c *cluster, to *node) []paxos.Message {
			b := paxos.Ballot{Round: 1<<62 - 1, Node: otherID(to)}
			return []paxos.Message{{Type: paxos.MsgPrepare, Cluster: e2eClusterID, From: b.Node, To: paxos.NodeID(to.id), Ballot: b, Slot: 1}}
		}),
		forge("spoofed Prepares to force a leader change", func(c *cluster, to *node) []paxos.Message {
			st, _ := c.status(to)
			round := uint64(1)
			if st != nil {
				round = st.Promised[0] + 1
			}
			b := paxos.Ballot{Round: round, Node: otherID(to)}
			return []paxos.Message{{Type: paxos.MsgPrepare, Cluster: e2eClusterID, From: b.Node, To: paxos.NodeID(to.id), Ballot: b, Slot: 1}}
		}),
		{name: "255 MB side-channel frames from a non-member", run: func(t *testing.T, c *cluster, cl *client.Client) string {
			return c.unharmed(cl, func() {
				for _, nd := range c.nodes {
					for range 4 {
						conn, err := net.DialTimeout("tcp", nd.consensus, time.Second)
						if err != nil {
							continue
						}
						conn.Write(binary.LittleEndian.AppendUint32(nil, 255<<20))
						conn.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
						conn.Write(make([]byte, 4<<20))
						conn.Close()
					}
				}
			})
		}},
		{name: "snapshot transfer requested by a non-member", run: func(t *testing.T, c *cluster, cl *client.Client) string {
			return forgedSnapshotRequest(c, cl, nil)
		}},
		{name: "delta snapshot transfer requested by a non-member", run: func(t *testing.T, c *cluster, cl *client.Client) string {
			// The same, as a delta request carrying a digest of garbage:
			// refused at the frame's head, before the digest is decoded
			// or a byte of state hashed.
			digest := make([]byte, 4096)
			for i := range digest {
				digest[i] = byte(i * 131)
			}
			return forgedSnapshotRequest(c, cl, digest)
		}},
		{name: "replayed packets sealed with the real secret by an old incarnation", run: func(t *testing.T, c *cluster, cl *client.Client) string {
			// An insider's capture from an earlier life of node 1: valid
			// tags, an incarnation older than node 1's current one.
			old, err := replica.NewAuth(e2eClusterID, 1, []paxos.NodeID{1, 2, 3}, [][]byte{mustHex(e2eClusterSecret)}, time.Now().Add(-time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			return c.unharmed(cl, func() {
				for _, nd := range c.nodes {
					if nd.id == 1 {
						continue
					}
					b := paxos.Ballot{Round: 1 << 20, Node: 1}
					m := paxos.Message{Type: paxos.MsgPrepare, Cluster: e2eClusterID, From: 1, To: paxos.NodeID(nd.id), Ballot: b, Slot: 1}
					sendDatagram(t, nd.consensus, old.SealDatagram(paxos.AppendMessage(nil, &m)))
				}
			})
		}},
	}
}

// unharmed runs attack and checks that it changed nothing a client or an
// operator can see: same leader and ballot, the victim key unchanged, the
// nodes refused what they got (their refusal counters grew).
func (c *cluster) unharmed(cl *client.Client, attack func()) string {
	l := c.leader()
	before, err := c.status(l)
	if err != nil {
		return fmt.Sprintf("status: %v", err)
	}
	ctx, cancel := ctxTimeout(killOpTimeout)
	defer cancel()
	victim := []byte("victim/consensus")
	if err := cl.Put(ctx, victim, []byte("v")); err != nil {
		return fmt.Sprintf("setting up: %v", err)
	}
	refusedBefore := c.authRefused()
	attack()
	time.Sleep(300 * time.Millisecond) // two election timeouts' worth of chances to do harm
	after, err := c.status(l)
	switch {
	case err != nil:
		return fmt.Sprintf("the leader's status after the attack: %v", err)
	case after.Role != "leader" || after.Promised != before.Promised:
		return fmt.Sprintf("leadership changed: node %d was leader at %v, now %s at %v", l.id, before.Promised, after.Role, after.Promised)
	}
	if v, err := cl.Get(ctx, victim); err != nil || string(v) != "v" {
		return fmt.Sprintf("the victim key changed: %q %v", v, err)
	}
	if c.authRefused() <= refusedBefore {
		return "no node counted a refused packet: the attack never reached authentication"
	}
	return ""
}

// authRefused sums the nodes' refused-packet counters (datagrams in
// synod_consensus_auth_refused_total plus side-channel refusals, which
// close the connection and show in the node's log).
func (c *cluster) authRefused() float64 {
	total := 0.0
	for _, nd := range c.nodes {
		total += metricValue(nd, "synod_consensus_auth_refused_total")
		total += float64(strings.Count(readLog(nd), "failed authentication"))
	}
	return total
}

// metricValue reads one unlabelled metric from nd's /metrics (0 if absent).
func metricValue(nd *node, name string) float64 {
	resp, err := httpClient.Get("http://" + nd.admin + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") {
			v, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, name)), 64)
			return v
		}
	}
	return 0
}

// readLog is nd's log so far.
func readLog(nd *node) string {
	b, _ := os.ReadFile(nd.logPath)
	return string(b)
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// otherID is a member id other than nd's (whom a forgery pretends to be).
func otherID(nd *node) paxos.NodeID { return paxos.NodeID(nd.id%3 + 1) }

func sendDatagram(t *testing.T, addr string, b []byte) {
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write(b)
}

// sendSideFrame sends b as an unsealed side-channel frame (length, body).
func sendSideFrame(addr string, b []byte) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return
	}
	defer conn.Close()
	conn.SetWriteDeadline(time.Now().Add(time.Second))
	conn.Write(append(binary.LittleEndian.AppendUint32(nil, uint32(len(b))), b...))
}

// forgedSnapshotRequest sends every node a snapshot transfer request (a
// delta request when digest is not nil) on the transfer connection
// ("SNP1"), framed as a sealed one from node 1 but with forged tags: the
// node must refuse it at its head, before sending a byte of state
// (kv/replica/snapshot_wire.go). It returns the harm done, "" for none.
func forgedSnapshotRequest(c *cluster, cl *client.Client, digest []byte) string {
	var leaked int
	harm := c.unharmed(cl, func() {
		kind := byte(1) // request
		if digest != nil {
			kind = 6 // delta request
		}
		req := []byte{kind, 1}                              // kind, version 1
		req = binary.LittleEndian.AppendUint64(req, 0xfeed) // transfer id
		req = binary.LittleEndian.AppendUint64(req, 1)      // from: node 1
		req = binary.LittleEndian.AppendUint64(req, 0)      // commit
		req = append(req, digest...)
		head := []byte{0xC5, 2, 0, 0} // sealed, snapshot channel
		head = binary.LittleEndian.AppendUint64(head, e2eClusterID)
		head = binary.LittleEndian.AppendUint64(head, 1)                             // sender: node 1
		head = binary.LittleEndian.AppendUint64(head, uint64(time.Now().UnixNano())) // incarnation
		head = binary.LittleEndian.AppendUint64(head, 1)                             // counter
		frame := append([]byte("SNP1"), binary.LittleEndian.AppendUint32(nil, uint32(len(head)+len(req)+8))...)
		frame = append(frame, head...)
		frame = binary.LittleEndian.AppendUint64(frame, 0xbad7a9) // forged head tag
		frame = append(frame, req...)
		frame = binary.LittleEndian.AppendUint64(frame, 0xbad7a9) // forged tag
		for _, nd := range c.nodes {
			conn, err := net.DialTimeout("tcp", nd.consensus, time.Second)
			if err != nil {
				continue
			}
			conn.SetDeadline(time.Now().Add(2 * time.Second))
			conn.Write(frame)
			n, _ := io.Copy(io.Discard, conn)
			leaked += int(n)
			conn.Close()
		}
	})
	if harm == "" && leaked > 0 {
		harm = fmt.Sprintf("the nodes answered a forged snapshot request with %d bytes", leaked)
	}
	return harm
}
