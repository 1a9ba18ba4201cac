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
