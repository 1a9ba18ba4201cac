package afxdp

import (
	"errors"
	"strings"
	"testing"
)

func TestConfigValidation(t *testing.T) {
	ok := Config{Interface: "eth0", Port: 7400}
	full, err := ok.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if full.Poll != PollAdaptive || full.Attach != AttachAuto || full.FrameBytes != 2048 || full.FrameCount != 4096 || full.SpinMicros != 50 {
		t.Fatalf("defaults: %+v", full)
	}
	bad := map[string]func(c *Config){
		"no interface":      func(c *Config) { c.Interface = "" },
		"long interface":    func(c *Config) { c.Interface = "abcdefghijklmnop" },
		"no port":           func(c *Config) { c.Port = 0 },
		"queue":             func(c *Config) { c.QueueID = -1 },
		"poll":              func(c *Config) { c.Poll = "sometimes" },
		"spin":              func(c *Config) { c.SpinMicros = spinMicrosMax + 1 },
		"frame bytes":       func(c *Config) { c.FrameBytes = 3000 },
		"frame count":       func(c *Config) { c.FrameCount = 1000 },
		"frame count small": func(c *Config) { c.FrameCount = 32 },
		"attach":            func(c *Config) { c.Attach = "offload" },
		"zero-copy generic": func(c *Config) { c.ZeroCopy, c.Attach = true, AttachGeneric },
		"negative core":     func(c *Config) { c.Cores = []int{-1} },
		"too many cores":    func(c *Config) { c.Cores = []int{0, 1, 0} },
		"multicast addr":    func(c *Config) { c.Addr = v4A.Addr(); c.Addr = mustAddr("224.0.0.1") },
		"unspecified addr":  func(c *Config) { c.Addr = mustAddr("::") },
	}
	for name, mutate := range bad {
		c := ok
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: Validate = %v, want ErrInvalidConfig", name, err)
		}
		// Open refuses an invalid config instead of falling back.
		if conn, fb, err := Open(c); err == nil || conn != nil || fb != nil {
			t.Errorf("%s: Open = %v, %v, %v", name, conn, fb, err)
		}
	}
	c := ok
	c.Cores = []int{4095}
	if _, err := NewXDP(c); err == nil || !strings.Contains(err.Error(), "core 4095") {
		t.Errorf("NewXDP with a missing core: %v", err)
	}
}

func TestOpenTransport(t *testing.T) {
	if _, _, err := OpenTransport("carrier-pigeon", Config{Interface: "lo", Port: 1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("unknown transport: %v", err)
	}
	if _, _, err := OpenTransport(TransportUDP, Config{Interface: "lo", Port: 1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("udp without addr: %v", err)
	}
	c, fb, err := OpenTransport(TransportUDP, Config{Interface: "lo", Addr: mustAddr("127.0.0.1"), Port: 47123})
	if err != nil {
		t.Skipf("no loopback udp: %v", err)
	}
	defer c.Close()
	if fb != nil || c.LocalAddr().String() != "127.0.0.1:47123" {
		t.Fatalf("udp transport: %v on %v", fb, c.LocalAddr())
	}
}

// TestOpenAutoWithoutInterface: the auto transport with no interface named
// takes the interface that holds its address (loopback for 127.0.0.1) and
// tries AF_XDP there; an address no interface holds falls back to UDP and
// says why, instead of refusing to start (kvnode's "auto" promise).
func TestOpenAutoWithoutInterface(t *testing.T) {
	if name, err := interfaceHolding(mustAddr("127.0.0.1")); err != nil || name == "" {
		t.Skipf("no interface holds 127.0.0.1 here: %q, %v", name, err)
	}
	if _, err := interfaceHolding(mustAddr("0.0.0.0")); err == nil {
		t.Fatal("the unspecified address named an interface")
	}
	if _, err := interfaceHolding(mustAddr("192.0.2.77")); err == nil {
		t.Fatal("a documentation address (TEST-NET-1) named an interface")
	}
	c, fb, err := Open(Config{Addr: mustAddr("127.0.0.1"), Port: 47124})
	if err != nil {
		t.Fatalf("auto on 127.0.0.1 without an interface: %v", err)
	}
	c.Close()
	t.Logf("auto on 127.0.0.1: fallback %v", fb)
	c, fb, err = Open(Config{Addr: mustAddr("0.0.0.0"), Port: 47125})
	if err != nil {
		t.Fatalf("auto on 0.0.0.0 without an interface: %v", err)
	}
	defer c.Close()
	if fb == nil || !strings.Contains(fb.Error(), "no interface configured") {
		t.Fatalf("auto on 0.0.0.0: fallback %v, want the reason", fb)
	}
	if _, ok := c.(*UDPConn); !ok {
		t.Fatalf("auto on 0.0.0.0: %T, want the UDP fallback", c)
	}
}
