// Command kvctl is synod's command-line client: get, put, delete, cas,
// scan and status against a cluster, over the binary protocol.
//
// Endpoints and the tenant token come from --endpoints/--token or from
// SYNOD_ENDPOINTS (comma-separated host:port) and SYNOD_TOKEN.
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
