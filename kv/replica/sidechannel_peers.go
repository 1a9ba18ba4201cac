package replica

import (
	"time"

	"synod/paxos"
)

// The side channel's peers follow the membership: the consensus loop
// hands it the address book's peers after every membership change
// (refreshPeers, members.go). A new peer gets its sender (started with the
// channel); a peer that left has its sender stopped and its queue dropped;
// a peer whose address changed gets a new sender. Inbound connections are
// not per peer: the authenticator decides which senders it admits.

func newSidePeer(id paxos.NodeID, addr string) *sidePeer {
	return &sidePeer{id: id, addr: addr, queue: make(chan sideMsg, sideQueueMsgsMax), stop: make(chan struct{}),
		wake: make(chan struct{}, 1)}
}

// heard tells the sender to peer id that a datagram from it just arrived.
// A peer heard after heardSilence (sideHeardSilence) or more of silence
// has returned (a restart, a pause, a healed partition): a sender sleeping
// off a failed dial to it dials again at once. The sender's backoff grew
// while the peer was down, up to sideDialBackoffMax, and the catch-ups a
// returned peer needs travel here: its leader counts them toward giving up
// on the log and offering a whole snapshot (paxos catchup_stuck.go), and a
// CI run saw it do so because they sat behind the sleep. A peer heard
// steadily wakes nothing, so one whose TCP port refuses while its
// datagrams flow is dialled at the backoff's pace, not at its datagrams'.
func (s *sideChannel) heard(id paxos.NodeID) {
	if testingSideIgnoresHeard.Load() {
		return
	}
	s.peersMu.Lock()
	p := s.peers[id]
	s.peersMu.Unlock()
	if p == nil {
		return
	}
	now := time.Now().UnixNano()
	if now-p.heardNanos.Swap(now) < int64(s.heardSilence) {
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
