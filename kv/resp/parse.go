package resp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// The command reader: RESP requests ("*<n>\r\n" then n times
// "$<len>\r\n<bytes>\r\n") and inline commands (one line of
// space-separated words, what a person types into telnet), read from a
// bufio.Reader one command at a time, with every length checked before
// anything is buffered for it.
//
// Why not redcon's reader (the library writes our replies): measured on
// redcon v1.6.4 (TestRedconReaderHazards),
//   - redcon.Reader trusts a declared bulk length: "*1\r\n$1073741824\r\n"
//     followed by data makes it double its buffer for as long as data
//     comes (no bound below the declared gigabyte), it re-parses the whole
//     buffer on every read, and it recurses once per read, so a command
//     trickled in small pieces costs quadratic time and a deep stack;
//   - redcon.ReadNextCommand panics on a negative bulk length
//     ("*1\r\n$-2\r\n"), which would take the node down with it.
// Neither can skip an oversized argument and keep the connection, which
// the binary protocol does for oversized frames. This reader is a few
// dozen lines, bounded everywhere, and fuzzed (FuzzReadCommand), with
// redcon's parser as the oracle for well-formed input.

// Limits of the command reader. Past ArgsPerCommandMax, BulkBytesMax, a
// header line or an inline line, the stream cannot be trusted (or is not
// worth reading) and the connection is closed after a protocol error;
// past the command's byte limit (CommandBytesMax after authentication)
// the rest of the command is read and dropped, and the command is
// answered with an error, the connection staying open.
const (
	// ArgsPerCommandMax bounds the arguments of one command: MSET of
	// proto.BatchOpsMax pairs needs 257; MGET, EXISTS and DEL of many keys
	// more.
	ArgsPerCommandMax = 1024
	// BulkBytesMax bounds one declared argument: the binary protocol's
	// FrameBytesMax, past which it also closes the connection.
	BulkBytesMax = 4 << 20
	// headerLineBytesMax bounds "*<n>\r\n" and "$<len>\r\n" lines.
	headerLineBytesMax = 24
	// InlineBytesMax bounds an inline command's line.
	InlineBytesMax = 16 << 10
	// argOverheadBytesMax is the most framing one argument adds: "$",
	// up to 7 digits of a length within BulkBytesMax, two CRLFs.
	argOverheadBytesMax = 1 + 7 + 4
	// DroppedBytesMax bounds a command that is read past rather than
	// buffered: like a binary frame over FrameBytesMax, a longer one
	// closes the connection.
	DroppedBytesMax = 4 << 20
)

// Errors of the command reader. errProtocol's text goes to the client
// ("-ERR Protocol error: ...") before the connection is closed.
var (
	errProtocol = errors.New("Protocol error")
	// errTooLarge marks a command that was read past and dropped.
	errTooLarge = errors.New("command too large")
)

// command is one request: its arguments (the command name first) and the
// bytes it took on the wire.
type command struct {
	args  [][]byte
	bytes int
	// inline: read as an inline command.
	inline bool
}

// commandReader reads commands from br. bytesMax bounds one command's
// argument bytes (and framing); argsMax its arguments.
type commandReader struct {
	br       *bufio.Reader
	bytesMax int
	argsMax  int
}

// read reads the next command. Errors: io errors as they come (io.EOF
// between commands is a clean end; inside one, io.ErrUnexpectedEOF);
// errProtocol (wrapped, with the reason) for input that cannot be parsed
// or is over a hard limit; errTooLarge (wrapped) for a command that was
// read and dropped because it exceeded bytesMax (the stream is still in
// step). An empty command ("*0\r\n", a blank line) returns a command
// with no arguments.
func (r *commandReader) read() (*command, error) {
	b, err := r.br.ReadByte()
	if err != nil {
		return nil, err
	}
	if b != '*' {
		r.br.UnreadByte()
		return r.readInline()
	}
	n, err := r.readLength()
	if err != nil {
		return nil, fmt.Errorf("%w: invalid multibulk length (%v)", errProtocol, err)
	}
	cmd := &command{bytes: 1 + digits(n) + 2}
	if n <= 0 {
		return cmd, nil
	}
	if n > r.argsMax {
		return nil, fmt.Errorf("%w: %d arguments in one command, more than %d", errProtocol, n, r.argsMax)
	}
	cmd.args = make([][]byte, 0, min(n, 16))
	dropped := false
	for i := 0; i < n; i++ {
		b, err := r.br.ReadByte()
		if err != nil {
			return nil, unexpected(err)
		}
		if b != '$' {
			return nil, fmt.Errorf("%w: expected '$', got %q", errProtocol, b)
		}
		size, err := r.readLength()
		if err != nil {
			return nil, fmt.Errorf("%w: invalid bulk length (%v)", errProtocol, err)
		}
		if size < 0 || size > BulkBytesMax {
			return nil, fmt.Errorf("%w: invalid bulk length %d (at most %d)", errProtocol, size, BulkBytesMax)
		}
		cmd.bytes += 1 + digits(size) + 2 + size + 2
		if cmd.bytes > max(r.bytesMax, DroppedBytesMax) {
			return nil, fmt.Errorf("%w: a command of %d bytes or more, more than %d", errProtocol, cmd.bytes, DroppedBytesMax)
		}
		if dropped || cmd.bytes > r.bytesMax {
			// Read past it: the lengths keep the stream in step.
			dropped = true
			if _, err := r.br.Discard(size); err != nil {
				return nil, unexpected(err)
			}
			if err := r.crlf(); err != nil {
				return nil, err
			}
			continue
		}
		arg := make([]byte, size+2)
		if _, err := io.ReadFull(r.br, arg); err != nil {
			return nil, unexpected(err)
		}
		if arg[size] != '\r' || arg[size+1] != '\n' {
			return nil, fmt.Errorf("%w: bulk of %d bytes not followed by CRLF", errProtocol, size)
		}
		cmd.args = append(cmd.args, arg[:size:size])
	}
	if dropped {
		return nil, fmt.Errorf("%w: %d bytes or more, more than %d", errTooLarge, cmd.bytes, r.bytesMax)
	}
	return cmd, nil
}

// crlf reads the "\r\n" that ends a bulk.
func (r *commandReader) crlf() error {
	var b [2]byte
	if _, err := io.ReadFull(r.br, b[:]); err != nil {
		return unexpected(err)
	}
	if b != [2]byte{'\r', '\n'} {
		return fmt.Errorf("%w: bulk not followed by CRLF", errProtocol)
	}
	return nil
}

// readLength reads a decimal length line ("-1", "0", "123") ended by
// CRLF, at most headerLineBytesMax bytes.
func (r *commandReader) readLength() (int, error) {
	var line [headerLineBytesMax]byte
	n := 0
	for {
		b, err := r.br.ReadByte()
		if err != nil {
			return 0, unexpected(err)
		}
		if b == '\n' {
			break
		}
		if n == len(line) {
			return 0, errors.New("line too long")
		}
		line[n] = b
		n++
	}
	if n < 2 || line[n-1] != '\r' {
		return 0, errors.New("line not ended by CRLF")
	}
	return parseLength(line[:n-1])
}

// parseLength parses an optional '-' and 1 to 9 decimal digits: every
// length the reader accepts fits, and nothing can overflow.
func parseLength(b []byte) (int, error) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 9 {
		return 0, fmt.Errorf("%q is not a length", b)
	}
	v := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not a length", b)
		}
		v = v*10 + int(c-'0')
	}
	if neg {
		return -v, nil
	}
	return v, nil
}

// digits is the number of decimal digits of n (with a sign).
func digits(n int) int {
	d := 1
	if n < 0 {
		d, n = 2, -n
	}
	for ; n >= 10; n /= 10 {
		d++
	}
	return d
}

// unexpected turns io.EOF inside a command into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readInline reads one inline command: a line of words separated by
// spaces or tabs; a word may be "double quoted" (with \" \\ \n \r \t
// \a \b and \xHH escapes) or 'single quoted' (with \' only), as redis-cli
// and Redis's own inline parser split them.
func (r *commandReader) readInline() (*command, error) {
	line := make([]byte, 0, 64)
	for {
		b, err := r.br.ReadByte()
		if err != nil {
			if len(line) == 0 {
				return nil, err
			}
			return nil, unexpected(err)
		}
		if b == '\n' {
			break
		}
		if len(line) >= min(InlineBytesMax, r.bytesMax) {
			return nil, fmt.Errorf("%w: too big inline request", errProtocol)
		}
		line = append(line, b)
	}
	cmd := &command{bytes: len(line) + 1, inline: true}
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	args, err := splitArgs(line)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errProtocol, err)
	}
	if len(args) > r.argsMax {
		return nil, fmt.Errorf("%w: %d arguments in one command, more than %d", errProtocol, len(args), r.argsMax)
	}
	cmd.args = args
	return cmd, nil
}

// splitArgs splits an inline command line (see readInline).
func splitArgs(line []byte) ([][]byte, error) {
	var args [][]byte
	i := 0
	for {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		if i == len(line) {
			return args, nil
		}
		var arg []byte
		switch line[i] {
		case '"':
			i++
			for {
				if i == len(line) {
					return nil, errors.New("unbalanced quotes in request")
				}
				c := line[i]
				if c == '"' {
					i++
					break
				}
				if c == '\\' && i+1 < len(line) {
					i++
					switch e := line[i]; e {
					case 'n':
						c = '\n'
					case 'r':
						c = '\r'
					case 't':
						c = '\t'
					case 'a':
						c = '\a'
					case 'b':
						c = '\b'
					case 'x':
						if i+2 < len(line) && isHex(line[i+1]) && isHex(line[i+2]) {
							c = unhex(line[i+1])<<4 | unhex(line[i+2])
							i += 2
						} else {
							c = 'x'
						}
					default:
						c = e
					}
				}
				arg = append(arg, c)
				i++
			}
		case '\'':
			i++
			for {
				if i == len(line) {
					return nil, errors.New("unbalanced quotes in request")
				}
				c := line[i]
				if c == '\'' {
					i++
					break
				}
				if c == '\\' && i+1 < len(line) && line[i+1] == '\'' {
					i++
					c = '\''
				}
				arg = append(arg, c)
				i++
			}
		default:
			for i < len(line) && line[i] != ' ' && line[i] != '\t' {
				if line[i] == '"' || line[i] == '\'' {
					return nil, errors.New("unbalanced quotes in request")
				}
				arg = append(arg, line[i])
				i++
			}
		}
		// A closing quote must be followed by a space or the end.
		if i < len(line) && line[i] != ' ' && line[i] != '\t' {
			return nil, errors.New("unbalanced quotes in request")
		}
		if arg == nil {
			arg = []byte{}
		}
		args = append(args, arg)
	}
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}
