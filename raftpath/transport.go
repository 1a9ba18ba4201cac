package raftpath

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Transport limits.
const (
	// peerQueueMsgsMax bounds the messages waiting for one peer's stream;
	// past it messages are dropped (raft retransmits).
	peerQueueMsgsMax = 4096
	// messageBytesMax bounds one framed message; a snapshot is the largest.
	messageBytesMax  = snapshotBytesMax + 1<<20
	snapshotBytesMax = 256 << 20
	dialTimeout      = 500 * time.Millisecond
	redialBackoff    = 50 * time.Millisecond
	streamBufBytes   = 256 << 10
)

// transport carries raft messages over one TCP stream per peer. Frames
// are a 4-byte big-endian length and a protobuf raftpb.Message.
type transport struct {
	self  uint64
	ln    net.Listener
	peers map[uint64]*peerStream
	node  raft.Node
	log   zerolog.Logger

	stop chan struct{}
	wg   sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

type peerStream struct {
	id   uint64
	addr string
	q    chan *pb.Message
}

func newTransport(self uint64, ln net.Listener, peers []Peer, log zerolog.Logger) *transport {
	t := &transport{self: self, ln: ln, peers: map[uint64]*peerStream{}, log: log,
		stop: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	for _, p := range peers {
		if p.ID != self {
			t.peers[p.ID] = &peerStream{id: p.ID, addr: p.Addr, q: make(chan *pb.Message, peerQueueMsgsMax)}
		}
	}
	return t
}

// start begins accepting and the outbound streams; node receives messages.
func (t *transport) start(node raft.Node) {
	t.node = node
	t.wg.Add(1)
	go t.acceptLoop()
	for _, p := range t.peers {
		t.wg.Add(1)
		go t.sendLoop(p)
	}
}

// send queues messages; it never blocks.
func (t *transport) send(msgs []*pb.Message) {
	for _, m := range msgs {
		p := t.peers[m.GetTo()]
		if p == nil {
			continue
		}
		select {
		case p.q <- m:
		default:
			if m.GetType() == pb.MessageType_MsgSnap {
				t.node.ReportSnapshot(p.id, raft.SnapshotFailure)
			}
			t.node.ReportUnreachable(p.id)
		}
	}
}

func (t *transport) track(c net.Conn, add bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if add {
		select {
		case <-t.stop:
			return false
		default:
		}
		t.conns[c] = struct{}{}
	} else {
		delete(t.conns, c)
	}
	return true
}

func (t *transport) sendLoop(p *peerStream) {
	defer t.wg.Done()
	for {
		var m *pb.Message
		select {
		case <-t.stop:
			return
		case m = <-p.q:
		}
		d := net.Dialer{Timeout: dialTimeout}
		c, err := d.Dial("tcp", p.addr)
		if err != nil {
			// The peer is down: drop what queued for it (raft resends
			// from its log once the peer answers again) rather than
			// flood it with stale messages on reconnect.
			t.failed(p, m)
			for drained := false; !drained; {
				select {
				case m := <-p.q:
					if m.GetType() == pb.MessageType_MsgSnap {
						t.node.ReportSnapshot(p.id, raft.SnapshotFailure)
					}
				default:
					drained = true
				}
			}
			select {
			case <-t.stop:
				return
			case <-time.After(redialBackoff):
			}
			continue
		}
		if !t.track(c, true) {
			c.Close()
			return
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		err = t.stream(p, c, m)
		c.Close()
		t.track(c, false)
		if err != nil && !errors.Is(err, errStopped) {
			t.log.Debug().Err(err).Uint64("peer", p.id).Msg("raft stream to peer broke")
		}
	}
}

var errStopped = errors.New("raftpath: transport stopped")

// stream writes first and then every queued message to c, flushing when
// the queue runs dry, until an error or stop.
func (t *transport) stream(p *peerStream, c net.Conn, first *pb.Message) error {
	w := bufio.NewWriterSize(c, streamBufBytes)
	var buf []byte
	var snaps []*pb.Message
	m := first
	for {
		var err error
		buf, err = proto.MarshalOptions{}.MarshalAppend(buf[:0], m)
		if err == nil && len(buf)+4 > messageBytesMax {
			err = fmt.Errorf("message of %d bytes exceeds %d", len(buf), messageBytesMax)
		}
		if err == nil {
			var h [4]byte
			binary.BigEndian.PutUint32(h[:], uint32(len(buf)))
			if _, err = w.Write(h[:]); err == nil {
				_, err = w.Write(buf)
			}
		}
		if m.GetType() == pb.MessageType_MsgSnap {
			snaps = append(snaps, m)
		}
		if err == nil && len(p.q) == 0 {
			err = w.Flush()
			if err == nil {
				for _, s := range snaps {
					t.node.ReportSnapshot(s.GetTo(), raft.SnapshotFinish)
				}
				snaps = snaps[:0]
			}
		}
		if err != nil {
			for _, s := range snaps {
				t.node.ReportSnapshot(s.GetTo(), raft.SnapshotFailure)
			}
			t.node.ReportUnreachable(p.id)
			return err
		}
		select {
		case <-t.stop:
			return errStopped
		case m = <-p.q:
		}
	}
}

// failed reports a message that could not be sent.
func (t *transport) failed(p *peerStream, m *pb.Message) {
	if m.GetType() == pb.MessageType_MsgSnap {
		t.node.ReportSnapshot(p.id, raft.SnapshotFailure)
	}
	t.node.ReportUnreachable(p.id)
}

func (t *transport) acceptLoop() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return
		}
		if !t.track(c, true) {
			c.Close()
			return
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			err := t.receive(c)
			c.Close()
			t.track(c, false)
			if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				t.log.Debug().Err(err).Msg("raft stream from peer broke")
			}
		}()
	}
}

// receive steps every message read from c into the node. A frame that
// does not decode ends the stream (it can no longer be trusted).
func (t *transport) receive(c net.Conn) error {
	r := bufio.NewReaderSize(c, streamBufBytes)
	var h [4]byte
	for {
		if _, err := io.ReadFull(r, h[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(h[:])
		if n > messageBytesMax {
			return fmt.Errorf("message of %d bytes exceeds %d", n, messageBytesMax)
		}
		buf := make([]byte, n)
		if _, err := io.ReadFull(r, buf); err != nil {
			return err
		}
		m := &pb.Message{}
		if err := proto.Unmarshal(buf, m); err != nil {
			return fmt.Errorf("decoding a raft message: %w", err)
		}
		if m.GetTo() != t.self || t.peers[m.GetFrom()] == nil {
			return fmt.Errorf("message from %d to %d on node %d", m.GetFrom(), m.GetTo(), t.self)
		}
		if err := t.node.Step(context.Background(), m); err != nil {
			if errors.Is(err, raft.ErrStopped) {
				return err
			}
		}
	}
}

// close stops every stream and the listener and waits for the goroutines.
func (t *transport) close() {
	t.mu.Lock()
	close(t.stop)
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.ln.Close()
	t.wg.Wait()
}
