package main

// kvctl member list | add | promote | remove | transfer-leadership: the
// membership of a running cluster, changed through the log by the leader
// (kv/replica members_ops.go) over the client protocol's membership
// opcodes (kv/proto member.go). The connection opens with a tenant token
// like every kvctl command; each request also carries the nodes' admin
// token ([admin] token), the operator credential that authorizes it.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"synod/kv/client"
	"synod/kv/proto"
)

// memberRetryInterval is how often `promote --wait` retries a promotion
// refused because the learner is still catching up.
const memberRetryInterval = 200 * time.Millisecond

type memberFlags struct {
	token     string
	tokenFile string
	wait      bool
	to        uint64
}

// adminToken resolves --admin-token, --admin-token-file or
// SYNOD_ADMIN_TOKEN.
func (f *memberFlags) adminToken() (string, error) {
	token := f.token
	if f.tokenFile != "" {
		if token != "" {
			return "", errors.New("give --admin-token or --admin-token-file, not both")
		}
		st, err := os.Stat(f.tokenFile)
		if err != nil {
			return "", err
		}
		if st.Size() > adminTokenFileBytesMax {
			return "", fmt.Errorf("--admin-token-file: %d bytes, at most %d", st.Size(), adminTokenFileBytesMax)
		}
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return "", err
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" {
		token = os.Getenv(envAdminToken)
	}
	if token == "" {
		return "", fmt.Errorf("membership commands need the nodes' admin token: pass --admin-token or set %s", envAdminToken)
	}
	return token, nil
}

func newMemberCmd(g *globals) *cobra.Command {
	f := &memberFlags{}
	cmd := &cobra.Command{
		Use:   "member",
		Short: "List or change the cluster's membership (needs the nodes' admin token)",
		Long: "List or change the cluster's membership. Every change goes through the replicated log,\n" +
			"one at a time: a second change while one is being committed is refused (CONFLICT).\n" +
			"Replace a dead node: start the new one with kvnode --join, `member add` it (a learner),\n" +
			"`member promote` it once it has caught up, then `member remove` the dead one.",
	}
	cmd.PersistentFlags().StringVar(&f.token, "admin-token", "", "the nodes' [admin] token (env "+envAdminToken+")")
	cmd.PersistentFlags().StringVar(&f.tokenFile, "admin-token-file", "", "read the [admin] token from this file")

	// op wraps a membership call: the admin token, then the reply printed.
	op := func(call func(ctx context.Context, c *client.Client, token string, args []string) (*proto.MembershipReply, error)) func(*cobra.Command, []string) error {
		return g.run(func(ctx context.Context, c *client.Client, out io.Writer, args []string) error {
			token, err := f.adminToken()
			if err != nil {
				return err
			}
			m, err := call(ctx, c, token, args)
			if err != nil {
				return err
			}
			return printMembership(out, m)
		})
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "Show every member (voter or learner), its addresses, and, from the leader, its commit index and reachability",
		Args:  cobra.NoArgs,
		RunE: op(func(ctx context.Context, c *client.Client, token string, _ []string) (*proto.MembershipReply, error) {
			return c.Members(ctx, token)
		}),
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "add ID CONSENSUS_ADDR CLIENT_ADDR",
		Short: "Add node ID as a learner: it receives the log but does not vote until promoted",
		Long: "Add node ID as a learner with its consensus address (ip:port, its consensus_listen) and client\n" +
			"address (host:port, its client_listen). Start it first with kvnode --config ... --join and an\n" +
			"empty data directory: it catches up by snapshot and log. Then promote it.",
		Args: cobra.ExactArgs(3),
		RunE: op(func(ctx context.Context, c *client.Client, token string, args []string) (*proto.MembershipReply, error) {
			id, err := parseMemberID(args[0])
			if err != nil {
				return nil, err
			}
			return c.AddLearner(ctx, token, id, args[1], args[2])
		}),
	})
	promote := &cobra.Command{
		Use:   "promote ID",
		Short: "Make learner ID a voter (refused while it lags the leader; --wait retries until it has caught up)",
		Args:  cobra.ExactArgs(1),
		RunE: op(func(ctx context.Context, c *client.Client, token string, args []string) (*proto.MembershipReply, error) {
			id, err := parseMemberID(args[0])
			if err != nil {
				return nil, err
			}
			for {
				m, err := c.PromoteMember(ctx, token, id)
				if err == nil || !f.wait || !errors.Is(err, client.ErrConflict) {
					return m, err
				}
				select {
				case <-ctx.Done():
					return nil, fmt.Errorf("%w (gave up waiting: %v)", err, ctx.Err())
				case <-time.After(memberRetryInterval):
				}
			}
		}),
	}
	promote.Flags().BoolVar(&f.wait, "wait", false, "retry while the learner catches up (or another change commits), until --timeout")
	cmd.AddCommand(promote)
	cmd.AddCommand(&cobra.Command{
		Use:   "remove ID",
		Short: "Take voter or learner ID out of the membership",
		Args:  cobra.ExactArgs(1),
		RunE: op(func(ctx context.Context, c *client.Client, token string, args []string) (*proto.MembershipReply, error) {
			id, err := parseMemberID(args[0])
			if err != nil {
				return nil, err
			}
			return c.RemoveMember(ctx, token, id)
		}),
	})
	transfer := &cobra.Command{
		Use:   "transfer-leadership --to ID",
		Short: "Hand leadership to voter ID without an election timeout (before restarting the leader)",
		Args:  cobra.NoArgs,
		RunE: op(func(ctx context.Context, c *client.Client, token string, _ []string) (*proto.MembershipReply, error) {
			if f.to == 0 {
				return nil, errors.New("--to ID is required")
			}
			m, err := c.TransferLeadership(ctx, token, f.to)
			if err != nil {
				return nil, err
			}
			return afterTransfer(ctx, c, token, m), nil
		}),
	}
	transfer.Flags().Uint64Var(&f.to, "to", 0, "the voter that is to lead")
	cmd.AddCommand(transfer)
	return cmd
}

// transferListWait bounds how long kvctl asks the new leader for the
// membership after a transfer, and transferListInterval how often.
const (
	transferListWait     = time.Second
	transferListInterval = 50 * time.Millisecond
)

// afterTransfer returns the membership as the new leader reports it: the
// transfer's own answer comes from the old leader, now a follower, which
// tracks nobody's progress, so every commit printed "?" (an outside
// tester's note). It asks the new leader (the client follows NOT_LEADER)
// until every member's row is known or transferListWait passes, and falls
// back on the best answer it got.
func afterTransfer(ctx context.Context, c *client.Client, token string, m *proto.MembershipReply) *proto.MembershipReply {
	deadline := time.Now().Add(transferListWait)
	for time.Now().Before(deadline) {
		if l, err := c.Members(ctx, token); err == nil && l.Leader == m.Leader {
			m = l
			if !slices.ContainsFunc(l.Members, func(mi proto.MemberInfo) bool { return !mi.Tracked }) {
				break
			}
		}
		select {
		case <-ctx.Done():
			return m
		case <-time.After(transferListInterval):
		}
	}
	return m
}

func parseMemberID(s string) (uint64, error) {
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return 0, fmt.Errorf("node id %q: want a positive integer", s)
	}
	return id, nil
}

// printMembership prints a membership reply as a table.
func printMembership(out io.Writer, m *proto.MembershipReply) error {
	if m == nil {
		return errors.New("the server sent no membership")
	}
	since := "the bootstrap peers"
	if m.Slot > 0 {
		since = fmt.Sprintf("slot %d", m.Slot)
	}
	pending := ""
	if m.Pending {
		pending = ", a change or transfer in progress"
	}
	if _, err := fmt.Fprintf(out, "leader %d, membership from %s%s\n", m.Leader, since, pending); err != nil {
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tROLE\tCONSENSUS\tCLIENT\tCOMMIT\tREACHABLE")
	for _, mi := range m.Members {
		role := "voter"
		if mi.Learner {
			role = "learner"
		}
		if mi.ID == m.Leader {
			role += " (leader)"
		}
		commit, reach := "?", "?"
		if mi.Tracked {
			commit = strconv.FormatUint(mi.Commit, 10)
			reach = strconv.FormatBool(mi.Reachable)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", mi.ID, role, mi.ConsensusAddr, mi.ClientAddr, commit, reach)
	}
	return w.Flush()
}
