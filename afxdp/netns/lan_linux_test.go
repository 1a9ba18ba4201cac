package netns

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestLANHostLink builds a two-node LAN, links the root namespace to it,
// pings the root end from a node and checks that remove deletes the root end.
func TestLANHostLink(t *testing.T) {
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true but: %v", err)
		}
		t.Skipf("skipped: %v", err)
	}
	subnet := 150 + os.Getpid()%50
	l, err := NewLAN(fmt.Sprintf("synod-nstest-%d", os.Getpid()), subnet, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	name := fmt.Sprintf("nt%d", os.Getpid()%1_000_000)
	host := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 199, byte(subnet), 254}), 24)
	remove, err := l.AddHostLink(name, host)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ip", "-4", "-o", "addr", "show", "dev", name).CombinedOutput()
	if err != nil || !strings.Contains(string(out), host.String()) {
		t.Fatalf("root end %s lacks %s: %v: %s", name, host, err, out)
	}
	if err := Ping(l.NS[0], host.Addr(), 5*time.Second); err != nil {
		t.Fatalf("ping %s from %s: %v", host.Addr(), l.NS[0], err)
	}
	if err := remove(); err != nil {
		t.Fatal(err)
	}
	if exec.Command("ip", "link", "show", name).Run() == nil {
		t.Fatalf("%s still exists after remove", name)
	}
	if err := remove(); err != nil {
		t.Fatalf("second remove: %v", err)
	}
}
