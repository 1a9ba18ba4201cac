package replica

import (
	"bytes"
	"fmt"
	"testing"
	"time"
)

// TestAuthFloorsRefuseReplaysAfterRestart: packets a node accepted before
// it restarted are refused after it, once the restart starts from the
// floors its previous life recorded (encoded and decoded, as kvnode keeps
// them in data_dir); the sender's later packets are accepted. Planted (a
// restart without the floors, as before): every replay is accepted, which
// an outside attacker did to a restarted follower.
func TestAuthFloorsRefuseReplaysAfterRestart(t *testing.T) {
	tx := mustAuth(t, 9, 1, secretA)
	rx := mustAuth(t, 9, 2, secretA)
	var captured [][]byte
	for i := 0; i < 200; i++ {
		p := tx.SealDatagram([]byte(fmt.Sprintf("message %d", i)))
		if _, _, err := rx.open(p, authChannelDatagram); err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
		captured = append(captured, p)
	}
	side := tx.sealSide([]byte("large"))
	if _, err := openSideFrame(rx, side); err != nil {
		t.Fatal(err)
	}
	floors, err := DecodeAuthFloors(EncodeAuthFloors(rx.Floors()))
	if err != nil {
		t.Fatal(err)
	}
	replays := func(restarted *Auth) (accepted int) {
		for _, p := range captured {
			if _, _, err := restarted.open(p, authChannelDatagram); err == nil {
				accepted++
			}
		}
		if _, err := openSideFrame(restarted, side); err == nil {
			accepted++
		}
		return accepted
	}
	after := mustAuth(t, 9, 2, secretA)
	after.SetFloors(floors)
	accepted := replays(after)
	later := tx.SealDatagram([]byte("after the restart"))
	_, _, laterErr := after.open(later, authChannelDatagram)
	planted := replays(mustAuth(t, 9, 2, secretA))
	fmt.Printf("auth floors: records=%d replays_accepted_after_restart=%d of %d later_packet_accepted=%v; planted (no floors): replays_accepted=%d\n",
		len(floors), accepted, len(captured)+1, laterErr == nil, planted)
	if accepted != 0 {
		t.Errorf("%d of %d replayed packets accepted after a restart with the floors", accepted, len(captured)+1)
	}
	if laterErr != nil {
		t.Errorf("the sender's next packet after the restart: %v", laterErr)
	}
	if planted == 0 {
		t.Error("planted: a restart without floors refused the replays too; the test does not show the floors' effect")
	}
}

// openSideFrame opens a whole side-channel frame as a receiver does: its
// head, then its body.
func openSideFrame(a *Auth, frame []byte) ([]byte, error) {
	if _, err := a.openSideHead(frame[:sideFrameHeadBytes], sideFrameBytesMax); err != nil {
		return nil, err
	}
	sealed := append(append([]byte{}, frame[4:4+authHeaderBytes]...), frame[sideFrameHeadBytes:]...)
	return a.openSideBody(sealed)
}

// TestAuthFloorsKeepNewerIncarnations: a record never lowers a window,
// and a sender's older incarnation stays refused.
func TestAuthFloorsKeepNewerIncarnations(t *testing.T) {
	rx := mustAuth(t, 9, 2, secretA)
	old := mustAuth(t, 9, 1, secretA)
	p := old.SealDatagram([]byte("old life"))
	newer, err := NewAuth(9, 1, members, [][]byte{secretA}, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := rx.open(newer.SealDatagram([]byte("new life")), authChannelDatagram); err != nil {
		t.Fatal(err)
	}
	rx.SetFloors([]AuthFloor{{Sender: 1, Channel: authChannelDatagram, Incarnation: 1, Counter: 1 << 40}})
	if _, _, err := rx.open(p, authChannelDatagram); err == nil {
		t.Fatal("a packet of the sender's older incarnation accepted after a floor of an even older one")
	}
	if _, _, err := rx.open(newer.SealDatagram([]byte("again")), authChannelDatagram); err != nil {
		t.Fatalf("the newer incarnation's next packet: %v", err)
	}
}

// TestDecodeAuthFloorsMalformed: the floors file is read from disk; every
// damage is an error, never a partial record.
func TestDecodeAuthFloorsMalformed(t *testing.T) {
	good := EncodeAuthFloors([]AuthFloor{{Sender: 1, Channel: 0, Incarnation: 5, Counter: 7}, {Sender: 3, Channel: 2, Incarnation: 6, Counter: 8}})
	if fs, err := DecodeAuthFloors(good); err != nil || len(fs) != 2 || fs[1].Counter != 8 {
		t.Fatalf("good record: %v %v", fs, err)
	}
	for i := 0; i < len(good); i++ {
		if _, err := DecodeAuthFloors(good[:i]); err == nil {
			t.Errorf("truncated to %d bytes: accepted", i)
		}
		bad := bytes.Clone(good)
		bad[i] ^= 0x10
		if _, err := DecodeAuthFloors(bad); err == nil {
			t.Errorf("byte %d flipped: accepted", i)
		}
	}
	if _, err := DecodeAuthFloors(append(bytes.Clone(good), 0)); err == nil {
		t.Error("a trailing byte: accepted")
	}
	for _, f := range []AuthFloor{{Sender: 0}, {Sender: 64}, {Sender: 1, Channel: authChannelMax + 1}} {
		if _, err := DecodeAuthFloors(EncodeAuthFloors([]AuthFloor{f})); err == nil {
			t.Errorf("record %+v: accepted", f)
		}
	}
	many := make([]AuthFloor, authFloorsMax+1)
	for i := range many {
		many[i] = AuthFloor{Sender: 1}
	}
	if _, err := DecodeAuthFloors(EncodeAuthFloors(many)); err == nil {
		t.Error("more than authFloorsMax records: accepted")
	}
}

// FuzzDecodeAuthFloors: whatever the bytes, decoding returns an error or
// records that encode back to the same bytes.
func FuzzDecodeAuthFloors(f *testing.F) {
	f.Add(EncodeAuthFloors(nil))
	f.Add(EncodeAuthFloors([]AuthFloor{{Sender: 2, Channel: 1, Incarnation: 3, Counter: 4}}))
	f.Add([]byte("SYNODAF1\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		fs, err := DecodeAuthFloors(b)
		if err != nil {
			return
		}
		if !bytes.Equal(EncodeAuthFloors(fs), b) {
			t.Fatalf("decoded %d records that do not encode back", len(fs))
		}
	})
}
