package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"synod/kv/proto"
	"synod/tenants"
)

const (
	connReadBufferBytes  = 64 << 10
	connWriteBufferBytes = 64 << 10
	connWriteTimeout     = 10 * time.Second
)

// conn is one pipelined connection: callers queue encoded frames for a
// writer goroutine that coalesces them into one flush; a reader goroutine
// hands responses to the waiting callers by request id.
type conn struct {
	addr   string
	nc     net.Conn
	tenant tenants.ID

	out   chan []byte   // encoded requests for the writer
	slots chan struct{} // bounds requests in flight to proto.InflightPerConnMax
	done  chan struct{} // closed when the connection is dead
	// answered is set by the first response to a request: the connection
	// proved useful, so its death is not a dial failure (endpoint.go).
	answered atomic.Bool

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]*call
	err     error // why the connection died; set before done is closed
}

// call is a request waiting for its answer on a conn.
type call struct {
	// answer receives the response (buffered: the reader never blocks).
	answer chan answer
	// room, when set, is asked for the answer's room before its body is
	// read (Room); the reader calls it under conn.mu, as it takes the
	// call out of pending, so it is never called once the caller forgot
	// the call, and what it did is seen by the caller either way.
	room Room
}

// answer is a call's response; refused marks a refusal of its Room (the
// body was never read): the call's answer, not retried.
type answer struct {
	resp    *proto.Response
	refused bool
}

// Room is asked, with an answer frame's body length, whether the caller
// has room to hold that answer before the client reads the body into
// memory: nil to read it, or the response to answer instead (the body is
// then read past without being held). A proxy charges its own budgets so,
// and so holds no answer it has not counted (kv/resp's forwarded GET).
// It runs on the connection's reader goroutine and must not block.
type Room func(bodyBytes int) *proto.Response

// dialConn connects to addr, runs TLS over the connection when tlsConf is
// not nil, and performs the HELLO handshake.
func dialConn(ctx context.Context, dial func(ctx context.Context, addr string) (net.Conn, error), tlsConf *tls.Config, addr, token string) (*conn, error) {
	nc, err := dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("%w: dialing %s: %v", ErrConnection, addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl) // bounds the TLS handshake and HELLO alike
	}
	if tlsConf != nil {
		if nc, err = startTLS(ctx, nc, tlsConf, addr); err != nil {
			return nil, err
		}
	}
	hello := proto.AppendRequest(nil, &proto.Request{Op: proto.OpHello, ID: 1, Version: proto.Version, Token: token})
	if _, err := nc.Write(hello); err != nil {
		nc.Close()
		return nil, fmt.Errorf("%w: handshake with %s: %v", ErrConnection, addr, err)
	}
	br := bufio.NewReaderSize(nc, connReadBufferBytes)
	resp, err := readResponse(br)
	if err != nil {
		nc.Close()
		hint := ""
		if tlsConf == nil && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			// A TLS server drops a plaintext HELLO without a word (a
			// reset when it closed with part of HELLO unread).
			hint = " (closed by the server before it answered HELLO: does it require TLS? see Options.TLS)"
		}
		return nil, fmt.Errorf("%w: handshake with %s: %w%s", ErrConnection, addr, err, hint)
	}
	if resp.Status != proto.StatusOK {
		nc.Close()
		return nil, errorOf(resp)
	}
	if resp.Op != proto.OpHello || resp.Tenant == 0 {
		nc.Close()
		return nil, fmt.Errorf("%w: handshake with %s: unexpected %v response", ErrConnection, addr, resp.Op)
	}
	nc.SetDeadline(time.Time{})
	c := &conn{addr: addr, nc: nc, tenant: resp.Tenant, nextID: 1,
		out:     make(chan []byte, proto.InflightPerConnMax),
		slots:   make(chan struct{}, proto.InflightPerConnMax),
		done:    make(chan struct{}),
		pending: map[uint64]*call{}}
	go c.readLoop(br)
	go c.writeLoop()
	return c, nil
}

// startTLS runs a TLS client handshake over nc; an empty ServerName in
// conf becomes addr's host. It closes nc on failure.
func startTLS(ctx context.Context, nc net.Conn, conf *tls.Config, addr string) (net.Conn, error) {
	conf = conf.Clone()
	if conf.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		conf.ServerName = host
	}
	tc := tls.Client(nc, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("%w: TLS handshake with %s: %v", ErrConnection, addr, err)
	}
	return tc, nil
}

func readResponse(br *bufio.Reader) (*proto.Response, error) {
	h, err := readHeader(br)
	if err != nil {
		return nil, err
	}
	return readBody(br, h)
}

func readHeader(br *bufio.Reader) (proto.Header, error) {
	var hb [proto.HeaderBytes]byte
	if _, err := io.ReadFull(br, hb[:]); err != nil {
		return proto.Header{}, err
	}
	return proto.DecodeHeader(hb[:])
}

func readBody(br *bufio.Reader, h proto.Header) (*proto.Response, error) {
	body := make([]byte, h.Length)
	if _, err := io.ReadFull(br, body); err != nil {
		return nil, err
	}
	return proto.DecodeResponse(h, body)
}

// fail marks the connection dead with err (once) and wakes every waiter.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	c.mu.Unlock()
	close(c.done)
	c.nc.Close()
}

func (c *conn) dead() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *conn) readLoop(br *bufio.Reader) {
	failed := func(err error) { c.fail(fmt.Errorf("%w: reading from %s: %v", ErrConnection, c.addr, err)) }
	for {
		h, err := readHeader(br)
		if err != nil {
			failed(err)
			return
		}
		c.answered.Store(true)
		c.mu.Lock()
		cl := c.pending[h.ID]
		delete(c.pending, h.ID)
		var refused *proto.Response
		if cl != nil && cl.room != nil {
			refused = cl.room(int(h.Length))
		}
		c.mu.Unlock()
		if cl == nil || refused != nil {
			// Nobody waits for it (its caller's ctx ended) or nobody has
			// room for it: read past the body without holding it
			// (io.Discard reads through a small pooled buffer).
			if _, err := io.CopyN(io.Discard, br, int64(h.Length)); err != nil {
				failed(err)
				return
			}
			if cl != nil {
				cl.answer <- answer{resp: refused, refused: true} // buffered: never blocks
			}
			continue
		}
		resp, err := readBody(br, h)
		if err != nil {
			failed(err)
			return
		}
		cl.answer <- answer{resp: resp} // buffered: never blocks
	}
}

func (c *conn) writeLoop() {
	bw := bufio.NewWriterSize(c.nc, connWriteBufferBytes)
	for {
		var b []byte
		select {
		case b = <-c.out:
		case <-c.done:
			return
		}
		c.nc.SetWriteDeadline(time.Now().Add(connWriteTimeout))
		_, err := bw.Write(b)
		for err == nil && len(c.out) > 0 {
			_, err = bw.Write(<-c.out)
		}
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			c.fail(fmt.Errorf("%w: writing to %s: %v", ErrConnection, c.addr, err))
			return
		}
	}
}

// roundTrip sends req (setting its ID and tenant) and waits for the
// response, the connection's death or ctx.
func (c *conn) roundTrip(ctx context.Context, req *proto.Request) (*proto.Response, error) {
	resp, _, err := c.roundTripWithin(ctx, req, nil)
	return resp, err
}

// roundTripWithin is roundTrip that asks room (when set) before it reads
// the answer's body; refused: the response is room's refusal.
func (c *conn) roundTripWithin(ctx context.Context, req *proto.Request, room Room) (_ *proto.Response, refused bool, _ error) {
	select {
	case c.slots <- struct{}{}:
	case <-c.done:
		return nil, false, c.dead()
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	defer func() { <-c.slots }()
	cl := &call{answer: make(chan answer, 1), room: room}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, false, c.err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = cl
	c.mu.Unlock()
	req.ID, req.Tenant = id, c.tenant
	frame := proto.AppendRequest(nil, req)
	forget := func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}
	select {
	case c.out <- frame:
	case <-c.done:
		forget()
		return nil, false, c.dead()
	case <-ctx.Done():
		forget()
		return nil, false, ctx.Err()
	}
	select {
	case a := <-cl.answer:
		resp := a.resp
		if !a.refused && resp.Op != req.Op && resp.Status == proto.StatusOK {
			err := fmt.Errorf("%w: %s answered %v to %v", ErrConnection, c.addr, resp.Op, req.Op)
			c.fail(err)
			return nil, false, err
		}
		return resp, a.refused, nil
	case <-c.done:
		// Taken out of pending under conn.mu, so that a room the reader
		// was asking has returned (and what it did is seen) before the
		// caller goes on.
		forget()
		return nil, false, c.dead()
	case <-ctx.Done():
		forget()
		return nil, false, ctx.Err()
	}
}

func (c *conn) close() { c.fail(errors.Join(ErrClosed)) }
