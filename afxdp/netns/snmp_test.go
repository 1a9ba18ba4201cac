package netns

import "testing"

func TestParseSnmpUDP(t *testing.T) {
	for _, good := range []string{
		"Ip: Forwarding DefaultTTL\nIp: 1 64\nUdp: InDatagrams NoPorts InErrors OutDatagrams\nUdp: 10 3 0 32\nUdpLite: InDatagrams\nUdpLite: 0\n",
		"Ip: Forwarding DefaultTTL\nIp: 1 64\n" +
			"Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors\n" +
			"Udp: 40 3 0 2 0\n" +
			"UdpLite: InDatagrams NoPorts InErrors OutDatagrams\nUdpLite: 9 9 9 9\n",
	} {
		if n, err := ParseSnmpUDP(good); err != nil || n != 42 {
			t.Fatalf("ParseSnmpUDP(%q) = %d, %v; want 42", good, n, err)
		}
	}
	for _, bad := range []string{
		"", "Ip: 1 64\n", "Udp: InDatagrams\n", "Udp: InDatagrams\nUdp: x\n",
		"Udp: InDatagrams OutDatagrams\nUdp: x 1\n", "Udp: InDatagrams OutDatagrams\nUdp: -1 1\n",
		"Udp: InDatagrams OutDatagrams\nUdp: 18446744073709551615 1\n",
	} {
		if _, err := ParseSnmpUDP(bad); err == nil {
			t.Errorf("ParseSnmpUDP(%q): no error", bad)
		}
	}
}

// FuzzParseSnmpUDP: any text gives a count or an error, never a panic.
func FuzzParseSnmpUDP(f *testing.F) {
	f.Add("Udp: InDatagrams NoPorts OutDatagrams\nUdp: 10 3 32\n")
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = ParseSnmpUDP(s)
	})
}
