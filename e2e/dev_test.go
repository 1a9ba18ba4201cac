package e2e

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"synod/internal/childproc"
)

// devPortsFree reports whether the dev cluster's twelve ports at base are
// free for TCP and UDP.
func devPortsFree(base int) bool {
	for _, off := range []int{1, 2, 3, 11, 12, 13, 21, 22, 23, 31, 32, 33} {
		p := base + off
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p})
		ln.Close()
		if err != nil {
			return false
		}
		uc.Close()
	}
	return true
}

// devBasePort picks a free block of loopback ports for `kvnode --dev
// --dev-port` (devPortsFree), trying up to 50 random bases.
func devBasePort(t *testing.T) int {
	t.Helper()
	for i := 0; i < 50; i++ {
		if b := portPickMin + rand.IntN(10000); devPortsFree(b) {
			return b
		}
	}
	t.Fatal("no free port block for the dev cluster")
	return 0
}

// TestDevMode runs the README's main job, `kvnode --dev`: it prints how to
// connect, the printed endpoints and token work, and Ctrl-C (SIGINT) stops
// the cluster and removes its temporary data.
func TestDevMode(t *testing.T) {
	base := devBasePort(t)
	cmd := exec.Command(kvnodeBin, "--dev", "--dev-port", fmt.Sprint(base))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := childproc.Start(cmd); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var (
		up             bool
		dataDir, token string
		endpoints      []string
	)
	timeout := time.After(startTimeout + leaderTimeout)
	for !up || token == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("kvnode --dev exited before the cluster was up")
			}
			switch f := strings.Fields(l); {
			case strings.HasPrefix(l, "synod dev cluster is up"):
				up = true
			case len(f) >= 2 && f[0] == "data:":
				dataDir = f[1]
			case strings.Contains(l, "kvctl --endpoints") && strings.HasSuffix(l, "put hello world"):
				for i := range f {
					switch f[i] {
					case "--endpoints":
						endpoints = strings.Split(f[i+1], ",")
					case "--token":
						token = f[i+1]
					}
				}
			}
		case <-timeout:
			t.Fatal("kvnode --dev did not report a cluster")
		}
	}
	if len(endpoints) != 3 || dataDir == "" {
		t.Fatalf("connect info: endpoints %v data %q", endpoints, dataDir)
	}
	cl := dialClient(t, endpoints, token, killClientRetries)
	ctx, cancel := ctxTimeout(killOpTimeout)
	defer cancel()
	if err := cl.Put(ctx, []byte("hello"), []byte("world")); err != nil {
		t.Fatal(err)
	}
	if v, err := cl.Get(ctx, []byte("hello")); err != nil || string(v) != "world" {
		t.Fatalf("get hello: %q %v", v, err)
	}
	cl.Close()

	cmd.Process.Signal(syscall.SIGINT)
	for range lines {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("kvnode --dev after SIGINT: %v", err)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Fatalf("dev data %s not removed (%v)", dataDir, err)
	}
}
