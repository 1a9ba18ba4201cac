package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/proto"
	"synod/tenants"
)

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("server: closed")

// acceptRetryDelayMax bounds the back-off after a failed accept.
const acceptRetryDelayMax = time.Second

// errIdle ends a connection that stayed idle for IdleTimeout.
var errIdle = errors.New("idle")

// Server serves the binary protocol. Create it with New.
type Server struct {
	cfg Config
	reg *tenants.Registry
	be  Backend
	log zerolog.Logger

	ctx    context.Context
	cancel context.CancelFunc

	// Response budgets: the node's, and each tenant's (fixed at New).
	node    *budget
	tenants map[tenants.ID]*budget
	// now is the clock of the node reserve's memory (node_reserve.go);
	// nil: time.Now.
	now func() time.Time
	// tenantThrottled counts each tenant's answers THROTTLED for want of
	// response or request budget (fixed at New; throttled is their sum).
	tenantThrottled map[tenants.ID]*atomic.Uint64
	// reqNode and reqTenants are the request budgets (request_budget.go).
	reqNode    *budget
	reqTenants map[tenants.ID]*budget
	// tenantPaces are the tenants' pace marks (refused_pace.go; fixed
	// at New).
	tenantPaces map[tenants.ID]*tenantPace

	// warnLog limits the warnings about refused connections and frames
	// that close a connection; noteLog the notices about refused requests.
	warnLog, noteLog logLimiter
	// admin checks the admin token of membership operations (admin.go).
	admin adminCheck

	refused, evicted, throttled atomic.Uint64
	acceptFailed                atomic.Uint64 // accept errors waited out (serve)
	paced                       atomic.Uint64 // frames read late: refused_pace.go
	pacedAtHello                atomic.Uint64 // connections paced from HELLO: refused_pace.go

	mu       sync.Mutex
	closed   bool
	lns      map[net.Listener]struct{}
	conns    map[*conn]struct{}
	preHello connList // Invariant: preHello.n <= cfg.ConnsUnauthenticatedMax
	authed   int      // Invariant: authed <= cfg.ConnsMax
	byTenant map[tenants.ID]int
	bySource map[netip.Addr]int
	wg       sync.WaitGroup

	// work hands an admitted request to a waiting worker (workers.go);
	// unbuffered: a send succeeds only while one waits.
	work           chan workItem
	workers        atomic.Int64  // request workers running or waiting
	workersStarted atomic.Uint64 // request workers started since New
	noWorkers      bool          // testingNoWorkers when New ran
}

// New returns a server that authenticates tenants against reg and executes
// requests on be. It panics (with ErrConfig) when cfg.Validate fails.
func New(cfg Config, reg *tenants.Registry, be Backend, log zerolog.Logger) *Server {
	if err := cfg.Validate(); err != nil {
		panic(fmt.Errorf("%w: %v", ErrConfig, err))
	}
	cfg = cfg.WithDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, reg: reg, be: be, log: log, ctx: ctx, cancel: cancel,
		node: newBudget(cfg.ResponseBytesPerNodeMax), tenants: map[tenants.ID]*budget{}, tenantThrottled: map[tenants.ID]*atomic.Uint64{},
		reqNode: newBudget(cfg.RequestBytesPerNodeMax), reqTenants: map[tenants.ID]*budget{}, tenantPaces: map[tenants.ID]*tenantPace{},
		lns: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{},
		byTenant: map[tenants.ID]int{}, bySource: map[netip.Addr]int{}, work: make(chan workItem)}
	s.warnLog.now, s.noteLog.now = time.Now, time.Now
	s.noWorkers = testingNoWorkers
	s.admin = newAdminCheck(cfg.AdminToken)
	for _, sp := range reg.All() {
		s.tenants[sp.ID] = newBudget(cfg.ResponseBytesPerTenantMax)
		s.tenantThrottled[sp.ID] = new(atomic.Uint64)
		s.reqTenants[sp.ID] = newBudget(cfg.RequestBytesPerTenantMax)
		s.tenantPaces[sp.ID] = new(tenantPace)
	}
	return s
}

// TenantBudget is what one tenant holds in the response and request
// budgets now, and how many of its requests were answered THROTTLED for
// want of room in any budget (the connection's, the tenant's or the
// node's): where an operator looks when THROTTLED answers mention
// response_bytes_per_node_max.
type TenantBudget struct {
	ResponseBytes, RequestBytes int64
	Throttled                   uint64
}

// TenantBudget returns tenant's figures (zero for a tenant not in the
// registry).
func (s *Server) TenantBudget(tenant tenants.ID) TenantBudget {
	var tb TenantBudget
	if b := s.tenants[tenant]; b != nil {
		tb.ResponseBytes = b.used.Load()
	}
	if b := s.reqTenants[tenant]; b != nil {
		tb.RequestBytes = b.used.Load()
	}
	if n := s.tenantThrottled[tenant]; n != nil {
		tb.Throttled = n.Load()
	}
	return tb
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	st := Stats{ConnsAuthenticated: s.authed, ConnsUnauthenticated: s.preHello.n}
	s.mu.Unlock()
	st.ConnsRefused, st.ConnsEvicted = s.refused.Load(), s.evicted.Load()
	st.AcceptsFailed = s.acceptFailed.Load()
	st.ResponseBytes, st.ResponseBytesPeak = s.node.used.Load(), s.node.peak.Load()
	st.RequestBytes, st.RequestBytesPeak = s.reqNode.used.Load(), s.reqNode.peak.Load()
	st.ResponsesThrottled = s.throttled.Load()
	st.FramesPaced = s.paced.Load()
	st.ConnsPacedAtHello = s.pacedAtHello.Load()
	st.LogLinesSuppressed = s.warnLog.total.Load() + s.noteLog.total.Load()
	return st
}

// Serve accepts connections on ln until Close is called (then it returns
// ErrServerClosed) or ln is closed under it (net.ErrClosed). It takes
// ownership of ln. Every other accept error (the process out of file
// descriptors, EMFILE, above all) is waited out with a back-off of up to
// acceptRetryDelayMax and the loop goes on: an outside tester who held
// 20,000 connections to the admin port exhausted the descriptors, and
// the client and RESP servers, which returned on that error, stayed
// stopped after the connections were gone while the node reported
// itself healthy.
func (s *Server) Serve(ln net.Listener) error { return s.serve(ln, nil) }

// serve is Serve, and with hosted not nil ServeHosted (hosted.go).
func (s *Server) serve(ln net.Listener, hosted func(*Hosted)) error {
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
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("server: accepting: %w", err)
			}
			delay = min(max(2*delay, 5*time.Millisecond), acceptRetryDelayMax)
			s.acceptFailed.Add(1)
			s.warnLog.event(s.log.Warn()).Err(err).Dur("retry_in", delay).Msg("accept failed; retrying")
			time.Sleep(delay)
			continue
		}
		delay = 0
		s.admit(nc, hosted)
	}
}

// admit registers a new connection in the pre-HELLO pool and starts its
// goroutines (the binary protocol's, or hosted's when not nil), making
// room by closing the oldest pre-HELLO connection (of its source when the
// source is full) or, when its source is full of authenticated
// connections, closing it instead.
func (s *Server) admit(nc net.Conn, hosted func(*Hosted)) {
	src := sourceOf(nc.RemoteAddr())
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		nc.Close()
		return
	}
	if s.bySource[src] >= s.cfg.ConnsPerSourceMax {
		old := s.preHello.oldestFrom(src)
		if old == nil {
			s.mu.Unlock()
			s.refused.Add(1)
			s.warnLog.event(s.log.Warn()).Str("remote", nc.RemoteAddr().String()).Int("conns_per_source_max", s.cfg.ConnsPerSourceMax).
				Msg("connection refused: its source address holds conns_per_source_max authenticated connections")
			nc.Close()
			return
		}
		s.evictLocked(old, "its source address is at conns_per_source_max")
	}
	if s.preHello.n >= s.cfg.ConnsUnauthenticatedMax {
		s.evictLocked(s.preHello.head, "the pre-HELLO pool is at conns_unauthenticated_max")
	}
	c := s.newConn(nc, src)
	s.conns[c] = struct{}{}
	s.preHello.pushBack(c)
	s.bySource[src]++
	if hosted != nil {
		s.wg.Add(1)
		s.mu.Unlock()
		go c.runHosted(hosted)
		return
	}
	s.wg.Add(2)
	s.mu.Unlock()
	go c.readLoop()
	go c.writeLoop()
}

// evictLocked closes a pre-HELLO connection to make room; its slot is free
// at once. s.mu is held.
func (s *Server) evictLocked(c *conn, why string) {
	s.releaseLocked(c)
	s.evicted.Add(1)
	c.close("evicted before HELLO: " + why)
}

// releaseLocked gives back c's connection slots (once). s.mu is held.
func (s *Server) releaseLocked(c *conn) {
	switch c.state {
	case connPreHello:
		s.preHello.remove(c)
	case connAuthed:
		s.authed--
		if s.byTenant[c.tenant]--; s.byTenant[c.tenant] == 0 {
			delete(s.byTenant, c.tenant)
		}
	case connReleased:
		return
	}
	if s.bySource[c.source]--; s.bySource[c.source] == 0 {
		delete(s.bySource, c.source)
	}
	c.state = connReleased
}

// promote moves c from the pre-HELLO pool to tenant id's authenticated
// connections. When a cap refuses it, resp is the answer (and ok false);
// when c was evicted meanwhile, both are zero.
func (s *Server) promote(c *conn, id tenants.ID) (resp *proto.Response, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case c.state != connPreHello:
		return nil, false
	case s.byTenant[id] >= s.cfg.ConnsPerTenantMax:
		s.refused.Add(1)
		r := proto.Errorf(proto.StatusThrottled, "the tenant holds %d connections to this node (conns_per_tenant_max)", s.cfg.ConnsPerTenantMax)
		r.RetryAfter = connsRetryAfter
		return r, false
	case s.authed >= s.cfg.ConnsMax:
		s.refused.Add(1)
		return proto.Errorf(proto.StatusUnavailable, "the node holds %d connections (conns_max)", s.cfg.ConnsMax), false
	}
	s.preHello.remove(c)
	c.state = connAuthed
	s.authed++
	s.byTenant[id]++
	if c.refused.inherit(s.tenantPaces[id]) {
		s.pacedAtHello.Add(1)
	}
	return nil, true
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
// connection once it is flushed. charged bytes are held in the
// connection's, tenant's and node's budgets until the frame is written.
type outFrame struct {
	b          []byte
	closeAfter bool
	charged    int64
	seq        uint64 // its place among the connection's answers (conn.sends); 0: none
}

type connState uint8

const (
	connPreHello connState = iota // in Server.preHello
	connAuthed                    // counted in Server.authed and byTenant
	connReleased                  // slots given back
)

type conn struct {
	s      *Server
	nc     net.Conn
	log    zerolog.Logger
	source netip.Addr

	ctx    context.Context
	cancel context.CancelFunc

	// Guarded by s.mu.
	state      connState
	prev, next *conn // in s.preHello while state == connPreHello

	// Set by the handshake before any request is read; read-only after.
	tenant        tenants.ID
	spec          tenants.Spec
	frameBytesMax int            // the longest request frame the tenant can be admitted
	tbudget       *budget        // the tenant's response budget
	tthrottled    *atomic.Uint64 // the tenant's count of budget THROTTLEDs

	// queued holds the response bytes reserved by this connection's
	// requests and those of its answers not yet written.
	// Invariant: queued.used <= cfg.ResponseBytesPerConnMax.
	queued *budget
	// reqQueued and reqTenant hold the bodies of this connection's
	// requests read and not yet answered (request_budget.go).
	reqQueued, reqTenant *budget

	refused refusals      // its run of THROTTLED answers (refused_pace.go)
	out     chan outFrame // Invariant: holds at most writeQueueFrames frames
	// wtoken is the right to write to nc: it holds one token while
	// nobody writes. The writer goroutine takes it for each burst, a
	// request's goroutine to write its own answer (writeInline).
	wtoken       chan struct{}
	inlineWrites atomic.Uint64  // answers written by writeInline (tests)
	sends        atomic.Uint64  // answers sent so far (outFrame.seq)
	fatalWaiting atomic.Bool    // the reader met a fatal frame (fatal; tests)
	slots        chan struct{}  // in-flight requests; capacity InflightPerConnMax
	inflight     sync.WaitGroup // requests being executed
	once         sync.Once
	frameArmed   bool // reader only: the frame deadline is set for the current frame
}

func (s *Server) newConn(nc net.Conn, src netip.Addr) *conn {
	ctx, cancel := context.WithCancel(s.ctx)
	wtoken := make(chan struct{}, 1)
	wtoken <- struct{}{}
	return &conn{s: s, nc: nc, source: src, ctx: ctx, cancel: cancel,
		log:       s.log.With().Str("remote", nc.RemoteAddr().String()).Logger(),
		queued:    newBudget(s.cfg.ResponseBytesPerConnMax),
		reqQueued: newBudget(s.cfg.RequestBytesPerConnMax),
		out:       make(chan outFrame, writeQueueFrames),
		wtoken:    wtoken,
		slots:     make(chan struct{}, proto.InflightPerConnMax)}
}

// close tears the connection down once; reason is logged.
func (c *conn) close(reason string) {
	c.once.Do(func() {
		c.log.Debug().Str("reason", reason).Msg("connection closed")
		c.cancel()
		c.nc.Close()
	})
}

// Response budget: every level at once, in the order connection, tenant,
// node (taking) and tenant, node, connection (giving back: a waiter on the
// node's budget then sees its tenant's lower holding, node_reserve.go).

// charge takes n bytes, waiting for room at each level; false when the
// connection ends first (nothing is held then).
func (c *conn) charge(n int64) bool {
	if !c.queued.wait(c.ctx, n) {
		return false
	}
	if !c.tbudget.wait(c.ctx, n) {
		c.queued.release(n)
		return false
	}
	if !c.s.node.waitWithin(c.ctx, n, c.nodeLimit) {
		c.tbudget.release(n)
		c.queued.release(n)
		return false
	}
	c.s.noteHeavy(c.tbudget, tenantLightBytes)
	return true
}

// tryCharge takes n bytes if every level has room, else nothing.
func (c *conn) tryCharge(n int64) bool { return c.tryChargeOrFull(n) == budgetNone }

// tryChargeOrFull is tryCharge that names the budget without room
// (budgetNone: charged), for the THROTTLED answer's message.
func (c *conn) tryChargeOrFull(n int64) budgetFull {
	if !c.queued.tryAdd(n) {
		return budgetConn
	}
	full := c.tryChargeSharedOrFull(n)
	if full != budgetNone {
		c.queued.release(n)
	}
	return full
}

// tryChargeSharedOrFull takes n bytes of the tenant's and node's budgets
// if both have room, else nothing, and names the one without room: for a
// SCAN's reservation, which has waited for its connection's budget.
func (c *conn) tryChargeSharedOrFull(n int64) budgetFull {
	if !c.tbudget.tryAdd(n) {
		return budgetTenant
	}
	if !c.s.node.tryAddWithin(n, c.nodeLimit()) {
		c.tbudget.release(n)
		return budgetNode
	}
	c.s.noteHeavy(c.tbudget, tenantLightBytes)
	return budgetNone
}

// countThrottled counts an answer THROTTLED for want of response or
// request budget, for the node and the connection's tenant.
func (c *conn) countThrottled() {
	c.s.throttled.Add(1)
	if c.tthrottled != nil {
		c.tthrottled.Add(1)
	}
}

func (c *conn) uncharge(n int64) {
	c.s.noteHeavy(c.tbudget, tenantLightBytes)
	c.tbudget.release(n)
	c.s.node.release(n)
	c.queued.release(n)
}

// send queues a response for the writer; held is what the request holds
// in the budgets (0 before HELLO: those few answers are not counted). The
// answer is charged its encoded size: the rest of held is given back, or
// the difference taken, or, when a budget has no room for it, the answer
// is replaced by THROTTLED. It never blocks past the connection's end.
func (c *conn) send(resp *proto.Response, closeAfter bool, held int64) {
	c.sendFrom(resp, closeAfter, held, false)
}

// sendFrom is send; inline lets the caller write the answer itself when
// the writer is idle (writeInline). Only request workers pass it: the
// reader must not block on a client that reads slowly, its answers go to
// the writer.
func (c *conn) sendFrom(resp *proto.Response, closeAfter bool, held int64, inline bool) {
	if resp.Status == proto.StatusThrottled && resp.RetryAfter < RetryAfterMin {
		resp.RetryAfter = RetryAfterMin
	}
	b := proto.AppendResponse(make([]byte, 0, responseBytesHint(resp)), resp)
	n := int64(len(b))
	throttled, retryAfter := resp.Status == proto.StatusThrottled, resp.RetryAfter
	if held > 0 && n > held {
		if full := c.tryChargeOrFull(n - held); full != budgetNone {
			c.countThrottled()
			r := proto.Errorf(proto.StatusThrottled, "a response of %d bytes %s", n, full.refusal())
			r.Op, r.ID, r.Tenant, r.RetryAfter = resp.Op, resp.ID, resp.Tenant, budgetRetryAfter
			b = proto.AppendResponse(b[:0], r)
			n = int64(len(b))
			throttled, retryAfter = true, r.RetryAfter
			if n > held {
				panic(fmt.Sprintf("server: a THROTTLED answer of %d bytes exceeds the %d held", n, held))
			}
		}
	}
	if throttled || endsRefusedRun(resp) {
		c.refused.answered(throttled, retryAfter)
	}
	charged := int64(0)
	if held > 0 {
		if n < held {
			c.uncharge(held - n)
		}
		charged = n
	}
	f := outFrame{b: b, closeAfter: closeAfter, charged: charged, seq: c.sends.Add(1)}
	if inline && c.writeInline(f) {
		return
	}
	select {
	case c.out <- f:
	case <-c.ctx.Done():
		c.uncharge(charged)
	}
}

// writeInline writes f on the caller's goroutine when nothing waits for
// the writer goroutine and nobody is writing (the write token is free),
// and reports whether it did (or, the connection being closed, gave f's
// bytes back). Otherwise f goes to the writer as before.
//
// Why: handing each answer to the writer goroutine woke it once per
// answer, about 13,000 wake-ups a second on a leader at half its ceiling
// (a fifth of all its goroutine wake-ups, most a futex and a context
// switch on a busy machine; docs/benchmarking.md "Fewer wake-ups a
// write"). The answer costs the same write(2) either way.
//
// Order: answers of one connection were never ordered with respect to
// each other (docs/protocol.md, "Pipelining"); a frame that closes the
// connection always goes through the writer, behind every frame queued
// before it, and an inline write has returned before its request counts
// as finished (inflight), so the close after end of stream still follows
// every answer.
func (c *conn) writeInline(f outFrame) bool {
	if testingNoInlineWrites || f.closeAfter || len(c.out) > 0 {
		return false
	}
	select {
	case <-c.wtoken:
	default:
		return false
	}
	if c.ctx.Err() != nil {
		c.uncharge(f.charged)
	} else {
		c.inlineWrites.Add(1)
		c.burst(f)
	}
	c.wtoken <- struct{}{}
	return true
}

// testingNoInlineWrites, planted, sends every answer through the writer
// goroutine (the old way).
var testingNoInlineWrites bool

// reject answers h with an error status; fatal ones close the connection
// after the response is flushed. The reason is logged (rate-limited).
func (c *conn) reject(h proto.Header, st proto.Status, fatal bool, held int64, reason string) {
	var ev *zerolog.Event
	if fatal {
		ev = c.s.warnLog.event(c.log.Warn())
	} else {
		ev = c.s.noteLog.event(c.log.Info())
	}
	ev.Str("op", h.Op.String()).Uint64("id", h.ID).Str("status", st.String()).Bool("closing", fatal).Msg(reason)
	resp := proto.Errorf(st, "%s", reason)
	resp.Op, resp.ID, resp.Tenant = h.Op, h.ID, c.tenant
	if !h.Op.Valid() {
		resp.Op = proto.OpNone
	}
	c.send(resp, fatal, held)
}

// fatal answers a frame after which the stream cannot be read on (a bad
// header, another tenant's) and closes the connection behind the answer,
// as the end of stream does: first every request read before it finishes
// and its answer is written, so a client loses no outcome of a write it
// sent before its bad frame (an outside client once saw 20 pipelined
// PUTs applied and none answered). The wait is bounded as the end of
// stream's is, by the requests' own timeouts; the reader reads nothing
// meanwhile.
func (c *conn) fatal(h proto.Header, st proto.Status, held int64, reason string) {
	if testingFatalDropsInflight {
		c.reject(h, st, true, held, reason)
		c.fatalWaiting.Store(true) // after: the test releases the requests only once the error is queued
		return
	}
	c.fatalWaiting.Store(true)
	c.inflight.Wait()
	c.reject(h, st, true, held, reason)
}

// testingFatalDropsInflight, planted, answers a fatal frame at once (the
// old way): the writer closes the connection behind it and the answers of
// requests still in flight are never written.
var testingFatalDropsInflight bool

// readLoop runs the handshake, then reads frames until the connection
// ends; then it waits for the connection's requests, gives back what they
// hold and the connection's slots.
func (c *conn) readLoop() {
	defer c.s.wg.Done()
	defer c.finish()
	if !c.handshake() {
		return
	}
	br := bufio.NewReaderSize(c.nc, readBufferBytes)
	var hb [proto.HeaderBytes]byte
	for {
		// Frames already buffered are not executed once the connection
		// is closed (a write timeout, a fatal frame, Close).
		if c.ctx.Err() != nil {
			return
		}
		// Take an in-flight slot and reserve the answer's room before
		// reading the next frame: a client over its pipeline depth, or
		// not reading its answers, is slowed by TCP back-pressure.
		select {
		case c.slots <- struct{}{}:
		case <-c.ctx.Done():
			return
		}
		if !c.charge(responseBytesReserved) {
			<-c.slots
			return
		}
		if err := c.awaitFrame(br); err != nil {
			c.done(responseBytesReserved)
			c.endOfStream(err)
			return
		}
		// A client pipelining on through its refusals is read one frame
		// per retry-after (refused_pace.go); asked once the next frame
		// has come, so a client that waited its retry-after is not. The
		// frame's own slot is the only one held when every earlier
		// request was answered (send comes before a slot is given back).
		if !c.waitPace(len(c.slots) == 1) {
			c.done(responseBytesReserved)
			return
		}
		if !c.frame(br, hb[:], responseBytesReserved) {
			return
		}
	}
}

// finish runs when the reader is done: once the connection is closed
// (every path that ends the reader closes it, or queues a frame that makes
// the writer close it), it waits for the requests in flight, gives back
// the budget held by answers never written and the connection's slots.
func (c *conn) finish() {
	<-c.ctx.Done()
	c.inflight.Wait()
	for drained := false; !drained; {
		select {
		case f := <-c.out:
			c.uncharge(f.charged)
		default:
			drained = true
		}
	}
	c.s.mu.Lock()
	c.s.releaseLocked(c)
	delete(c.s.conns, c)
	c.s.mu.Unlock()
}

// done gives back a request's slot and what it holds, unanswered.
func (c *conn) done(held int64) {
	c.uncharge(held)
	<-c.slots
}

// answer sends resp for a request the reader finished itself and gives
// back its slot.
func (c *conn) answer(resp *proto.Response, held int64) {
	c.send(resp, false, held)
	<-c.slots
}

// awaitFrame waits for the first byte of the next frame: up to IdleTimeout
// at a time, for as long as requests are in flight or answers unwritten.
func (c *conn) awaitFrame(br *bufio.Reader) error {
	c.frameArmed = false
	for br.Buffered() == 0 {
		c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.IdleTimeout))
		_, err := br.Peek(1)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if !c.busy() {
			return errIdle
		}
	}
	return nil
}

// busy reports requests in flight (besides the slot the reader holds) or
// answers not yet written (besides the reader's reservation).
func (c *conn) busy() bool {
	return len(c.slots) > 1 || c.queued.used.Load() > responseBytesReserved
}

// armFrameDeadline starts the frame timeout when the next need bytes of
// the current frame are not all buffered yet (once per frame).
func (c *conn) armFrameDeadline(br *bufio.Reader, need int) {
	if c.frameArmed || br.Buffered() >= need {
		return
	}
	c.frameArmed = true
	c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.FrameTimeout))
}

// endOfStream handles the end of reading between frames: a clean EOF lets
// in-flight requests finish and their responses go out before the
// connection closes.
func (c *conn) endOfStream(err error) {
	switch {
	case errors.Is(err, io.EOF):
		c.inflight.Wait()
		select {
		case c.out <- outFrame{closeAfter: true}:
		case <-c.ctx.Done():
		}
	case errors.Is(err, errIdle):
		c.close(fmt.Sprintf("idle for %v (idle_timeout)", c.s.cfg.IdleTimeout))
	default:
		c.close("read: " + err.Error())
	}
}

// readFailed closes the connection after a read error inside a frame.
func (c *conn) readFailed(err error) {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.s.warnLog.event(c.log.Warn()).Dur("frame_timeout", c.s.cfg.FrameTimeout).
			Msg("closing: a frame did not arrive within frame_timeout of its first byte")
		c.close("frame timeout")
		return
	}
	c.close("read: " + err.Error())
}

// handshakeBodyBytesMax bounds a HELLO body: version and token.
const handshakeBodyBytesMax = 2 + 2 + proto.TokenBytesMax

// handshakeDiscardBytesMax bounds what the server reads and drops of a
// HELLO body over handshakeBodyBytesMax before answering TOO_LARGE, so the
// close after the answer is a FIN that delivers it (closing with unread
// bytes resets the connection, and a reset can discard the answer). A
// longer body is answered at once: its sender may see the reset instead.
const handshakeDiscardBytesMax = 4096

// handshake reads and answers HELLO, reading straight from the socket (no
// buffer is allocated for a connection before it authenticates). It
// returns false when the connection is finished.
func (c *conn) handshake() bool {
	c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.HandshakeTimeout))
	var hb [proto.HeaderBytes]byte
	if _, err := io.ReadFull(c.nc, hb[:]); err != nil {
		c.close("handshake read: " + err.Error())
		return false
	}
	h, err := proto.DecodeHeader(hb[:])
	if err != nil {
		c.reject(h, statusOf(err), true, 0, "handshake header: "+err.Error())
		return false
	}
	if h.Op != proto.OpHello {
		c.reject(h, proto.StatusUnauthorized, true, 0, "the first frame must be HELLO")
		return false
	}
	if h.Length > handshakeBodyBytesMax {
		// Too long for a version and a token of TokenBytesMax: TOO_LARGE,
		// the token limit's status (docs/protocol.md), then close.
		if h.Length <= handshakeDiscardBytesMax {
			if _, err := io.CopyN(io.Discard, c.nc, int64(h.Length)); err != nil {
				c.close("handshake read: " + err.Error())
				return false
			}
		}
		c.reject(h, proto.StatusTooLarge, true, 0, fmt.Sprintf("HELLO body of %d bytes exceeds %d (a version and a token of at most %d bytes)",
			h.Length, handshakeBodyBytesMax, proto.TokenBytesMax))
		return false
	}
	body := make([]byte, h.Length)
	if _, err := io.ReadFull(c.nc, body); err != nil {
		c.close("handshake read: " + err.Error())
		return false
	}
	// Checked once the (short) body is read, so the close that follows
	// the answer is a FIN, not a reset that could discard the answer.
	if h.Tenant != 0 {
		c.reject(h, proto.StatusBadRequest, true, 0, fmt.Sprintf("HELLO carries tenant %d in its header; it must be 0", h.Tenant))
		return false
	}
	req, err := proto.DecodeRequest(h, body)
	if err != nil {
		c.reject(h, statusOf(err), true, 0, err.Error())
		return false
	}
	if req.Version != proto.Version {
		c.reject(h, proto.StatusBadRequest, true, 0, fmt.Sprintf("protocol version %d, server speaks %d", req.Version, proto.Version))
		return false
	}
	spec, ok := c.s.reg.Authenticate(req.Token)
	if !ok {
		c.reject(h, proto.StatusUnauthorized, true, 0, "unknown token")
		return false
	}
	if resp, ok := c.s.promote(c, spec.ID); !ok {
		if resp == nil {
			c.close("evicted during the handshake")
			return false
		}
		c.s.warnLog.event(c.log.Warn()).Uint32("tenant", uint32(spec.ID)).Str("status", resp.Status.String()).Msg("connection refused: " + resp.Message)
		resp.Op, resp.ID = h.Op, h.ID
		c.send(resp, true, 0)
		return false
	}
	c.nc.SetReadDeadline(time.Time{})
	c.tenant, c.spec, c.tbudget, c.reqTenant = spec.ID, spec, c.s.tenants[spec.ID], c.s.reqTenants[spec.ID]
	c.tthrottled = c.s.tenantThrottled[spec.ID]
	c.frameBytesMax = proto.RequestFrameBytesMax
	if m := spec.FrameBytesMax(); m > 0 && m < int64(c.frameBytesMax) {
		c.frameBytesMax = int(m)
	}
	c.log = c.log.With().Uint32("tenant", uint32(spec.ID)).Logger()
	c.send(&proto.Response{Op: proto.OpHello, ID: h.ID, Tenant: spec.ID, Version: proto.Version,
		InflightPerConnMax: proto.InflightPerConnMax, FrameBytesMax: uint32(c.frameBytesMax)}, false, 0)
	return true
}

// frame handles one frame, whose first byte is buffered. The caller holds
// an in-flight slot and held bytes of response budget, which frame gives
// back (now, or when the request is answered). It returns false when the
// connection is finished.
func (c *conn) frame(br *bufio.Reader, hb []byte, held int64) bool {
	c.armFrameDeadline(br, proto.HeaderBytes)
	if _, err := io.ReadFull(br, hb); err != nil {
		c.done(held)
		c.readFailed(err)
		return false
	}
	received := time.Now() // admission starts (ReceivedAt)
	h, err := proto.DecodeHeader(hb)
	if err != nil {
		// The length cannot be trusted: the stream is lost.
		c.fatal(h, statusOf(err), held, "bad header: "+err.Error())
		<-c.slots
		return false
	}
	if h.Tenant != c.tenant {
		c.fatal(h, proto.StatusUnauthorized, held, fmt.Sprintf("header tenant %d is not the authenticated tenant", h.Tenant))
		<-c.slots
		return false
	}
	frameBytes := proto.HeaderBytes + int(h.Length)
	switch {
	case h.Op == proto.OpHello:
		return c.skip(br, h, held, proto.StatusBadRequest, "HELLO after the handshake")
	case h.Length > proto.RequestBodyBytesMax:
		// Checked before anything is buffered: no request this long can
		// fit in an acceptor-log record (the size chain, kv/proto).
		return c.skip(br, h, held, proto.StatusTooLarge, fmt.Sprintf("request body of %d bytes exceeds %d (RequestBodyBytesMax)", h.Length, proto.RequestBodyBytesMax))
	case frameBytes > c.frameBytesMax:
		// The tenant's bytes bucket never holds this much: refused now
		// rather than left to wait for a full bucket.
		return c.skip(br, h, held, proto.StatusTooLarge, fmt.Sprintf("frame of %d bytes exceeds the tenant's bytes_burst of %d", frameBytes, c.frameBytesMax))
	}
	if a := c.s.cfg.Admitter; a != nil {
		if ok, retry := a.Admit(c.tenant, h.Op, frameBytes); !ok {
			c.answer(&proto.Response{Op: h.Op, ID: h.ID, Tenant: c.tenant, Status: proto.StatusThrottled, RetryAfter: retry}, held)
			return c.discard(br, h)
		}
	}
	// The body's bytes, held until the request is answered.
	n := int64(h.Length)
	switch ok, full, waited := c.chargeRequest(n); {
	case full != budgetNone:
		c.countThrottled()
		resp := requestThrottled(h, n, full)
		resp.Tenant = c.tenant
		c.answer(resp, held)
		return c.discard(br, h)
	case !ok:
		c.done(held)
		return false
	case waited:
		// Waiting was not the client's slowness: its body gets a fresh
		// frame timeout.
		c.frameArmed = false
	}
	c.armFrameDeadline(br, int(h.Length))
	body := make([]byte, h.Length)
	if _, err := io.ReadFull(br, body); err != nil {
		c.releaseRequest(n)
		c.done(held)
		c.readFailed(err)
		return false
	}
	req, err := proto.DecodeRequest(h, body)
	if err != nil {
		c.releaseRequest(n)
		c.reject(h, statusOf(err), false, held, err.Error())
		<-c.slots
		return true
	}
	if msg := c.overTenantLimits(req); msg != "" {
		c.releaseRequest(n)
		c.reject(h, proto.StatusTooLarge, false, held, msg)
		<-c.slots
		return true
	}
	if msg := c.s.memberRefusal(req); msg != "" {
		c.releaseRequest(n)
		c.reject(h, proto.StatusUnauthorized, false, held, msg)
		<-c.slots
		return true
	}
	if req.Op == proto.OpPing {
		c.releaseRequest(n)
		c.answer(&proto.Response{Op: h.Op, ID: h.ID, Tenant: c.tenant}, held)
		return true
	}
	c.inflight.Add(1)
	c.s.runRequest(workItem{c: c, req: req, held: held, body: n, received: received})
	return true
}

// skip answers a frame with st from its header and then reads past its
// body.
func (c *conn) skip(br *bufio.Reader, h proto.Header, held int64, st proto.Status, reason string) bool {
	c.reject(h, st, false, held, reason)
	<-c.slots
	return c.discard(br, h)
}

// discard reads past the body of a frame already answered (its slot and
// held given back with the answer); on failure it closes the connection.
//
// A frame refused from its header is answered before its body is read
// past, so a client that waits for an answer before it sends a large
// body learns the refusal at once (an outside tester's header announcing
// a 2 MB body waited for the frame timeout, then saw the connection
// closed without an answer, until the refusal went first).
func (c *conn) discard(br *bufio.Reader, h proto.Header) bool {
	c.armFrameDeadline(br, int(h.Length))
	if _, err := br.Discard(int(h.Length)); err != nil {
		c.readFailed(err)
		return false
	}
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

// do executes req; held is its response reservation, body its request
// bytes (given back once the backend answered).
func (c *conn) do(req *proto.Request, held, body int64, received time.Time) {
	defer c.inflight.Done()
	ctx, cancel := context.WithTimeout(WithReceived(c.ctx, received), c.s.cfg.RequestTimeout)
	ctx = c.withValueRoom(ctx, &held, req.Op) // GET and SCAN: value_room.go
	resp := c.s.be.Do(ctx, c.tenant, req)
	cancel()
	c.releaseRequest(body)
	if resp == nil {
		resp = proto.Errorf(proto.StatusInternal, "backend returned no response")
	}
	resp.Op, resp.ID, resp.Tenant = req.Op, req.ID, c.tenant
	c.sendFrom(resp, false, held, true)
	<-c.slots
}

// writerPool holds the writers' buffers between bursts, so an idle
// connection holds none.
var writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writeBufferBytes) }}

// writeLoop writes the responses queued for it, a burst at a time, each
// burst under the write token (a request's goroutine may hold it for an
// answer of its own: writeInline).
func (c *conn) writeLoop() {
	defer c.s.wg.Done()
	for {
		var f outFrame
		select {
		case f = <-c.out:
		case <-c.ctx.Done():
			return
		}
		// Wait while a request's goroutine writes (writeInline).
		select {
		case <-c.wtoken:
		case <-c.ctx.Done():
			c.uncharge(f.charged)
			return
		}
		closed := c.burst(f)
		c.wtoken <- struct{}{}
		if closed {
			return
		}
	}
}

// burst writes f and everything else queued for the writer at the moment
// in one flush, gives their bytes back to the budgets once the kernel has
// them, and closes the connection after a write error or a closing frame,
// which it reports. The caller holds the write token.
//
// A large answer (writeBufferBytes or more) is flushed and given back at
// once rather than at the end of the burst: a client reading megabyte
// answers one at a time receives each as soon as the kernel has it and
// sends its next GET, whose answer joins the same burst, so answers it had
// read stayed charged, and an outside tester's one-at-a-time reader got
// THROTTLED ("read the connection's answers") on a connection budget of
// three such answers.
func (c *conn) burst(f outFrame) (closed bool) {
	bw := writerPool.Get().(*bufio.Writer)
	bw.Reset(c.nc)
	c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
	var charged int64 // written into bw and not yet given back
	write := func(f outFrame) error {
		_, err := bw.Write(f.b)
		charged += f.charged
		if err == nil && len(f.b) >= writeBufferBytes {
			if err = bw.Flush(); err == nil {
				if !testingUnchargeAtBurstEnd {
					c.uncharge(charged)
					charged = 0
				}
				c.afterLargeFrame(f.seq)
			}
		}
		return err
	}
	closeAfter := f.closeAfter
	err := write(f)
	// Coalesce what else is queued, without blocking: finish drains
	// c.out once the connection is closed, so a frame seen queued may
	// be gone by the time it is received (a blocking receive after a
	// length check hung the writer, and Server.Close waiting for it,
	// in a CI run).
coalesce:
	for err == nil && !closeAfter {
		select {
		case f = <-c.out:
			closeAfter = f.closeAfter
			err = write(f)
		default:
			break coalesce
		}
	}
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writerPool.Put(bw)
	c.uncharge(charged)
	if err != nil {
		c.close("write: " + err.Error())
		return true
	}
	if closeAfter {
		c.close("closed after the last response")
		return true
	}
	return false
}

// afterLargeFrame is a test hook: called by the writer after it gave a
// large answer's bytes back (nil: nothing).
func (c *conn) afterLargeFrame(seq uint64) {
	if testingAfterLargeFrame != nil {
		testingAfterLargeFrame(c, seq)
	}
}

// testingAfterLargeFrame, when set, runs after the writer gave a large
// frame's bytes back (a test holds the writer there, as a busy machine
// does).
var testingAfterLargeFrame func(c *conn, seq uint64)

// testingUnchargeAtBurstEnd plants the old behaviour: a large frame's
// bytes are given back only at the end of the writer's burst.
var testingUnchargeAtBurstEnd bool

// statusOf maps a decoding error to the status that answers it.
func statusOf(err error) proto.Status {
	if errors.Is(err, proto.ErrTooLarge) {
		return proto.StatusTooLarge
	}
	return proto.StatusBadRequest
}
