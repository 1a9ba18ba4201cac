package main

import (
	"github.com/rs/zerolog"

	"synod/kv/replica"
	"synod/kv/server"
)

// The node's file descriptors are bounded by its caps: client and RESP
// connections (conns_max authenticated plus conns_unauthenticated_max
// before HELLO: RESP shares the client server's caps), admin connections
// (adminConnsMax), accepted side-channel and snapshot connections
// (replica.SideConnsMax), Pebble's open sstables (its MaxOpenFiles) and a
// reserve for the rest. The process must be allowed that many: an outside
// tester who took every descriptor (through the admin port, uncapped
// then) saw the client listeners stop and the leader exit when Pebble
// could not open a file. A limit below the need is logged at startup
// with what makes up the need, so the operator raises the limit or
// lowers the caps.
const (
	// pebbleOpenFilesMax is Pebble's MaxOpenFiles default, which kv/sm
	// keeps.
	pebbleOpenFilesMax = 1000
	// fdOtherMax covers the rest: the acceptor log, logs and traces, the
	// node's own dials to its peers (side channel, snapshots, RESP
	// proxying), the runtime's own.
	fdOtherMax = 256
)

// fdNeed is the most descriptors sc's caps (with its defaults) and the
// node's fixed caps let the node hold at once.
func fdNeed(sc server.Config) int {
	sc = sc.WithDefaults()
	return sc.ConnsMax + sc.ConnsUnauthenticatedMax + adminConnsMax + replica.SideConnsMax + pebbleOpenFilesMax + fdOtherMax
}

// warnFDLimit logs a warning when limit (RLIMIT_NOFILE's soft limit, which
// the Go runtime raised to the hard limit at start; 0: unknown) is below
// need, and reports whether it did.
func warnFDLimit(need int, limit uint64, sc server.Config, log zerolog.Logger) bool {
	if limit == 0 || limit >= uint64(need) {
		return false
	}
	sc = sc.WithDefaults()
	log.Warn().Uint64("nofile_limit", limit).Int("descriptors_needed", need).
		Int("conns_max", sc.ConnsMax).Int("conns_unauthenticated_max", sc.ConnsUnauthenticatedMax).
		Int("admin_conns_max", adminConnsMax).Int("side_conns_max", replica.SideConnsMax).
		Int("pebble_open_files_max", pebbleOpenFilesMax).Int("other", fdOtherMax).
		Msg("the open-file limit is below what this node's connection caps let it hold: raise it (ulimit -n, LimitNOFILE=) or lower limits.conns_max; out of descriptors, listeners wait and the state machine cannot open its files")
	return true
}
