package server

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/tenants"
)

// refuseAll answers every GET THROTTLED with retryAfter, except the keys
// "ok", and counts the requests it saw.
type refuseAll struct {
	retryAfter time.Duration
	calls      atomic.Int64
}

func (b *refuseAll) Do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
	b.calls.Add(1)
	if string(req.Key) == "ok" {
		return &proto.Response{Value: []byte("v")}
	}
	r := proto.Errorf(proto.StatusThrottled, "refused")
	r.RetryAfter = b.retryAfter
	return r
}

// TestRefusedConnectionPaced: a connection pipelining on through its
// THROTTLED answers is read, once refusedRunPacedMin answers in a row were
// THROTTLED, one frame per retry-after (refused_pace.go): the frames past
// the run take at least their retry-afters to be answered, and are
// counted paced. A client that waits each retry-after before it sends is
// not paced, though still refused; a paced connection stays paced
// through a lone answer that is not THROTTLED, and two in a row end the
// run; a connection whose refusals are interleaved with answers, never 64
// in a row, is never paced.
func TestRefusedConnectionPaced(t *testing.T) {
	const retryAfter = 2 * time.Millisecond
	const past = proto.InflightPerConnMax + 40 // frames sent past the run
	be := &refuseAll{retryAfter: retryAfter}
	s, addr := start(t, be, Config{})
	c := dialRaw(t, addr)
	c.hello(tokenA)
	get := func(frames []byte, id int, key string) []byte {
		return proto.AppendRequest(frames, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: uint64(id), Key: []byte(key)})
	}
	// Interleaved: never paced. (Answers of pipelined requests go out in
	// the order they finish, so an answer every 16 keeps every run of
	// refusals well under the threshold however they reorder.)
	var frames []byte
	for i := range 4 * refusedRunPacedMin {
		key := "no"
		if i%(refusedRunPacedMin/4) == refusedRunPacedMin/4-1 {
			key = "ok"
		}
		frames = get(frames, i+1, key)
	}
	go c.nc.Write(frames)
	for range 4 * refusedRunPacedMin {
		c.mustRecv()
	}
	if n := s.Stats().FramesPaced; n != 0 {
		t.Fatalf("%d frames paced on a connection whose refusals were interleaved with answers", n)
	}
	// A run: the frames past it are paced.
	frames = nil
	for i := range refusedRunPacedMin + past {
		frames = get(frames, 10_000+i, "no")
	}
	go c.nc.Write(frames)
	var runEnd time.Time
	for i := range refusedRunPacedMin + past {
		if r := c.mustRecv(); r.Status != proto.StatusThrottled {
			t.Fatalf("answer %d: %v", i, r.Status)
		}
		if i == refusedRunPacedMin-1 {
			runEnd = time.Now()
		}
	}
	took := time.Since(runEnd)
	// The reader may have read up to a pipeline's depth ahead before the
	// run was complete (so at least past-InflightPerConnMax frames are
	// read in it; half that is asked, for a slow machine's gaps); each
	// frame it read in the run waits a retry-after since the last.
	paced := s.Stats().FramesPaced
	if paced < (past-proto.InflightPerConnMax)/2 || took < time.Duration(paced-1)*retryAfter {
		t.Fatalf("%d frames past a run of %d refusals answered in %v, %d counted paced; want at least %d paced, each a retry-after (%v) apart",
			past, refusedRunPacedMin, took, paced, (past-proto.InflightPerConnMax)/2, retryAfter)
	}
	runPaced := paced
	// Still in the run, a client that waits each retry-after before it
	// sends is not paced.
	for i := range 10 {
		time.Sleep(retryAfter + time.Millisecond)
		c.send(get(nil, 40_000+i, "no"))
		if r := c.mustRecv(); r.Status != proto.StatusThrottled {
			t.Fatalf("a waiting client's GET: %v", r.Status)
		}
	}
	if n := s.Stats().FramesPaced - paced; n != 0 {
		t.Fatalf("%d frames of a client waiting its retry-afters paced", n)
	}
	// A flooder whose refusals an admitted request breaks now and then (a
	// tenant's rate bucket admitting one per retry-after) stays paced:
	// a lone answer does not end the run. (With the run ended by any answer, an
	// outside tester's flooder of a 100 ops/s tenant got 64 refusals at
	// full speed after each admitted GET: 6,472 answers a second.)
	paced = s.Stats().FramesPaced
	frames = nil
	const sporadic = 40
	for i := range sporadic {
		key := "no"
		if i%4 == 3 {
			key = "ok"
		}
		frames = get(frames, 45_000+i, key)
	}
	go c.nc.Write(frames)
	for range sporadic {
		c.mustRecv()
	}
	sporadicPaced := s.Stats().FramesPaced - paced
	if sporadicPaced < sporadic/2 {
		t.Fatalf("%d of %d frames paced on a paced connection whose every fourth request was answered; want at least %d", sporadicPaced, sporadic, sporadic/2)
	}
	// Two answers in a row end the run.
	for i := range 2 {
		c.send(get(nil, 50_000+i, "ok"))
		if r := c.mustRecv(); r.Status != proto.StatusOK {
			t.Fatalf("ok: %v", r.Status)
		}
	}
	paced = s.Stats().FramesPaced
	frames = nil
	for i := range refusedRunPacedMin - 1 {
		frames = get(frames, 60_000+i, "no")
	}
	c.send(frames)
	for range refusedRunPacedMin - 1 {
		c.mustRecv()
	}
	if n := s.Stats().FramesPaced - paced; n > 1 {
		t.Fatalf("%d frames paced after two answers ended the run", n)
	}
	fmt.Printf("refused pacing: run=%d past=%d paced=%d took=%v retry_after=%v; every fourth answered: paced=%d of %d\n",
		refusedRunPacedMin, past, runPaced, took.Round(time.Millisecond), retryAfter, sporadicPaced, sporadic)
}

// TestPaceCarriedToTenantsNewConnection: a connection a tenant opens
// within tenantPaceCarryOver of a refusal in another of its connections'
// paced runs starts paced (refused_pace.go), so a flooder that reconnects
// once paced is not refused refusedRunPacedMin times at full speed on
// each new connection; another tenant's connection, and the tenant's
// after the carry-over, start unpaced. Planted (testingNoTenantMark): the
// reconnected flooder's frames go at full speed.
func TestPaceCarriedToTenantsNewConnection(t *testing.T) {
	const frames = 40
	paced, line := reconnectPaced(t, frames)
	if paced < frames/2 {
		t.Fatalf("%s: want at least %d of its %d frames paced", line, frames/2, frames)
	}
	testingNoTenantMark = true
	defer func() { testingNoTenantMark = false }()
	plantedPaced, plantedLine := reconnectPaced(t, frames)
	if plantedPaced >= frames/2 {
		t.Fatalf("planted (no tenant mark): %s: the test does not show the gap", plantedLine)
	}
	fmt.Printf("tenant pace: %s; planted (no tenant mark): %s\n", line, plantedLine)
}

// reconnectPaced paces one connection of tenant 1, closes it, opens
// another and pipelines frames refused GETs there; it returns how many of
// them were paced, and a line.
func reconnectPaced(t *testing.T, frames int) (int, string) {
	const retryAfter = 2 * time.Millisecond
	be := &refuseAll{retryAfter: retryAfter}
	s, addr := start(t, be, Config{})
	get := func(b []byte, id int) []byte {
		return proto.AppendRequest(b, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: uint64(id), Key: []byte("no")})
	}
	flood := func(c *rawConn, n, id int) time.Duration {
		var b []byte
		for i := range n {
			b = get(b, id+i)
		}
		start := time.Now()
		go c.nc.Write(b)
		for i := range n {
			if r := c.mustRecv(); r.Status != proto.StatusThrottled {
				t.Fatalf("answer %d: %v", i, r.Status)
			}
		}
		return time.Since(start)
	}
	a := dialRaw(t, addr)
	a.hello(tokenA)
	flood(a, refusedRunPacedMin+8, 1)
	a.nc.Close()
	// Another tenant's connection is not paced at HELLO.
	other := dialRaw(t, addr)
	other.hello(tokenB)
	if n := s.Stats().ConnsPacedAtHello; n != 0 {
		t.Fatalf("another tenant's connection paced at HELLO (%d)", n)
	}
	b := dialRaw(t, addr)
	b.hello(tokenA)
	atHello := s.Stats().ConnsPacedAtHello
	before := s.Stats().FramesPaced
	took := flood(b, frames, 1_000)
	paced := int(s.Stats().FramesPaced - before)
	if testingNoTenantMark == (atHello != 0) || took < time.Duration(paced-1)*retryAfter {
		t.Fatalf("reconnected: paced_at_hello=%d, %d of %d frames paced in %v (retry-after %v)", atHello, paced, frames, took, retryAfter)
	}
	// Past the carry-over, and with no refusal since, a new connection
	// starts unpaced.
	b.nc.Close()
	time.Sleep(tenantPaceCarryOver + 100*time.Millisecond)
	d := dialRaw(t, addr)
	d.hello(tokenA)
	if n := s.Stats().ConnsPacedAtHello; n != atHello {
		t.Fatalf("a connection opened %v after the tenant's last paced refusal paced at HELLO", tenantPaceCarryOver+100*time.Millisecond)
	}
	return paced, fmt.Sprintf("paced_at_hello=%d frames=%d paced=%d took=%v", atHello, frames, paced, took.Round(time.Millisecond))
}

// TestTenantsPacedConnectionsShareTurns: a tenant's paced connections
// together are read one frame per retry-after (tenantPace.reserve), not
// one per retry-after each: sixteen of them pipelining ten refused GETs
// each take about 160 retry-afters, not ten. Planted
// (testingOwnTurns): about ten.
func TestTenantsPacedConnectionsShareTurns(t *testing.T) {
	took, line := sharedTurns(t)
	const conns, each = 16, 10
	const retryAfter = sharedTurnsRetryAfter
	if want := conns * each / 2 * retryAfter; took < want {
		t.Fatalf("%s: want at least %v", line, want)
	}
	testingOwnTurns = true
	defer func() { testingOwnTurns = false }()
	plantedTook, plantedLine := sharedTurns(t)
	if plantedTook >= conns*each/2*retryAfter {
		t.Fatalf("planted (each connection its own turns): %s: the test does not show the gap", plantedLine)
	}
	fmt.Printf("tenant turns: %s; planted (own turns): %s\n", line, plantedLine)
}

// sharedTurnsRetryAfter is the refusals' retry-after in sharedTurns:
// long enough that sixteen connections' own turns (ten each, 100 ms)
// stay well under the bound (800 ms) on a loaded machine (under three CPU
// hogs the planted run took up to 266 ms with eight).
const sharedTurnsRetryAfter = 10 * time.Millisecond

// sharedTurns paces one connection of tenant 1, opens fifteen more, and
// has all sixteen pipeline ten refused GETs at once; it returns how long
// the 160 answers took, and a line.
func sharedTurns(t *testing.T) (time.Duration, string) {
	const conns, each = 16, 10
	const retryAfter = sharedTurnsRetryAfter
	be := &refuseAll{retryAfter: retryAfter}
	s, addr := start(t, be, Config{})
	get := func(b []byte, id int) []byte {
		return proto.AppendRequest(b, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: uint64(id), Key: []byte("no")})
	}
	pipeline := func(c *rawConn, n, id int) {
		var b []byte
		for i := range n {
			b = get(b, id+i)
		}
		go c.nc.Write(b)
		for i := range n {
			if r := c.mustRecv(); r.Status != proto.StatusThrottled {
				t.Errorf("answer %d: %v", i, r.Status)
				return
			}
		}
	}
	cs := make([]*rawConn, conns)
	cs[0] = dialRaw(t, addr)
	cs[0].hello(tokenA)
	pipeline(cs[0], refusedRunPacedMin+8, 1)
	for i := 1; i < conns; i++ {
		cs[i] = dialRaw(t, addr)
		cs[i].hello(tokenA)
	}
	before := s.Stats().FramesPaced
	start := time.Now()
	done := make(chan struct{})
	for i, c := range cs {
		go func() {
			defer func() { done <- struct{}{} }()
			pipeline(c, each, 10_000*(i+1))
		}()
	}
	for range cs {
		<-done
	}
	took := time.Since(start)
	return took, fmt.Sprintf("conns=%d frames_each=%d paced_at_hello=%d paced=%d took=%v retry_after=%v",
		conns, each, s.Stats().ConnsPacedAtHello, s.Stats().FramesPaced-before, took.Round(time.Millisecond), retryAfter)
}

// TestTenantTurnsBounded: the tenant's next turn stays within a turn per
// paced connection of now (tenantPace.next's bound): N readers, each
// taking its next turn as soon as its last one came and its own pace
// allows, never push it further. Planted (each reserve takes two turns'
// room): caught.
func TestTenantTurnsBounded(t *testing.T) {
	const conns, after = 16, 7 * time.Millisecond
	if worst := turnsAhead(conns, after, 1); worst > (conns+1)*after {
		t.Fatalf("next turn %v ahead of now with %d paced connections at %v; want at most %v", worst, conns, after, (conns+1)*after)
	}
	if worst := turnsAhead(conns, after, 2); worst <= (conns+1)*after {
		t.Fatalf("planted (two turns per frame): next turn at most %v ahead: the check does not catch it", worst)
	}
}

// turnsAhead simulates conns readers of one tenant, each reserving its
// next frame's turn once the last one came (its own pace a retry-after
// after it), for 1,000 turns, each reservation taking span turns, and
// returns how far the tenant's next turn got ahead of now.
func turnsAhead(conns int, after time.Duration, span int) time.Duration {
	var p tenantPace
	now := time.Duration(0)
	turns := make([]time.Duration, conns)
	for i := range turns {
		turns[i] = p.reserve(now, time.Duration(span)*after)
	}
	worst := time.Duration(0)
	for range 1000 {
		i := 0
		for j := range turns {
			if turns[j] < turns[i] {
				i = j
			}
		}
		now = turns[i]
		turns[i] = p.reserve(now+after, time.Duration(span)*after)
		worst = max(worst, time.Duration(p.next.Load())-now)
	}
	return worst
}

// TestTenantRunMarksReconnects: a flooder that closes each connection
// after 32 refused GETs, never 64 on one, still marks its tenant once 64
// of its answers in a row, on any of its connections, were THROTTLED (the
// tenant's run): its next connections start paced. Planted
// (testingNoTenantRun): none does (an outside tester closing after 63:
// 122-133k answers a second, never paced).
func TestTenantRunMarksReconnects(t *testing.T) {
	atHello, line := reconnectEvery(t, refusedRunPacedMin/2, 4)
	if atHello < 2 {
		t.Fatalf("%s: want the connections after the tenant's 64th refusal paced at HELLO", line)
	}
	testingNoTenantRun = true
	defer func() { testingNoTenantRun = false }()
	plantedAtHello, plantedLine := reconnectEvery(t, refusedRunPacedMin/2, 4)
	if plantedAtHello != 0 {
		t.Fatalf("planted (no tenant run): %s: the test does not show the gap", plantedLine)
	}
	fmt.Printf("tenant run: %s; planted (no tenant run): %s\n", line, plantedLine)
}

// reconnectEvery opens conns connections of tenant 1 one after another,
// each pipelining per refused GETs; it returns how many were paced at
// HELLO, and a line.
func reconnectEvery(t *testing.T, per, conns int) (uint64, string) {
	const retryAfter = 2 * time.Millisecond
	s, addr := start(t, &refuseAll{retryAfter: retryAfter}, Config{})
	for k := range conns {
		c := dialRaw(t, addr)
		c.hello(tokenA)
		var b []byte
		for i := range per {
			b = proto.AppendRequest(b, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: uint64(k*1000 + i + 1), Key: []byte("no")})
		}
		go c.nc.Write(b)
		for range per {
			if r := c.mustRecv(); r.Status != proto.StatusThrottled {
				t.Fatalf("connection %d: %v", k, r.Status)
			}
		}
		c.nc.Close()
	}
	st := s.Stats()
	return st.ConnsPacedAtHello, fmt.Sprintf("conns=%d per_conn=%d paced_at_hello=%d paced=%d", conns, per, st.ConnsPacedAtHello, st.FramesPaced)
}

// TestTurnsSpareFramesSentInTime: a client of a flooding tenant that
// waits its retry-after before each request, on a connection opened while
// 32 of the tenant's paced connections hold a turn each (1.6 s of them),
// waits for none of them: its first frame waits one retry-after, the
// others none. Planted (testingTurnsForAll: every paced frame takes a
// turn): it waits behind the flood (an outside tester: up to 1 s a frame,
// 10 s for one request).
func TestTurnsSpareFramesSentInTime(t *testing.T) {
	line, plantedLine := turnsSpared(t, false, &testingTurnsForAll, "turns for every frame")
	fmt.Printf("turns spare frames in time: %s; planted (turns for all): %s\n", line, plantedLine)
}

// TestTurnsSpareFramesAfterAdmitted: a compliant client on a connection
// paced from HELLO (its tenant's other connections flood), whose GET was
// admitted, sends its next GET 1 ms after that answer: no retry-after was
// asked, so the frame takes no turn behind the flooders' (refused_pace.go,
// takesTurn); it waits at most its own pace. Planted
// (testingTurnsAfterAdmitted): it waits for the turns, about 1.6 s.
func TestTurnsSpareFramesAfterAdmitted(t *testing.T) {
	line, plantedLine := turnsSpared(t, true, &testingTurnsAfterAdmitted, "turns after an admitted answer")
	fmt.Printf("turns spare frames after an admitted answer: %s; planted: %s\n", line, plantedLine)
}

// turnsSpared runs besideFlood(admitted), whose every answer must come
// within turnsSpareBound, then again with *planted set, which must show
// the gap (an answer past the bound); it returns both runs' lines.
func turnsSpared(t *testing.T, admitted bool, planted *bool, plantedName string) (string, string) {
	t.Helper()
	worst, line := besideFlood(t, admitted)
	if worst > turnsSpareBound {
		t.Fatalf("%s: want every request answered within %v", line, turnsSpareBound)
	}
	*planted = true
	defer func() { *planted = false }()
	plantedWorst, plantedLine := besideFlood(t, admitted)
	if plantedWorst <= turnsSpareBound {
		t.Fatalf("planted (%s): %s: the test does not show the gap", plantedName, plantedLine)
	}
	return line, plantedLine
}

// turnsSpareBound is the slowest answer the TestTurnsSpare tests
// accept: a retry-after and change, well under the 1.6 s of turns.
const turnsSpareBound = 800 * time.Millisecond

// besideFlood paces 32 connections of tenant 1 with 60 pipelined refused
// GETs each (at a 50 ms retry-after: each holds a turn, so a turn taken
// now comes about 1.6 s later), then opens one more and sends three GETs
// one at a time, each after the last answer's retry-after; it returns the
// slowest answer (the first over turnsSpareBound ends it), and a line.
// With admitted, the one more connection's GETs are refused, then
// admitted, then admitted again, the last sent 1 ms after the answer
// before it (an admitted answer asks for no wait), while the connection
// is still paced (one admitted answer does not end a run).
func besideFlood(t *testing.T, admitted bool) (time.Duration, string) {
	const retryAfter = 50 * time.Millisecond
	const flooders, each = 32, 60
	s, addr := start(t, &refuseAll{retryAfter: retryAfter}, Config{})
	get := func(b []byte, id int) []byte {
		return proto.AppendRequest(b, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: uint64(id), Key: []byte("no")})
	}
	first := dialRaw(t, addr)
	first.hello(tokenA)
	var b []byte
	for i := range refusedRunPacedMin {
		b = get(b, i+1)
	}
	go first.nc.Write(b)
	for range refusedRunPacedMin {
		first.mustRecv()
	}
	for k := range flooders {
		c := dialRaw(t, addr)
		c.hello(tokenA)
		var b []byte
		for i := range each {
			b = get(b, 10_000*(k+1)+i)
		}
		go c.nc.Write(b)
		go func() {
			for range each {
				if _, err := c.recv(); err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(200 * time.Millisecond) // the flooders' frames have come and taken their turns
	c := dialRaw(t, addr)
	c.hello(tokenA)
	keys, want, gaps := []string{"no", "no", "no"}, []proto.Status{proto.StatusThrottled, proto.StatusThrottled, proto.StatusThrottled},
		[]time.Duration{retryAfter + 2*time.Millisecond, retryAfter + 2*time.Millisecond, 0}
	if admitted {
		keys, want = []string{"no", "ok", "ok"}, []proto.Status{proto.StatusThrottled, proto.StatusOK, proto.StatusOK}
		gaps = []time.Duration{retryAfter + 2*time.Millisecond, time.Millisecond, 0}
	}
	var worst time.Duration
	for i := range keys {
		start := time.Now()
		c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: uint64(900_000 + i), Key: []byte(keys[i])}))
		if r := c.mustRecv(); r.Status != want[i] {
			t.Fatalf("compliant GET %d of %q: %v, want %v", i, keys[i], r.Status, want[i])
		}
		worst = max(worst, time.Since(start))
		if worst > turnsSpareBound {
			break
		}
		time.Sleep(gaps[i])
	}
	return worst, fmt.Sprintf("flooders=%d frames_each=%d retry_after=%v compliant_worst=%v paced_at_hello=%d",
		flooders, each, retryAfter, worst.Round(time.Millisecond), s.Stats().ConnsPacedAtHello)
}

// TestRefusedRunNotEndedByPings: PINGs (or malformed frames) slipped
// between refused GETs do not end their run (endsRefusedRun): a client
// that pipelines 32 refused GETs, reads their answers, sends a PING, and
// again, is paced once 64 GETs were refused. Planted by hand (every
// answer counted): paced=0.
func TestRefusedRunNotEndedByPings(t *testing.T) {
	const rounds, per = 10, refusedRunPacedMin / 2
	s, addr := start(t, &refuseAll{retryAfter: 2 * time.Millisecond}, Config{})
	c := dialRaw(t, addr)
	c.hello(tokenA)
	id := uint64(1)
	for range rounds {
		var b []byte
		for range per {
			b = proto.AppendRequest(b, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: id, Key: []byte("no")})
			id++
		}
		c.send(b)
		for range per {
			if r := c.mustRecv(); r.Status != proto.StatusThrottled {
				t.Fatalf("GET: %v", r.Status)
			}
		}
		c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpPing, Tenant: 1, ID: id}))
		id++
		if r := c.mustRecv(); r.Status != proto.StatusOK {
			t.Fatalf("PING: %v", r.Status)
		}
	}
	if n := s.Stats().FramesPaced; n < rounds*per/4 {
		t.Fatalf("%d of %d frames paced with a PING after every %d refused GETs; want at least %d", n, rounds*(per+1), per, rounds*per/4)
	}
	fmt.Printf("run through pings: frames=%d paced=%d\n", rounds*(per+1), s.Stats().FramesPaced)
}
