package resp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"synod/kv/proto"
	"synod/kv/server"
	"synod/tenants"
)

// Connection limits. The connection caps, budgets and timeouts are the
// host server's (kv/server); these are the RESP framing's own.
const (
	// CommandBytesMax bounds one command after authentication: a write
	// whose binary-protocol body is RequestBodyBytesMax, plus the RESP
	// framing of ArgsPerCommandMax arguments. A longer command is read
	// past and answered "ERR ... too large" (the connection stays open).
	CommandBytesMax = proto.RequestBodyBytesMax + ArgsPerCommandMax*argOverheadBytesMax + 64
	// preAuthCommandBytesMax bounds a command before authentication:
	// HELLO 3 AUTH <64-byte tenant name> <256-byte token> SETNAME <name>.
	preAuthCommandBytesMax = 1024
	// preAuthArgsMax bounds its arguments (HELLO with AUTH and SETNAME: 7).
	preAuthArgsMax = 8
	// preAuthCommandsMax bounds the commands a connection may send before
	// it authenticates (wrong tokens, NOAUTH answers); past it the
	// connection is closed. handshake_timeout bounds the time.
	preAuthCommandsMax = 8
	// preAuthReadBufferBytes is the read buffer before authentication
	// (a pre-authentication connection holds no more).
	preAuthReadBufferBytes = 512
	// readBufferBytes and writeBufferBytes are an authenticated
	// connection's buffers, the binary protocol's sizes.
	readBufferBytes  = 64 << 10
	writeBufferBytes = 64 << 10
	// InflightPerConnMax bounds the commands read ahead and not yet
	// answered on one connection: the binary protocol's bound.
	InflightPerConnMax = proto.InflightPerConnMax
	// clientNameBytesMax bounds CLIENT SETNAME and HELLO SETNAME.
	clientNameBytesMax = 64
)

// errIdle ends a connection idle for idle_timeout.
var errIdle = errors.New("idle")

// conn is one RESP connection.
type conn struct {
	s  *Server
	h  *server.Hosted
	nc net.Conn
	id uint64
	dr *deadlineReader
	rd commandReader

	// Set by the reader before the executor starts; read-only afterwards
	// except as noted.
	spec tenants.Spec

	// Executor only.
	resp3    bool
	readonly bool   // READONLY: reads may be answered from this node's applied state
	name     string // CLIENT SETNAME
	libName  string
	libVer   string
	writeID  uint64 // exactly-once client id of this connection's writes (0: none drawn yet)
	writeSeq uint64 // last sequence used

	// queue carries commands from the reader to the executor, in order.
	// Invariant: len(queue) <= InflightPerConnMax.
	queue chan *pending
	// inflight counts commands read and not yet answered on the wire.
	inflight atomic.Int32
}

// pending is one command between the reader and the executor.
type pending struct {
	cmd  *command
	held int64 // response budget the command holds
	// body is what the command holds of the request budgets (its
	// argument bytes, ChargeRequest) until it has run.
	body int64
	// fail, when set, is the whole answer (a command that was too large
	// or did not parse); closeAfter closes the connection once it is
	// written.
	fail       string
	closeAfter bool
	// answeredAll: when it was read, every earlier command's answer had
	// gone to the kernel (inflight was 0), so its client sent it after
	// them; a pipelined command was read before (pacing's answeredAll,
	// as the binary reader tells it from its free slots).
	answeredAll bool
}

// deadlineReader arms the frame timeout the first time a command needs
// bytes that are not buffered yet (once per command).
type deadlineReader struct {
	nc        net.Conn
	frame     time.Duration
	inCommand bool
	armed     bool
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	if d.inCommand && !d.armed {
		d.armed = true
		d.nc.SetReadDeadline(time.Now().Add(d.frame))
	}
	return d.nc.Read(p)
}

// serveConn runs one connection (kv/server calls it in a goroutine of
// its own and closes the connection when it returns).
func (s *Server) serveConn(h *server.Hosted) {
	s.stats.connsTotal.Add(1)
	s.stats.conns.Add(1)
	defer s.stats.conns.Add(-1)
	cfg := h.Config()
	c := &conn{s: s, h: h, nc: h.Conn(), id: s.connIDs.Add(1)}
	c.dr = &deadlineReader{nc: c.nc, frame: cfg.FrameTimeout}
	c.rd = commandReader{br: bufio.NewReaderSize(c.dr, preAuthReadBufferBytes), bytesMax: preAuthCommandBytesMax, argsMax: preAuthArgsMax}
	if !c.handshake(cfg) {
		return
	}
	// Authenticated: full-size buffers and limits. Bytes the small
	// reader already holds (a pipelined first command) are read first.
	br := c.rd.br
	if br.Buffered() == 0 {
		br = bufio.NewReaderSize(c.dr, readBufferBytes)
	} else {
		br = bufio.NewReaderSize(br, readBufferBytes)
	}
	c.rd = commandReader{br: br, bytesMax: CommandBytesMax, argsMax: ArgsPerCommandMax}
	c.queue = make(chan *pending, InflightPerConnMax)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.execLoop(cfg)
	}()
	c.readLoop(cfg)
	close(c.queue)
	wg.Wait()
}

// handshake reads commands until AUTH (or HELLO ... AUTH) succeeds; only
// AUTH, HELLO and QUIT are served before it. handshake_timeout bounds the
// whole handshake, TLS included. It returns false when the connection is
// finished.
func (c *conn) handshake(cfg server.Config) bool {
	c.nc.SetReadDeadline(time.Now().Add(cfg.HandshakeTimeout))
	for n := 0; ; n++ {
		if n == preAuthCommandsMax {
			c.h.Warn().Int("commands", n).Msg("closing: no successful AUTH within the commands allowed before it")
			c.writeNow(cfg, errorReply("ERR too many commands before AUTH"))
			return false
		}
		cmd, err := c.rd.read()
		if err != nil {
			if errors.Is(err, errProtocol) || errors.Is(err, errTooLarge) {
				c.s.stats.protocolError.Add(1)
				c.h.Warn().Err(err).Msg("closing: bad command before AUTH")
				c.writeNow(cfg, errorReply("ERR "+err.Error()))
			}
			return false
		}
		if len(cmd.args) == 0 {
			continue
		}
		w := &reply{}
		done, authed := c.preAuth(cmd.args, w)
		if len(w.b) > 0 && !c.writeNow(cfg, w.b) {
			return false
		}
		switch {
		case done:
			return false
		case authed:
			c.nc.SetReadDeadline(time.Time{})
			return true
		}
	}
}

// writeNow writes b with the write timeout (before authentication, and
// a last answer before a close); false when it failed.
func (c *conn) writeNow(cfg server.Config, b []byte) bool {
	c.nc.SetWriteDeadline(time.Now().Add(cfg.WriteTimeout))
	_, err := c.nc.Write(b)
	return err == nil
}

// readLoop reads commands and queues them for the executor, each holding
// a slot of the queue and RequestBytesReserved of response budget from
// before it is read: a client over its pipeline depth, or not reading its
// answers, is no longer read.
func (c *conn) readLoop(cfg server.Config) {
	ctx := c.h.Context()
	for {
		if ctx.Err() != nil {
			return
		}
		if !c.h.Reserve() {
			return
		}
		held := int64(server.RequestBytesReserved)
		if err := c.awaitCommand(cfg); err != nil {
			c.h.Release(held)
			c.endOfStream(cfg, err)
			return
		}
		c.dr.inCommand, c.dr.armed = true, false
		cmd, err := c.rd.read()
		c.dr.inCommand = false
		p := &pending{cmd: cmd, held: held, answeredAll: c.inflight.Load() == 0}
		switch {
		case errors.Is(err, errTooLarge):
			p.cmd, p.fail = nil, "ERR "+err.Error()+" (CommandBytesMax)"
		case errors.Is(err, errProtocol):
			c.s.stats.protocolError.Add(1)
			c.h.Warn().Err(err).Msg("closing: protocol error")
			p.cmd, p.fail, p.closeAfter = nil, "ERR "+err.Error(), true
		case err != nil:
			c.h.Release(held)
			c.readFailed(cfg, err)
			return
		case len(cmd.args) == 0:
			c.h.Release(held)
			continue
		default:
			// What is read ahead is bounded by the request budgets: past
			// the connection's, the next command is not read.
			charged, ok, throttled := c.h.ChargeRequest(int64(cmd.bytes))
			switch {
			case throttled != nil:
				p.cmd, p.fail = nil, errorText(throttled, true)
			case !ok:
				c.h.Release(held)
				return
			default:
				p.body = charged
			}
		}
		if !c.enqueue(p) {
			return
		}
		if p.closeAfter || (p.cmd != nil && isQuit(p.cmd.args)) {
			// Nothing after QUIT or a protocol error is read.
			return
		}
	}
}

// testingAnsweredAllOff plants the gap answeredAll closes: every paced
// command counts as pipelined, so a compliant client's command after an
// admitted answer waits for its tenant's flooders' turns.
var testingAnsweredAllOff bool

// enqueue hands p to the executor; false when the connection ended
// first (then p's budget is given back).
func (c *conn) enqueue(p *pending) bool {
	c.inflight.Add(1)
	select {
	case c.queue <- p:
		return true
	case <-c.h.Context().Done():
		c.inflight.Add(-1)
		c.h.Release(p.held)
		c.h.ReleaseRequest(p.body)
		return false
	}
}

// awaitCommand waits for the first byte of the next command: up to
// idle_timeout at a time, for as long as commands are in flight.
func (c *conn) awaitCommand(cfg server.Config) error {
	br := c.rd.br
	for br.Buffered() == 0 {
		c.nc.SetReadDeadline(time.Now().Add(cfg.IdleTimeout))
		_, err := br.Peek(1)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if c.inflight.Load() == 0 {
			return errIdle
		}
	}
	return nil
}

// endOfStream handles the end of reading between commands. A clean EOF
// lets the queued commands run and their answers go out (the executor
// closes the connection after the last); anything else closes now.
func (c *conn) endOfStream(cfg server.Config, err error) {
	switch {
	case errors.Is(err, io.EOF):
	case errors.Is(err, errIdle):
		c.h.Close(fmt.Sprintf("idle for %v (idle_timeout)", cfg.IdleTimeout))
	default:
		c.h.Close("read: " + err.Error())
	}
}

// readFailed closes the connection after a read error inside a command.
func (c *conn) readFailed(cfg server.Config, err error) {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.h.Warn().Dur("frame_timeout", cfg.FrameTimeout).Msg("closing: a command did not arrive within frame_timeout of its first byte")
		c.h.Close("frame timeout")
		return
	}
	c.h.Close("read: " + err.Error())
}

// execLoop runs the queued commands in order and writes their answers,
// flushing when nothing more is queued (write coalescing), a buffer's
// worth is waiting or a large answer was written; each answer's bytes
// stay charged to the budgets until the flush hands them to the kernel.
// It returns when the queue is closed and drained.
func (c *conn) execLoop(cfg server.Config) {
	ctx := c.h.Context()
	bw := bufio.NewWriterSize(c.nc, writeBufferBytes)
	var unflushed int64 // budget charged for answers in bw
	var answered int32  // commands whose answers are in bw
	dead := false
	flush := func() {
		if !dead && bw.Buffered() > 0 {
			c.nc.SetWriteDeadline(time.Now().Add(cfg.WriteTimeout))
			if err := bw.Flush(); err != nil {
				dead = true
				c.h.Close("write: " + err.Error())
			}
		}
		c.h.Release(unflushed)
		c.inflight.Add(-answered)
		unflushed, answered = 0, 0
	}
	for p := range c.queue {
		// A client pipelining on through its -BUSY answers runs one
		// command per retry-after (kv/server refused_pace.go); what it
		// was answered goes out first.
		if !dead && c.h.Paced() {
			flush()
			c.h.WaitPace(p.answeredAll && !testingAnsweredAllOff)
		}
		if dead || ctx.Err() != nil {
			// Closed: give back what the command holds, unanswered.
			c.h.Release(p.held)
			c.h.ReleaseRequest(p.body)
			c.inflight.Add(-1)
			continue
		}
		b, held, closeAfter, request := c.run(ctx, cfg, p)
		if busy, retryAfter := busyRetryAfter(b); busy || request {
			// Only backend requests' answers, and every -BUSY, count
			// for pacing: a PING or a malformed command slipped between
			// refused GETs must not end their run.
			c.h.Answered(busy, retryAfter)
		}
		c.h.ReleaseRequest(p.body)
		if _, err := bw.Write(b); err != nil && !dead {
			dead = true
			c.h.Close("write: " + err.Error())
		}
		unflushed += held
		answered++
		// A large answer went to the kernel as it was written (bufio
		// writes through what does not fit its buffer): give its bytes
		// back now, not after the rest of a pipeline, or a client reading
		// every answer at once sees its third megabyte GET in a row -BUSY.
		if closeAfter || len(c.queue) == 0 || bw.Buffered() >= writeBufferBytes/2 || len(b) >= writeBufferBytes/2 {
			flush()
		}
		if closeAfter {
			dead = true
			c.h.Close("closed after the last answer")
		}
	}
	flush()
	// The reader stopped on a clean EOF (or the connection was closed):
	// every answer is out, so the connection ends here.
	c.h.Close("end of stream")
}

// run executes one command and returns its answer, the budget it holds
// (exactly the answer's size, or the request's reservation when the
// answer did not fit and was replaced by an error), and whether it asked
// the backend (request).
func (c *conn) run(ctx context.Context, cfg server.Config, p *pending) (b []byte, held int64, closeAfter, request bool) {
	w := &reply{resp3: c.resp3}
	held = p.held
	if p.cmd == nil {
		w.err(p.fail)
		c.s.stats.errors.Add(1)
		closeAfter = p.closeAfter
	} else {
		c.s.stats.commands.Add(1)
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
		x := &exec{c: c, ctx: rctx, w: w, held: held, cmd: p.cmd}
		closeAfter = c.dispatch(x)
		cancel()
		held, request = x.held, x.request
		c.s.observe(start)
	}
	n := int64(len(w.b))
	if !c.h.Fit(held, n) {
		c.h.Throttled()
		busy := &reply{resp3: c.resp3}
		busy.err(errorText(server.BudgetThrottled(n), false))
		w = busy
		n = int64(len(w.b))
		c.h.Fit(held, n) // gives back the rest: an error fits any reservation
	}
	return w.b, n, closeAfter, request
}

// busyRetryAfter reports whether answer b is -BUSY, and its retry-after
// (errorText's "-BUSY retry-after-ms N ...").
func busyRetryAfter(b []byte) (bool, time.Duration) {
	const prefix = "-BUSY retry-after-ms "
	if !bytes.HasPrefix(b, []byte(prefix)) {
		return false, 0
	}
	ms := 0
	for _, d := range b[len(prefix):] {
		if d < '0' || d > '9' || ms > 1_000_000 {
			break
		}
		ms = ms*10 + int(d-'0')
	}
	return true, time.Duration(ms) * time.Millisecond
}

// errorReply is an error answer on its own.
func errorReply(msg string) []byte {
	w := &reply{}
	w.err(msg)
	return w.b
}
