package replica

import "synod/paxos"

// The side channel's peers follow the membership: the consensus loop
// hands it the address book's peers after every membership change
// (refreshPeers, members.go). A new peer gets its sender (started with the
// channel); a peer that left has its sender stopped and its queue dropped;
// a peer whose address changed gets a new sender. Inbound connections are
// not per peer: the authenticator decides which senders it admits.

func newSidePeer(id paxos.NodeID, addr string) *sidePeer {
	return &sidePeer{id: id, addr: addr, queue: make(chan []byte, sideQueueMsgsMax), stop: make(chan struct{})}
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
