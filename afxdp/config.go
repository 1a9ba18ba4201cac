package afxdp

import (
	"errors"
	"fmt"
	"net/netip"
)

// Limits and defaults of the AF_XDP Conn.
const (
	// xdpHeadroomBytes is XDP_PACKET_HEADROOM: received frames start this
	// far into their UMEM chunk.
	xdpHeadroomBytes = 256
	// frameBytesMin/Max bound Config.FrameBytes; aligned UMEM chunks must be
	// a power of two between 2048 and the page size.
	frameBytesMin     = 2048
	frameBytesMax     = 4096
	frameBytesDefault = 2048
	// frameCountMin/Max bound Config.FrameCount (a power of two: half the
	// frames feed the fill/RX rings, half the TX/completion rings).
	frameCountMin     = 64
	frameCountMax     = 1 << 16
	frameCountDefault = 4096
	// queueIDMax bounds Config.QueueID.
	queueIDMax = 1023
	// spinMicrosDefault/Max bound Config.SpinMicros, the adaptive mode's
	// spin before it sleeps in poll(2).
	spinMicrosDefault = 50
	spinMicrosMax     = 10_000
	// coresMax bounds len(Config.Cores).
	coresMax = 2
	// xdpBatchPackets is the BatchSize of an XDPConn.
	xdpBatchPackets = 64
	// mtuBytesDefault is the link MTU assumed when the interface's is
	// unknown.
	mtuBytesDefault = 1500
)

// Poll modes.
const (
	PollBusy     = "busy"     // spin on the rings; for dedicated, pinned cores
	PollAdaptive = "adaptive" // spin up to SpinMicros, then sleep in poll(2)
)

// Attach modes.
const (
	AttachNative  = "native"  // driver XDP; fail if the driver lacks it
	AttachGeneric = "generic" // SKB-mode XDP; works on any interface, copy only
	AttachAuto    = "auto"    // native, falling back to generic
)

// Config describes one AF_XDP socket. The zero value of each optional field
// selects its default; Validate checks everything before any syscall. The
// toml tags let kvnode's config embed it.
type Config struct {
	// Interface is the network interface name (required).
	Interface string `toml:"interface"`
	// QueueID is the interface RX/TX queue the socket binds (default 0).
	QueueID int `toml:"queue"`
	// Addr is the local IP address (IPv4 or IPv6). Zero: the interface's
	// first IPv4 address, else its first global IPv6 address.
	Addr netip.Addr `toml:"addr"`
	// Port is the local UDP port (required): only datagrams to it are
	// redirected to the socket.
	Port uint16 `toml:"port"`
	// Poll is PollBusy or PollAdaptive (default adaptive).
	Poll string `toml:"poll"`
	// SpinMicros bounds the adaptive mode's spin (default 50, at most
	// 10000).
	SpinMicros int `toml:"spin_micros"`
	// FrameBytes is the UMEM chunk size: 2048 or 4096 (default 2048). The
	// largest payload is FrameBytes-256-headers (and the MTU).
	FrameBytes int `toml:"frame_bytes"`
	// FrameCount is the number of UMEM chunks, a power of two in
	// 64..65536 (default 4096).
	FrameCount int `toml:"frame_count"`
	// ZeroCopy binds with XDP_ZEROCOPY (real NICs: ice, mlx5, i40e)
	// instead of XDP_COPY. Needs native attach.
	ZeroCopy bool `toml:"zero_copy"`
	// Attach is AttachNative, AttachGeneric or AttachAuto (default auto).
	Attach string `toml:"attach"`
	// Cores pins poll loops: the goroutine that first calls ReadBatch is
	// locked to its thread and pinned to Cores[0]; Cores[1], if present, is
	// validated for the caller's send loop (see PinToCPU). Empty: no
	// pinning.
	Cores []int `toml:"cores"`
	// AcceptPartialChecksum also accepts UDP checksums holding only the
	// pseudo-header sum, which senders behind a veth with transmit
	// checksum offload produce. Off: such packets count as bad checksums
	// (prefer turning the offload off on the peer: DisableTxChecksum).
	AcceptPartialChecksum bool `toml:"accept_partial_checksum"`
}

// ErrInvalidConfig is wrapped by every Config validation error.
var ErrInvalidConfig = errors.New("afxdp: invalid config")

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

// withDefaults returns a copy with defaults filled in, or an error naming
// the first invalid field. It makes no syscalls.
func (c Config) withDefaults() (Config, error) {
	if c.Interface == "" || len(c.Interface) >= 16 {
		return c, configErr("interface name %q must be 1..15 bytes", c.Interface)
	}
	if c.QueueID < 0 || c.QueueID > queueIDMax {
		return c, configErr("queue %d out of range 0..%d", c.QueueID, queueIDMax)
	}
	if c.Port == 0 {
		return c, configErr("port must be set")
	}
	if c.Addr.IsValid() {
		c.Addr = c.Addr.Unmap()
		if c.Addr.IsUnspecified() || c.Addr.IsMulticast() {
			return c, configErr("addr %v must be a unicast address", c.Addr)
		}
	}
	switch c.Poll {
	case "":
		c.Poll = PollAdaptive
	case PollBusy, PollAdaptive:
	default:
		return c, configErr("poll mode %q: want %q or %q", c.Poll, PollBusy, PollAdaptive)
	}
	if c.SpinMicros == 0 {
		c.SpinMicros = spinMicrosDefault
	}
	if c.SpinMicros < 0 || c.SpinMicros > spinMicrosMax {
		return c, configErr("spin_micros %d out of range 0..%d", c.SpinMicros, spinMicrosMax)
	}
	if c.FrameBytes == 0 {
		c.FrameBytes = frameBytesDefault
	}
	if c.FrameBytes != 2048 && c.FrameBytes != 4096 {
		return c, configErr("frame_bytes %d: want %d or %d", c.FrameBytes, frameBytesMin, frameBytesMax)
	}
	if c.FrameCount == 0 {
		c.FrameCount = frameCountDefault
	}
	if c.FrameCount < frameCountMin || c.FrameCount > frameCountMax || c.FrameCount&(c.FrameCount-1) != 0 {
		return c, configErr("frame_count %d: want a power of two in %d..%d", c.FrameCount, frameCountMin, frameCountMax)
	}
	switch c.Attach {
	case "":
		c.Attach = AttachAuto
	case AttachNative, AttachGeneric, AttachAuto:
	default:
		return c, configErr("attach mode %q: want %q, %q or %q", c.Attach, AttachNative, AttachGeneric, AttachAuto)
	}
	if c.ZeroCopy && c.Attach == AttachGeneric {
		return c, configErr("zero_copy needs native attach, not %q", c.Attach)
	}
	if len(c.Cores) > coresMax {
		return c, configErr("%d cores given, at most %d (receive loop, send loop)", len(c.Cores), coresMax)
	}
	for _, cpu := range c.Cores {
		if cpu < 0 {
			return c, configErr("core %d is negative", cpu)
		}
	}
	c.Cores = append([]int(nil), c.Cores...)
	return c, nil
}

// Validate reports whether c is usable, without touching the system
// (whether the cores exist is checked by NewXDP).
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}
