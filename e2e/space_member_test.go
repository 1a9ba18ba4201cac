package e2e

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"synod/kv/client"
)

// TestFollowerDiskReserveHoldsWrites: a follower whose disk is below its
// own reserve (here a reserve larger than any disk, on that follower only)
// makes the leader refuse growing writes with NO_SPACE naming it, since
// the follower could not refuse the committed writes it has no room for;
// deletes and reads are still served. A member that stops reporting (here
// paused with SIGSTOP, then killed) stops holding writes back within the
// reports' lifetime, a paused one counts again once continued, and a
// follower back with room lets writes through again. Every acknowledged
// write is read back from the follower once it caught up.
func TestFollowerDiskReserveHoldsWrites(t *testing.T) {
	c := &cluster{t: t, dir: t.TempDir()}
	mode := c.pmemDir("synod-e2e-member-disk-")
	for i := 1; i <= 3; i++ {
		nd := loopbackNode(t, i)
		nd.resp = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		c.nodes = append(c.nodes, nd)
	}
	write := func(nd *node, tables string) { c.writeConfig(nd, 62, mode, "", tables, []tenant{tenantA}) }
	for _, nd := range c.nodes {
		write(nd, "")
	}
	t.Cleanup(func() { c.stopAll(true) })
	for _, nd := range c.nodes {
		c.start(nd)
	}
	leader := c.leader()
	a := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer a.Close()
	ctx, cancel := ctxTimeout(3 * time.Minute)
	defer cancel()

	acked := map[string]string{}
	put := func(k, v string) error {
		err := a.Put(ctx, []byte(k), []byte(v))
		if err == nil {
			acked[k] = v
		}
		return err
	}
	for i := range 20 {
		if err := put(fmt.Sprintf("k-%03d", i), "before"); err != nil {
			t.Fatalf("put before: %v", err)
		}
	}

	// A follower restarts short of disk (by its own reserve).
	f := c.other(leader)
	write(f, fmt.Sprintf("[limits]\ndisk_free_min_bytes = %d\n", reserveAboveFree(t, c.dir)))
	if err := c.term(f); err != nil {
		t.Fatal(err)
	}
	c.start(f)
	start := time.Now()
	var refusal error
	for i := 0; ; i++ {
		err := put(fmt.Sprintf("probe-%03d", i), "x")
		if errors.Is(err, client.ErrNoSpace) {
			refusal = err
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("30 s after node %d came back below its reserve, puts still answer %v (want NO_SPACE)", f.id, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	refusedAfter := time.Since(start)
	fLeads := c.leader() == f
	if fLeads {
		// It took over: its own disk check refuses, also NO_SPACE.
		t.Logf("node %d leads now; refusal: %v", f.id, refusal)
	} else if !strings.Contains(refusal.Error(), fmt.Sprintf("node %d's disk", f.id)) {
		t.Fatalf("the refusal does not name node %d: %v", f.id, refusal)
	}
	if err := a.Delete(ctx, []byte("k-000")); err != nil {
		t.Fatalf("a delete while a member is below its reserve: %v", err)
	}
	delete(acked, "k-000")
	if v, err := a.Get(ctx, []byte("k-001")); err != nil || string(v) != "before" {
		t.Fatalf("a read while a member is below its reserve: %q, %v", v, err)
	}
	// The same through RESP, whose DEL is a BATCH that checks the value
	// read and then deletes (an outside tester found it refused -OOM, so
	// a Redis client could not make room): SET is -OOM, DEL and GETDEL pass.
	rc := respClient(t, c.respAddrs(), tenantA.token, 0)
	if err := rc.Set(ctx, "resp-new", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("RESP SET while a member is below its reserve: %v, want -OOM", err)
	}
	if n, err := rc.Del(ctx, "k-002", "k-003").Result(); err != nil || n != 2 {
		t.Fatalf("RESP DEL while a member is below its reserve: %d, %v", n, err)
	}
	if v, err := rc.GetDel(ctx, "k-004").Result(); err != nil || v != "before" {
		t.Fatalf("RESP GETDEL while a member is below its reserve: %q, %v", v, err)
	}
	for _, k := range []string{"k-002", "k-003", "k-004"} {
		delete(acked, k)
	}
	refused := 0.0
	for _, nd := range c.nodes {
		refused += metricValue(nd, `synod_space_refused_total{reason="member_disk"}`)
	}
	low := metricValue(c.leader(), "synod_space_members_below_reserve")
	if fLeads {
		low = 1 // its own disk is not a member's report
	}

	// The short member is paused (SIGSTOP): its last report stops
	// counting, writes resume; continued, it reports and counts again.
	if err := f.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for i := 0; ; i++ {
		err := put(fmt.Sprintf("paused-%03d", i), "x")
		if err == nil {
			break
		}
		if !errors.Is(err, client.ErrNoSpace) || time.Since(start) > 30*time.Second {
			f.cmd.Process.Signal(syscall.SIGCONT)
			t.Fatalf("with the short member paused for %v: %v", time.Since(start), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	resumedPaused := time.Since(start)
	if err := f.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for i := 0; ; i++ {
		err := put(fmt.Sprintf("continued-%03d", i), "x")
		if errors.Is(err, client.ErrNoSpace) {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("%v after the short member continued, puts still answer %v (want NO_SPACE)", time.Since(start), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	countedAgain := time.Since(start)

	// The short member goes down: its last report stops counting.
	c.kill(f)
	start = time.Now()
	for i := 0; ; i++ {
		err := put(fmt.Sprintf("down-%03d", i), "x")
		if err == nil {
			break
		}
		if !errors.Is(err, client.ErrNoSpace) || time.Since(start) > 30*time.Second {
			t.Fatalf("with the short member down for %v: %v", time.Since(start), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	resumedDown := time.Since(start)

	// Back with room: writes pass, and it holds every acknowledged write.
	write(f, "")
	c.start(f)
	for i := range 20 {
		if err := put(fmt.Sprintf("after-%03d", i), "after"); err != nil {
			t.Fatalf("put with every member back with room: %v", err)
		}
	}
	st, err := c.status(c.leader())
	if err != nil {
		t.Fatal(err)
	}
	c.waitCaughtUp(f, st.Applied)
	fc := dialClient(t, c.endpoints(f), tenantA.token, killClientRetries)
	defer fc.Close()
	lost := 0
	for k, v := range acked {
		got, err := fc.GetStale(ctx, []byte(k))
		if err != nil || string(got) != v {
			lost++
			t.Errorf("node %d: %s = %q, %v; want %q", f.id, k, got, err, v)
		}
	}
	for _, nd := range c.nodes {
		if !nd.running() {
			t.Fatalf("node %d exited", nd.id)
		}
	}
	if refused < 1 || low != 1 {
		t.Fatalf("metrics: refused{member_disk}=%v members_below_reserve=%v on the leader, want >= 1 and 1", refused, low)
	}
	fmt.Printf("e2e member disk reserve: short_node=%d refused_after=%s refused=NO_SPACE deletes_ok=true resumed_with_member_paused_after=%s counted_again_after=%s resumed_with_member_down_after=%s acked=%d lost=%d\n",
		f.id, refusedAfter.Round(100*time.Millisecond), resumedPaused.Round(100*time.Millisecond), countedAgain.Round(100*time.Millisecond),
		resumedDown.Round(100*time.Millisecond), len(acked), lost)
}
