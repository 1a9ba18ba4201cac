package main

import (
	"flag"
	"os"

	"synod/afxdp/rtt"
)

// rttMain is `kvbench rtt`: the AF_XDP vs kernel UDP round-trip table of
// afxdp/rtt (needs root; builds and removes its own namespaces).
func rttMain(args []string) error {
	fs := flag.NewFlagSet("kvbench rtt", flag.ContinueOnError)
	pings := fs.Int("pings", 20000, "measured round trips per mode")
	if err := fs.Parse(args); err != nil {
		return err
	}
	res, err := rtt.Run(rtt.Options{Pings: *pings})
	if err != nil {
		return err
	}
	rtt.WriteTable(os.Stdout, res)
	return nil
}
