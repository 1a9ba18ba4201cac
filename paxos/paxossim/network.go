package paxossim

import (
	"container/heap"

	"synod/paxos"
)

// Simulated time is counted in micro-ticks so that messages can arrive
// between two ticks and node clocks can drift by fractions of a tick.
const microsPerTick = 1000

// Network limits.
const (
	packetsInFlightMax = 1 << 16 // beyond this, new packets are dropped (and counted)
	delayMicrosMin     = 200
	delayMicrosMax     = 2500
	longDelayMicrosMax = 12 * microsPerTick // "reorder" fault: a packet overtaken by later ones
	// One delayed packet in ancientPerDelayed arrives very late, long after
	// the ballot that sent it was superseded.
	ancientPerDelayed     = 10
	ancientDelayMicrosMax = 150 * microsPerTick
)

// packet is one encoded message in flight. Messages travel as bytes so
// every delivery exercises paxos.AppendMessage and paxos.UnmarshalMessage.
type packet struct {
	at   int64  // delivery time, micro-ticks
	seq  uint64 // tie-break, so equal times deliver in send order
	from paxos.NodeID
	to   paxos.NodeID
	data []byte
}

type packetHeap []packet

func (h packetHeap) Len() int { return len(h) }
func (h packetHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h packetHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *packetHeap) Push(x any)   { *h = append(*h, x.(packet)) }
func (h *packetHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = packet{}
	*h = old[:len(old)-1]
	return p
}

// link is a directed pair of nodes.
type link struct{ from, to paxos.NodeID }

// network is the simulated network. Its faults are probabilities in parts
// per million, set by the fault profile and cleared when faults heal.
type network struct {
	q       packetHeap
	nextSeq uint64
	// blocked links drop every packet at delivery time, so a partition
	// also stops packets already in flight.
	blocked map[link]bool

	dropPPM      uint32
	dupPPM       uint32
	longDelayPPM uint32

	stats netStats
}

type netStats struct {
	sent, delivered, dropped, duplicated, delayed, blocked, overflow uint64
}

func (s *netStats) add(o netStats) {
	s.sent += o.sent
	s.delivered += o.delivered
	s.dropped += o.dropped
	s.duplicated += o.duplicated
	s.delayed += o.delayed
	s.blocked += o.blocked
	s.overflow += o.overflow
}

func newNetwork() *network {
	return &network{blocked: map[link]bool{}}
}

// send queues data for delivery, applying drop, duplicate and delay faults.
func (n *network) send(r *simRand, now int64, from, to paxos.NodeID, data []byte) {
	n.stats.sent++
	if r.ppm(n.dropPPM) {
		n.stats.dropped++
		return
	}
	copies := 1
	if r.ppm(n.dupPPM) {
		n.stats.duplicated++
		copies = 2
	}
	for range copies {
		if n.q.Len() >= packetsInFlightMax {
			n.stats.overflow++
			return
		}
		d := r.between(delayMicrosMin, delayMicrosMax)
		if r.ppm(n.longDelayPPM) {
			n.stats.delayed++
			d = r.between(delayMicrosMax, longDelayMicrosMax)
			if r.chance(1, ancientPerDelayed) {
				d = r.between(longDelayMicrosMax, ancientDelayMicrosMax)
			}
		}
		n.nextSeq++
		heap.Push(&n.q, packet{at: now + d, seq: n.nextSeq, from: from, to: to, data: data})
	}
}

// due pops the next packet due at or before now.
func (n *network) due(now int64) (packet, bool) {
	for n.q.Len() > 0 && n.q[0].at <= now {
		p := heap.Pop(&n.q).(packet)
		if n.blocked[link{p.from, p.to}] {
			n.stats.blocked++
			continue
		}
		return p, true
	}
	return packet{}, false
}

// partition blocks every link between side a and side b, both ways.
func (n *network) partition(a, b []paxos.NodeID) {
	for _, x := range a {
		for _, y := range b {
			n.blocked[link{x, y}] = true
			n.blocked[link{y, x}] = true
		}
	}
}

// block blocks one direction only.
func (n *network) block(from, to paxos.NodeID) { n.blocked[link{from, to}] = true }

// heal removes every partition.
func (n *network) heal() { clear(n.blocked) }

// partitioned reports whether any link is blocked.
func (n *network) partitioned() bool { return len(n.blocked) > 0 }
