package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/proto"
	"synod/tenants"
)

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("server: closed")

// acceptRetryDelayMax bounds the back-off after a temporary accept error.
const acceptRetryDelayMax = time.Second

// Server serves the binary protocol. Create it with New.
type Server struct {
	cfg Config
	reg *tenants.Registry
	be  Backend
	log zerolog.Logger

	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	lns    map[net.Listener]struct{}
	conns  map[*conn]struct{}
	wg     sync.WaitGroup
}

// New returns a server that authenticates tenants against reg and executes
// requests on be.
func New(cfg Config, reg *tenants.Registry, be Backend, log zerolog.Logger) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{cfg: cfg.withDefaults(), reg: reg, be: be, log: log, ctx: ctx, cancel: cancel,
		lns: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}}
}

// Serve accepts connections on ln until ln fails or Close is called (then
// it returns ErrServerClosed). It takes ownership of ln.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.lns, ln)
		s.mu.Unlock()
		ln.Close()
	}()
	delay := time.Duration(0)
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				delay = min(max(2*delay, 5*time.Millisecond), acceptRetryDelayMax)
				s.log.Warn().Err(err).Dur("retry_in", delay).Msg("accept failed")
				time.Sleep(delay)
				continue
			}
			return fmt.Errorf("server: accepting: %w", err)
		}
		delay = 0
		s.mu.Lock()
		if s.closed || len(s.conns) >= s.cfg.ConnsMax {
			full := !s.closed
			s.mu.Unlock()
			if full {
				s.log.Warn().Str("remote", nc.RemoteAddr().String()).Int("conns_max", s.cfg.ConnsMax).Msg("connection refused: too many connections")
			}
			nc.Close()
			continue
		}
		c := s.newConn(nc)
		s.conns[c] = struct{}{}
		s.wg.Add(2)
		s.mu.Unlock()
		go c.readLoop()
		go c.writeLoop()
	}
}

// Close stops every listener and connection and waits for their
// goroutines. In-flight Backend calls see their ctx cancelled.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.close("server closing")
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// outFrame is one encoded response; closeAfter makes the writer close the
// connection once it is flushed.
type outFrame struct {
	b          []byte
	closeAfter bool
}

type conn struct {
	s   *Server
	nc  net.Conn
	log zerolog.Logger

	ctx    context.Context
	cancel context.CancelFunc

	tenant tenants.ID
	spec   tenants.Spec

	out      chan outFrame  // Invariant: holds at most writeQueueFrames frames
	slots    chan struct{}  // in-flight requests; capacity InflightPerConnMax
	inflight sync.WaitGroup // requests being executed
	once     sync.Once
}

func (s *Server) newConn(nc net.Conn) *conn {
	ctx, cancel := context.WithCancel(s.ctx)
	return &conn{s: s, nc: nc, ctx: ctx, cancel: cancel,
		log:   s.log.With().Str("remote", nc.RemoteAddr().String()).Logger(),
		out:   make(chan outFrame, writeQueueFrames),
		slots: make(chan struct{}, proto.InflightPerConnMax)}
}

// close tears the connection down once; reason is logged.
func (c *conn) close(reason string) {
	c.once.Do(func() {
		c.log.Debug().Str("reason", reason).Msg("connection closed")
		c.cancel()
		c.nc.Close()
	})
}

// send queues a response for the writer. It never blocks past the
// connection's end.
func (c *conn) send(resp *proto.Response, closeAfter bool) {
	b := proto.AppendResponse(make([]byte, 0, proto.HeaderBytes+64+len(resp.Value)), resp)
	select {
	case c.out <- outFrame{b: b, closeAfter: closeAfter}:
	case <-c.ctx.Done():
	}
}

// reject answers h with an error status; fatal ones close the connection
// after the response is flushed, and the reason is logged.
func (c *conn) reject(h proto.Header, st proto.Status, fatal bool, reason string) {
	ev := c.log.Info()
	if fatal {
		ev = c.log.Warn()
	}
	ev.Str("op", h.Op.String()).Uint64("id", h.ID).Str("status", st.String()).Bool("closing", fatal).Msg(reason)
	resp := proto.Errorf(st, "%s", reason)
	resp.Op, resp.ID, resp.Tenant = h.Op, h.ID, c.tenant
	if !h.Op.Valid() {
		resp.Op = proto.OpNone
	}
	c.send(resp, fatal)
}

func (c *conn) readLoop() {
	defer c.s.wg.Done()
	defer func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	}()
	br := bufio.NewReaderSize(c.nc, readBufferBytes)
	var hb [proto.HeaderBytes]byte

	c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.HandshakeTimeout))
	if !c.handshake(br, hb[:]) {
		return
	}
	c.nc.SetReadDeadline(time.Time{})

	for {
		// Take an in-flight slot before reading the next frame: a client
		// over its pipeline depth is slowed by TCP back-pressure.
		select {
		case c.slots <- struct{}{}:
		case <-c.ctx.Done():
			return
		}
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			<-c.slots
			c.endOfStream(err)
			return
		}
		if !c.frame(br, hb[:]) {
			<-c.slots
			return
		}
	}
}

// endOfStream handles a read error: a clean EOF lets in-flight requests
// finish and their responses go out before the connection closes.
func (c *conn) endOfStream(err error) {
	if errors.Is(err, io.EOF) {
		c.inflight.Wait()
		select {
		case c.out <- outFrame{closeAfter: true}:
		case <-c.ctx.Done():
		}
		return
	}
	c.close("read: " + err.Error())
}

// handshake reads and answers HELLO. It returns false when the connection
// is finished.
func (c *conn) handshake(br *bufio.Reader, hb []byte) bool {
	if _, err := io.ReadFull(br, hb); err != nil {
		c.close("handshake read: " + err.Error())
		return false
	}
	h, err := proto.DecodeHeader(hb)
	if err != nil {
		c.reject(h, statusOf(err), true, "handshake header: "+err.Error())
		return false
	}
	if h.Op != proto.OpHello || h.Length > proto.TokenBytesMax+16 {
		c.reject(h, proto.StatusUnauthorized, true, "the first frame must be HELLO")
		return false
	}
	body := make([]byte, h.Length)
	if _, err := io.ReadFull(br, body); err != nil {
		c.close("handshake read: " + err.Error())
		return false
	}
	req, err := proto.DecodeRequest(h, body)
	if err != nil {
		c.reject(h, statusOf(err), true, err.Error())
		return false
	}
	if req.Version != proto.Version {
		c.reject(h, proto.StatusBadRequest, true, fmt.Sprintf("protocol version %d, server speaks %d", req.Version, proto.Version))
		return false
	}
	spec, ok := c.s.reg.Authenticate(req.Token)
	if !ok {
		c.reject(h, proto.StatusUnauthorized, true, "unknown token")
		return false
	}
	c.tenant, c.spec = spec.ID, spec
	c.log = c.log.With().Uint32("tenant", uint32(spec.ID)).Logger()
	c.send(&proto.Response{Op: proto.OpHello, ID: h.ID, Tenant: spec.ID, Version: proto.Version,
		InflightPerConnMax: proto.InflightPerConnMax, FrameBytesMax: proto.RequestFrameBytesMax}, false)
	return true
}

// frame handles one frame whose header is in hb; the caller holds an
// in-flight slot, which frame releases (now, or when the request is
// answered). It returns false when the connection is finished.
func (c *conn) frame(br *bufio.Reader, hb []byte) bool {
	h, err := proto.DecodeHeader(hb)
	if err != nil {
		// The length cannot be trusted: the stream is lost.
		c.reject(h, statusOf(err), true, "bad header: "+err.Error())
		return false
	}
	if h.Tenant != c.tenant {
		c.reject(h, proto.StatusUnauthorized, true, fmt.Sprintf("header tenant %d is not the authenticated tenant", h.Tenant))
		return false
	}
	frameBytes := proto.HeaderBytes + int(h.Length)
	if h.Op == proto.OpHello {
		return c.skip(br, h, proto.StatusBadRequest, "HELLO after the handshake")
	}
	if h.Length > proto.RequestBodyBytesMax {
		// Checked before anything is buffered: no request this long can
		// fit in an acceptor-log record (the size chain, kv/proto).
		return c.skip(br, h, proto.StatusTooLarge, fmt.Sprintf("request body of %d bytes exceeds %d (RequestBodyBytesMax)", h.Length, proto.RequestBodyBytesMax))
	}
	if a := c.s.cfg.Admitter; a != nil {
		if ok, retry := a.Admit(c.tenant, h.Op, frameBytes); !ok {
			if _, err := br.Discard(int(h.Length)); err != nil {
				c.close("read: " + err.Error())
				return false
			}
			resp := &proto.Response{Op: h.Op, ID: h.ID, Tenant: c.tenant, Status: proto.StatusThrottled, RetryAfter: retry}
			c.send(resp, false)
			<-c.slots
			return true
		}
	}
	body := make([]byte, h.Length)
	if _, err := io.ReadFull(br, body); err != nil {
		c.close("read: " + err.Error())
		return false
	}
	req, err := proto.DecodeRequest(h, body)
	if err != nil {
		c.reject(h, statusOf(err), false, err.Error())
		<-c.slots
		return true
	}
	if msg := c.overTenantLimits(req); msg != "" {
		c.reject(h, proto.StatusTooLarge, false, msg)
		<-c.slots
		return true
	}
	if req.Op == proto.OpPing {
		c.send(&proto.Response{Op: h.Op, ID: h.ID, Tenant: c.tenant}, false)
		<-c.slots
		return true
	}
	c.inflight.Add(1)
	go c.do(req)
	return true
}

// skip discards a frame's body and answers it with st.
func (c *conn) skip(br *bufio.Reader, h proto.Header, st proto.Status, reason string) bool {
	if _, err := br.Discard(int(h.Length)); err != nil {
		c.close("read: " + err.Error())
		return false
	}
	c.reject(h, st, false, reason)
	<-c.slots
	return true
}

// overTenantLimits checks the tenant's own key and value limits, which may
// be tighter than the protocol's.
func (c *conn) overTenantLimits(req *proto.Request) string {
	kmax, vmax := c.spec.MaxKeyBytes, c.spec.MaxValueBytes
	check := func(key, value, expect []byte) string {
		if kmax > 0 && len(key) > kmax {
			return fmt.Sprintf("key of %d bytes exceeds the tenant's %d", len(key), kmax)
		}
		if vmax > 0 && (len(value) > vmax || len(expect) > vmax) {
			return fmt.Sprintf("value of %d bytes exceeds the tenant's %d", max(len(value), len(expect)), vmax)
		}
		return ""
	}
	if msg := check(req.Key, req.Value, req.Expect); msg != "" {
		return msg
	}
	for i := range req.Ops {
		if msg := check(req.Ops[i].Key, req.Ops[i].Value, req.Ops[i].Expect); msg != "" {
			return msg
		}
	}
	return ""
}

func (c *conn) do(req *proto.Request) {
	defer c.inflight.Done()
	ctx, cancel := context.WithTimeout(c.ctx, c.s.cfg.RequestTimeout)
	resp := c.s.be.Do(ctx, c.tenant, req)
	cancel()
	if resp == nil {
		resp = proto.Errorf(proto.StatusInternal, "backend returned no response")
	}
	resp.Op, resp.ID, resp.Tenant = req.Op, req.ID, c.tenant
	c.send(resp, false)
	<-c.slots
}

// writeLoop writes queued responses, coalescing everything queued at the
// moment into one flush.
func (c *conn) writeLoop() {
	defer c.s.wg.Done()
	bw := bufio.NewWriterSize(c.nc, writeBufferBytes)
	for {
		var f outFrame
		select {
		case f = <-c.out:
		case <-c.ctx.Done():
			return
		}
		closeAfter := f.closeAfter
		c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
		_, err := bw.Write(f.b)
		for err == nil && !closeAfter && len(c.out) > 0 {
			f = <-c.out
			closeAfter = f.closeAfter
			_, err = bw.Write(f.b)
		}
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			c.close("write: " + err.Error())
			return
		}
		if closeAfter {
			c.close("closed after the last response")
			return
		}
	}
}

// statusOf maps a decoding error to the status that answers it.
func statusOf(err error) proto.Status {
	if errors.Is(err, proto.ErrTooLarge) {
		return proto.StatusTooLarge
	}
	return proto.StatusBadRequest
}
