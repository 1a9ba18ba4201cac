package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNodeProfilesFetched: with --node-profiles every node is asked for
// one CPU profile of the recorded part (its length in whole seconds, with
// the admin token), written under --out/profiles/PATH/; a node that
// refuses is named, not fatal; without the flag nothing is asked.
func TestNodeProfilesFetched(t *testing.T) {
	var asked []string
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+benchAdminToken {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		asked = append(asked, r.URL.String())
		w.Write([]byte("\x1f\x8bprofile"))
	}))
	defer ok.Close()
	refusing := httptest.NewServer(http.NotFoundHandler())
	defer refusing.Close()
	addr := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

	o := tinyOptions()
	o.OutDir = t.TempDir()
	c := &cluster{path: Path{Name: "paxos-shm"}, admins: []string{addr(ok), addr(refusing)}}
	if np := startNodeProfiles(context.Background(), &o, c, scenTail, 0, 2*time.Second); np != nil {
		t.Fatal("profiles taken without --node-profiles")
	}
	o.NodeProfiles = true
	files, errs := startNodeProfiles(context.Background(), &o, c, scenTail, 10*time.Millisecond, 2500*time.Millisecond).wait()
	want := filepath.Join(o.OutDir, "profiles", "paxos-shm", "tail-node1.pprof")
	if len(files) != 1 || files[0] != want {
		t.Fatalf("files %v, want [%s]", files, want)
	}
	if b, err := os.ReadFile(want); err != nil || string(b) != "\x1f\x8bprofile" {
		t.Fatalf("profile file %q: %v", b, err)
	}
	if len(asked) != 1 || asked[0] != "/debug/pprof/profile?seconds=2" {
		t.Fatalf("asked %v, want one profile of 2 s", asked)
	}
	if len(errs) != 1 || !strings.HasPrefix(errs[0], "node2: ") || !strings.Contains(errs[0], "404") {
		t.Fatalf("errors %v, want node2's refusal", errs)
	}
}
