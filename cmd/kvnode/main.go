// Command kvnode runs one synod replica from a TOML config file, or, with
// --dev, a whole 3-replica cluster on loopback with temporary data.
//
//	kvnode --config examples/kvnode.toml
//	kvnode --dev
//	kvnode --config node4.toml --join   (a new member of a running cluster; kvctl member add)
//	kvnode restore --from FILE --config node1.toml   (a new member from a backup; restore.go)
//
// See examples/kvnode.toml for every config key.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "restore" {
		err := runRestore(os.Args[2:], os.Stdout)
		switch {
		case errors.Is(err, flag.ErrHelp):
			return
		case err != nil:
			fmt.Fprintf(os.Stderr, "kvnode: %v\n", err)
			os.Exit(1)
		}
		return
	}
	var (
		configPath = flag.String("config", "", "path of the TOML config file")
		dev        = flag.Bool("dev", false, "start a 3-replica cluster on loopback with temporary data and print how to connect")
		devPort    = flag.Int("dev-port", devPortDefault, "with --dev: base port (clients use base+1.., consensus base+11.., admin base+21.., RESP base+31..)")
		devKeep    = flag.Bool("dev-keep", false, "with --dev: keep the temporary data and logs on exit")
		join       = flag.Bool("join", false, "with --config and an empty data_dir: join a running cluster (wait to be added with kvctl member add, then catch up by snapshot)")
	)
	flag.Usage = usage
	flag.Parse()
	var err error
	switch {
	case *dev:
		err = runDev(*devPort, *devKeep)
	case *configPath != "":
		var cfg *Config
		cfg, err = loadConfig(*configPath)
		if err == nil {
			cfg.join = *join
			err = runNode(cfg)
		}
	default:
		fmt.Fprintln(os.Stderr, "kvnode: give --config FILE or --dev (see --help), or: kvnode restore --from BACKUP --config FILE")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvnode: %v\n", err)
		os.Exit(1)
	}
}

// usage is kvnode --help: every way to run it, the restore subcommand
// included (it has flags of its own: kvnode restore --help), then the
// flags.
func usage() {
	out := flag.CommandLine.Output()
	fmt.Fprintf(out, `Usage:
  kvnode --config FILE            run one replica (examples/kvnode.toml lists every key)
  kvnode --config FILE --join     a new member of a running cluster (then: kvctl member add)
  kvnode --dev                    a 3-replica cluster on loopback with temporary data
  kvnode restore --from BACKUP --config FILE
                                  seed a new node's data_dir from a backup (kvnode restore --help)

Flags:
`)
	flag.PrintDefaults()
}
