// Command xdprtt measures datagram round-trip times between two network
// namespaces joined by a veth pair, for AF_XDP busy polling, AF_XDP
// adaptive polling and kernel UDP, side by side, and prints a Markdown
// table of p50/p99/p99.9. It needs root; it creates and removes its own
// namespaces (synod-xdprtt-<pid>-a/-b, 10.199.<subnet>.0/24).
//
//	go run ./afxdp/cmd/xdprtt -pings 20000 -attach native
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"synod/afxdp/rtt"
)

func main() {
	var opts rtt.Options
	flag.IntVar(&opts.Pings, "pings", 20000, "measured round trips per transport")
	flag.IntVar(&opts.Warmup, "warmup", 1000, "unmeasured round trips first")
	flag.IntVar(&opts.PayloadBytes, "payload", 64, "payload bytes")
	flag.StringVar(&opts.Attach, "attach", "native", "AF_XDP attach mode: native, generic or auto")
	flag.IntVar(&opts.Subnet, "subnet", 199, "third octet of the namespace subnet 10.199.x.0/24")
	modes := flag.String("modes", "afxdp-busy,afxdp-adaptive,udp", "comma-separated transports")
	serverCPU := flag.Int("server-cpu", 0, "CPU for the echo loop (-1: unpinned)")
	clientCPU := flag.Int("client-cpu", 1, "CPU for the ping loop (-1: unpinned)")
	flag.BoolVar(&opts.PinUDP, "pin-udp", false, "pin the kernel UDP loops too (slower: netpoller hand-offs)")
	flag.Parse()
	opts.Modes = strings.Split(*modes, ",")
	opts.ServerCPU, opts.ClientCPU = serverCPU, clientCPU
	results, err := rtt.Run(opts)
	if len(results) > 0 {
		rtt.WriteTable(os.Stdout, results)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdprtt:", err)
		os.Exit(1)
	}
}
