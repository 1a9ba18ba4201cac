package replica

import "synod/paxos"

// The side channel's peers follow the membership: the consensus loop
// hands it the address book's peers after every membership change
// (refreshPeers, members.go). A new peer gets its sender (started with the
// channel); a peer that left has its sender stopped and its queue dropped;
// a peer whose address changed gets a new sender. Inbound connections are
// not per peer: the authenticator decides which senders it admits.

func newSidePeer(id paxos.NodeID, addr string) *sidePeer {
	return &sidePeer{id: id, addr: addr, queue: make(chan []byte, sideQueueMsgsMax), stop: make(chan struct{}),
		wake: make(chan struct{}, 1)}
}

// heard tells the sender to peer id that a datagram from it just arrived:
// a sender sleeping off a failed dial dials again at once. A peer that was
// down (restarted, paused) made its sender back off for up to
// sideDialBackoffMax; the catch-ups it needs on its return travel here,
// and its leader counts them toward giving up on the log and offering a
// whole snapshot (paxos catchup_stuck.go). So a returned peer is dialled
// when it is heard, not when the backoff ends. At most one dial runs per
// peer, so a peer heard often costs one dial per failure, no more.
func (s *sideChannel) heard(id paxos.NodeID) {
	if testingSideIgnoresHeard {
		return
	}
	s.peersMu.Lock()
	p := s.peers[id]
	s.peersMu.Unlock()
	if p == nil {
		return
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// setPeers makes the senders match peers (id -> TCP address).
func (s *sideChannel) setPeers(peers map[paxos.NodeID]string) {
	s.peersMu.Lock()
	defer s.peersMu.Unlock()
	select {
	case <-s.stop:
		return // closed: no sender may start
	default:
	}
	for id, p := range s.peers {
		if addr, ok := peers[id]; !ok || addr != p.addr {
			close(p.stop)
			delete(s.peers, id)
		}
	}
	for id, addr := range peers {
		if s.peers[id] != nil {
			continue
		}
		p := newSidePeer(id, addr)
		s.peers[id] = p
		if s.started {
			s.wg.Add(1)
			go s.sendLoop(p)
		}
	}
}
