package main

import (
	"net"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"synod/afxdp"
)

// TestTransportDropsExported: a datagram larger than the consensus
// receive buffer, dropped by the transport before the replica sees it,
// shows in synod_transport_rx_dropped_total{reason="truncated"} (it
// showed nowhere), and a delivered one in the rx packets.
func TestTransportDropsExported(t *testing.T) {
	conn, err := afxdp.NewUDP(netip.MustParseAddrPort("127.0.0.1:0"), afxdp.UDPOptions{})
	if err != nil {
		t.Skipf("no UDP transport here: %v", err)
	}
	defer conn.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(newTransportCollector(conn))
	u, err := net.Dial("udp", conn.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u.Write(make([]byte, 3000))
	u.Write([]byte("short"))
	in := []afxdp.Packet{{Buf: make([]byte, 2048)}}
	if n, err := conn.ReadBatch(in); n != 1 || err != nil || string(in[0].Buf[:in[0].N]) != "short" {
		t.Fatalf("ReadBatch = %d, %v", n, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "/" + l.GetValue()
			}
			got[name] = m.GetCounter().GetValue()
		}
	}
	for name, want := range map[string]float64{
		"synod_transport_rx_dropped_total/truncated": 1, "synod_transport_rx_dropped_total/runt": 0,
		"synod_transport_rx_dropped_total/foreign": 0, "synod_transport_rx_dropped_total/bad_checksum": 0,
		"synod_transport_packets_total/rx": 1, "synod_transport_tx_ring_full_total": 0,
		"synod_transport_rx_dropped_total/kernel_buffer": 0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (exported: %v), want %v", name, v, ok, want)
		}
	}
	if newTransportCollector(afxdp.NewMemNetwork()) != nil {
		t.Fatal("a value without counters got a collector")
	}
}
