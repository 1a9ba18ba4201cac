package replica

import (
	"sync/atomic"

	"synod/paxos"
)

// Faults is the runtime's fault hook for tests and drills: traffic to and
// from a blocked peer is dropped on both the datagram path and the side
// channel, as a network partition would drop it. The zero value blocks
// nothing. Safe for concurrent use.
type Faults struct {
	blocked atomic.Uint64 // bit i set: peer i blocked (ids 1..peersMax-1)
	dropped atomic.Uint64
	// persistDelay slows the next persist once, applyDelay the apply
	// loop (faults_delay.go).
	persistDelay, applyDelay oneShotDelay
}

// Block drops all traffic to and from the given peers (in addition to any
// already blocked).
func (f *Faults) Block(ids ...paxos.NodeID) {
	for _, id := range ids {
		if id > 0 && id < peersMax {
			f.blocked.Or(1 << uint(id))
		}
	}
}

// Set replaces the blocked set with ids (empty heals everything).
func (f *Faults) Set(ids ...paxos.NodeID) {
	var m uint64
	for _, id := range ids {
		if id > 0 && id < peersMax {
			m |= 1 << uint(id)
		}
	}
	f.blocked.Store(m)
}

// HealAll unblocks every peer.
func (f *Faults) HealAll() { f.blocked.Store(0) }

// Blocked returns the blocked peers.
func (f *Faults) Blocked() []paxos.NodeID {
	m := f.blocked.Load()
	var out []paxos.NodeID
	for i := 1; i < peersMax; i++ {
		if m&(1<<uint(i)) != 0 {
			out = append(out, paxos.NodeID(i))
		}
	}
	return out
}

// Dropped returns how many messages the hook dropped.
func (f *Faults) Dropped() uint64 { return f.dropped.Load() }

// drop reports whether traffic with peer id must be dropped, counting it.
func (f *Faults) drop(id paxos.NodeID) bool {
	if f == nil || id >= peersMax || f.blocked.Load()&(1<<uint(id)) == 0 {
		return false
	}
	f.dropped.Add(1)
	return true
}
