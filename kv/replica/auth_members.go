package replica

import (
	"fmt"

	"synod/internal/siphash"
	"synod/paxos"
)

// The senders an Auth admits follow the membership. Every node id that can
// exist (1..peersMax-1) has its key derived once, at NewAuth; which of them
// may send is a bitmask the consensus loop rewrites on every membership
// change (setSenders, from refreshPeers): a packet from any other sender
// is refused before its tag is even checked, and the replay windows of
// senders that left are dropped.

// deriveKeys derives every possible sender's key under secret.
func deriveKeys(secret []byte, cluster uint64) map[paxos.NodeID]siphash.Key {
	m := make(map[paxos.NodeID]siphash.Key, peersMax-1)
	for id := paxos.NodeID(1); id < peersMax; id++ {
		m[id] = deriveKey(secret, cluster, id)
	}
	return m
}

// admits reports whether sender may send to this node now.
func (a *Auth) admits(sender paxos.NodeID) bool {
	return sender > 0 && sender < peersMax && a.senders.Load()&(1<<sender) != 0
}

// setSenders admits exactly ids (this node's own id among them or not: it
// never opens its own packets) and forgets the replay windows of every
// sender no longer admitted.
func (a *Auth) setSenders(ids []paxos.NodeID) error {
	var mask uint64
	for _, id := range ids {
		if id == 0 || id >= peersMax {
			return fmt.Errorf("replica: node id %d outside 1..%d", id, peersMax-1)
		}
		mask |= 1 << id
	}
	a.senders.Store(mask)
	a.mu.Lock()
	for k := range a.windows {
		if mask&(1<<k.sender) == 0 {
			delete(a.windows, k)
		}
	}
	a.mu.Unlock()
	return nil
}

// openStranger authenticates a sealed packet of channel from a sender this
// node does not admit yet, and returns that sender: a joining node learns
// its leader this way when its config does not list it (learnContact).
// Every check of open runs but the admission, the replay window included,
// so a packet the node saw once does not teach it twice; the payload is
// not returned: the packet is dropped, and the sender's next one, once
// admitted, is delivered.
func (a *Auth) openStranger(b []byte, channel byte) (paxos.NodeID, error) {
	h, err := a.authenticate(b, channel, true, false)
	if err != nil {
		return 0, err
	}
	return h.sender, nil
}
