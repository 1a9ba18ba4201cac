package testport

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestFreeBelowEphemeralAndDistinct: 50 ports, none twice, each below the
// kernel's ephemeral range when it is known and bindable now.
func TestFreeBelowEphemeralAndDistinct(t *testing.T) {
	lo := ephemeralLow()
	seen := map[int]bool{}
	for i := 0; i < 50; i++ {
		p := Free(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if lo > pickMin+1000 && (p < pickMin || p >= lo) {
			t.Fatalf("port %d outside %d..%d (the ephemeral range starts at %d)", p, pickMin, lo-1, lo)
		}
	}
}

// TestClaimAcrossProcesses: a port another live process claimed is not
// handed out here (the test binaries of two packages run at once); once
// that process ends, its claims go with it. The child is this test binary
// (TestClaimChild), holding its claim until its stdin closes.
func TestClaimAcrossProcesses(t *testing.T) {
	// A port Free never picks (below pickMin): one it picked could be
	// claimed already, by this process (the test above claims 50) or by
	// another package's test binary, and the child refused (CI, once,
	// with 20123).
	const p = pickMin - 1
	cmd := exec.Command(os.Args[0], "-test.run=^TestClaimChild$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("TESTPORT_CHILD_PORT=%d", p))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "claimed" {
		t.Fatalf("child: %q, %v", line, err)
	}
	mu.Lock()
	held := !claim(p)
	mu.Unlock()
	stdin.Close()
	cmd.Wait()
	mu.Lock()
	free := claim(p)
	if free {
		// Given back, so the test can run again in this process.
		lk := syscall.Flock_t{Type: syscall.F_UNLCK, Whence: 0, Start: int64(p), Len: 1}
		syscall.FcntlFlock(claims.Fd(), syscall.F_SETLK, &lk)
	}
	mu.Unlock()
	if !held || !free {
		t.Fatalf("port %d: refused while another process held it %v, claimed once it ended %v", p, held, free)
	}
}

// TestClaimChild is TestClaimAcrossProcesses's child (it does nothing
// unless TESTPORT_CHILD_PORT is set).
func TestClaimChild(t *testing.T) {
	ps := os.Getenv("TESTPORT_CHILD_PORT")
	if ps == "" {
		t.Skip("helper process for TestClaimAcrossProcesses")
	}
	p, _ := strconv.Atoi(ps)
	mu.Lock()
	ok := claim(p)
	mu.Unlock()
	if !ok {
		fmt.Println("refused")
		return
	}
	fmt.Println("claimed")
	io.Copy(io.Discard, os.Stdin) // hold the claim until the parent closes stdin
}
