package resp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/tidwall/redcon"

	"synod/kv/local"
	"synod/kv/server"
	"synod/kv/sm"
	"synod/tenants"
)

// encodeCommand is args as a RESP request, written with redcon's encoder.
func encodeCommand(args ...string) []byte {
	b := redcon.AppendArray(nil, len(args))
	for _, a := range args {
		b = redcon.AppendBulkString(b, a)
	}
	return b
}

// readAll reads every command of in with the post-authentication limits.
func readAll(in []byte, bytesMax int) ([]*command, error) {
	r := commandReader{br: bufio.NewReaderSize(bytes.NewReader(in), 64), bytesMax: bytesMax, argsMax: ArgsPerCommandMax}
	var out []*command
	for {
		c, err := r.read()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
		out = append(out, c)
	}
}

func argsOf(c *command) []string {
	var out []string
	for _, a := range c.args {
		out = append(out, string(a))
	}
	return out
}

func TestReadCommandWellFormed(t *testing.T) {
	in := slices.Concat(encodeCommand("SET", "k", "v\r\nwith\x00bytes"), encodeCommand("GET", "k"), []byte("*0\r\n"),
		encodeCommand("SET", "", ""), []byte("PING\r\nset  \"a b\" 'c\\'d' \"\\x41\\n\"\n\r\n"))
	cmds, err := readAll(in, CommandBytesMax)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"SET", "k", "v\r\nwith\x00bytes"}, {"GET", "k"}, nil, {"SET", "", ""}, {"PING"}, {"set", "a b", "c'd", "A\n"}, nil}
	if len(cmds) != len(want) {
		t.Fatalf("%d commands, want %d", len(cmds), len(want))
	}
	for i, c := range cmds {
		if got := argsOf(c); !slices.Equal(got, want[i]) {
			t.Errorf("command %d: %q, want %q", i, got, want[i])
		}
	}
}

// TestReadCommandMalformed: every malformed input is a protocol error (the
// connection is closed), an oversized one is read past (errTooLarge, the
// stream still in step), and nothing allocates what a length merely
// declares beyond the limits.
func TestReadCommandMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want error
	}{
		{"negative bulk length (panics redcon.ReadNextCommand)", "*1\r\n$-2\r\n", errProtocol},
		{"bulk length over BulkBytesMax", "*1\r\n$1073741824\r\n", errProtocol},
		{"too many arguments", fmt.Sprintf("*%d\r\n", ArgsPerCommandMax+1), errProtocol},
		{"not a bulk", "*1\r\n+OK\r\n", errProtocol},
		{"bad count", "*x\r\n", errProtocol},
		{"count line too long", "*" + strings.Repeat("1", 40) + "\r\n", errProtocol},
		{"LF without CR", "*1\n$1\r\na\r\n", errProtocol},
		{"bulk without CRLF", "*1\r\n$1\r\nabc", errProtocol},
		{"plus sign", "*1\r\n$+1\r\na\r\n", errProtocol},
		{"unbalanced quotes", "SET \"a b\r\n", errProtocol},
		{"quote glued to a word", "SET \"a\"b\r\n", errProtocol},
		{"inline too long", strings.Repeat("a", InlineBytesMax+1) + "\n", errProtocol},
		{"truncated", "*2\r\n$3\r\nGET\r\n$1\r\n", io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readAll([]byte(tc.in), CommandBytesMax)
			if !errors.Is(err, tc.want) {
				t.Fatalf("%q: %v, want %v", tc.in, err, tc.want)
			}
		})
	}
	// A command over the byte limit is read past; the next one is fine.
	big := encodeCommand("SET", "k", strings.Repeat("v", 300))
	in := slices.Concat(big, encodeCommand("PING"))
	r := commandReader{br: bufio.NewReader(bytes.NewReader(in)), bytesMax: 200, argsMax: 8}
	if _, err := r.read(); !errors.Is(err, errTooLarge) {
		t.Fatalf("an oversized command: %v", err)
	}
	if c, err := r.read(); err != nil || !slices.Equal(argsOf(c), []string{"PING"}) {
		t.Fatalf("after an oversized command: %v %v", c, err)
	}
}

// TestRedconReaderHazards measures why the command reader is not
// redcon's (redcon v1.6.4, pinned in go.mod): ReadNextCommand panics on
// a negative bulk length, and Reader buffers whatever a declared length
// promises. If a new redcon version changes either, revisit parse.go.
func TestRedconReaderHazards(t *testing.T) {
	panicked := func() (p bool) {
		defer func() { p = recover() != nil }()
		redcon.ReadNextCommand([]byte("*1\r\n$-2\r\n"), nil)
		return false
	}()
	if !panicked {
		t.Logf("redcon.ReadNextCommand no longer panics on a negative length")
	}
	// 8 MiB of a declared 1 GiB argument: redcon.Reader holds it all
	// (our reader refuses the length before reading any of it).
	const fed = 8 << 20
	src := io.MultiReader(strings.NewReader("*1\r\n$1073741824\r\n"), io.LimitReader(zeros{}, fed))
	rd := redcon.NewReader(src)
	_, err := rd.ReadCommand()
	t.Logf("redcon.Reader after %d MiB of one declared 1 GiB bulk: %v (panicked on negative length: %v)", fed>>20, err, panicked)
	if _, err := readAll([]byte("*1\r\n$1073741824\r\n"), CommandBytesMax); !errors.Is(err, errProtocol) {
		t.Fatalf("our reader: %v", err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestWriteSeedCorpus regenerates testdata/fuzz/FuzzReadCommand and
// FuzzCommands when SYNOD_WRITE_CORPUS=1; otherwise it checks that they
// exist (they run with every go test).
func TestWriteSeedCorpus(t *testing.T) {
	seeds := [][]byte{
		encodeCommand("SET", "k", "v"),
		slices.Concat(encodeCommand("GET", "k"), encodeCommand("MGET", "k", "j")),
		encodeCommand("SET", "k", "v", "NX", "GET"),
		encodeCommand("SET", "k", "v", "EX", "10"),
		encodeCommand("MSET", "a", "1", "b", "2"),
		encodeCommand("INCRBY", "n", "-9223372036854775808"),
		encodeCommand("SCAN", "0", "MATCH", "a*", "COUNT", "5"),
		encodeCommand("CAS", "k", "v", "w"),
		encodeCommand("DEL", "a", "b", "a"),
		encodeCommand("HELLO", "3", "AUTH", "default", "alpha-token-0001", "SETNAME", "x"),
		encodeCommand("CLIENT", "SETINFO", "LIB-NAME", "go-redis"),
		encodeCommand("COMMAND", "INFO", "get", "nope"),
		[]byte("*1\r\n$-2\r\n"),
		[]byte("PING\r\nECHO \"a\\x00b\"\r\n"),
		[]byte("*2\r\n$3\r\nGET\r\n$1\r\n"),
		[]byte("SET \"unbalanced\r\n"),
	}
	for _, target := range []string{"FuzzReadCommand", "FuzzCommands"} {
		dir := filepath.Join("testdata", "fuzz", target)
		if os.Getenv("SYNOD_WRITE_CORPUS") != "1" {
			if ents, err := os.ReadDir(dir); err != nil || len(ents) == 0 {
				t.Fatalf("seed corpus %s missing (run with SYNOD_WRITE_CORPUS=1): %v", dir, err)
			}
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// FuzzReadCommand: the reader never panics, respects its limits, agrees
// with redcon's parser on every RESP command both accept, and reads back
// what it would encode.
func FuzzReadCommand(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		r := commandReader{br: bufio.NewReaderSize(bytes.NewReader(in), 16), bytesMax: 4096, argsMax: 64}
		rest := in
		for {
			c, err := r.read()
			if err != nil {
				return
			}
			if len(c.args) > 64 {
				t.Fatalf("%d arguments, limit 64", len(c.args))
			}
			if c.bytes > 4096+64 && !c.inline {
				t.Fatalf("a command of %d bytes passed the 4096 limit", c.bytes)
			}
			if !c.inline && len(rest) >= c.bytes && len(c.args) > 0 {
				// Oracle: redcon on the same bytes, recovering its panics.
				func() {
					defer func() { recover() }()
					complete, args, kind, _, rerr := redcon.ReadNextCommand(rest[:c.bytes], nil)
					if rerr == nil && complete && kind == redcon.Redis {
						if len(args) != len(c.args) {
							t.Fatalf("redcon read %d arguments, we read %d", len(args), len(c.args))
						}
						for i := range args {
							if !bytes.Equal(args[i], c.args[i]) {
								t.Fatalf("argument %d: redcon %q, we %q", i, args[i], c.args[i])
							}
						}
					}
				}()
				// Round trip.
				var strs []string
				for _, a := range c.args {
					strs = append(strs, string(a))
				}
				back, err := readAll(encodeCommand(strs...), 1<<20)
				if err != nil || len(back) != 1 || !slices.Equal(argsOf(back[0]), strs) {
					t.Fatalf("round trip of %q: %v %v", strs, back, err)
				}
			}
			if c.bytes <= len(rest) {
				rest = rest[c.bytes:]
			}
		}
	})
}

// FuzzCommands runs whatever parses as commands through an authenticated
// connection's dispatcher on a real state machine: no input panics, and
// every answer is well-formed RESP.
func FuzzCommands(f *testing.F) {
	reg, err := tenants.NewRegistry([]tenants.Spec{specAlpha})
	if err != nil {
		f.Fatal(err)
	}
	store, err := sm.Open(filepath.Join(f.TempDir(), "sm"), sm.Options{})
	if err != nil {
		f.Fatal(err)
	}
	defer store.Close()
	be := local.New(store, "127.0.0.1:1")
	host := server.New(server.Config{}, reg, be, zerolog.Nop())
	defer host.Close()
	s := New(host, reg, be, Config{NodeID: 1, Log: zerolog.Nop()})
	f.Fuzz(func(t *testing.T, in []byte) {
		cmds, _ := readAll(in, CommandBytesMax)
		h := hostedForTest(t, host, specAlpha)
		c := &conn{s: s, h: h, spec: specAlpha, nc: h.Conn()}
		for _, cmd := range cmds {
			if len(cmd.args) == 0 {
				continue
			}
			w := &reply{resp3: c.resp3}
			x := &exec{c: c, ctx: t.Context(), w: w, held: 1 << 30, cmd: cmd}
			c.dispatch(x)
			if n, err := checkReply(w.b); err != nil || n != len(w.b) {
				t.Fatalf("%q answered %q: %v", argsOf(cmd), w.b, err)
			}
		}
	})
}

// checkReply parses one RESP2/RESP3 reply and returns its length.
func checkReply(b []byte) (int, error) {
	line := func(b []byte) (string, int, error) {
		i := bytes.Index(b, []byte("\r\n"))
		if i < 1 {
			return "", 0, errors.New("no line")
		}
		return string(b[1:i]), i + 2, nil
	}
	if len(b) == 0 {
		return 0, errors.New("empty reply")
	}
	s, n, err := line(b)
	if err != nil {
		return 0, err
	}
	var v int
	switch b[0] {
	case '+', '-', ':', '_':
		return n, nil
	case '$':
		if _, err := fmt.Sscan(s, &v); err != nil {
			return 0, err
		}
		if v < 0 {
			return n, nil
		}
		if len(b) < n+v+2 || string(b[n+v:n+v+2]) != "\r\n" {
			return 0, errors.New("short bulk")
		}
		return n + v + 2, nil
	case '*', '%', '~':
		if _, err := fmt.Sscan(s, &v); err != nil {
			return 0, err
		}
		if b[0] == '%' {
			v *= 2
		}
		for range max(v, 0) {
			m, err := checkReply(b[n:])
			if err != nil {
				return 0, err
			}
			n += m
		}
		return n, nil
	}
	return 0, fmt.Errorf("unknown reply type %q", b[0])
}

// hostedForTest is a kv/server hosted connection for spec over a pipe,
// for driving the dispatcher without a socket.
func hostedForTest(t testing.TB, host *server.Server, spec tenants.Spec) *server.Hosted {
	t.Helper()
	ln := newPipeListener()
	got := make(chan *server.Hosted, 1)
	release := make(chan struct{})
	go host.ServeHosted(ln, func(h *server.Hosted) {
		if r := h.Authenticate(spec); r != nil {
			t.Errorf("authenticate: %v", r.Message)
		}
		got <- h
		<-release
	})
	cc := ln.dial()
	t.Cleanup(func() { close(release); cc.Close(); ln.Close() })
	select {
	case h := <-got:
		return h
	case <-time.After(10 * time.Second):
		t.Fatal("no hosted connection")
		return nil
	}
}

// pipeListener hands out the server ends of net.Pipe connections.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *pipeListener) dial() net.Conn {
	c, s := net.Pipe()
	l.conns <- s
	return c
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }
