package resp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/kv/server"
	"synod/tenants"
)

// refusingBackend answers GET "ok" with a value and every other GET
// THROTTLED with retryAfter.
type refusingBackend struct{ retryAfter time.Duration }

func (b refusingBackend) Do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
	if req.Op == proto.OpGet && string(req.Key) != "ok" {
		r := proto.Errorf(proto.StatusThrottled, "refused")
		r.RetryAfter = b.retryAfter
		return r
	}
	return &proto.Response{Value: []byte("v"), HasValue: true}
}

// TestBusyConnectionPaced: a RESP connection pipelining on through its
// -BUSY answers runs, once 64 answers in a row were -BUSY, one command per
// retry-after (kv/server refused_pace.go), as a binary connection is read
// one frame per retry-after; two answers in a row that are not -BUSY end
// it.
func TestBusyConnectionPaced(t *testing.T) {
	const retryAfter = 2 * time.Millisecond
	const past = 40
	ts := startServer(t, server.Config{}, func(server.Backend) server.Backend { return refusingBackend{retryAfter} })
	r := dialRaw(t, ts.addr)
	r.send(encodeCommand("AUTH", specAlpha.Token))
	r.expect("+OK")
	var pipe []byte
	for range server.RefusedRunPacedMin + past {
		pipe = append(pipe, encodeCommand("GET", "no")...)
	}
	go r.nc.Write(pipe)
	var runEnd time.Time
	for i := range server.RefusedRunPacedMin + past {
		r.expect("-BUSY retry-after-ms 2 ")
		if i == server.RefusedRunPacedMin-1 {
			runEnd = time.Now()
		}
	}
	took := time.Since(runEnd)
	paced := ts.host.Stats().FramesPaced
	// Each command past the run runs a retry-after after the one before
	// it; it is counted paced only when it had to wait for that, so one
	// whose goroutine was descheduled past its retry-after (a loaded CI
	// machine: 39 of 40 once) is not counted, though it was not early.
	if paced > past || paced < past/2 || took < (past-1)*retryAfter {
		t.Fatalf("%d commands past a run of %d -BUSY answers: %d paced, answered in %v; want at least %d paced, each %v after the one before", past, server.RefusedRunPacedMin, paced, took, past/2, retryAfter)
	}
	// Two answers in a row end the run (the commands that gave them still
	// waited: they ran inside the run); one would not (kv/server
	// refused_pace.go).
	for range 2 {
		r.send(encodeCommand("GET", "ok"))
		r.expect("v")
	}
	runPaced := paced
	paced = ts.host.Stats().FramesPaced
	pipe = nil
	for range server.RefusedRunPacedMin - 1 {
		pipe = append(pipe, encodeCommand("GET", "no")...)
	}
	r.send(pipe)
	for range server.RefusedRunPacedMin - 1 {
		r.expect("-BUSY")
	}
	if n := ts.host.Stats().FramesPaced - paced; n != 0 {
		t.Fatalf("%d commands paced after two answers ended the run", n)
	}
	fmt.Printf("resp pacing: run=%d past=%d paced=%d took=%v\n", server.RefusedRunPacedMin, past, runPaced, took.Round(time.Millisecond))
}

// TestBusyPaceCarriedToNewConnection: a RESP connection its tenant opens
// right after another was paced starts paced (kv/server refused_pace.go,
// the tenant's mark): its pipelined commands run one per retry-after from
// the first, not 64 at full speed first.
func TestBusyPaceCarriedToNewConnection(t *testing.T) {
	const retryAfter = 2 * time.Millisecond
	const n = 20
	ts := startServer(t, server.Config{}, func(server.Backend) server.Backend { return refusingBackend{retryAfter} })
	flood := func(r *rawConn, cmds int) time.Duration {
		var pipe []byte
		for range cmds {
			pipe = append(pipe, encodeCommand("GET", "no")...)
		}
		start := time.Now()
		go r.nc.Write(pipe)
		for range cmds {
			r.expect("-BUSY")
		}
		return time.Since(start)
	}
	first := dialRaw(t, ts.addr)
	first.send(encodeCommand("AUTH", specAlpha.Token))
	first.expect("+OK")
	flood(first, server.RefusedRunPacedMin+4)
	first.nc.Close()
	second := dialRaw(t, ts.addr)
	second.send(encodeCommand("AUTH", specAlpha.Token))
	second.expect("+OK")
	took := flood(second, n)
	if st := ts.host.Stats(); st.ConnsPacedAtHello != 1 || took < (n-1)*retryAfter {
		t.Fatalf("the tenant's next connection: paced_at_hello=%d, %d commands answered in %v; want 1, each %v after the one before", st.ConnsPacedAtHello, n, took, retryAfter)
	}
	fmt.Printf("resp pace carried: commands=%d took=%v\n", n, took.Round(time.Millisecond))
}

// TestBusyReconnectsMarkTenant: a RESP flooder that closes each
// connection after 32 -BUSY answers, never 64 on one, marks its tenant
// by the tenant's run (kv/server refused_pace.go; AUTH's +OK does not end
// it): its connections after the 64th -BUSY start paced.
func TestBusyReconnectsMarkTenant(t *testing.T) {
	const retryAfter = 2 * time.Millisecond
	const per, conns = server.RefusedRunPacedMin / 2, 4
	ts := startServer(t, server.Config{}, func(server.Backend) server.Backend { return refusingBackend{retryAfter} })
	for range conns {
		r := dialRaw(t, ts.addr)
		r.send(encodeCommand("AUTH", specAlpha.Token))
		r.expect("+OK")
		var pipe []byte
		for range per {
			pipe = append(pipe, encodeCommand("GET", "no")...)
		}
		go r.nc.Write(pipe)
		for range per {
			r.expect("-BUSY")
		}
		r.nc.Close()
	}
	if n := ts.host.Stats().ConnsPacedAtHello; n < 2 {
		t.Fatalf("%d connections of %d (each %d -BUSY, then closed) paced at AUTH; want the two after the tenant's 64th", n, conns, per)
	}
	fmt.Printf("resp tenant run: conns=%d per_conn=%d paced_at_auth=%d\n", conns, per, ts.host.Stats().ConnsPacedAtHello)
}

// TestBusyRunNotEndedByLocalCommands: a PING (or any command no backend
// request serves) slipped between refused GETs does not end their run of
// -BUSY answers: a client pipelining 32 refused GETs and a PING, again
// and again, is paced once 64 GETs were refused. Planted by hand (every
// answer counted, as before): never paced (paced=0 of 330).
func TestBusyRunNotEndedByLocalCommands(t *testing.T) {
	const rounds, per = 10, server.RefusedRunPacedMin / 2
	ts := startServer(t, server.Config{}, func(server.Backend) server.Backend { return refusingBackend{2 * time.Millisecond} })
	r := dialRaw(t, ts.addr)
	r.send(encodeCommand("AUTH", specAlpha.Token))
	r.expect("+OK")
	var pipe []byte
	for range rounds {
		for range per {
			pipe = append(pipe, encodeCommand("GET", "no")...)
		}
		pipe = append(pipe, encodeCommand("PING")...)
	}
	go r.nc.Write(pipe)
	for range rounds {
		for range per {
			r.expect("-BUSY")
		}
		r.expect("+PONG")
	}
	if n := ts.host.Stats().FramesPaced; n < rounds*per/4 {
		t.Fatalf("%d of %d commands paced with a PING after every %d refused GETs; want at least %d", n, rounds*(per+1), per, rounds*per/4)
	}
	fmt.Printf("resp run through PINGs: commands=%d paced=%d\n", rounds*(per+1), ts.host.Stats().FramesPaced)
}

// TestBusyTurnsSpareCommandAfterAdmitted: beside 32 flooding RESP
// connections of its tenant, each holding a turn (so a turn taken now
// comes about 1.6 s later), a compliant RESP client of the same tenant
// opens a connection (which starts paced: the tenant is marked) and sends
// three GETs that are admitted, each 1 ms after the answer before it. An
// admitted answer asks for no wait, and each command came once every
// earlier one was answered, so none takes a turn (kv/server
// refused_pace.go, takesTurn), as a binary frame would not: the second
// waits only its connection's own pace (a retry-after since the first
// was read). Planted (testingAnsweredAllOff: every paced command counted
// as pipelined, the rule before), the second waited for the flooders'
// turns (1.64 s).
func TestBusyTurnsSpareCommandAfterAdmitted(t *testing.T) {
	worst, line := busyBesideFlood(t, false)
	if worst > busyTurnsSpareBound {
		t.Fatalf("%s: want every command answered within %v", line, busyTurnsSpareBound)
	}
	// The same three GETs pipelined are read before the first answer
	// goes out: they are early frames, and still take turns.
	piped, pipedLine := busyBesideFlood(t, true)
	if piped <= busyTurnsSpareBound {
		t.Fatalf("%s: want the turns waited", pipedLine)
	}
	testingAnsweredAllOff = true
	defer func() { testingAnsweredAllOff = false }()
	plantedWorst, plantedLine := busyBesideFlood(t, false)
	if plantedWorst <= busyTurnsSpareBound {
		t.Fatalf("planted (every paced command counted as pipelined): %s: the test does not show the gap", plantedLine)
	}
	fmt.Printf("resp turns spared after admitted: %s; %s; planted: %s\n", line, pipedLine, plantedLine)
}

// busyTurnsSpareBound is the slowest answer TestBusyTurnsSpare accepts:
// a retry-after and change, well under the 1.6 s of turns.
const busyTurnsSpareBound = 800 * time.Millisecond

// busyBesideFlood paces tenant alpha, starts 32 connections pipelining 60
// refused GETs each at a 50 ms retry-after, then opens one more that
// sends three admitted GETs one at a time, each 1 ms after the answer
// before it (pipelined: all three at once); it returns the slowest of the
// three answers and a line.
func busyBesideFlood(t *testing.T, pipelined bool) (time.Duration, string) {
	const retryAfter = 50 * time.Millisecond
	const flooders, each = 32, 60
	ts := startServer(t, server.Config{}, func(server.Backend) server.Backend { return refusingBackend{retryAfter} })
	auth := func() *rawConn {
		r := dialRaw(t, ts.addr)
		r.send(encodeCommand("AUTH", specAlpha.Token))
		r.expect("+OK")
		return r
	}
	pipeline := func(r *rawConn, n int) {
		var pipe []byte
		for range n {
			pipe = append(pipe, encodeCommand("GET", "no")...)
		}
		go r.nc.Write(pipe)
	}
	first := auth()
	pipeline(first, server.RefusedRunPacedMin)
	for range server.RefusedRunPacedMin {
		first.expect("-BUSY")
	}
	for range flooders {
		r := auth()
		pipeline(r, each)
		go func() {
			for range each {
				if _, err := r.line(); err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(200 * time.Millisecond) // the flooders' commands have come and taken their turns
	c := auth()
	var worst time.Duration
	if pipelined {
		start := time.Now()
		c.send(append(append(encodeCommand("GET", "ok"), encodeCommand("GET", "ok")...), encodeCommand("GET", "ok")...))
		for range 3 {
			c.expect("v")
		}
		worst = time.Since(start)
		return worst, fmt.Sprintf("pipelined worst=%v flooders=%d", worst.Round(time.Millisecond), flooders)
	}
	for range 3 {
		start := time.Now()
		c.send(encodeCommand("GET", "ok"))
		c.expect("v")
		worst = max(worst, time.Since(start))
		if worst > busyTurnsSpareBound {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return worst, fmt.Sprintf("worst=%v flooders=%d", worst.Round(time.Millisecond), flooders)
}
