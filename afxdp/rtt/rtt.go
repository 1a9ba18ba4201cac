// Package rtt measures datagram round-trip times over a namespace pair:
// a client in one namespace pings an echo server in the other, for AF_XDP
// in busy and adaptive poll mode and for kernel UDP, in one run. This RTT
// is the floor synod's commit latency is measured against. cmd/xdprtt and
// kvbench rtt print its table.
package rtt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"synod/afxdp"
	"synod/afxdp/netns"
)

// Limits of a run.
const (
	pingsMax        = 10_000_000
	payloadBytesMin = 16 // sequence number + send time
	payloadBytesMax = 1400
	latencyNanosMax = int64(10 * time.Second)
	latencySigFigs  = 3
	replyTimeout    = 2 * time.Second
	subnetDefault   = 199
	rttPort         = 7500
	modeSwitchPause = 50 * time.Millisecond
	warmupPingsMax  = 100_000
)

// Modes a run can measure.
const (
	ModeXDPBusy     = "afxdp-busy"
	ModeXDPAdaptive = "afxdp-adaptive"
	ModeUDP         = "udp"
)

// Options configures Run. Zero values select defaults.
type Options struct {
	Pings        int      // measured round trips per mode (default 20000)
	Warmup       int      // unmeasured round trips first (default 1000)
	PayloadBytes int      // datagram payload (default 64)
	Modes        []string // default: all three
	Attach       string   // AF_XDP attach mode (default native)
	// ServerCPU and ClientCPU pin the two loops (-1: unpinned). Defaults:
	// 0 and 1 when the machine has two or more CPUs.
	ServerCPU, ClientCPU *int
	// PinUDP pins the kernel UDP loops too. Off by default: a goroutine
	// locked to a thread that blocks in Go's netpoller needs an extra
	// thread hand-off per wake-up, which roughly triples its RTT here.
	PinUDP bool
	Subnet int // 10.199.<Subnet>.0/24 inside the namespaces (default 199)
}

// Result is one mode's latency distribution.
type Result struct {
	Mode    string
	Attach  string // for AF_XDP modes: how the program attached
	Pinned  bool   // both loops pinned to CPUs
	Pings   int
	Lost    int
	P50     time.Duration
	P99     time.Duration
	P999    time.Duration
	Max     time.Duration
	Elapsed time.Duration
}

func (o *Options) defaults() error {
	if o.Pings == 0 {
		o.Pings = 20_000
	}
	if o.Warmup == 0 {
		o.Warmup = 1000
	}
	if o.PayloadBytes == 0 {
		o.PayloadBytes = 64
	}
	if len(o.Modes) == 0 {
		o.Modes = []string{ModeXDPBusy, ModeXDPAdaptive, ModeUDP}
	}
	if o.Attach == "" {
		o.Attach = afxdp.AttachNative
	}
	if o.Subnet == 0 {
		o.Subnet = subnetDefault
	}
	if o.Pings < 1 || o.Pings > pingsMax {
		return fmt.Errorf("rtt: pings %d out of range 1..%d", o.Pings, pingsMax)
	}
	if o.Warmup < 0 || o.Warmup > warmupPingsMax {
		return fmt.Errorf("rtt: warmup %d out of range 0..%d", o.Warmup, warmupPingsMax)
	}
	if o.PayloadBytes < payloadBytesMin || o.PayloadBytes > payloadBytesMax {
		return fmt.Errorf("rtt: payload %d out of range %d..%d", o.PayloadBytes, payloadBytesMin, payloadBytesMax)
	}
	for _, m := range o.Modes {
		if m != ModeXDPBusy && m != ModeXDPAdaptive && m != ModeUDP {
			return fmt.Errorf("rtt: unknown mode %q", m)
		}
	}
	if o.ServerCPU == nil || o.ClientCPU == nil {
		s, c := -1, -1
		if runtime.NumCPU() >= 2 {
			s, c = 0, 1
		}
		if o.ServerCPU == nil {
			o.ServerCPU = &s
		}
		if o.ClientCPU == nil {
			o.ClientCPU = &c
		}
	}
	return nil
}

// Run builds a namespace pair, measures every mode in turn and removes
// the namespaces. It needs root.
func Run(opts Options) ([]Result, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if err := netns.Available(); err != nil {
		return nil, err
	}
	pair, err := netns.NewPair(fmt.Sprintf("synod-xdprtt-%d", os.Getpid()), opts.Subnet)
	if err != nil {
		return nil, err
	}
	defer pair.Close()
	var results []Result
	for _, mode := range opts.Modes {
		r, err := runMode(pair, mode, opts)
		if err != nil {
			return results, fmt.Errorf("rtt: %s: %w", mode, err)
		}
		results = append(results, r)
		time.Sleep(modeSwitchPause)
	}
	return results, nil
}

func cores(cpu int) []int {
	if cpu < 0 {
		return nil
	}
	return []int{cpu}
}

// open creates one side's Conn inside namespace i of the pair.
func open(pair *netns.Pair, i int, mode string, opts Options, cpu int) (afxdp.Conn, string, error) {
	var c afxdp.Conn
	var attach string
	err := netns.Run(pair.NS[i], func() error {
		if mode == ModeUDP {
			u, err := afxdp.NewUDP(netip.AddrPortFrom(pair.Addr4[i], rttPort), afxdp.UDPOptions{})
			c = u
			return err
		}
		poll := afxdp.PollBusy
		if mode == ModeXDPAdaptive {
			poll = afxdp.PollAdaptive
		}
		x, err := afxdp.NewXDP(afxdp.Config{
			Interface: pair.If[i], Addr: pair.Addr4[i], Port: rttPort,
			Poll: poll, Attach: opts.Attach, Cores: cores(cpu),
		})
		if err == nil {
			c, attach = x, x.AttachMode()
		}
		return err
	})
	return c, attach, err
}

func runMode(pair *netns.Pair, mode string, opts Options) (Result, error) {
	res := Result{Mode: mode}
	srv, attach, err := open(pair, 0, mode, opts, *opts.ServerCPU)
	if err != nil {
		return res, err
	}
	defer srv.Close()
	cli, _, err := open(pair, 1, mode, opts, *opts.ClientCPU)
	if err != nil {
		return res, err
	}
	defer cli.Close()
	res.Attach = attach
	res.Pinned = *opts.ServerCPU >= 0 && *opts.ClientCPU >= 0 && (mode != ModeUDP || opts.PinUDP)

	srvDone := make(chan error, 1)
	srvCPU := *opts.ServerCPU
	if mode == ModeUDP && !opts.PinUDP {
		srvCPU = -1
	}
	go func() { srvDone <- echo(srv, mode, srvCPU) }()

	errc := make(chan error, 1)
	go func() {
		// The client loop gets its own locked, pinned thread (AF_XDP
		// conns pin their reader themselves; UDP needs it done here).
		if mode == ModeUDP && opts.PinUDP && *opts.ClientCPU >= 0 {
			if err := afxdp.PinToCPU(*opts.ClientCPU); err != nil {
				errc <- err
				return
			}
		}
		errc <- ping(cli, srv.LocalAddr(), opts, &res)
	}()
	err = <-errc
	srv.Close()
	cli.Close()
	if serr := <-srvDone; err == nil && serr != nil && !errors.Is(serr, afxdp.ErrClosed) {
		err = serr
	}
	return res, err
}

// echo sends every datagram back to where it came from until the Conn is
// closed.
func echo(c afxdp.Conn, mode string, cpu int) error {
	if mode == ModeUDP && cpu >= 0 {
		if err := afxdp.PinToCPU(cpu); err != nil {
			return err
		}
	}
	pkts := make([]afxdp.Packet, c.BatchSize())
	for i := range pkts {
		pkts[i].Buf = make([]byte, 2048)
	}
	for {
		n, err := c.ReadBatch(pkts)
		if err != nil {
			return err
		}
		if _, err := c.WriteBatch(pkts[:n]); err != nil {
			return err
		}
	}
}

// ping runs the warmup and measured round trips, one outstanding at a
// time. A reply missing for replyTimeout counts as lost (the Conn is
// closed by a timer to unblock the read) and ends the run.
func ping(c afxdp.Conn, to netip.AddrPort, opts Options, res *Result) error {
	hist := hdrhistogram.New(1, latencyNanosMax, latencySigFigs)
	tx := []afxdp.Packet{{Buf: make([]byte, opts.PayloadBytes), N: opts.PayloadBytes, Addr: to}}
	rx := make([]afxdp.Packet, c.BatchSize())
	for i := range rx {
		rx[i].Buf = make([]byte, 2048)
	}
	var lost atomic.Bool
	timer := time.AfterFunc(time.Hour, func() { lost.Store(true); c.Close() })
	defer timer.Stop()
	total := opts.Warmup + opts.Pings
	var start time.Time
	for seq := 0; seq < total; seq++ {
		if seq == opts.Warmup {
			start = time.Now()
		}
		timer.Reset(replyTimeout)
		binary.BigEndian.PutUint64(tx[0].Buf[0:8], uint64(seq))
		sent := time.Now()
		if _, err := c.WriteBatch(tx); err != nil {
			return err
		}
		for got := false; !got; {
			n, err := c.ReadBatch(rx)
			if err != nil {
				if lost.Load() {
					res.Lost = total - seq
					return fmt.Errorf("no reply to ping %d within %v", seq, replyTimeout)
				}
				return err
			}
			for _, p := range rx[:n] {
				if p.N == opts.PayloadBytes && binary.BigEndian.Uint64(p.Buf[0:8]) == uint64(seq) {
					got = true
				}
			}
		}
		if seq >= opts.Warmup {
			hist.RecordValue(int64(time.Since(sent)))
		}
	}
	res.Elapsed = time.Since(start)
	res.Pings = int(hist.TotalCount())
	res.P50 = time.Duration(hist.ValueAtQuantile(50))
	res.P99 = time.Duration(hist.ValueAtQuantile(99))
	res.P999 = time.Duration(hist.ValueAtQuantile(99.9))
	res.Max = time.Duration(hist.Max())
	return nil
}

// WriteTable prints results as a Markdown table, microseconds.
func WriteTable(w io.Writer, results []Result) {
	fmt.Fprintf(w, "| transport | attach | pinned | pings | p50 µs | p99 µs | p99.9 µs | max µs |\n")
	fmt.Fprintf(w, "| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	us := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e3) }
	for _, r := range results {
		attach := r.Attach
		if attach == "" {
			attach = "-"
		}
		pinned := "no"
		if r.Pinned {
			pinned = "yes"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %d | %s | %s | %s | %s |\n", r.Mode, attach, pinned, r.Pings, us(r.P50), us(r.P99), us(r.P999), us(r.Max))
	}
}
