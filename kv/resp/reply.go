package resp

import (
	"strconv"
	"strings"

	"github.com/tidwall/redcon"
)

// reply builds one command's answer in RESP2 or, after HELLO 3, RESP3.
// The RESP2 types come from redcon's encoders; RESP3 adds null ("_"),
// maps ("%") and sets ("~"), which redcon does not write.
type reply struct {
	b     []byte
	resp3 bool
}

func (w *reply) ok()             { w.b = redcon.AppendOK(w.b) }
func (w *reply) simple(s string) { w.b = redcon.AppendString(w.b, s) }
func (w *reply) int(n int64)     { w.b = redcon.AppendInt(w.b, n) }
func (w *reply) bulk(v []byte)   { w.b = redcon.AppendBulk(w.b, v) }
func (w *reply) bulkString(s string) {
	w.b = redcon.AppendBulkString(w.b, s)
}
func (w *reply) array(n int) { w.b = redcon.AppendArray(w.b, n) }

// err writes an error reply; msg starts with its code ("ERR ...",
// "BUSY ...") and is cut at errorBytesMax.
func (w *reply) err(msg string) {
	if len(msg) > errorBytesMax {
		msg = msg[:errorBytesMax]
	}
	w.b = redcon.AppendError(w.b, msg)
}

// errorBytesMax bounds an error reply's text (the binary protocol's
// MessageBytesMax and a code).
const errorBytesMax = 1024 + 32

// null writes a null: "$-1" in RESP2, "_" in RESP3.
func (w *reply) null() {
	if w.resp3 {
		w.b = append(w.b, '_', '\r', '\n')
		return
	}
	w.b = redcon.AppendNull(w.b)
}

// mapLen starts a map of n pairs: "%n" in RESP3, an array of 2n in RESP2.
func (w *reply) mapLen(n int) {
	if w.resp3 {
		w.b = append(w.b, '%')
		w.b = strconv.AppendInt(w.b, int64(n), 10)
		w.b = append(w.b, '\r', '\n')
		return
	}
	w.array(2 * n)
}

// setLen starts a set of n: "~n" in RESP3, an array in RESP2.
func (w *reply) setLen(n int) {
	if w.resp3 {
		w.b = append(w.b, '~')
		w.b = strconv.AppendInt(w.b, int64(n), 10)
		w.b = append(w.b, '\r', '\n')
		return
	}
	w.array(n)
}

// errWrongArgs is Redis's arity error.
func (w *reply) errWrongArgs(name string) {
	w.err("ERR wrong number of arguments for '" + strings.ToLower(name) + "' command")
}

// errSyntax is Redis's generic syntax error.
func (w *reply) errSyntax() { w.err("ERR syntax error") }
