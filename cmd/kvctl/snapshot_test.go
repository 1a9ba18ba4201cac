package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"synod/kv/backup"
	"synod/kv/proto"
	"synod/kv/sm"
)

// sampleBackup is a valid backup file of a state machine with two keys.
func sampleBackup(t *testing.T) []byte {
	t.Helper()
	s, err := sm.Open(t.TempDir(), sm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i, k := range []string{"a", "b"} {
		seq := uint64(i + 1)
		req := &proto.Request{Op: proto.OpPut, ClientID: 3, Seq: seq, FirstUnacked: seq, Key: []byte(k), Value: []byte("v")}
		if _, err := s.Apply(seq, [][]byte{sm.EncodeCommand(1, req)}); err != nil {
			t.Fatal(err)
		}
	}
	rc, slot, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var buf bytes.Buffer
	if _, err := backup.Write(&buf, backup.Header{ClusterID: 11, Slot: slot, Created: time.Now(), Members: []uint64{1, 2, 3}}, rc); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

const snapToken = "0123456789abcdef0123456789abcdef"

// TestSnapshotSave: the follower's 409 moves on to the next endpoint, the
// leader's stream is verified and saved; status describes the file.
func TestSnapshotSave(t *testing.T) {
	good := sampleBackup(t)
	follower := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not the leader", http.StatusConflict)
	}))
	defer follower.Close()
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/snapshot" || r.Header.Get("Authorization") != "Bearer "+snapToken {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		w.Write(good)
	}))
	defer leader.Close()
	dir := t.TempDir()
	file := filepath.Join(dir, "c.backup")
	admin := strings.TrimPrefix(follower.URL, "http://") + "," + leader.URL
	out, err := kvctl(t, "snapshot", "save", file, "--admin", admin, "--admin-token", snapToken)
	if err != nil {
		t.Fatalf("save: %v\n%s", err, out)
	}
	for _, want := range []string{"cluster:    11", "slot:       2", "members:    [1 2 3]", "2 keys", "verified"} {
		if !strings.Contains(out, want) {
			t.Errorf("save printed no %q:\n%s", want, out)
		}
	}
	if b, _ := os.ReadFile(file); !bytes.Equal(b, good) {
		t.Fatal("the saved file differs from the stream")
	}
	if _, err := os.Stat(file + partialSuffix); !os.IsNotExist(err) {
		t.Fatalf("the partial file was left behind: %v", err)
	}
	if out, err := kvctl(t, "snapshot", "status", file); err != nil || !strings.Contains(out, "slot:       2") {
		t.Fatalf("status: %v\n%s", err, out)
	}
	// No overwrite without --force.
	if _, err := kvctl(t, "snapshot", "save", file, "--admin", leader.URL, "--admin-token", snapToken); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("save over an existing file: %v", err)
	}
	// Without the token: the 401 is explained.
	if _, err := kvctl(t, "snapshot", "save", filepath.Join(dir, "x"), "--admin", leader.URL); err == nil || !strings.Contains(err.Error(), "admin] token") {
		t.Fatalf("save without the token: %v", err)
	}
	// Every endpoint a follower.
	if _, err := kvctl(t, "snapshot", "save", filepath.Join(dir, "y"), "--admin", follower.URL); err == nil || !strings.Contains(err.Error(), "leader") {
		t.Fatalf("save with no leader: %v", err)
	}
}

// TestSnapshotSaveCutStream: a stream cut short (the node aborted it) is
// refused after the download and nothing is saved.
func TestSnapshotSaveCutStream(t *testing.T) {
	good := sampleBackup(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(good[:len(good)-20])
	}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "cut.backup")
	_, err := kvctl(t, "snapshot", "save", file, "--admin", srv.URL)
	if err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("save of a cut stream: %v", err)
	}
	for _, p := range []string{file, file + partialSuffix} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s exists after a refused save", p)
		}
	}
}

// TestSnapshotStatusRefuses: status names what is wrong with a file.
func TestSnapshotStatusRefuses(t *testing.T) {
	good := sampleBackup(t)
	dir := t.TempDir()
	flip := bytes.Clone(good)
	flip[len(flip)/2] ^= 0x20
	for name, tc := range map[string]struct {
		b    []byte
		want string
	}{
		"bad magic": {append([]byte("PK\x03\x04zip!"), good[8:]...), "not a synod backup file"},
		"truncated": {good[:len(good)-1], "truncated"},
		"bit flip":  {flip, "checksum mismatch"},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		if err := os.WriteFile(p, tc.b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := kvctl(t, "snapshot", "status", p)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	if _, err := kvctl(t, "snapshot", "status", filepath.Join(dir, "missing")); err == nil {
		t.Error("status of a missing file succeeded")
	}
}
