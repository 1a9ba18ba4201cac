package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/replica"
	"synod/paxos"
)

// TestAuthFloorsFile: a node's replay floors reach data_dir (at stop at
// the latest) and a restart reads them back, so packets a node accepted
// before it stopped are refused after it; no file is no floors; a file
// that is not a floors record is an error naming it.
func TestAuthFloorsFile(t *testing.T) {
	dir := t.TempDir()
	secret := [][]byte{[]byte("cluster-secret-A-0123456789abcdef")}
	members := []paxos.NodeID{1, 2, 3}
	if fs, err := loadAuthFloors(dir); err != nil || fs != nil {
		t.Fatalf("no file: %v %v", fs, err)
	}
	tx, err := replica.NewAuth(7, 1, members, secret, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rx, err := replica.NewAuth(7, 2, members, secret, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	k := startFloorsKeeper(dir, rx, zerolog.Nop())
	var captured [][]byte
	for i := 0; i < 10; i++ {
		p := tx.SealDatagram([]byte("m"))
		if _, _, err := rx.OpenDatagram(p); err != nil {
			t.Fatal(err)
		}
		captured = append(captured, p)
	}
	k.Stop()
	fs, err := loadAuthFloors(dir)
	if err != nil || len(fs) != 1 || fs[0].Sender != 1 || fs[0].Counter != 10 {
		t.Fatalf("floors read back: %+v %v", fs, err)
	}
	restarted, err := replica.NewAuth(7, 2, members, secret, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	restarted.SetFloors(fs)
	for i, p := range captured {
		if _, _, err := restarted.OpenDatagram(p); err == nil {
			t.Fatalf("captured packet %d accepted after the restart", i)
		}
	}
	if _, _, err := restarted.OpenDatagram(tx.SealDatagram([]byte("next"))); err != nil {
		t.Fatalf("the sender's next packet: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, authFloorsFileName), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadAuthFloors(dir); err == nil || !strings.Contains(err.Error(), authFloorsFileName) {
		t.Fatalf("a garbage file: %v, want an error naming it", err)
	}
}
