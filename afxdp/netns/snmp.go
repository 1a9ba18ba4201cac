package netns

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// SnmpBytesMax bounds what is read of a namespace's /proc/net/snmp (the
// real file is about 2 KiB).
const SnmpBytesMax = 1 << 16

// KernelUDPDatagrams returns the kernel UDP stack's datagram count (Udp
// InDatagrams + OutDatagrams of /proc/net/snmp) inside namespace ns.
// Traffic an AF_XDP socket carries bypasses that stack, so comparing the
// figure between an AF_XDP node and a UDP node shows which transport
// carried the consensus datagrams.
func KernelUDPDatagrams(ns string) (uint64, error) {
	out, err := Exec(ns, "cat", "/proc/net/snmp")
	if err != nil {
		return 0, err
	}
	if len(out) > SnmpBytesMax {
		out = out[:SnmpBytesMax]
	}
	n, err := ParseSnmpUDP(out)
	if err != nil {
		return 0, fmt.Errorf("namespace %s: %w", ns, err)
	}
	return n, nil
}

// ParseSnmpUDP returns InDatagrams + OutDatagrams from the "Udp:" header
// and value lines of /proc/net/snmp text. Malformed text is an error,
// never a panic.
func ParseSnmpUDP(snmp string) (uint64, error) {
	var head []string
	for _, line := range strings.Split(snmp, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		var sum uint64
		for i := 1; i < len(f) && i < len(head); i++ {
			if head[i] == "InDatagrams" || head[i] == "OutDatagrams" {
				v, err := strconv.ParseUint(f[i], 10, 64)
				if err != nil {
					return 0, fmt.Errorf("/proc/net/snmp: Udp %s %q is not a count", head[i], f[i])
				}
				if sum+v < sum {
					return 0, errors.New("/proc/net/snmp: Udp datagram counts overflow")
				}
				sum += v
			}
		}
		return sum, nil
	}
	return 0, errors.New("/proc/net/snmp: no Udp lines")
}
