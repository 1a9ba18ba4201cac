package replica

import (
	"errors"
	"net/netip"

	"synod/afxdp"
	"synod/paxos"
)

// receiveLoop reads datagram batches, decodes them and queues them for the
// consensus loop.
func (r *Replica) receiveLoop() {
	defer r.loopsWG.Done()
	if err := pinCPU(r.cfg.Cores.RX); err != nil {
		r.reportFatal(err)
		return
	}
	n := min(max(r.conn.BatchSize(), 1), recvBatchPackets)
	size := max(r.conn.MaxPayload(), 2048)
	pkts := make([]afxdp.Packet, n)
	for i := range pkts {
		pkts[i].Buf = make([]byte, min(size, recvBufferBytes))
	}
	for {
		got, err := r.conn.ReadBatch(pkts)
		if err != nil {
			if errors.Is(err, afxdp.ErrClosed) {
				return
			}
			select {
			case <-r.stop:
				return
			default:
			}
			r.log.Warn().Err(err).Msg("receive")
			continue
		}
		for i := range got {
			// Copy: the decoded message may alias its bytes, and the
			// buffer is reused by the next ReadBatch.
			b := append([]byte(nil), pkts[i].Buf[:pkts[i].N]...)
			var sender paxos.NodeID // 0: not authenticated (no secret)
			if a := r.cfg.Auth; a != nil {
				payload, from, err := a.open(b, authChannelDatagram)
				if err != nil && errors.Is(err, errAuthSender) && r.joining.Load() {
					// A joiner whose config does not list the leader:
					// a member's packet teaches it the sender's address.
					if from, serr := a.openStranger(b, authChannelDatagram); serr == nil {
						a.forgive() // a member's packet, not a refusal
						r.learnContact(from, pkts[i].Addr)
						continue
					}
				}
				if err != nil {
					r.metrics.AuthRefused.Inc()
					r.metrics.InboundDropped.Inc()
					if a.shouldLog(r.cfg.Now()) {
						r.log.Warn().Err(err).Str("from", pkts[i].Addr.String()).Uint64("refused_total", a.Rejected()).
							Msg("refusing consensus datagrams that fail authentication (one line per second at most)")
					}
					continue
				}
				b, sender = payload, from
				if r.joining.Load() && r.learnedMask.Load()&(1<<from) != 0 {
					// A learned contact: its latest authenticated
					// packet says where it is (a packet of it replayed
					// from elsewhere taught the first address).
					if p, ok := r.peer(from); ok && p.ConsensusAddr != pkts[i].Addr && !testingContactKeepsFirstAddr {
						r.learnContact(from, pkts[i].Addr)
					}
				}
			}
			var err error
			if isDiskReport(b) {
				if err = r.receiveDiskReport(b, sender); err != nil {
					r.metrics.InboundDropped.Inc()
				}
			} else if r.deliver(b, false) == deliverMisaddressed { // counted dropped there
				err = errMisaddressed
			}
			if a := r.cfg.Auth; a != nil && errors.Is(err, errMisaddressed) {
				// It authenticated: a member's packet to another node,
				// replayed here.
				a.reject(err)
				r.metrics.AuthRefused.Inc()
				if a.shouldLog(r.cfg.Now()) {
					r.log.Warn().Err(err).Str("from", pkts[i].Addr.String()).Uint64("refused_total", a.Rejected()).
						Msg("refusing an authenticated consensus datagram addressed to another node: a replay of a member's traffic, or a sender with a stale address book (one line per second at most)")
				}
			}
		}
	}
}

// deliverSide receives a side-channel frame (it owns b).
func (r *Replica) deliverSide(b []byte) bool { return r.deliver(b, true) == deliverTaken }

// deliverResult says what deliver did with a payload.
type deliverResult uint8

const (
	// deliverTaken: a message addressed to this node (queued, answered
	// by the accel fast path, or dropped by an injected fault or a full
	// queue alike).
	deliverTaken deliverResult = iota
	// deliverUndecodable: not a message or accel frame (dropped).
	deliverUndecodable
	// deliverMisaddressed: a message or accel frame addressed to another
	// node (dropped).
	deliverMisaddressed
)

// deliver decodes one message and queues it. Datagrams are dropped when the
// queue is full (as a socket buffer would); side-channel messages wait,
// because they are large and costly to resend. Every payload it does not
// take is counted in InboundDropped.
func (r *Replica) deliver(b []byte, wait bool) deliverResult {
	if isAccelFrame(b) {
		f, err := parseAccelFrame(b)
		if err != nil {
			r.metrics.InboundDropped.Inc()
			return deliverUndecodable
		}
		if f.to != r.cfg.ID {
			r.metrics.InboundDropped.Inc()
			return deliverMisaddressed
		}
		if r.accel != nil {
			r.accel.frame(f)
		} // without accel: ignored (a peer with accel sends them)
		return deliverTaken
	}
	m, err := paxos.UnmarshalMessage(b)
	if err != nil {
		r.metrics.InboundDropped.Inc()
		return deliverUndecodable
	}
	if m.To != r.cfg.ID {
		r.metrics.InboundDropped.Inc()
		return deliverMisaddressed
	}
	if r.faults.drop(m.From) {
		r.metrics.InboundDropped.Inc()
		return deliverTaken
	}
	if !wait && r.side != nil {
		r.side.heard(m.From) // a datagram: the sender is up; redial it now if its side channel is down
	}
	if r.accel != nil && r.accel.received(&m, !wait) {
		return deliverTaken // the accept fast path answered it and queued its mirror
	}
	if wait {
		select {
		case r.inbound <- m:
		case <-r.stop:
		}
		return deliverTaken
	}
	select {
	case r.inbound <- m:
	default:
		r.metrics.InboundDropped.Inc()
	}
	return deliverTaken
}

// sendLoop writes encoded messages as datagrams, or over the side channel
// when one exceeds the Conn's MaxPayload.
func (r *Replica) sendLoop() {
	defer r.loopsWG.Done()
	if err := pinCPU(r.cfg.Cores.TX); err != nil {
		r.reportFatal(err)
		return
	}
	maxPayload := r.conn.MaxPayload()
	if r.cfg.Auth != nil {
		maxPayload -= authOverheadBytes // the seal travels in the same datagram
	}
	batchMax := max(r.conn.BatchSize(), 1)
	pkts := make([]afxdp.Packet, 0, batchMax)
	// sealed holds the sealed datagrams of pkts, one after the other, and
	// is reused after each flush (WriteBatch keeps no Buf), so sealing
	// costs no allocation a datagram. It holds at most batchMax datagrams
	// of maxPayload bytes and their seals; a datagram sealed after the
	// buffer grew lands in the new array, and the packets before it keep
	// the old one until the flush.
	var sealed []byte
	flush := func() {
		for rest := pkts; len(rest) > 0; {
			n, err := r.conn.WriteBatch(rest)
			if err != nil {
				// Skip the packet that failed; Paxos retransmits.
				r.metrics.OutboundDropped.Inc()
				if !errors.Is(err, afxdp.ErrClosed) {
					r.log.Debug().Err(err).Msg("send")
				}
				n++
			}
			rest = rest[min(n, len(rest)):]
		}
		clear(pkts) // drop the references to sent buffers
		pkts, sealed = pkts[:0], sealed[:0]
	}
	for {
		var out []outMsg
		select {
		case <-r.stop:
			return
		case out = <-r.outbound:
		}
		for {
			for _, m := range out {
				if r.faults.drop(m.to) {
					continue
				}
				if m.size() > maxPayload {
					r.metrics.SideSent.Inc()
					r.side.sendParts(m.to, m.b, m.body)
					continue
				}
				p, _ := r.peer(m.to)
				addr := p.ConsensusAddr
				if addr == (netip.AddrPort{}) {
					r.metrics.OutboundDropped.Inc()
					continue
				}
				b := m.b
				if a := r.cfg.Auth; a != nil {
					start := len(sealed)
					sealed = a.sealParts(sealed, authChannelDatagram, m.b, m.body)
					b = sealed[start:len(sealed):len(sealed)]
				} else if m.body != nil {
					start := len(sealed)
					sealed = append(append(sealed, m.b...), m.body...)
					b = sealed[start:len(sealed):len(sealed)]
				}
				pkts = append(pkts, afxdp.Packet{Buf: b, N: len(b), Addr: addr})
				if len(pkts) == batchMax {
					flush()
				}
			}
			// Coalesce batches already queued into fewer WriteBatch calls.
			select {
			case out = <-r.outbound:
				continue
			default:
			}
			break
		}
		flush()
	}
}
