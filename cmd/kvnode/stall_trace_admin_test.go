package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/internal/stall"
)

// stallTraceCall makes one request to srv's stallTracePath and returns
// the status and the decoded state (zero unless 200).
func stallTraceCall(t *testing.T, srv *httptest.Server, method, query, auth string) (int, stallTraceState) {
	t.Helper()
	u := srv.URL + stallTracePath
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st stallTraceState
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatalf("%s %s: %v", method, u, err)
		}
	} else {
		io.Copy(io.Discard, resp.Body)
	}
	return resp.StatusCode, st
}

// TestStallTraceSwitchedAtRuntime: the flight recorder, off by default,
// is turned on and off through the admin endpoint behind its token: GET
// says the state, POST on=true starts it (a second POST changes nothing),
// on=false stops it; a bad or missing value, another method or no token
// changes nothing; with the detector off the path answers 409.
func TestStallTraceSwitchedAtRuntime(t *testing.T) {
	d, err := stall.New(stall.Config{Dir: t.TempDir(), Threshold: 5 * time.Millisecond}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cfg := &Config{AdminListen: "0.0.0.0:7021", Admin: AdminConfig{Token: testAdminToken}}
	if err := cfg.validateAdmin(); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(stallTracePath, stallTraceHandler(d, zerolog.Nop()))
	srv := httptest.NewServer(cfg.adminHandler(mux, zerolog.Nop()))
	defer srv.Close()
	auth := "Bearer " + testAdminToken

	if code, st := stallTraceCall(t, srv, http.MethodGet, "", auth); code != http.StatusOK || st.Trace {
		t.Fatalf("GET: %d %+v; want 200, off", code, st)
	}
	for _, c := range []struct{ method, query, auth string }{
		{http.MethodPost, "on=true", ""}, {http.MethodPost, "on=true", "Bearer wrong-token-0123456789abcdef"},
		{http.MethodPost, "", auth}, {http.MethodPost, "on=yes-please", auth}, {http.MethodPut, "on=true", auth},
		{http.MethodDelete, "", auth},
	} {
		code, _ := stallTraceCall(t, srv, c.method, c.query, c.auth)
		if code == http.StatusOK || d.Recording() {
			t.Fatalf("%s %q (auth %q): %d, recording %v; want a refusal that changes nothing", c.method, c.query, c.auth, code, d.Recording())
		}
	}
	for i, wantChanged := range []bool{true, false} {
		code, st := stallTraceCall(t, srv, http.MethodPost, "on=true", auth)
		if code != http.StatusOK || !st.Trace || st.Changed != wantChanged || !d.Recording() {
			t.Fatalf("POST on=true #%d: %d %+v, recording %v; want on, changed %v", i+1, code, st, d.Recording(), wantChanged)
		}
	}
	if code, st := stallTraceCall(t, srv, http.MethodGet, "", auth); code != http.StatusOK || !st.Trace {
		t.Fatalf("GET after on: %d %+v", code, st)
	}
	// A form body works as well as the query string.
	req, _ := http.NewRequest(http.MethodPost, srv.URL+stallTracePath, strings.NewReader(url.Values{"on": {"false"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", auth)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || d.Recording() {
		t.Fatalf("POST on=false (form): %d, recording %v; want off", resp.StatusCode, d.Recording())
	}

	off := httptest.NewServer(stallTraceHandler(nil, zerolog.Nop()))
	defer off.Close()
	if code, _ := stallTraceCall(t, off, http.MethodPost, "on=true", ""); code != http.StatusConflict {
		t.Fatalf("detector off: %d, want 409", code)
	}
}
