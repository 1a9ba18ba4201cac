package replica

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"synod/internal/lograte"
	"synod/paxos"
)

// The side channel carries consensus messages larger than one datagram
// (big batches, snapshots) over TCP. Each node listens on the TCP port of
// its consensus address and keeps one outbound connection per peer.
//
// With authentication (Config.Auth, the default in kvnode) a frame is
// sealed as auth.go describes: its head (length, header, header tag) is
// authenticated before a byte of its body is read or buffered, the body
// is then checked with the whole tag and the replay window, and any
// failure closes the connection. The bytes buffered for bodies across
// all connections are bounded by sideBufferedBytesMax, and those of
// unproven ones by sideProbationBytesMax within it (a receiver waits
// for room before it reads a body: TCP back-pressure), a body by
// sideFrameBytesMax. Without authentication (in-process tests) a frame is
// a 4-byte little-endian length and the message.

var (
	errSideFrameTooLarge = errors.New("replica: side-channel frame too large")
	errSideMisaddressed  = errors.New("replica: side-channel connection's first frame is addressed to another node (a replay of another node's traffic?)")
	// errUnprovenTimeout: a connection on probation (side channel or
	// snapshot transfer) did not send its first whole frame within its
	// deadline; counted as a refusal, as a replayed or idle connection is
	// the likely sender.
	errUnprovenTimeout = errors.New("replica: an unproven consensus connection sent no whole first frame within its deadline")
)

// isRefusal reports whether err refused a consensus connection for what it
// sent, not for a failure of its own: authentication (a forged, foreign or
// replayed frame), a first frame or request addressed to another node, or
// a connection on probation past its deadline. Those count in
// synod_consensus_auth_refused_total, on the side channel and snapshot
// transfers alike.
func isRefusal(err error) bool {
	for _, e := range []error{ErrAuthFailed, errAuthSender, errAuthMalformed, errAuthReplay,
		errSideMisaddressed, errSnapMisaddressed, errUnprovenTimeout} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// isTimeout reports whether err is a read deadline passing.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// sideChannel is the TCP transport for large messages.
type sideChannel struct {
	ln      net.Listener
	log     zerolog.Logger
	auth    *Auth         // nil: frames are not sealed (tests)
	refused func()        // counts a connection refused by authentication (may be nil)
	budget  chan struct{} // one token per sideBudgetUnitBytes of buffered bodies (proven connections)
	// probation bounds the share of budget unproven connections' first
	// frames may hold together (sideProbationBytesMax): what they hold
	// leaves proven peers the rest.
	probation chan struct{}
	// spare holds frame buffers delivered frames are done with
	// (takeBuf, giveBack): at most sideSpareBufs of at most
	// sideRecvBufBytesMax each.
	spare chan []byte
	// deliver is called by receivers with a frame that is theirs only
	// until deliver returns (the receiver reads its next frame into the
	// same buffer: a megabyte frame is not allocated and zeroed anew);
	// it reports whether the frame's message was addressed to this node
	// (a frame that was not proves nothing: a replay of another node's
	// traffic).
	deliver func(b []byte) bool
	// serveSnapshot, when set, is handed a connection that opens with
	// snapshotConnMagic (a snapshot transfer, snapshot_wire.go) instead
	// of side-channel frames; it runs on the connection's goroutine,
	// which closes it afterwards.
	serveSnapshot func(c net.Conn, r *bufio.Reader)
	// peers follow the membership (setPeers, sidechannel_peers.go).
	peersMu sync.Mutex
	peers   map[paxos.NodeID]*sidePeer
	started bool
	stop    chan struct{}
	wg      sync.WaitGroup
	conns   atomic.Int64 // accepted connections open
	dropped atomic.Uint64
	// backoffMin and backoffMax bound a sender's sleep after a failed
	// dial (sideDialBackoffMin and sideDialBackoffMax), and heardSilence
	// is sideHeardSilence (heard); tests lengthen them before start.
	backoffMin, backoffMax, heardSilence time.Duration

	mu       sync.Mutex
	accepted map[net.Conn]*sideConn
	seq      uint64 // accept order (mu)
	// newest is, per member, the accept order of the newest connection
	// on which a head of that member's was taken (authenticated and
	// fresh; mu; one entry per member that ever sent one).
	newest map[paxos.NodeID]uint64
	// overtakenConns counts connections closed by overtaken (their
	// frames older than the replay window, refused after a newer
	// connection of the same member had a head taken): nil in tests.
	overtakenConns func()
}

// sideConn is an accepted connection's standing. A connection is unproven
// until its first whole frame authenticated, was fresh, and carried a
// message addressed to this node: unproven ones must send that frame's
// head within sideHeadTimeout and its body within sideHeadTimeout more,
// together their bodies may hold only the probation share of the body
// budget (the rest is the proven peers'), and when the table is full the oldest of them is closed to make
// room for a new connection. So connections that send nothing, garbage, or
// replayed traffic can hold no slot and no buffer a peer needs: before,
// 64 idle connections from anyone refused every peer's new connection,
// and later (an outside attacker again) connections that replayed the
// head of a captured frame counted as proven at its head, held their slot
// and the body budget for sideBodyTimeout, and kept the cluster without a
// leader for 27 s while they lasted. A head's counter is now taken at the
// head (Auth.openFrameHead), so a copy of a head the receiver already saw
// is refused before anything else; a head copied from a frame sent to
// another node passes that check once, and its frame, if the attacker
// sends it whole, is addressed elsewhere. A connection that misses a
// probation deadline is counted as refused (errUnprovenTimeout).
type sideConn struct {
	seq    uint64
	proven atomic.Bool
	// sender is the member whose head last authenticated on this
	// connection (0 before one did); its receiver goroutine only.
	sender paxos.NodeID
}

type sidePeer struct {
	id    paxos.NodeID
	addr  string
	queue chan sideMsg
	// queued is the bytes of the messages in queue, at most
	// sideQueueBytesMax unless one message alone is more.
	queued atomic.Int64
	stop   chan struct{} // closed when the peer leaves the membership
	// wake ends a backoff sleep early: the peer was heard after a
	// silence (heard, sidechannel_peers.go). One token at most.
	wake chan struct{}
	// heardNanos is when a datagram from the peer last arrived (Unix
	// nanoseconds; 0 before the first).
	heardNanos atomic.Int64
}

// newSideChannel listens on listenAddr and prepares one sender per peer
// (id -> TCP address); senders start with start.
func newSideChannel(listenAddr string, peers map[paxos.NodeID]string, auth *Auth, deliver func([]byte) bool, log zerolog.Logger) (*sideChannel, error) {
	ln, err := net.Listen("tcp", listenAddr)
	if err != nil {
		return nil, fmt.Errorf("listening for the side channel on %s: %w", listenAddr, err)
	}
	s := &sideChannel{
		ln:           ln,
		log:          log,
		auth:         auth,
		budget:       make(chan struct{}, sideBufferedBytesMax/sideBudgetUnitBytes),
		probation:    make(chan struct{}, sideProbationBytesMax/sideBudgetUnitBytes),
		spare:        make(chan []byte, sideSpareBufs),
		deliver:      deliver,
		peers:        make(map[paxos.NodeID]*sidePeer, len(peers)),
		stop:         make(chan struct{}),
		accepted:     make(map[net.Conn]*sideConn),
		newest:       make(map[paxos.NodeID]uint64),
		backoffMin:   sideDialBackoffMin,
		backoffMax:   sideDialBackoffMax,
		heardSilence: sideHeardSilence,
	}
	for id, addr := range peers {
		s.peers[id] = newSidePeer(id, addr)
	}
	return s, nil
}

func (s *sideChannel) start() {
	s.wg.Add(1)
	go s.acceptLoop()
	s.peersMu.Lock()
	defer s.peersMu.Unlock()
	s.started = true
	for _, p := range s.peers {
		s.wg.Add(1)
		go s.sendLoop(p)
	}
}

// sideMsg is one encoded message queued for a peer: head, then body (nil,
// or bytes shared with other peers' messages: read-only).
type sideMsg struct{ head, body []byte }

func (m sideMsg) size() int { return len(m.head) + len(m.body) }

// sendParts queues one encoded message, head then body, for peer id
// (both stay the caller's to share but not to change); it drops (and
// counts) when the peer's queue is full, by messages or by bytes
// (sideQueueBytesMax; an empty queue takes one message of any size), as
// Paxos retransmits.
func (s *sideChannel) sendParts(id paxos.NodeID, head, body []byte) {
	s.peersMu.Lock()
	p := s.peers[id]
	s.peersMu.Unlock()
	if p == nil {
		s.dropped.Add(1)
		return
	}
	m := sideMsg{head, body}
	if !reserveBytes(&p.queued, int64(m.size()), sideQueueBytesMax) {
		s.dropped.Add(1)
		return
	}
	select {
	case p.queue <- m:
	default:
		p.take(m)
		s.dropped.Add(1)
	}
}

// take is the sender's side of send: m left p's queue.
func (p *sidePeer) take(m sideMsg) sideMsg {
	p.queued.Add(-int64(m.size()))
	return m
}

func (s *sideChannel) close() {
	close(s.stop)
	s.ln.Close()
	s.mu.Lock()
	for c := range s.accepted {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *sideChannel) acceptLoop() {
	defer s.wg.Done()
	// Refusals of a full table are logged at most once per
	// authRejectLogPeriod, with their count (an attacker's connection
	// flood wrote 7,295 lines in minutes).
	fullLog := lograte.Limiter{Every: authRejectLogPeriod}
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.stop:
				return
			default:
			}
			s.log.Warn().Err(err).Msg("side channel accept")
			time.Sleep(sideDialBackoffMin)
			continue
		}
		if s.conns.Load() >= sideConnsMax && !s.evictUnproven() {
			if ok, held := fullLog.Allow(time.Now()); ok {
				s.log.Warn().Str("remote", c.RemoteAddr().String()).Uint64("refused", held+1).
					Msg("side channel: too many connections, refusing")
			}
			c.Close()
			continue
		}
		s.mu.Lock()
		s.seq++
		sc := &sideConn{seq: s.seq}
		s.accepted[c] = sc
		s.mu.Unlock()
		s.conns.Add(1)
		s.wg.Add(1)
		go s.recvLoop(c, sc)
	}
}

// evictUnproven closes the oldest connection that has not yet sent an
// authenticated head, making room for a new one; it reports whether there
// was one (acceptLoop). The count of open connections falls when the
// closed one's goroutine ends, so it may pass sideConnsMax by the few
// evicted connections still winding down.
func (s *sideChannel) evictUnproven() bool {
	if testingNoSideEviction {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var oldest net.Conn
	var at uint64
	for c, sc := range s.accepted {
		if !sc.proven.Load() && (oldest == nil || sc.seq < at) {
			oldest, at = c, sc.seq
		}
	}
	if oldest == nil {
		return false
	}
	oldest.Close()
	return true
}

func (s *sideChannel) recvLoop(c net.Conn, sc *sideConn) {
	defer func() {
		s.mu.Lock()
		delete(s.accepted, c)
		s.mu.Unlock()
		s.conns.Add(-1)
		c.Close()
		s.wg.Done()
	}()
	r := bufio.NewReaderSize(c, 64<<10)
	var frameBuf []byte // taken from s.spare when a frame comes; given back after it
	// The first head (or a snapshot transfer's magic) within
	// sideHeadTimeout; readSealedFrame lifts the deadline once a head
	// authenticates.
	c.SetReadDeadline(time.Now().Add(sideHeadTimeout))
	if s.serveSnapshot != nil {
		if b, err := r.Peek(4); err == nil && binary.LittleEndian.Uint32(b) == snapshotConnMagic {
			r.Discard(4)
			s.serveSnapshot(c, r)
			return
		}
	}
	for {
		var (
			b   []byte
			err error
		)
		if s.auth != nil {
			b, err = s.readSealedFrame(c, r, sc, &frameBuf)
		} else {
			b, err = readSideFrame(r)
			sc.proven.Store(true) // no authentication: nothing to prove
			c.SetReadDeadline(time.Time{})
		}
		if err == nil && s.auth != nil && !sc.proven.Load() {
			// The first frame proves the connection only if it is for
			// this node.
			if !s.deliver(b) {
				err = s.auth.reject(errSideMisaddressed)
			} else {
				sc.proven.Store(true)
				continue
			}
		}
		if err != nil && s.auth != nil && !sc.proven.Load() && isTimeout(err) {
			// A head that authenticated and no body, or nothing at all,
			// within the probation deadlines: counted, so that
			// connections holding captured heads show in the refusals.
			err = s.auth.reject(fmt.Errorf("%w: %w", errUnprovenTimeout, err))
		}
		if err != nil {
			if s.overtaken(sc, err) {
				s.auth.forgive()
				if s.overtakenConns != nil {
					s.overtakenConns()
				}
				s.log.Debug().Err(err).Uint64("member", uint64(sc.sender)).Str("remote", c.RemoteAddr().String()).
					Msg("side channel: closing a member's connection that its newer one overtook (frames older than the replay window)")
				return
			}
			if isRefusal(err) {
				if s.refused != nil {
					s.refused()
				}
				if s.auth.shouldLog(time.Now()) {
					s.log.Warn().Err(err).Str("remote", c.RemoteAddr().String()).Uint64("refused_total", s.auth.Rejected()).
						Msg("side channel: refusing a connection that failed authentication (wrong or missing cluster secret, or not a member)")
				}
			} else if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug().Err(err).Str("remote", c.RemoteAddr().String()).Msg("side channel receive closed")
			}
			return
		}
		s.deliver(b)
		s.giveBack(&frameBuf)
	}
}

// takeBuf returns a buffer of n bytes for a frame body: a spare one when
// one is large enough, else a new one.
func (s *sideChannel) takeBuf(n int) []byte {
	select {
	case b := <-s.spare:
		if cap(b) >= n {
			return b[:n]
		}
		s.giveBack(&b) // too small for this frame: kept for the next
	default:
	}
	return make([]byte, n)
}

// giveBack keeps *b for the next frame of any connection, unless it is
// larger than sideRecvBufBytesMax or sideSpareBufs are kept already, and
// clears *b.
func (s *sideChannel) giveBack(b *[]byte) {
	if *b != nil && cap(*b) <= sideRecvBufBytesMax {
		select {
		case s.spare <- *b:
		default:
		}
	}
	*b = nil
}

// readSealedFrame reads one authenticated frame: its head is checked
// before the body is read, and the body waits for room in the node's
// buffered-bytes budget (released once the frame was handed on): the
// proven connections' budget, or the probation budget for an unproven
// connection's first frame, whose body must then come within
// sideHeadTimeout.
//
// The body is read into a buffer taken from the spares (takeBuf) and left
// in *buf; the payload returned aliases it until the caller gives it back.
func (s *sideChannel) readSealedFrame(c net.Conn, r io.Reader, sc *sideConn, buf *[]byte) ([]byte, error) {
	var head [sideFrameHeadBytes]byte
	proven := sc.proven.Load()
	if proven {
		c.SetReadDeadline(time.Time{}) // a proven peer may idle
	}
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n, err := s.auth.openSideHead(head[:], sideFrameBytesMax)
	if err == nil || errors.Is(err, errAuthReplay) {
		// The head's tag was verified (the counter is checked after
		// it): its sender is the member it names.
		if h, perr := parseSealedHeader(head[4 : 4+authHeaderBytes]); perr == nil {
			sc.sender = h.sender
		}
	}
	if err != nil {
		return nil, err
	}
	s.took(sc)
	// An unproven connection's body takes room in the probation budget
	// first, so that together they hold at most its share of the budget.
	pools, bodyTimeout := []chan struct{}{s.budget}, sideBodyTimeout
	if testingSideProvenAtHead.Load() {
		sc.proven.Store(true)
	} else if !proven {
		pools, bodyTimeout = []chan struct{}{s.probation, s.budget}, sideHeadTimeout
	}
	units := (n + sideBudgetUnitBytes - 1) / sideBudgetUnitBytes
	var taken []chan struct{}
	defer func() {
		for _, pool := range taken {
			for i := 0; i < units; i++ {
				<-pool
			}
		}
	}()
	for _, pool := range pools {
		for i := 0; i < units; i++ {
			select {
			case pool <- struct{}{}:
			case <-s.stop:
				for ; i > 0; i-- {
					<-pool
				}
				return nil, net.ErrClosed
			}
		}
		taken = append(taken, pool)
	}
	// An authenticated head gets bodyTimeout for its body.
	c.SetReadDeadline(time.Now().Add(bodyTimeout))
	*buf = s.takeBuf(n)
	sealed := *buf
	copy(sealed, head[4:4+authHeaderBytes])
	if _, err := io.ReadFull(r, sealed[authHeaderBytes:]); err != nil {
		return nil, fmt.Errorf("reading side-channel frame: %w", err)
	}
	payload, err := s.auth.openSideBody(sealed)
	if err != nil {
		return nil, err
	}
	return payload, nil
}

// readSideFrame reads one length-prefixed frame.
func readSideFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n > sideFrameBytesMax {
		return nil, fmt.Errorf("%w: %d bytes", errSideFrameTooLarge, n)
	}
	// Grow with the bytes that actually arrive: a header alone must not
	// make the receiver allocate sideFrameBytesMax.
	b, err := io.ReadAll(io.LimitReader(r, int64(n)))
	if err != nil {
		return nil, fmt.Errorf("reading side-channel frame: %w", err)
	}
	if len(b) != int(n) {
		return nil, fmt.Errorf("reading side-channel frame: %w", io.ErrUnexpectedEOF)
	}
	return b, nil
}

// writeFrame writes one frame, sealed (in f) when the channel
// authenticates.
func (s *sideChannel) writeFrame(w io.Writer, m sideMsg, f *sealedFrame) error {
	if s.auth == nil {
		return writeSideFrame(w, m)
	}
	if m.size()+authOverheadBytes > sideFrameBytesMax {
		return fmt.Errorf("%w: %d bytes", errSideFrameTooLarge, m.size())
	}
	s.auth.sealFrame(f, authChannelSide, m.head, m.body)
	return f.write(w, m.head, m.body)
}

// writeSideFrame writes one unsealed frame.
func writeSideFrame(w io.Writer, m sideMsg) error {
	if m.size() > sideFrameBytesMax {
		return fmt.Errorf("%w: %d bytes", errSideFrameTooLarge, m.size())
	}
	var hdr [4]byte
	binary.LittleEndian.PutUint32(hdr[:], uint32(m.size()))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := w.Write(m.head); err != nil {
		return err
	}
	_, err := w.Write(m.body)
	return err
}

// sendLoop keeps one connection to p, dialling lazily when a message waits
// and backing off (bounded) after a failure, or until p is heard from
// after a silence. A message whose write fails is dropped: Paxos
// retransmits what matters.
func (s *sideChannel) sendLoop(p *sidePeer) {
	defer s.wg.Done()
	var (
		conn    net.Conn
		w       *bufio.Writer
		sealing sealedFrame // reused frame after frame
		backoff = s.backoffMin
	)
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for {
		var b sideMsg
		select {
		case <-s.stop:
			return
		case <-p.stop:
			return
		case b = <-p.queue:
			p.take(b)
		}
		if conn == nil {
			c, err := net.DialTimeout("tcp", p.addr, sideDialTimeout)
			if err != nil {
				s.dropped.Add(1)
				s.log.Debug().Err(err).Uint64("peer", uint64(p.id)).Dur("backoff", backoff).Msg("side channel dial failed")
				select {
				case <-p.wake: // a token from before this failure says nothing
				default:
				}
				select {
				case <-s.stop:
					return
				case <-p.stop:
					return
				case <-time.After(backoff):
				case <-p.wake:
				}
				backoff = min(2*backoff, s.backoffMax)
				continue
			}
			backoff = s.backoffMin
			conn, w = c, bufio.NewWriterSize(c, 64<<10)
		}
		conn.SetWriteDeadline(time.Now().Add(sideWriteTimeout))
		err := s.writeFrame(w, b, &sealing)
		// Coalesce whatever else is queued into the same flush.
		for err == nil && len(p.queue) > 0 {
			err = s.writeFrame(w, p.take(<-p.queue), &sealing)
		}
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			s.dropped.Add(1)
			s.log.Debug().Err(err).Uint64("peer", uint64(p.id)).Msg("side channel write failed; reconnecting")
			conn.Close()
			conn, w = nil, nil
		}
	}
}

// A member's connections can reach the receiver out of order. While a
// receiver is paused (SIGSTOP, a stalled VM) its kernel still accepts the
// connections its peers dial: a sender whose write times out dials again,
// and on resuming the receiver reads several connections of one member at
// once, each in its own goroutine. When a newer connection's frames are
// read first, the replay window moves past the older connection's frames,
// which are then refused as replays: genuine traffic, only late. An
// outside tester saw this after every pause of 10 s or more under load:
// it counted as an authentication failure, a false alarm on the counter
// an operator watches for attacks. So a replay refusal on a connection
// accepted before the newest one on which a head of the same member's was
// taken (authenticated and fresh) is that member's own delayed traffic:
// the connection is closed as before, but counted in
// synod_inbound_dropped_total, not as a refusal. The newest is taken at
// the head, not at the connection's proof, because the window moves at
// the head: a first version that waited for the proof still counted one
// refusal in one of four 20 s pauses, likely an old connection read
// between the newer one's head and its body.
//
// An attacker replaying captured frames dials after the member's
// connections it copied, so its connection is the newest and its
// refusals count. To pass as older it must have connected earlier and
// sent nothing, and a connection on probation that sends nothing within
// sideHeadTimeout is closed and counted (errUnprovenTimeout), as is one
// whose fresh head (copied from traffic to another node) moved the
// newest: its body is addressed elsewhere, or never comes.

// took records that a head of sc's member was taken on sc (its receiver
// goroutine).
func (s *sideChannel) took(sc *sideConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sc.sender != 0 && sc.seq > s.newest[sc.sender] {
		s.newest[sc.sender] = sc.seq
	}
}

// overtaken reports whether err refused a frame of sc as a replay after a
// head of its member's was taken on a connection accepted after sc.
func (s *sideChannel) overtaken(sc *sideConn, err error) bool {
	if testingOvertakenCounted.Load() || sc.sender == 0 || !errors.Is(err, errAuthReplay) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.newest[sc.sender] > sc.seq
}
