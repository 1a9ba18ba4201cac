package main

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// postFaults posts form to srv's /debug/faults and returns the status.
func postFaults(t *testing.T, srv *httptest.Server, form url.Values) int {
	t.Helper()
	resp, err := http.PostForm(srv.URL+"/debug/faults", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestAdminPersistDelay: delay_persist sets the one-shot persist delay,
// refuses malformed and out-of-range durations without changing anything,
// leaves the blocked peers alone, and is not served with fault_injection
// off.
func TestAdminPersistDelay(t *testing.T) {
	r := newSoloReplica(t)
	post := func(srv *httptest.Server, form url.Values) int { return postFaults(t, srv, form) }
	off := httptest.NewServer(adminMux(r, prometheus.NewRegistry(), r.Faults(), false))
	defer off.Close()
	if code := post(off, url.Values{persistDelayField: {"1s"}}); code != http.StatusNotFound || r.Faults().PersistDelayPending() != 0 {
		t.Fatalf("fault_injection off: %d, pending %v", code, r.Faults().PersistDelayPending())
	}

	srv := httptest.NewServer(adminMux(r, prometheus.NewRegistry(), r.Faults(), true))
	defer srv.Close()
	if code := post(srv, url.Values{"block": {"2"}}); code != http.StatusOK {
		t.Fatalf("block: %d", code)
	}
	for _, bad := range []string{"", "soon", "-1s", "1h", "1e400s", "\x00"} {
		if code := post(srv, url.Values{persistDelayField: {bad}}); code != http.StatusBadRequest {
			t.Errorf("delay_persist=%q: %d, want 400", bad, code)
		}
	}
	if d := r.Faults().PersistDelayPending(); d != 0 {
		t.Fatalf("a refused delay was set: %v", d)
	}
	// A solo replica persists only when written to: the delay stays
	// pending until then.
	if code := post(srv, url.Values{persistDelayField: {"250ms"}}); code != http.StatusOK {
		t.Fatalf("delay_persist=250ms: %d", code)
	}
	if d := r.Faults().PersistDelayPending(); d != 250*time.Millisecond {
		t.Fatalf("pending delay %v, want 250ms", d)
	}
	if b := r.Faults().Blocked(); len(b) != 1 || b[0] != 2 {
		t.Fatalf("delay_persist changed the blocked peers: %v", b)
	}
	// In the query string, as examples/kvnode.toml's curl line sends it:
	// the same field, the same checks; it used to be ignored, and the
	// request taken for "block=" (everything healed).
	query := func(q string) int {
		t.Helper()
		resp, err := http.Post(srv.URL+"/debug/faults?"+q, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := query(persistDelayField + "=2m"); code != http.StatusBadRequest {
		t.Fatalf("?delay_persist=2m: %d, want 400", code)
	}
	if code := query(persistDelayField + "=1s"); code != http.StatusOK {
		t.Fatalf("?delay_persist=1s: %d", code)
	}
	if d := r.Faults().PersistDelayPending(); d != time.Second {
		t.Fatalf("?delay_persist=1s left %v pending, want 1s", d)
	}
	if b := r.Faults().Blocked(); len(b) != 1 || b[0] != 2 {
		t.Fatalf("?delay_persist changed the blocked peers: %v", b)
	}
	// A POST naming neither field is refused and heals nothing.
	if code := query(""); code != http.StatusBadRequest {
		t.Fatalf("a POST naming nothing: %d, want 400", code)
	}
	if b := r.Faults().Blocked(); len(b) != 1 || b[0] != 2 {
		t.Fatalf("a POST naming nothing changed the blocked peers: %v", b)
	}
	if code := query("block=3"); code != http.StatusOK {
		t.Fatalf("?block=3: %d", code)
	}
	if b := r.Faults().Blocked(); len(b) != 1 || b[0] != 3 {
		t.Fatalf("?block=3: blocked %v", b)
	}
	// This node itself, or an id no member can have: refused, nothing
	// changed (an outside tester saw "blocked [1]" on node 1).
	for _, q := range []string{"block=1", "block=0", "block=64", "block=3,1"} {
		if code := query(q); code != http.StatusBadRequest {
			t.Errorf("?%s: %d, want 400", q, code)
		}
	}
	if b := r.Faults().Blocked(); len(b) != 1 || b[0] != 3 {
		t.Fatalf("refused blocks changed the blocked peers: %v", b)
	}
	r.Faults().HealAll()
}

// TestAdminApplyDelay: delay_apply sets the one-shot apply stall with the
// same checks as delay_persist (its bound is replica.ApplyDelayMax); a
// request carrying a bad value for either field changes neither.
func TestAdminApplyDelay(t *testing.T) {
	r := newSoloReplica(t)
	srv := httptest.NewServer(adminMux(r, prometheus.NewRegistry(), r.Faults(), true))
	defer srv.Close()
	post := func(form url.Values) int { return postFaults(t, srv, form) }
	for _, bad := range []string{"", "soon", "-1s", "61s", "1h"} {
		if code := post(url.Values{applyDelayField: {bad}}); code != http.StatusBadRequest {
			t.Errorf("delay_apply=%q: %d, want 400", bad, code)
		}
	}
	if code := post(url.Values{applyDelayField: {"2s"}, persistDelayField: {"2h"}}); code != http.StatusBadRequest {
		t.Fatalf("a good delay_apply beside a bad delay_persist: %d, want 400", code)
	}
	if d, p := r.Faults().ApplyDelayPending(), r.Faults().PersistDelayPending(); d != 0 || p != 0 {
		t.Fatalf("refused requests set delays: apply %v, persist %v", d, p)
	}
	if code := post(url.Values{applyDelayField: {"1m"}}); code != http.StatusOK {
		t.Fatalf("delay_apply=1m: %d", code)
	}
	if d := r.Faults().ApplyDelayPending(); d != time.Minute {
		t.Fatalf("pending apply delay %v, want 1m", d)
	}
	if p, b := r.Faults().PersistDelayPending(), r.Faults().Blocked(); p != 0 || len(b) != 0 {
		t.Fatalf("delay_apply changed other faults: persist %v, blocked %v", p, b)
	}
	r.Faults().DelayNextApply(0)
}
