package server

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// failingListener fails its first fails Accept calls with EMFILE, as a
// process out of file descriptors sees, then accepts as ln does.
type failingListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestServeOutlivesAcceptErrors: an accept error (the process out of file
// descriptors) does not stop the server: it waits the error out and
// serves the next client, and counts what it waited out. Only Close, or
// the listener closed under it, ends Serve. An outside tester who
// exhausted a node's descriptors through its admin port left the client
// and RESP servers stopped for good while the node reported itself
// healthy.
func TestServeOutlivesAcceptErrors(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &failingListener{Listener: inner}
	const fails = 4
	ln.fails.Store(fails)
	s := New(Config{}, registry(t), &echoBackend{}, zerolog.Nop())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() { s.Close() })

	c := dialRaw(t, inner.Addr().String())
	if r := c.hello(tokenA); r.Status != 0 {
		t.Fatalf("HELLO after %d failed accepts: %v %s", fails, r.Status, r.Message)
	}
	if got := s.Stats().AcceptsFailed; got != fails {
		t.Fatalf("AcceptsFailed %d, want %d", got, fails)
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned %v while its listener was open", err)
	default:
	}
	inner.Close() // closed under the server: Serve ends, and says why
	select {
	case err := <-served:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Serve returned %v after its listener closed, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its listener closed")
	}
}
