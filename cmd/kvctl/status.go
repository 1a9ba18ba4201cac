package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"
	"time"

	"synod/kv/client"
	"synod/kv/proto"
)

// memberStatusTimeout bounds how long kvctl status waits for one member's
// own figures; a member that does not answer in time keeps the row the
// view gave it.
const memberStatusTimeout = 2 * time.Second

// statusRow is one member as kvctl status prints it.
type statusRow struct {
	proto.MemberStatus
	// answered: the member answered kvctl itself, and the row's role,
	// ballot, commit and applied slot are its own figures.
	answered bool
}

// clusterView gathers what kvctl status prints: the leader's view of the
// group (asked of the leader when the first node that answered is not
// it), each member's row refreshed with the figures the member reports
// about itself (it knows its own commit and applied slots exactly), while
// the leader's figures about it (acked slot, last heard, lag, reachable)
// stay as the leader sees them.
func clusterView(ctx context.Context, c *client.Client) (*proto.ClusterStatus, []statusRow, error) {
	view, err := c.Status(ctx)
	if err != nil {
		return nil, nil, err
	}
	if view.LeaderID != 0 && view.LeaderID != view.Self && view.LeaderAddr != "" {
		lctx, cancel := context.WithTimeout(ctx, memberStatusTimeout)
		if lv, err := c.StatusAt(lctx, view.LeaderAddr); err == nil && lv.Self == view.LeaderID {
			view = lv
		}
		cancel()
	}
	rows := make([]statusRow, len(view.Members))
	var wg sync.WaitGroup
	for i := range view.Members {
		rows[i].MemberStatus = view.Members[i]
		m := &rows[i]
		if m.ID == view.Self {
			m.answered = true
			continue
		}
		if m.Addr == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			mctx, cancel := context.WithTimeout(ctx, memberStatusTimeout)
			defer cancel()
			own, err := c.StatusAt(mctx, m.Addr)
			if err != nil {
				if !view.Extended {
					// A basic reply knows nothing better.
					m.Reachable = false
				}
				return
			}
			for _, row := range own.Members {
				if row.ID == own.Self && row.ID == m.ID {
					m.Role, m.Ballot, m.Commit, m.Applied = row.Role, row.Ballot, row.Commit, row.Applied
					m.Known |= proto.KnownRole | proto.KnownCommit | proto.KnownApplied
					m.answered = true
					if !view.Extended {
						m.Reachable = true
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	return view, rows, nil
}

// printStatus prints the view: per member its role, ballot, commit and
// applied slots, its lag behind the leader's commit in slots and in time,
// how long ago the leader last heard from it, and whether it is reachable.
// A figure nobody could know is printed "?".
func printStatus(out io.Writer, view *proto.ClusterStatus, rows []statusRow) error {
	leader := "unknown"
	if view.LeaderID != 0 {
		leader = fmt.Sprintf("%d (%s)", view.LeaderID, view.LeaderAddr)
	}
	fmt.Fprintf(out, "answered by: %d\nleader:      %s\nballot:      %d.%d\n", view.Self, leader, view.Ballot.Round, view.Ballot.Node)
	var leaderCommit uint64
	haveLeader := false
	for _, r := range rows {
		if r.ID == view.LeaderID && r.ID == view.Self {
			leaderCommit, haveLeader = r.Commit, true
		}
	}
	if !view.Extended {
		fmt.Fprintln(out, "(the server predates the progress extension: lag and last-heard are not reported)")
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tADDRESS\tROLE\tBALLOT\tCOMMIT\tAPPLIED\tLAG SLOTS\tLAG TIME\tLAST HEARD\tREACHABLE")
	for _, r := range rows {
		known := func(k proto.Known) bool { return !view.Extended || r.Known&k != 0 }
		role, ballot, commit, applied := "?", "?", "?", "?"
		if known(proto.KnownRole) {
			role, ballot = r.Role.String(), fmt.Sprintf("%d.%d", r.Ballot.Round, r.Ballot.Node)
		}
		if known(proto.KnownCommit) {
			commit = fmt.Sprint(r.Commit)
		}
		if known(proto.KnownApplied) {
			applied = fmt.Sprint(r.Applied)
		}
		lagSlots := "?"
		if haveLeader && known(proto.KnownCommit) {
			lagSlots = fmt.Sprint(leaderCommit - min(leaderCommit, r.Commit))
		}
		lagTime, heard, reachable := "?", "?", "?"
		if view.Extended && r.Known&proto.KnownLag != 0 {
			lagTime = fmtAge(r.Lag)
			if r.LagAtLeast {
				lagTime = ">=" + lagTime
			}
		}
		switch {
		case r.ID == view.Self:
			heard = "-"
		case view.Extended && r.Known&proto.KnownHeard != 0:
			heard = fmtAge(r.HeardAgo) + " ago"
		}
		if !view.Extended || r.Known&proto.KnownReachable != 0 {
			reachable = fmt.Sprint(r.Reachable)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Addr, role, ballot, commit, applied, lagSlots, lagTime, heard, reachable)
	}
	return tw.Flush()
}

// fmtAge prints d rounded for a person: milliseconds below ten seconds,
// then seconds.
func fmtAge(d time.Duration) string {
	if d < 10*time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
