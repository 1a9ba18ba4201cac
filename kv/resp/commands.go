package resp

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"synod/kv/proto"
	"synod/kv/server"
)

// cmdSpec is one command: how it is checked and run, and what COMMAND
// says about it (Redis's conventions: arity n is exactly n arguments,
// the name included, -n at least n; first/last/step locate the keys).
type cmdSpec struct {
	name               string
	arity              int
	flags              []string
	first, last, step  int
	run                func(x *exec)
	write, preAuthOnly bool
}

// Limits of the commands.
const (
	// casAttemptsMax bounds the read-compare-write rounds of one command
	// built on CAS (INCR, SET XX/GET, GETDEL, DEL): past it the key kept
	// changing under the command, which answers TRYAGAIN (nothing of it
	// was applied).
	casAttemptsMax = 64
	// delKeysMax bounds DEL's keys: each takes two operations (a
	// condition and the delete) of one atomic BATCH.
	delKeysMax = proto.BatchOpsMax / 2
	// scanCountDefault is SCAN's COUNT when none is given (Redis's).
	scanCountDefault = 10
	// commandNameBytesMax: no command name is longer.
	commandNameBytesMax = 16
)

var commandTable map[string]*cmdSpec

func init() {
	w, r, f := "write", "readonly", "fast"
	specs := []*cmdSpec{
		{name: "get", arity: 2, flags: []string{r, f}, first: 1, last: 1, step: 1, run: cmdGet},
		{name: "set", arity: -3, flags: []string{w}, first: 1, last: 1, step: 1, run: cmdSet, write: true},
		{name: "setnx", arity: 3, flags: []string{w, f}, first: 1, last: 1, step: 1, run: cmdSetNX, write: true},
		{name: "getset", arity: 3, flags: []string{w}, first: 1, last: 1, step: 1, run: cmdGetSet, write: true},
		{name: "getdel", arity: 2, flags: []string{w}, first: 1, last: 1, step: 1, run: cmdGetDel, write: true},
		{name: "del", arity: -2, flags: []string{w}, first: 1, last: -1, step: 1, run: cmdDel, write: true},
		{name: "unlink", arity: -2, flags: []string{w}, first: 1, last: -1, step: 1, run: cmdDel, write: true},
		{name: "exists", arity: -2, flags: []string{r, f}, first: 1, last: -1, step: 1, run: cmdExists},
		{name: "mget", arity: -2, flags: []string{r, f}, first: 1, last: -1, step: 1, run: cmdMGet},
		{name: "mset", arity: -3, flags: []string{w}, first: 1, last: -1, step: 2, run: cmdMSet, write: true},
		{name: "incr", arity: 2, flags: []string{w, f}, first: 1, last: 1, step: 1, run: cmdIncr, write: true},
		{name: "decr", arity: 2, flags: []string{w, f}, first: 1, last: 1, step: 1, run: cmdIncr, write: true},
		{name: "incrby", arity: 3, flags: []string{w, f}, first: 1, last: 1, step: 1, run: cmdIncr, write: true},
		{name: "decrby", arity: 3, flags: []string{w, f}, first: 1, last: 1, step: 1, run: cmdIncr, write: true},
		{name: "cas", arity: 4, flags: []string{w}, first: 1, last: 1, step: 1, run: cmdCAS, write: true},
		{name: "scan", arity: -2, flags: []string{r}, run: cmdScan},
		{name: "ping", arity: -1, flags: []string{f}, run: cmdPing},
		{name: "echo", arity: 2, flags: []string{f}, run: cmdEcho},
		{name: "select", arity: 2, flags: []string{f}, run: cmdSelect},
		{name: "client", arity: -2, run: cmdClient},
		{name: "info", arity: -1, run: cmdInfo},
		{name: "command", arity: -1, run: cmdCommand},
		{name: "config", arity: -2, run: cmdConfig},
		{name: "readonly", arity: 1, flags: []string{f}, run: cmdReadOnly},
		{name: "readwrite", arity: 1, flags: []string{f}, run: cmdReadWrite},
		{name: "hello", arity: -1, flags: []string{f}, run: cmdHello},
		{name: "auth", arity: -2, flags: []string{f}, run: cmdAuth},
		{name: "quit", arity: -1, flags: []string{f}},
	}
	commandTable = make(map[string]*cmdSpec, len(specs))
	for _, s := range specs {
		commandTable[s.name] = s
	}
}

// lookup finds a command by name, in any case.
func lookup(name []byte) *cmdSpec {
	if len(name) > commandNameBytesMax {
		return nil
	}
	return commandTable[strings.ToLower(string(name))]
}

func isQuit(args [][]byte) bool { return len(args) > 0 && strings.EqualFold(string(args[0]), "quit") }

// dispatch runs one command of an authenticated connection; true when
// the connection closes after its answer (QUIT).
func (c *conn) dispatch(x *exec) bool {
	args := x.args()
	spec := lookup(args[0])
	if spec == nil {
		x.c.s.stats.errors.Add(1)
		x.w.err(unknownCommand(args))
		return false
	}
	if (spec.arity > 0 && len(args) != spec.arity) || len(args) < -spec.arity {
		x.c.s.stats.errors.Add(1)
		x.w.errWrongArgs(spec.name)
		return false
	}
	if spec.name == "quit" {
		x.w.ok()
		return true
	}
	spec.run(x)
	return false
}

// unknownCommand is Redis's answer to an unknown command.
func unknownCommand(args [][]byte) string {
	var b strings.Builder
	b.WriteString("ERR unknown command '")
	b.WriteString(printable(args[0], 32))
	b.WriteString("', with args beginning with: ")
	for _, a := range args[1:min(len(args), 4)] {
		b.WriteString("'" + printable(a, 32) + "' ")
	}
	return b.String()
}

// printable is b cut at n bytes with anything but printable ASCII as '?'.
func printable(b []byte, n int) string {
	out := []byte(string(b[:min(len(b), n)]))
	for i, c := range out {
		if c < 0x20 || c > 0x7e || c == '\'' {
			out[i] = '?'
		}
	}
	return string(out)
}

func upper(b []byte) string {
	if len(b) > commandNameBytesMax {
		return ""
	}
	return strings.ToUpper(string(b))
}

// --- reads ---

// get reads key: its value and whether it exists, or an error response.
func (x *exec) get(key []byte) ([]byte, bool, *proto.Response) {
	resp := x.do(&proto.Request{Op: proto.OpGet, Key: key})
	switch resp.Status {
	case proto.StatusOK:
		return resp.Value, true, nil
	case proto.StatusNotFound:
		return nil, false, nil
	}
	return nil, false, resp
}

func cmdGet(x *exec) {
	v, ok, errResp := x.get(x.args()[1])
	switch {
	case errResp != nil:
		x.fail(errResp, false)
	case ok:
		x.w.bulk(v)
	default:
		x.w.null()
	}
}

func cmdExists(x *exec) {
	n := int64(0)
	for _, k := range x.args()[1:] {
		_, ok, errResp := x.get(k)
		if errResp != nil {
			x.fail(errResp, false)
			return
		}
		if ok {
			n++
		}
	}
	x.w.int(n)
}

// cmdMGet answers each key's value or null. Each GET is linearizable on
// its own; MGET is not one snapshot of all its keys.
func cmdMGet(x *exec) {
	keys := x.args()[1:]
	x.w.array(len(keys))
	for i, k := range keys {
		v, ok, errResp := x.get(k)
		if errResp != nil {
			x.w.b = x.w.b[:0]
			x.fail(errResp, false)
			return
		}
		if ok {
			x.w.bulk(v)
		} else {
			x.w.null()
		}
		if n := int64(len(x.w.b)); n > x.c.h.AnswerBytesMax() {
			// -BUSY would have the client retry what can never fit.
			x.w.b = x.w.b[:0]
			x.c.s.stats.errors.Add(1)
			x.w.err(fmt.Sprintf("ERR the MGET answer reached %d bytes after %d of %d keys, over the connection's response budget of %d (response_bytes_per_conn_max): ask for fewer keys", n, i+1, len(keys), x.c.h.AnswerBytesMax()))
			return
		}
		if !x.fits() {
			x.busy()
			return
		}
	}
}

// cmdScan: SCAN cursor [MATCH prefix*] [COUNT n] [TYPE string].
func cmdScan(x *exec) {
	args := x.args()
	var prefix []byte
	exact := false
	count := scanCountDefault
	typeOK := true
	for i := 2; i < len(args); i += 2 {
		if i+1 >= len(args) {
			x.w.errSyntax()
			return
		}
		switch upper(args[i]) {
		case "MATCH":
			p, ex, ok := matchPrefix(args[i+1])
			if !ok {
				x.w.err("ERR synod's SCAN MATCH takes a prefix pattern ('prefix*'), '*' or a literal key")
				return
			}
			prefix, exact = p, ex
		case "COUNT":
			n, err := strconv.Atoi(string(args[i+1]))
			if err != nil || n < 1 {
				x.w.err("ERR value is not an integer or out of range")
				return
			}
			count = min(n, proto.ScanLimitMax)
		case "TYPE":
			typeOK = strings.EqualFold(string(args[i+1]), "string")
		default:
			x.w.errSyntax()
			return
		}
	}
	start := prefix
	if cur := args[1]; string(cur) != "0" {
		id, err := strconv.ParseUint(string(cur), 10, 64)
		if err != nil {
			x.w.err("ERR invalid cursor")
			return
		}
		last, ok := x.c.s.scans.get(x.c.spec.ID, id)
		if !ok {
			x.w.err("ERR invalid cursor: unknown on this node, or one of the tenant's oldest (a node keeps " +
				strconv.Itoa(scanCursorsPerTenantMax) + " per tenant)")
			return
		}
		if after := append(bytes.Clone(last), 0); bytes.Compare(after, start) > 0 {
			start = after
		}
	}
	if !admittedScan(x, typeOK) {
		return
	}
	end := prefixEnd(prefix)
	if exact {
		end = append(bytes.Clone(prefix), 0)
	}
	if end != nil && bytes.Compare(start, end) >= 0 {
		x.scanReply(0, nil)
		return
	}
	// COUNT is a hint (as in Redis): with little room in the response
	// budgets the page is shorter and the cursor goes on (the scan's room
	// check, and scanPage for a page the leader served).
	resp := x.do(&proto.Request{Op: proto.OpScan, Start: start, End: end, Limit: uint32(count)})
	if resp.Status != proto.StatusOK {
		x.fail(resp, false)
		return
	}
	x.scanPage(resp.Pairs, resp.More)
}

// scanPage answers a SCAN page of pairs (more: the scan goes on past
// them), shortened to what the response budgets hold. A page this node
// read was charged pair by pair as it was read, values included though
// only keys are sent, and one forwarded to the leader reserved its
// largest reply before it went, so either almost always fits (a key's
// RESP framing can outgrow its binary pair's by a few bytes when its
// value is shorter); when not, it is halved until it fits, or answered
// -BUSY when not even one key does.
func (x *exec) scanPage(pairs []proto.KV, more bool) {
	n := len(pairs)
	for n > 0 && !x.fitsMore(scanReplyBytes(pairs[:n])) {
		n /= 2
	}
	if n == 0 && len(pairs) > 0 {
		x.c.h.Throttled()
		x.fail(server.BudgetThrottled(scanReplyBytes(pairs[:1])), false)
		return
	}
	next := uint64(0)
	if (more || n < len(pairs)) && n > 0 {
		next = x.c.s.scans.put(x.c.spec.ID, pairs[n-1].Key)
	}
	x.scanReply(next, pairs[:n])
}

// scanReplyBytes bounds scanReply's bytes for pairs (the cursor at its
// longest).
func scanReplyBytes(pairs []proto.KV) int64 {
	const head = len("*2\r\n$20\r\n18446744073709551615\r\n*\r\n") + 4 // 4: the count's digits
	n := int64(head)
	for _, kv := range pairs {
		n += int64(len("$\r\n\r\n") + len(strconv.Itoa(len(kv.Key))) + len(kv.Key))
	}
	return n
}

// admittedScan handles SCAN ... TYPE other-than-string: synod holds
// strings only, so the answer is the end of the scan with no keys.
func admittedScan(x *exec, typeOK bool) bool {
	if typeOK {
		return true
	}
	if x.admitLocal() {
		x.scanReply(0, nil)
	}
	return false
}

func (x *exec) scanReply(next uint64, pairs []proto.KV) {
	x.w.array(2)
	x.w.bulkString(strconv.FormatUint(next, 10))
	x.w.array(len(pairs))
	for _, kv := range pairs {
		x.w.bulk(kv.Key)
	}
}

// --- writes ---

// write runs one write and answers a non-OK, non-CAS_MISMATCH status;
// ok reports OK, mismatch CAS_MISMATCH.
func (x *exec) write(req *proto.Request) (ok, mismatch bool) {
	resp := x.do(req)
	switch resp.Status {
	case proto.StatusOK:
		return true, false
	case proto.StatusCASMismatch:
		return false, true
	}
	x.fail(resp, true)
	return false, false
}

// casRequest is a CAS of key from (found, cur) to value. The condition
// carries cur's digest, not cur: a condition on the value read plus the new
// value would not fit RequestBodyBytesMax once both are over half of it.
func casRequest(key []byte, found bool, cur, value []byte) *proto.Request {
	req := &proto.Request{Op: proto.OpCAS, Key: key, Value: value}
	if found {
		req.ExpectPresent, req.ExpectDigest, req.Expect = true, true, proto.ValueDigest(cur)
	}
	return req
}

// contended answers a command whose CAS lost casAttemptsMax times.
func (x *exec) contended() {
	x.c.s.stats.errors.Add(1)
	x.w.err("TRYAGAIN the key changed under the command " + strconv.Itoa(casAttemptsMax) + " times in a row; nothing was written")
}

func cmdSet(x *exec) {
	args := x.args()
	key, value := args[1], args[2]
	var nx, xx, get bool
	for _, opt := range args[3:] {
		switch upper(opt) {
		case "NX":
			nx = true
		case "XX":
			xx = true
		case "GET":
			get = true
		case "KEEPTTL":
			// No key has a time to live: there is nothing to keep.
		case "EX", "PX", "EXAT", "PXAT":
			x.w.err("ERR synod has no key expiry: SET EX/PX/EXAT/PXAT is not supported (keys live until deleted)")
			return
		default:
			x.w.errSyntax()
			return
		}
	}
	if nx && xx {
		x.w.errSyntax()
		return
	}
	switch {
	case !nx && !xx && !get:
		if ok, _ := x.write(&proto.Request{Op: proto.OpPut, Key: key, Value: value}); ok {
			x.w.ok()
		}
	case nx && !get:
		ok, mismatch := x.write(casRequest(key, false, nil, value))
		switch {
		case ok:
			x.w.ok()
		case mismatch:
			x.w.null()
		}
	default:
		x.setLoop(key, value, nx, xx, get)
	}
}

// setLoop is SET with XX or GET: read the key, decide, CAS from what was
// read; again when the key changed in between.
func (x *exec) setLoop(key, value []byte, nx, xx, get bool) {
	for range casAttemptsMax {
		cur, found, errResp := x.get(key)
		if errResp != nil {
			x.fail(errResp, false)
			return
		}
		if (nx && found) || (xx && !found) {
			if get && found {
				x.w.bulk(cur)
			} else {
				x.w.null()
			}
			return
		}
		ok, mismatch := x.write(casRequest(key, found, cur, value))
		switch {
		case ok && get && found:
			x.w.bulk(cur)
		case ok && get:
			x.w.null()
		case ok:
			x.w.ok()
		case mismatch:
			continue
		}
		return
	}
	x.contended()
}

func cmdSetNX(x *exec) {
	args := x.args()
	ok, mismatch := x.write(casRequest(args[1], false, nil, args[2]))
	switch {
	case ok:
		x.w.int(1)
	case mismatch:
		x.w.int(0)
	}
}

func cmdGetSet(x *exec) { x.setLoop(x.args()[1], x.args()[2], false, false, true) }

// deleteIf is a BATCH that deletes key only if it holds (found, cur): a
// condition on cur's digest (its value is moot: the DELETE after it on the
// same key wins), then the DELETE. So a conditional delete costs about
// 2 x key + 80 bytes whatever the value's size, and DEL of up to
// delKeysMax keys always fits one request.
func deleteIf(ops []proto.BatchOp, key []byte, found bool, cur []byte) []proto.BatchOp {
	cond := proto.BatchOp{Op: proto.OpCAS, Key: key, Value: []byte{}}
	if found {
		cond.ExpectPresent, cond.ExpectDigest, cond.Expect = true, true, proto.ValueDigest(cur)
	}
	return append(ops, cond, proto.BatchOp{Op: proto.OpDelete, Key: key})
}

func cmdGetDel(x *exec) {
	key := x.args()[1]
	for range casAttemptsMax {
		cur, found, errResp := x.get(key)
		if errResp != nil {
			x.fail(errResp, false)
			return
		}
		if !found {
			x.w.null()
			return
		}
		ok, mismatch := x.write(&proto.Request{Op: proto.OpBatch, Ops: deleteIf(nil, key, true, cur)})
		switch {
		case ok:
			x.w.bulk(cur)
		case mismatch:
			continue
		}
		return
	}
	x.contended()
}

// cmdDel deletes keys and answers how many existed, atomically: one
// BATCH that deletes every key on the condition that each still holds
// what was read (an absent key: still absent).
func cmdDel(x *exec) {
	var keys [][]byte
	seen := map[string]bool{}
	for _, k := range x.args()[1:] {
		if !seen[string(k)] {
			seen[string(k)] = true
			keys = append(keys, k)
		}
	}
	if len(keys) > delKeysMax {
		x.w.err("ERR DEL of more than " + strconv.Itoa(delKeysMax) + " keys: synod deletes them in one atomic BATCH of at most " +
			strconv.Itoa(proto.BatchOpsMax) + " operations")
		return
	}
	for range casAttemptsMax {
		ops := make([]proto.BatchOp, 0, 2*len(keys))
		n := int64(0)
		for _, k := range keys {
			cur, found, errResp := x.get(k)
			if errResp != nil {
				x.fail(errResp, false)
				return
			}
			if found {
				n++
			}
			ops = deleteIf(ops, k, found, cur)
		}
		if n == 0 {
			x.w.int(0) // nothing to delete: the reads are the answer
			return
		}
		ok, mismatch := x.write(&proto.Request{Op: proto.OpBatch, Ops: ops})
		switch {
		case ok:
			x.w.int(n)
		case mismatch:
			continue
		}
		return
	}
	x.contended()
}

// cmdMSet writes every pair in one atomic BATCH.
func cmdMSet(x *exec) {
	args := x.args()
	if (len(args)-1)%2 != 0 {
		x.w.errWrongArgs("mset")
		return
	}
	pairs := (len(args) - 1) / 2
	if pairs > proto.BatchOpsMax {
		x.w.err("ERR MSET of more than " + strconv.Itoa(proto.BatchOpsMax) + " keys: synod applies MSET as one atomic BATCH of at most " +
			strconv.Itoa(proto.BatchOpsMax) + " operations")
		return
	}
	ops := make([]proto.BatchOp, 0, pairs)
	for i := 1; i < len(args); i += 2 {
		ops = append(ops, proto.BatchOp{Op: proto.OpPut, Key: args[i], Value: args[i+1]})
	}
	if ok, _ := x.write(&proto.Request{Op: proto.OpBatch, Ops: ops}); ok {
		x.w.ok()
	}
}

// cmdIncr: INCR, DECR, INCRBY, DECRBY. The key's value is read and the
// sum written with a CAS from the value read, again if the key changed
// in between: each attempt is one write applied at most once, and only
// a CAS that matched changes the key, so one command adds its increment
// exactly once (a client's retry of the command is a new command).
func cmdIncr(x *exec) {
	args := x.args()
	delta := int64(1)
	switch name := strings.ToLower(string(args[0])); name {
	case "decr":
		delta = -1
	case "incrby", "decrby":
		d, err := parseRedisInt(args[2])
		if err != nil || (name == "decrby" && d == -1<<63) {
			x.w.err("ERR value is not an integer or out of range")
			return
		}
		if delta = d; name == "decrby" {
			delta = -d
		}
	}
	key := args[1]
	for range casAttemptsMax {
		cur, found, errResp := x.get(key)
		if errResp != nil {
			x.fail(errResp, false)
			return
		}
		v := int64(0)
		if found {
			n, err := parseRedisInt(cur)
			if err != nil {
				x.w.err("ERR value is not an integer or out of range")
				return
			}
			v = n
		}
		if (delta > 0 && v > 1<<63-1-delta) || (delta < 0 && v < -1<<63-delta) {
			x.w.err("ERR increment or decrement would overflow")
			return
		}
		next := v + delta
		ok, mismatch := x.write(casRequest(key, found, cur, strconv.AppendInt(nil, next, 10)))
		switch {
		case ok:
			x.w.int(next)
		case mismatch:
			continue
		}
		return
	}
	x.contended()
}

// parseRedisInt parses b as Redis parses an integer argument or value: an
// optional '-', then decimal digits without a leading zero (or the single
// digit 0), within int64. strconv.ParseInt alone also takes "+5" and
// "012", which Redis refuses.
func parseRedisInt(b []byte) (int64, error) {
	digits := b
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || (digits[0] == '0' && len(b) > 1) {
		return 0, errNotRedisInt
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, errNotRedisInt
		}
	}
	return strconv.ParseInt(string(b), 10, 64)
}

var errNotRedisInt = errors.New("not an integer")

// cmdCAS: CAS key expected new -> 1 when the key held expected and now
// holds new, 0 when it held something else or nothing.
func cmdCAS(x *exec) {
	args := x.args()
	ok, mismatch := x.write(casRequest(args[1], true, args[2], args[3]))
	switch {
	case ok:
		x.w.int(1)
	case mismatch:
		x.w.int(0)
	}
}

// sortedNames lists the command names in order (COMMAND).
func sortedNames() []string {
	names := make([]string, 0, len(commandTable))
	for n := range commandTable {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
