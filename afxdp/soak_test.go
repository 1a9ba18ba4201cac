package afxdp_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"synod/afxdp"
)

// soakPayloadBytes is the size of each soak datagram (sequence number in
// the first 8 bytes).
const soakPayloadBytes = 64

// pingPong sends total datagrams from cli to an echo loop on srv, at most
// window outstanding, and checks that the replies come back as 0, 1, 2, ...
// It returns how many replies arrived, how many were lost (a gap in the
// sequence, or a stall longer than stall, which ends the run, closes cli
// and counts the rest as lost), and an error for the first anomaly: loss,
// or a reply out of sequence (duplicated, reordered, corrupted). The
// caller closes srv.
func pingPong(cli, srv afxdp.Conn, total, window int, stall time.Duration) (received, lost int, err error) {
	go func() {
		pkts := make([]afxdp.Packet, srv.BatchSize())
		for i := range pkts {
			pkts[i].Buf = make([]byte, 2048)
		}
		for {
			n, err := srv.ReadBatch(pkts)
			if err != nil {
				return
			}
			if _, err := srv.WriteBatch(pkts[:n]); err != nil {
				return
			}
		}
	}()

	var progress atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		last := int64(-1)
		for {
			select {
			case <-stop:
				return
			case <-time.After(stall):
			}
			cur := progress.Load()
			if cur == last {
				cli.Close()
				return
			}
			last = cur
		}
	}()

	rx := make([]afxdp.Packet, cli.BatchSize())
	for i := range rx {
		rx[i].Buf = make([]byte, 2048)
	}
	tx := make([]afxdp.Packet, window)
	bufs := make([][soakPayloadBytes]byte, window)
	next := 0
	for received < total {
		k := 0
		for next < total && next-received < window && k < window {
			binary.BigEndian.PutUint64(bufs[k][:], uint64(next))
			tx[k] = afxdp.Packet{Buf: bufs[k][:], N: soakPayloadBytes, Addr: srv.LocalAddr()}
			k++
			next++
		}
		if k > 0 {
			if n, err := cli.WriteBatch(tx[:k]); n != k || err != nil {
				return received, total - received, fmt.Errorf("WriteBatch = %d of %d: %v", n, k, err)
			}
		}
		n, err := cli.ReadBatch(rx)
		if err != nil {
			return received, total - received, fmt.Errorf("lost %d of %d (no reply for %v): %v", total-received, total, stall, err)
		}
		for _, pk := range rx[:n] {
			got := binary.BigEndian.Uint64(pk.Buf)
			switch {
			case pk.N != soakPayloadBytes:
				return received, 0, fmt.Errorf("reply %d: %d bytes", received, pk.N)
			case got > uint64(received) && got < uint64(total):
				return received, int(got) - received, fmt.Errorf("sequence %d arrived while %d was due: %d lost (or reordered)", got, received, int(got)-received)
			case got != uint64(received):
				return received, 0, fmt.Errorf("reply %d: got sequence %d (duplicate, reordered or corrupted)", received, got)
			}
			received++
		}
		progress.Store(int64(received))
	}
	return received, 0, nil
}

// dupConn plants a bug: it sends every dupEvery'th datagram twice.
type dupConn struct {
	afxdp.Conn
	sent, dupEvery int
}

func (d *dupConn) WriteBatch(pkts []afxdp.Packet) (int, error) {
	n, err := d.Conn.WriteBatch(pkts)
	for i := range pkts[:n] {
		d.sent++
		if d.sent%d.dupEvery == 0 {
			d.Conn.WriteBatch(pkts[i : i+1])
		}
	}
	return n, err
}

// TestPingPongCatchesPlantedFaults runs the soak checker over the
// in-memory network: clean, with one datagram dropped, and with a
// duplicating sender. It must pass the first and catch the other two.
func TestPingPongCatchesPlantedFaults(t *testing.T) {
	a, b := netip.MustParseAddrPort("10.0.0.1:7400"), netip.MustParseAddrPort("10.0.0.2:7400")
	const total, window = 5000, 32

	net := afxdp.NewMemNetwork()
	cli, srv := net.Listen(a), net.Listen(b)
	if got, lost, err := pingPong(cli, srv, total, window, time.Second); err != nil || got != total || lost != 0 {
		t.Fatalf("clean network: received=%d lost=%d err=%v", got, lost, err)
	}
	srv.Close()

	net = afxdp.NewMemNetwork()
	var n atomic.Int64
	net.SetDropFunc(func(from, to netip.AddrPort, payload []byte) bool { return n.Add(1) == 1234 })
	cli, srv = net.Listen(a), net.Listen(b)
	got, lost, err := pingPong(cli, srv, total, window, 200*time.Millisecond)
	if err == nil || lost == 0 {
		t.Fatalf("one dropped datagram went unnoticed: received=%d lost=%d", got, lost)
	}
	t.Logf("planted drop caught: %v", err)
	srv.Close()

	net = afxdp.NewMemNetwork()
	cli, srv = net.Listen(a), net.Listen(b)
	_, _, err = pingPong(&dupConn{Conn: cli, dupEvery: 777}, srv, total, window, time.Second)
	if err == nil {
		t.Fatal("a duplicated datagram went unnoticed")
	}
	t.Logf("planted duplicate caught: %v", err)
	cli.Close()
	srv.Close()
}
