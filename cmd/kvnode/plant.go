//go:build synod_plant

package main

import (
	"fmt"
	"os"
	"strings"

	"synod/kv/replica"
)

// A kvnode built with the synod_plant tag (only the e2e tests build one)
// turns on the planted bugs SYNOD_PLANT names, comma-separated, so that the
// end-to-end checks can show they catch them:
//
//	stale-clock          replica.TestingStaleClock
//	reused-proposal-ids  replica.TestingReusedProposalIDs
//	no-chosen-notes      replica.TestingNoChosenNotes
//	no-auth-floors       replica.TestingNoAuthFloors
//	apply-queue-blocks   replica.TestingApplyQueueBlocks
//
// Production builds have no such file: nothing outside a test binary can
// turn a planted bug on.
func init() {
	for _, name := range strings.Split(os.Getenv("SYNOD_PLANT"), ",") {
		switch strings.TrimSpace(name) {
		case "":
		case "stale-clock":
			replica.TestingStaleClock = true
		case "reused-proposal-ids":
			replica.TestingReusedProposalIDs = true
		case "no-chosen-notes":
			replica.TestingNoChosenNotes = true
		case "no-auth-floors":
			replica.TestingNoAuthFloors = true
		case "apply-queue-blocks":
			replica.TestingApplyQueueBlocks = true
		default:
			fmt.Fprintf(os.Stderr, "kvnode: SYNOD_PLANT: unknown planted bug %q\n", name)
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "kvnode: PLANTED BUG %q is on (a synod_plant test build)\n", name)
	}
}
