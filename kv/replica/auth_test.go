package replica

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/paxos"
)

var (
	secretA = []byte("cluster-secret-A-0123456789abcdef")
	secretB = []byte("cluster-secret-B-0123456789abcdef")
	members = []paxos.NodeID{1, 2, 3}
)

func mustAuth(t testing.TB, cluster uint64, self paxos.NodeID, secrets ...[]byte) *Auth {
	t.Helper()
	a, err := NewAuth(cluster, self, members, secrets, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestAuthOpensOnlyWhatItsPeerSealed: a sealed datagram opens at a peer
// with the same secret and cluster, and every forgery the hostile-input
// review tried is refused before the payload is read: a flipped bit
// anywhere, a wrong or missing secret, another cluster, an unknown or
// impersonated sender, a replay.
func TestAuthOpensOnlyWhatItsPeerSealed(t *testing.T) {
	n1, n2 := mustAuth(t, 9, 1, secretA), mustAuth(t, 9, 2, secretA)
	msg := []byte("a paxos message")
	sealed := n1.seal(nil, authChannelDatagram, msg)
	got, from, err := n2.open(bytes.Clone(sealed), authChannelDatagram)
	if err != nil || from != 1 || !bytes.Equal(got, msg) {
		t.Fatalf("open: %q from %d, %v", got, from, err)
	}
	if _, _, err := n2.open(bytes.Clone(sealed), authChannelDatagram); !errors.Is(err, errAuthReplay) {
		t.Fatalf("a replayed datagram: %v", err)
	}
	for i := range sealed {
		b := bytes.Clone(n1.seal(nil, authChannelDatagram, msg))
		b[i] ^= 0x01
		if _, _, err := n2.open(b, authChannelDatagram); err == nil {
			t.Fatalf("a datagram with byte %d flipped opened", i)
		}
	}
	for name, b := range map[string][]byte{
		"wrong secret":   mustAuth(t, 9, 1, secretB).seal(nil, authChannelDatagram, msg),
		"other cluster":  mustAuth(t, 8, 1, secretA).seal(nil, authChannelDatagram, msg),
		"from itself":    mustAuth(t, 9, 2, secretA).seal(nil, authChannelDatagram, msg),
		"wrong channel":  n1.seal(nil, authChannelSide, msg),
		"unsealed":       msg,
		"too short":      n1.seal(nil, authChannelDatagram, msg)[:authHeaderBytes+2],
		"empty":          nil,
		"impersonation":  impersonate(n1.seal(nil, authChannelDatagram, msg), 3),
		"truncated tag":  n1.seal(nil, authChannelDatagram, msg)[:len(sealed)-1],
		"extra trailing": append(n1.seal(nil, authChannelDatagram, msg), 0),
	} {
		if _, _, err := n2.open(b, authChannelDatagram); err == nil {
			t.Errorf("%s: opened", name)
		}
	}
	// No secret at all: a node configured without one cannot be built.
	if _, err := NewAuth(9, 1, members, nil, time.Now()); err == nil {
		t.Fatal("an authenticator without a secret")
	}
	if _, err := NewAuth(9, 1, members, [][]byte{[]byte("short")}, time.Now()); err == nil {
		t.Fatal("a 5-byte secret accepted")
	}
}

// impersonate rewrites the sender id of a sealed packet (its tag no longer
// matches the id's key).
func impersonate(b []byte, id paxos.NodeID) []byte {
	binary.LittleEndian.PutUint64(b[12:20], uint64(id))
	return b
}

// TestAuthReplayWindow: reordering within the window is fine, a duplicate
// or a counter below it is refused, an older incarnation is refused and a
// newer one (a restart) starts a new window.
func TestAuthReplayWindow(t *testing.T) {
	rx := mustAuth(t, 9, 2, secretA)
	tx := mustAuth(t, 9, 1, secretA)
	var pkts [][]byte
	for i := 0; i < authReplayWindow+10; i++ {
		pkts = append(pkts, tx.seal(nil, authChannelDatagram, []byte{byte(i)}))
	}
	open := func(b []byte) error { _, _, err := rx.open(bytes.Clone(b), authChannelDatagram); return err }
	if err := open(pkts[5]); err != nil {
		t.Fatal(err)
	}
	if err := open(pkts[3]); err != nil {
		t.Fatalf("reordered within the window: %v", err)
	}
	if err := open(pkts[3]); !errors.Is(err, errAuthReplay) {
		t.Fatalf("duplicate: %v", err)
	}
	if err := open(pkts[authReplayWindow+9]); err != nil {
		t.Fatal(err)
	}
	if err := open(pkts[4]); !errors.Is(err, errAuthReplay) {
		t.Fatalf("below the window: %v", err)
	}
	restarted, err := NewAuth(9, 1, members, [][]byte{secretA}, time.Now().Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := open(restarted.seal(nil, authChannelDatagram, []byte("new life"))); err != nil {
		t.Fatalf("a restarted sender (newer incarnation): %v", err)
	}
	if err := open(pkts[authReplayWindow+8]); !errors.Is(err, errAuthReplay) {
		t.Fatalf("the old incarnation after the new one: %v", err)
	}
}

// TestAuthRotation: a node seals with its first secret and opens with any,
// so [A,B] / [B,A] / [B] talk across each rotation step, and [A] cannot
// open what [B,A] seals.
func TestAuthRotation(t *testing.T) {
	steps := [][]([]byte){{secretA}, {secretA, secretB}, {secretB, secretA}, {secretB}}
	for i := 0; i+1 < len(steps); i++ {
		x, y := mustAuth(t, 9, 1, steps[i]...), mustAuth(t, 9, 2, steps[i+1]...)
		if _, _, err := y.open(x.seal(nil, authChannelDatagram, []byte("m")), authChannelDatagram); err != nil {
			t.Fatalf("step %d -> %d: %v", i, i+1, err)
		}
		if _, _, err := mustAuth(t, 9, 1, steps[i]...).open(mustAuth(t, 9, 2, steps[i+1]...).seal(nil, authChannelDatagram, []byte("m")), authChannelDatagram); err != nil {
			t.Fatalf("step %d <- %d: %v", i, i+1, err)
		}
	}
	old := mustAuth(t, 9, 2, secretA)
	if _, _, err := old.open(mustAuth(t, 9, 1, secretB, secretA).seal(nil, authChannelDatagram, []byte("m")), authChannelDatagram); err == nil {
		t.Fatal("a node that knows only the old secret opened what the new one seals")
	}
}

// TestSideChannelRefusesUnauthenticatedBeforeBuffering reproduces the
// side-channel memory attack: a connection announcing a 255 MB frame. With
// authentication its head fails the tag check and the connection is closed
// before any body is read; the node's heap stays small. An authenticated
// peer's frames arrive.
func TestSideChannelRefusesUnauthenticatedBeforeBuffering(t *testing.T) {
	got := make(chan []byte, 4)
	rx, err := newSideChannel("127.0.0.1:0", nil, mustAuth(t, 9, 2, secretA), func(p []byte) bool { got <- bytes.Clone(p); return true }, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	rx.start()
	defer rx.close()
	addr := rx.ln.Addr().String()

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, forged := range [][]byte{
		forgedSideHead(mustAuth(t, 9, 1, secretB), 255<<20), // wrong secret
		forgedSideHead(nil, 255<<20),                        // no secret: a raw length
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(forged)
		c.Write(make([]byte, 1<<20)) // a megabyte of "body"
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Read(make([]byte, 1))
		var ne net.Error
		if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
			t.Fatalf("the forged connection was not closed: %v", err)
		}
		c.Close()
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 32<<20 {
		t.Fatalf("the heap grew by %d bytes for forged frames", grew)
	}

	tx, err := newSideChannel("127.0.0.1:0", map[paxos.NodeID]string{2: addr}, mustAuth(t, 9, 1, secretA), func([]byte) bool { return true }, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	tx.start()
	defer tx.close()
	big := bytes.Repeat([]byte{7}, 3<<20)
	tx.send(2, big)
	select {
	case p := <-got:
		if !bytes.Equal(p, big) {
			t.Fatalf("got %d bytes", len(p))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("an authenticated frame never arrived")
	}
}

// forgedSideHead is a side-frame head announcing n bytes, sealed with a's
// (wrong) secret, or a bare length without a.
func forgedSideHead(a *Auth, n int) []byte {
	if a == nil {
		return binary.LittleEndian.AppendUint32(nil, uint32(n))
	}
	head := a.sealSide([]byte("x"))[:sideFrameHeadBytes]
	binary.LittleEndian.PutUint32(head[0:4], uint32(n))
	return head
}

// FuzzOpenSealed: consensus datagrams come from the network; any bytes
// must open or be refused cleanly, and a refused one never panics.
func FuzzOpenSealed(f *testing.F) {
	tx := mustAuth(f, 9, 1, secretA)
	f.Add(tx.seal(nil, authChannelDatagram, []byte("seed")))
	f.Add([]byte{authMagic, 0, 0, 0})
	f.Add(make([]byte, authOverheadBytes))
	f.Fuzz(func(t *testing.T, b []byte) {
		rx := mustAuth(t, 9, 2, secretA)
		if p, from, err := rx.open(b, authChannelDatagram); err == nil && (from != 1 || len(p) != len(b)-authOverheadBytes) {
			t.Fatalf("opened %d bytes from %d", len(p), from)
		}
		var head [sideFrameHeadBytes]byte
		copy(head[:], b)
		rx.openSideHead(head[:], sideFrameBytesMax)
		// A joiner's look at a sender it does not admit (node 1 is not,
		// here): only a packet node 1 sealed teaches it node 1.
		if err := rx.setSenders([]paxos.NodeID{2, 3}); err != nil {
			t.Fatal(err)
		}
		if from, err := rx.openStranger(b, authChannelDatagram); err == nil && from != 1 {
			t.Fatalf("openStranger learned node %d", from)
		}
	})
}

// TestAuthRestartWithClockBehind: a peer that saw a sender's incarnation
// refuses every packet of a lower one, so a sender restarted with its
// clock stepped back is deaf to its peers, however long they run: the
// incarnation must come from a record that never goes back (kvnode's
// data_dir/incarnation, cmd/kvnode TestNextIncarnation). With the
// recorded incarnation plus one, the restarted sender is heard at once.
func TestAuthRestartWithClockBehind(t *testing.T) {
	rx := mustAuth(t, 9, 2, secretA)
	start := time.Now()
	tx, err := NewAuth(9, 1, members, [][]byte{secretA}, start)
	if err != nil {
		t.Fatal(err)
	}
	open := func(b []byte) error { _, _, err := rx.open(b, authChannelDatagram); return err }
	if err := open(tx.seal(nil, authChannelDatagram, []byte("first life"))); err != nil {
		t.Fatal(err)
	}
	naive, err := NewAuth(9, 1, members, [][]byte{secretA}, start.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := open(naive.seal(nil, authChannelDatagram, []byte("clock behind"))); !errors.Is(err, errAuthReplay) {
			t.Fatalf("packet %d of a restart with the clock behind: %v, want refused", i, err)
		}
	}
	recorded, err := NewAuth(9, 1, members, [][]byte{secretA}, time.Unix(0, start.UnixNano()+1))
	if err != nil {
		t.Fatal(err)
	}
	if err := open(recorded.seal(nil, authChannelDatagram, []byte("recorded + 1"))); err != nil {
		t.Fatalf("a restart with the recorded incarnation + 1: %v", err)
	}
}

// TestSideHeadTakenAtHead: a side-channel head's counter is taken when the
// head authenticates, before any body: a second copy of the head is refused
// at its head whether or not the first copy's body ever came (a head copied
// from traffic to another node, fresh here once, could otherwise be held
// 5 s at a time again and again), and a frame whose head was taken opens
// once its body comes.
func TestSideHeadTakenAtHead(t *testing.T) {
	tx := mustAuth(t, 9, 1, secretA)
	rx := mustAuth(t, 9, 2, secretA)
	frame := tx.sealSide([]byte("no body follows"))
	if _, err := rx.openSideHead(frame[:sideFrameHeadBytes], sideFrameBytesMax); err != nil {
		t.Fatal(err)
	}
	if _, err := rx.openSideHead(frame[:sideFrameHeadBytes], sideFrameBytesMax); !errors.Is(err, errAuthReplay) {
		t.Fatalf("a second copy of a taken head: %v, want a replay refusal", err)
	}
	next := tx.sealSide([]byte("whole"))
	if p, err := openSideFrame(rx, next); err != nil || string(p) != "whole" {
		t.Fatalf("a whole frame: %q %v", p, err)
	}
	if _, err := openSideFrame(rx, next); !errors.Is(err, errAuthReplay) {
		t.Fatalf("a whole frame again: %v, want a replay refusal", err)
	}
}

// TestOpenStranger: a joining node learns a sender it does not admit only
// from a packet sealed under the cluster's secret, fresh, of its cluster,
// and not its own (learnContact); what it admits it still opens as
// before. Everything else is refused and teaches nothing.
func TestOpenStranger(t *testing.T) {
	auth := func(cluster uint64, self paxos.NodeID, secret []byte) *Auth {
		a, err := NewAuth(cluster, self, []paxos.NodeID{1, 2, 3, 4, 5}, [][]byte{secret}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	tx := auth(9, 5, secretA) // node 5, which the joiner does not list
	rx := auth(9, 4, secretA)
	if err := rx.setSenders([]paxos.NodeID{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	p := tx.SealDatagram([]byte("heartbeat"))
	if _, _, err := rx.open(p, authChannelDatagram); !errors.Is(err, errAuthSender) {
		t.Fatalf("open of a sender not admitted: %v, want errAuthSender", err)
	}
	if from, err := rx.openStranger(p, authChannelDatagram); err != nil || from != 5 {
		t.Fatalf("openStranger: %d %v, want 5", from, err)
	}
	if _, err := rx.openStranger(p, authChannelDatagram); !errors.Is(err, errAuthReplay) {
		t.Fatalf("the same packet again: %v, want errAuthReplay", err)
	}
	tampered := bytes.Clone(tx.SealDatagram([]byte("heartbeat")))
	tampered[len(tampered)-authTagBytes-1] ^= 1
	for name, b := range map[string][]byte{
		"tampered":      tampered,
		"other secret":  auth(9, 5, secretB).SealDatagram([]byte("x")),
		"other cluster": auth(8, 5, secretA).SealDatagram([]byte("x")),
		"its own":       auth(9, 4, secretA).SealDatagram([]byte("x")),
		"truncated":     p[:authHeaderBytes],
	} {
		if from, err := rx.openStranger(b, authChannelDatagram); err == nil {
			t.Fatalf("%s: learned node %d", name, from)
		}
	}
}
