package resp

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"synod/kv/proto"
	"synod/tenants"
)

// Compatibility: the Redis version synod's RESP endpoint answers like, as
// HELLO and INFO report it (clients gate features on it).
const redisCompatVersion = "7.0.0"

// Errors of authentication, in Redis's words.
const (
	errNoAuth       = "NOAUTH Authentication required."
	errNoAuthHello  = "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time"
	errWrongPass    = "WRONGPASS invalid username-password pair or user is disabled."
	errTenantChange = "ERR a connection's tenant cannot change: open a new connection to authenticate as another tenant"
)

// preAuth serves one command before authentication: AUTH, HELLO and
// QUIT; anything else is NOAUTH. done: close the connection after the
// answer; authed: the connection is now authenticated.
func (c *conn) preAuth(args [][]byte, w *reply) (done, authed bool) {
	switch upper(args[0]) {
	case "AUTH":
		var user, token []byte
		switch len(args) {
		case 2:
			token = args[1]
		case 3:
			user, token = args[1], args[2]
		default:
			w.errWrongArgs("auth")
			return false, false
		}
		spec, ok := c.checkToken(user, token, w)
		if !ok {
			return false, false
		}
		if !c.admitConn(spec, w) {
			return true, false
		}
		w.ok()
		return false, true
	case "HELLO":
		h, ok := parseHello(args, w)
		if !ok {
			return false, false
		}
		if !h.auth {
			w.err(errNoAuthHello)
			return false, false
		}
		spec, ok := c.checkToken(h.user, h.token, w)
		if !ok {
			return false, false
		}
		if !c.admitConn(spec, w) {
			return true, false
		}
		c.hello(h, w)
		return false, true
	case "QUIT":
		w.ok()
		return true, false
	}
	w.err(errNoAuth)
	return false, false
}

// checkToken authenticates token (and user: a tenant's name or id, or
// "default" for whichever tenant the token is) as the binary HELLO does.
func (c *conn) checkToken(user, token []byte, w *reply) (tenants.Spec, bool) {
	spec, ok := c.s.reg.Authenticate(string(token))
	if ok && user != nil {
		u := string(user)
		ok = u == "default" || u == spec.Name || u == strconv.FormatUint(uint64(spec.ID), 10)
	}
	if !ok {
		c.s.stats.authFailures.Add(1)
		c.h.Notice().Msg("RESP AUTH refused: unknown token")
		w.err(errWrongPass)
		return tenants.Spec{}, false
	}
	return spec, true
}

// admitConn takes the tenant's connection slot (the binary protocol's
// caps); false: refused and answered, the connection closes.
func (c *conn) admitConn(spec tenants.Spec, w *reply) bool {
	if r := c.h.Authenticate(spec); r != nil {
		if r.Status == proto.StatusUnavailable {
			w.err("ERR max number of clients reached: " + r.Message)
		} else {
			w.err(errorText(r, false))
		}
		return false
	}
	c.spec = spec
	return true
}

// helloArgs is a parsed HELLO.
type helloArgs struct {
	proto       int // 0: unchanged
	auth        bool
	user, token []byte
	name        []byte
	setName     bool
}

// parseHello parses HELLO [protover [AUTH user pass] [SETNAME name]].
func parseHello(args [][]byte, w *reply) (helloArgs, bool) {
	var h helloArgs
	if len(args) < 2 {
		return h, true
	}
	v, err := strconv.Atoi(string(args[1]))
	if err != nil {
		w.err("ERR Protocol version is not an integer or out of range")
		return h, false
	}
	if v != 2 && v != 3 {
		w.err("NOPROTO unsupported protocol version")
		return h, false
	}
	h.proto = v
	for i := 2; i < len(args); i++ {
		switch upper(args[i]) {
		case "AUTH":
			if i+2 >= len(args) {
				w.errSyntax()
				return h, false
			}
			h.auth, h.user, h.token = true, args[i+1], args[i+2]
			i += 2
		case "SETNAME":
			if i+1 >= len(args) {
				w.errSyntax()
				return h, false
			}
			if e := nameErr(args[i+1], "Client names"); e != "" {
				w.err(e)
				return h, false
			}
			h.setName, h.name = true, args[i+1]
			i++
		default:
			w.errSyntax()
			return h, false
		}
	}
	return h, true
}

// nameErr is the error for a client name or library field that is not
// valid ("" for a valid one): longer than clientNameBytesMax, or with a
// byte outside '!'..'~' (Redis's rule). what names it as Redis's messages
// do ("Client names", "lib-name and lib-ver").
func nameErr(b []byte, what string) string {
	if len(b) > clientNameBytesMax {
		return fmt.Sprintf("ERR %s are at most %d bytes (got %d)", what, clientNameBytesMax, len(b))
	}
	for _, c := range b {
		if c < '!' || c > '~' {
			return "ERR " + what + " cannot contain spaces, newlines or special characters."
		}
	}
	return ""
}

// hello applies a parsed HELLO and answers it.
func (c *conn) hello(h helloArgs, w *reply) {
	if h.proto != 0 {
		c.resp3 = h.proto == 3
	}
	if h.setName {
		c.name = string(h.name)
	}
	w.resp3 = c.resp3
	p := 2
	if c.resp3 {
		p = 3
	}
	w.mapLen(7)
	w.bulkString("server")
	w.bulkString("synod")
	w.bulkString("version")
	w.bulkString(redisCompatVersion)
	w.bulkString("proto")
	w.int(int64(p))
	w.bulkString("id")
	w.int(int64(c.id))
	w.bulkString("mode")
	w.bulkString("standalone")
	w.bulkString("role")
	w.bulkString("master")
	w.bulkString("modules")
	w.array(0)
}

func cmdHello(x *exec) {
	if !x.admitLocal() {
		return
	}
	h, ok := parseHello(x.args(), x.w)
	if !ok {
		return
	}
	if h.auth && !x.reauth(h.user, h.token) {
		return
	}
	x.c.hello(h, x.w)
}

func cmdAuth(x *exec) {
	if !x.admitLocal() {
		return
	}
	args := x.args()
	var user, token []byte
	switch len(args) {
	case 2:
		token = args[1]
	case 3:
		user, token = args[1], args[2]
	default:
		x.w.errWrongArgs("auth")
		return
	}
	if x.reauth(user, token) {
		x.w.ok()
	}
}

// reauth checks an AUTH on an authenticated connection: the same tenant
// is fine, another one is refused (its connection slot is the first
// tenant's).
func (x *exec) reauth(user, token []byte) bool {
	spec, ok := x.c.checkToken(user, token, x.w)
	if !ok {
		return false
	}
	if spec.ID != x.c.spec.ID {
		x.w.err(errTenantChange)
		return false
	}
	return true
}

func cmdPing(x *exec) {
	if !x.admitLocal() {
		return
	}
	switch args := x.args(); len(args) {
	case 1:
		x.w.simple("PONG")
	case 2:
		x.w.bulk(args[1])
	default:
		x.w.errWrongArgs("ping")
	}
}

func cmdEcho(x *exec) {
	if x.admitLocal() {
		x.w.bulk(x.args()[1])
	}
}

func cmdSelect(x *exec) {
	if !x.admitLocal() {
		return
	}
	if string(x.args()[1]) != "0" {
		x.w.err("ERR DB index is out of range (synod has database 0 only: each tenant has its own keyspace)")
		return
	}
	x.w.ok()
}

func cmdReadOnly(x *exec) {
	if x.admitLocal() {
		x.c.readonly = true
		x.w.ok()
	}
}

func cmdReadWrite(x *exec) {
	if x.admitLocal() {
		x.c.readonly = false
		x.w.ok()
	}
}

func cmdClient(x *exec) {
	if !x.admitLocal() {
		return
	}
	args, c := x.args(), x.c
	switch sub := upper(args[1]); {
	case sub == "ID" && len(args) == 2:
		x.w.int(int64(c.id))
	case sub == "SETNAME" && len(args) == 3:
		if e := nameErr(args[2], "Client names"); e != "" {
			x.w.err(e)
			return
		}
		c.name = string(args[2])
		x.w.ok()
	case sub == "GETNAME" && len(args) == 2:
		if c.name == "" {
			x.w.null()
		} else {
			x.w.bulkString(c.name)
		}
	case sub == "SETINFO" && len(args) == 4:
		v := string(args[3])
		if e := nameErr(args[3], "lib-name and lib-ver"); e != "" && v != "" {
			x.w.err(e)
			return
		}
		switch upper(args[2]) {
		case "LIB-NAME":
			c.libName = v
		case "LIB-VER":
			c.libVer = v
		default:
			x.w.err("ERR Unrecognized option '" + printable(args[2], 32) + "'")
			return
		}
		x.w.ok()
	case sub == "INFO" && len(args) == 2:
		x.w.bulkString(c.clientInfo() + "\n")
	default:
		x.w.err("ERR unknown subcommand or wrong number of arguments for '" + printable(args[1], 32) + "'. Try CLIENT HELP.")
	}
}

// clientInfo is CLIENT INFO's line for the connection.
func (c *conn) clientInfo() string {
	p := 2
	if c.resp3 {
		p = 3
	}
	return fmt.Sprintf("id=%d addr=%s laddr=%s name=%s db=0 resp=%d lib-name=%s lib-ver=%s tenant=%s readonly=%v",
		c.id, c.nc.RemoteAddr(), c.nc.LocalAddr(), c.name, p, c.libName, c.libVer, c.spec.Name, c.readonly)
}

func cmdConfig(x *exec) {
	if !x.admitLocal() {
		return
	}
	if upper(x.args()[1]) == "GET" {
		// Nothing of synod's configuration is Redis's: an empty answer,
		// as Redis gives for parameters it does not know
		// (redis-benchmark asks for "save" and "appendonly").
		x.w.mapLen(0)
		return
	}
	x.w.err("ERR synod is configured by kvnode's config file: CONFIG " + printable(x.args()[1], 32) + " is not supported")
}

// cmdCommand: COMMAND [COUNT | INFO name... | DOCS [name...] | LIST].
func cmdCommand(x *exec) {
	if !x.admitLocal() {
		return
	}
	args := x.args()
	if len(args) == 1 {
		names := sortedNames()
		x.w.array(len(names))
		for _, n := range names {
			x.commandInfo(commandTable[n])
		}
		return
	}
	switch upper(args[1]) {
	case "COUNT":
		x.w.int(int64(len(commandTable)))
	case "LIST":
		names := sortedNames()
		x.w.array(len(names))
		for _, n := range names {
			x.w.bulkString(n)
		}
	case "INFO":
		x.w.array(len(args) - 2)
		for _, n := range args[2:] {
			if spec := lookup(n); spec != nil {
				x.commandInfo(spec)
			} else {
				x.w.null()
			}
		}
	case "DOCS":
		// No docs: clients fall back on their own help (redis-cli does).
		x.w.mapLen(0)
	default:
		x.w.err("ERR unknown subcommand '" + printable(args[1], 32) + "'. Try COMMAND HELP.")
	}
}

// commandInfo writes one COMMAND entry in Redis 7's shape: name, arity,
// flags, first key, last key, step, ACL categories, tips, key specs,
// subcommands.
func (x *exec) commandInfo(s *cmdSpec) {
	x.w.array(10)
	x.w.bulkString(s.name)
	x.w.int(int64(s.arity))
	x.w.setLen(len(s.flags))
	for _, f := range s.flags {
		x.w.simple(f)
	}
	x.w.int(int64(s.first))
	x.w.int(int64(s.last))
	x.w.int(int64(s.step))
	x.w.setLen(0)
	x.w.setLen(0)
	x.w.array(0)
	x.w.array(0)
}

// infoMember is member i's line in INFO replication. A figure the
// answering node does not know of the member (a follower knows little of
// the others: docs/protocol.md, "STATUS") is left out rather than printed
// as 0, which would read as slot 0; an unknown role is "unknown".
func infoMember(i int, m proto.MemberStatus) string {
	var b strings.Builder
	fmt.Fprintf(&b, "member%d:id=%d,addr=%s", i, m.ID, m.Addr)
	if m.Known&proto.KnownRole != 0 {
		fmt.Fprintf(&b, ",role=%s", m.Role)
	} else {
		b.WriteString(",role=unknown")
	}
	if m.Known&proto.KnownCommit != 0 {
		fmt.Fprintf(&b, ",commit=%d", m.Commit)
	}
	if m.Known&proto.KnownApplied != 0 {
		fmt.Fprintf(&b, ",applied=%d", m.Applied)
	}
	if m.Known&proto.KnownReachable != 0 {
		fmt.Fprintf(&b, ",reachable=%v", m.Reachable)
	}
	if m.Known&proto.KnownHeard != 0 {
		fmt.Fprintf(&b, ",heard_ms=%d", m.HeardAgo.Milliseconds())
	}
	b.WriteString("\r\n")
	return b.String()
}

// cmdInfo: INFO [section ...]: server, clients, replication (the leader
// and members as this node sees them), stats, keyspace.
func cmdInfo(x *exec) {
	want := map[string]bool{}
	for _, a := range x.args()[1:] {
		want[strings.ToLower(string(a))] = true
	}
	all := len(want) == 0 || want["all"] || want["everything"] || want["default"]
	sec := func(name string) bool { return all || want[name] }
	var b strings.Builder
	s := x.c.s
	if sec("server") {
		fmt.Fprintf(&b, "# Server\r\nredis_version:%s\r\nredis_mode:standalone\r\nsynod_node_id:%d\r\nos:%s %s\r\nprocess_id:%d\r\n"+
			"tcp_port:%s\r\nuptime_in_seconds:%d\r\n\r\n",
			redisCompatVersion, s.cfg.NodeID, runtime.GOOS, runtime.GOARCH, os.Getpid(), portOf(x.c.nc.LocalAddr().String()),
			int64(time.Since(s.start).Seconds()))
	}
	if sec("clients") {
		fmt.Fprintf(&b, "# Clients\r\nconnected_clients:%d\r\n\r\n", s.stats.conns.Load())
	}
	if sec("replication") {
		resp := x.do(&proto.Request{Op: proto.OpStatus, StatusFormat: proto.StatusFormatProgress})
		if resp.Status != proto.StatusOK || resp.Cluster == nil {
			x.fail(resp, false)
			return
		}
		cs := resp.Cluster
		role := "slave"
		if cs.LeaderID != 0 && cs.LeaderID == cs.Self {
			role = "master"
		}
		fmt.Fprintf(&b, "# Replication\r\nrole:%s\r\nsynod_self:%d\r\nsynod_leader_id:%d\r\nsynod_leader_addr:%s\r\nsynod_ballot:%d.%d\r\nsynod_members:%d\r\n",
			role, cs.Self, cs.LeaderID, cs.LeaderAddr, cs.Ballot.Round, cs.Ballot.Node, len(cs.Members))
		for i, m := range cs.Members {
			b.WriteString(infoMember(i, m))
		}
		b.WriteString("\r\n")
	}
	if sec("stats") {
		fmt.Fprintf(&b, "# Stats\r\ntotal_connections_received:%d\r\ntotal_commands_processed:%d\r\nsynod_proxied_requests:%d\r\n"+
			"synod_error_replies:%d\r\nsynod_auth_failures:%d\r\nsynod_protocol_errors:%d\r\n\r\n",
			s.stats.connsTotal.Load(), s.stats.commands.Load(), s.stats.proxied.Load(), s.stats.errors.Load(),
			s.stats.authFailures.Load(), s.stats.protocolError.Load())
	}
	if sec("keyspace") {
		b.WriteString("# Keyspace\r\n\r\n")
	}
	if !sec("replication") && !x.admitLocal() {
		return
	}
	x.w.bulkString(b.String())
}

func portOf(addr string) string {
	if i := strings.LastIndexByte(addr, ':'); i >= 0 {
		return addr[i+1:]
	}
	return addr
}
