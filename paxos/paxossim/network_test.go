package paxossim

import (
	"testing"

	"synod/paxos"
)

func drain(n *network, now int64) []packet {
	var out []packet
	for {
		p, ok := n.due(now)
		if !ok {
			return out
		}
		out = append(out, p)
	}
}

func TestNetworkPartitionAndHeal(t *testing.T) {
	r := newSimRand(1)
	n := newNetwork()
	n.partition([]paxos.NodeID{1}, []paxos.NodeID{2, 3})
	n.block(2, 3)
	for _, l := range []link{{1, 2}, {2, 1}, {1, 3}, {3, 1}, {2, 3}, {3, 2}} {
		n.send(r, 0, l.from, l.to, []byte{byte(l.from), byte(l.to)})
	}
	got := drain(n, longDelayMicrosMax)
	if len(got) != 1 || got[0].from != 3 || got[0].to != 2 {
		t.Fatalf("delivered %+v, want only 3->2", got)
	}
	n.heal()
	n.send(r, 0, 1, 2, nil)
	if got := drain(n, longDelayMicrosMax); len(got) != 1 {
		t.Fatalf("after heal delivered %d, want 1", len(got))
	}
}

func TestNetworkFaultRates(t *testing.T) {
	r := newSimRand(2)
	n := newNetwork()
	n.dropPPM, n.dupPPM, n.longDelayPPM = 100_000, 100_000, 100_000
	const sent = 10_000
	for i := range sent {
		n.send(r, int64(i), 1, 2, nil)
	}
	got := drain(n, 1<<40)
	st := n.stats
	if st.dropped == 0 || st.duplicated == 0 || st.delayed == 0 {
		t.Fatalf("faults not injected: %+v", st)
	}
	if uint64(len(got)) != sent-st.dropped+st.duplicated {
		t.Fatalf("delivered %d, want %d", len(got), sent-st.dropped+st.duplicated)
	}
	reordered := false
	for i := 1; i < len(got); i++ {
		if got[i].at < got[i-1].at {
			t.Fatal("due returned packets out of time order")
		}
		if got[i].seq < got[i-1].seq {
			reordered = true
		}
	}
	if !reordered {
		t.Fatal("no packet was overtaken")
	}
}
