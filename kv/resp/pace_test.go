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
// one frame per retry-after; the first answer that is not -BUSY ends it.
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
	if paced != past || took < (past-1)*retryAfter {
		t.Fatalf("%d commands past a run of %d -BUSY answers: %d paced, answered in %v; want all paced, %v apart", past, server.RefusedRunPacedMin, paced, took, retryAfter)
	}
	// One answer ends the run (the command that gave it still waited: it
	// ran inside the run).
	r.send(encodeCommand("GET", "ok"))
	r.expect("v")
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
		t.Fatalf("%d commands paced after an answer ended the run", n)
	}
	fmt.Printf("resp pacing: run=%d past=%d paced=%d took=%v\n", server.RefusedRunPacedMin, past, past, took.Round(time.Millisecond))
}
