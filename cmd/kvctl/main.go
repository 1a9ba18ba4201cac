// Command kvctl is synod's command-line client: get, put, delete, cas,
// scan and status against a cluster, over the binary protocol; backups
// (snapshot save, snapshot status); and membership (member).
//
// Endpoints and the tenant token come from --endpoints/--token or from
// SYNOD_ENDPOINTS (comma-separated host:port) and SYNOD_TOKEN.
//
// Plain TCP is the default (what kvnode --dev serves). For a cluster whose
// [tls] table turns TLS on, --tls-ca FILE names the CA that issued the
// nodes' certificates (or --tls alone trusts the system roots);
// --tls-cert and --tls-key present a client certificate where the nodes
// require one (mutual TLS); --tls-server-name verifies every node against
// one name instead of the host dialled. --tls-insecure skips verification
// and is for tests only.
//
// kvctl snapshot save FILE backs up the whole cluster from the leader's
// admin endpoint (--admin, --admin-token; not the client port), and
// kvctl snapshot status FILE verifies a backup and prints what it holds.
//
// kvctl member list | add | promote | remove | transfer-leadership lists
// and changes the membership through the leader's client port, with the
// nodes' admin token (--admin-token, --admin-token-file or
// SYNOD_ADMIN_TOKEN) on each request (member.go).
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvctl:", err)
		os.Exit(1)
	}
}
