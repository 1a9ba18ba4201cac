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
	if fs, _, err := loadAuthFloors(dir); err != nil || fs != nil {
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
	k := startFloorsKeeper(dir, rx, 0, zerolog.Nop())
	var captured [][]byte
	for i := 0; i < 10; i++ {
		p := tx.SealDatagram([]byte("m"))
		if _, _, err := rx.OpenDatagram(p); err != nil {
			t.Fatal(err)
		}
		captured = append(captured, p)
	}
	k.Stop()
	fs, _, err := loadAuthFloors(dir)
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
	if _, _, err := loadAuthFloors(dir); err == nil || !strings.Contains(err.Error(), authFloorsFileName) {
		t.Fatalf("a garbage file: %v, want an error naming it", err)
	}
}

// TestAuthFloorsWrittenInPlace: a node that starts on a floors file of
// version 1 keeps its records and replaces it with a file of two slots;
// from then on each record is written in place (the same file, no rename)
// with a write number that grows, across a restart too, and the last
// record is what a restart reads.
func TestAuthFloorsWrittenInPlace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, authFloorsFileName)
	secret := [][]byte{[]byte("cluster-secret-A-0123456789abcdef")}
	members := []paxos.NodeID{1, 2, 3}
	tx, err := replica.NewAuth(7, 1, members, secret, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	old := []replica.AuthFloor{{Sender: 3, Channel: 0, Incarnation: 1, Counter: 42}}
	if err := os.WriteFile(path, replica.EncodeAuthFloors(old), 0o600); err != nil {
		t.Fatal(err)
	}
	var first os.FileInfo
	lastGen := uint64(0)
	for life := range 2 {
		fs, gen, err := loadAuthFloors(dir)
		if err != nil {
			t.Fatalf("life %d: %v", life, err)
		}
		rx, err := replica.NewAuth(7, 2, members, secret, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		rx.SetFloors(fs)
		k := startFloorsKeeper(dir, rx, gen, zerolog.Nop())
		for range 3 {
			if _, _, err := rx.OpenDatagram(tx.SealDatagram([]byte("m"))); err != nil {
				t.Fatal(err)
			}
			gen := waitFloorsWrite(t, path, lastGen)
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if first == nil {
				first = fi
			} else if !os.SameFile(first, fi) {
				t.Fatalf("life %d, write %d: the floors file was replaced, not written in place", life, gen)
			}
			lastGen = gen
		}
		k.Stop()
	}
	fs, _, err := loadAuthFloors(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got3, got1 bool
	for _, f := range fs {
		got3 = got3 || f == old[0]
		got1 = got1 || (f.Sender == 1 && f.Counter == 6)
	}
	if !got3 || !got1 {
		t.Fatalf("after two lives: %+v; want the version 1 record kept and sender 1 at counter 6", fs)
	}
}

// waitFloorsWrite waits until path is a version 2 floors file with a write
// number above after, and returns it.
func waitFloorsWrite(t *testing.T, path string, after uint64) uint64 {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if b, err := os.ReadFile(path); err == nil {
			if _, gen, err := replica.DecodeAuthFloorsFile(b); err == nil && gen > after {
				return gen
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no floors write above %d within 5 s", after)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
