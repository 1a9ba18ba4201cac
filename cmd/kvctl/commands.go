package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"synod/kv/client"
	"synod/kv/proto"
)

// Environment variables read when the flags are not given.
const (
	envEndpoints   = "SYNOD_ENDPOINTS"
	envToken       = "SYNOD_TOKEN"
	timeoutDefault = 5 * time.Second
)

type globals struct {
	endpoints string
	token     string
	timeout   time.Duration
	tls       tlsFlags
}

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "kvctl",
		Short:         "Command-line client for a synod cluster",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.endpoints, "endpoints", "", "comma-separated host:port list (env "+envEndpoints+")")
	root.PersistentFlags().StringVar(&g.token, "token", "", "tenant token (env "+envToken+")")
	root.PersistentFlags().DurationVar(&g.timeout, "timeout", timeoutDefault, "deadline of the whole command")
	g.tls.register(root)

	root.AddCommand(&cobra.Command{
		Use:   "get KEY",
		Short: "Print a key's value",
		Args:  cobra.ExactArgs(1),
		RunE: g.run(func(ctx context.Context, c *client.Client, out io.Writer, args []string) error {
			v, err := c.Get(ctx, []byte(args[0]))
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(out, "%s\n", v)
			return err
		}),
	})
	root.AddCommand(&cobra.Command{
		Use:   "put KEY VALUE",
		Short: "Store a value",
		Args:  cobra.ExactArgs(2),
		RunE: g.run(func(ctx context.Context, c *client.Client, out io.Writer, args []string) error {
			if err := c.Put(ctx, []byte(args[0]), []byte(args[1])); err != nil {
				return err
			}
			_, err := fmt.Fprintln(out, "OK")
			return err
		}),
	})
	root.AddCommand(&cobra.Command{
		Use:   "delete KEY",
		Short: "Delete a key",
		Args:  cobra.ExactArgs(1),
		RunE: g.run(func(ctx context.Context, c *client.Client, out io.Writer, args []string) error {
			if err := c.Delete(ctx, []byte(args[0])); err != nil {
				return err
			}
			_, err := fmt.Fprintln(out, "OK")
			return err
		}),
	})
	var absent bool
	casCmd := &cobra.Command{
		Use:   "cas KEY EXPECTED NEW | cas --absent KEY NEW",
		Short: "Compare-and-swap: store NEW if KEY holds EXPECTED (or is absent with --absent)",
		Args:  cobra.RangeArgs(2, 3),
		RunE: g.run(func(ctx context.Context, c *client.Client, out io.Writer, args []string) error {
			var key, expect, value []byte
			switch {
			case absent && len(args) == 2:
				key, value = []byte(args[0]), []byte(args[1])
			case !absent && len(args) == 3:
				key, expect, value = []byte(args[0]), []byte(args[1]), []byte(args[2])
			default:
				return errors.New("cas takes KEY EXPECTED NEW, or --absent KEY NEW")
			}
			err := c.CAS(ctx, key, expect, value)
			var se *client.StatusError
			if errors.As(err, &se) && errors.Is(err, client.ErrCASMismatch) {
				if se.HasCurrent {
					return fmt.Errorf("CAS mismatch: current value %q", se.Current)
				}
				return errors.New("CAS mismatch: key is absent")
			}
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(out, "OK")
			return err
		}),
	}
	casCmd.Flags().BoolVar(&absent, "absent", false, "require the key to be absent")
	root.AddCommand(casCmd)

	var limit int
	scanCmd := &cobra.Command{
		Use:   "scan [START [END]]",
		Short: "List keys in [START, END) with their values",
		Args:  cobra.MaximumNArgs(2),
		RunE: g.run(func(ctx context.Context, c *client.Client, out io.Writer, args []string) error {
			var start, end []byte
			if len(args) > 0 {
				start = []byte(args[0])
			}
			if len(args) > 1 {
				end = []byte(args[1])
			}
			pairs, more, err := c.Scan(ctx, start, end, limit)
			if err != nil {
				return err
			}
			for _, kv := range pairs {
				if _, err := fmt.Fprintf(out, "%s\t%s\n", kv.Key, kv.Value); err != nil {
					return err
				}
			}
			if more {
				_, err = fmt.Fprintf(out, "# more keys follow %q\n", pairs[len(pairs)-1].Key)
			}
			return err
		}),
	}
	scanCmd.Flags().IntVar(&limit, "limit", 100, fmt.Sprintf("most pairs to list (1..%d)", proto.ScanLimitMax))
	root.AddCommand(scanCmd)

	root.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "Show the leader, and each member's role, slots, lag behind the leader (slots and time) and reachability",
		Args:  cobra.NoArgs,
		RunE: g.run(func(ctx context.Context, c *client.Client, out io.Writer, args []string) error {
			view, rows, err := clusterView(ctx, c) // status.go
			if err != nil {
				return err
			}
			return printStatus(out, view, rows)
		}),
	})
	root.AddCommand(newSnapshotCmd(g)) // backups over the admin endpoint (snapshot.go)
	root.AddCommand(newMemberCmd(g))   // membership changes (member.go)
	return root
}

// run wraps a command body with flag/env resolution, a deadline and a
// connected client.
func (g *globals) run(body func(ctx context.Context, c *client.Client, out io.Writer, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		endpoints := g.endpoints
		if endpoints == "" {
			endpoints = os.Getenv(envEndpoints)
		}
		token := g.token
		if token == "" {
			token = os.Getenv(envToken)
		}
		var eps []string
		for _, e := range strings.Split(endpoints, ",") {
			if e = strings.TrimSpace(e); e != "" {
				eps = append(eps, e)
			}
		}
		if len(eps) == 0 {
			return fmt.Errorf("no endpoints: pass --endpoints or set %s", envEndpoints)
		}
		if token == "" {
			return fmt.Errorf("no token: pass --token or set %s", envToken)
		}
		tlsConf, err := g.tls.config()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
		defer cancel()
		c, err := client.Dial(ctx, eps, token, client.Options{TLS: tlsConf})
		if err != nil {
			if tlsConf == nil && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
				// What a TLS port does to a plaintext HELLO.
				return fmt.Errorf("%w\nif the cluster serves TLS, pass --tls-ca FILE (or --tls)", err)
			}
			return err
		}
		defer c.Close()
		return body(ctx, c, cmd.OutOrStdout(), args)
	}
}
