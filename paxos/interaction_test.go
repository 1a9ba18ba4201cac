package paxos

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestInteraction runs the scripted scenarios in testdata/*.txt. Commands:
//
//	nodes n=3 [lease=8]     a fresh group of n nodes
//	campaign id [force]     fire id's election timer (it pre-checks first);
//	                        force: run phase 1 at once, as a transfer's
//	                        target does (a lagging node's pre-check fails)
//	tick [n=1] [only=id]    tick every live node (or one) n times, delivering
//	propose id cmd...       propose commands on id
//	confchange id add=N|remove=N
//	read id req             ReadIndex(req) on id
//	cut a b / uncut a b     drop messages a -> b / stop dropping them
//	isolate id / heal       cut id off both ways / restore every link
//	crash id / restart id   stop id / restart it from its durable state
//	compact id slot         Compact(slot, "snap@slot") on id
//	stabilize               process Readys and deliver until quiet; prints
//	                        every delivered message and what nodes applied
//	status                  one line per node
//	lease                   one line per node: its clock and lease bookkeeping
//	hold a b type           hold back messages of type (e.g. HeartbeatResp) a -> b
//	release                 deliver everything held back (at the next stabilize)
//	log id                  id's accepted entries
func TestInteraction(t *testing.T) {
	// Only the scripts: testdata also holds the fuzz corpus.
	scripts, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no interaction scripts under testdata (err %v)", err)
	}
	for _, path := range scripts {
		t.Run(filepath.Base(path), func(t *testing.T) { runInteractionScript(t, path) })
	}
}

func runInteractionScript(t *testing.T, path string) {
	var it *interaction
	datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
		if td.Cmd == "nodes" {
			it = newInteraction(t, td)
			return ""
		}
		if it == nil {
			t.Fatalf("%s: nodes must come first", td.Pos)
		}
		it.t = t
		return it.run(td)
	})
}

type interaction struct {
	t   *testing.T
	nw  *network
	out strings.Builder
	// holds: messages of these (from, to, type) are held back; held keeps
	// them until release.
	holds map[holdKey]bool
	held  []Message
}

type holdKey struct {
	from, to NodeID
	typ      string
}

func newInteraction(t *testing.T, td *datadriven.TestData) *interaction {
	size, lease := 3, 8
	td.ScanArgs(t, "n", &size)
	td.MaybeScanArgs(t, "lease", &lease)
	nw := newNetwork(t, size)
	for _, id := range nw.ids {
		cfg := testConfig(id, nw.ids)
		cfg.LeaseTicks = lease
		if lease == 0 {
			cfg.DriftTicks = 0
		}
		// Timers far away: scripts elect explicitly with campaign.
		cfg.ElectionTicks = 50
		cfg.HeartbeatTicks = 5
		nw.start(id, cfg)
		nw.nodes[id].leaseUntil = 0 // scripts start as if the lease wait passed
	}
	it := &interaction{t: t, nw: nw}
	return it
}

func (it *interaction) id(s string) NodeID {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		it.t.Fatalf("bad node id %q", s)
	}
	return NodeID(v)
}

func (it *interaction) arg(td *datadriven.TestData, i int) NodeID {
	if len(td.CmdArgs) <= i {
		it.t.Fatalf("%s: missing argument %d", td.Pos, i)
	}
	return it.id(td.CmdArgs[i].Key)
}

func (it *interaction) run(td *datadriven.TestData) string {
	nw := it.nw
	it.out.Reset()
	switch td.Cmd {
	case "campaign":
		n := nw.nodes[it.arg(td, 0)]
		if td.HasArg("force") {
			n.campaign() // as a transfer's target: no pre-check
		} else {
			n.electionElapsed = n.electionTimeout - 1
			n.Tick()
		}
		it.stabilize()
	case "tick":
		k := 1
		td.MaybeScanArgs(it.t, "n", &k)
		var only NodeID
		if td.HasArg("only") {
			var o uint64
			td.ScanArgs(it.t, "only", &o)
			only = NodeID(o)
		}
		for range k {
			for _, id := range nw.ids {
				if !nw.down[id] && (only == 0 || id == only) {
					nw.nodes[id].Tick()
				}
			}
			it.stabilize()
		}
	case "propose":
		id := it.arg(td, 0)
		var cmds [][]byte
		for _, a := range td.CmdArgs[1:] {
			cmds = append(cmds, []byte(a.Key))
		}
		if err := nw.nodes[id].Propose(cmds); err != nil {
			fmt.Fprintf(&it.out, "error: %v\n", err)
		}
	case "confchange":
		id := it.arg(td, 0)
		cc := ConfChange{Type: ConfAddNode}
		var v uint64
		if td.HasArg("add") {
			td.ScanArgs(it.t, "add", &v)
		} else {
			cc.Type = ConfRemoveNode
			td.ScanArgs(it.t, "remove", &v)
		}
		cc.Node = NodeID(v)
		if err := nw.nodes[id].ProposeConfChange(cc); err != nil {
			fmt.Fprintf(&it.out, "error: %v\n", err)
		}
	case "add-node":
		// Start a node that joins with the initial membership.
		id := it.arg(td, 0)
		cfg := nw.nodes[1].cfg
		cfg.ID = id
		nw.start(id, cfg)
		nw.nodes[id].leaseUntil = 0
	case "read":
		id := it.arg(td, 0)
		req, _ := strconv.ParseUint(td.CmdArgs[1].Key, 10, 64)
		if err := nw.nodes[id].ReadIndex(req); err != nil {
			fmt.Fprintf(&it.out, "error: %v\n", err)
		}
	case "cut", "uncut":
		a, b := it.arg(td, 0), it.arg(td, 1)
		if td.Cmd == "cut" {
			nw.cut[[2]NodeID{a, b}] = true
		} else {
			delete(nw.cut, [2]NodeID{a, b})
		}
	case "isolate":
		nw.isolate(it.arg(td, 0))
	case "heal":
		nw.heal()
	case "crash":
		nw.crash(it.arg(td, 0))
	case "restart":
		id := it.arg(td, 0)
		nw.restart(id)
	case "compact":
		id := it.arg(td, 0)
		s, _ := strconv.ParseUint(td.CmdArgs[1].Key, 10, 64)
		if err := nw.compactAt(id, Slot(s), []byte(fmt.Sprintf("snap@%d", s))); err != nil {
			fmt.Fprintf(&it.out, "error: %v\n", err)
		}
	case "stabilize":
		it.stabilize()
	case "status":
		for _, id := range nw.ids {
			if nw.down[id] {
				fmt.Fprintf(&it.out, "%d: down\n", id)
				continue
			}
			st := nw.nodes[id].Status()
			fmt.Fprintf(&it.out, "%d: %s leader=%d promised=%s commit=%d first=%d last=%d members=%v lease=%v\n",
				id, st.Role, st.Leader, fmtBallot(st.Promised), st.Commit, st.FirstSlot, st.LastSlot, st.Members, st.LeaseValid)
		}
	case "lease":
		for _, id := range nw.ids {
			if nw.down[id] {
				fmt.Fprintf(&it.out, "%d: down\n", id)
				continue
			}
			ls := nw.nodes[id].LeaseState()
			fmt.Fprintf(&it.out, "%d: now=%d leader_until=%d granted_to=%d granted_until=%d\n", id, ls.Now, ls.LeaderUntil, ls.GrantedTo, ls.GrantedUntil)
		}
	case "hold":
		if it.holds == nil {
			it.holds = map[holdKey]bool{}
		}
		it.holds[holdKey{it.arg(td, 0), it.arg(td, 1), td.CmdArgs[2].Key}] = true
	case "release":
		clear(it.holds)
		fmt.Fprintf(&it.out, "released %d\n", len(it.held))
		nw.queue = append(nw.queue, it.held...)
		it.held = nil
	case "log":
		n := nw.nodes[it.arg(td, 0)]
		for s := n.log.first; s <= n.log.last(); s++ {
			if e := n.log.get(s); e != nil {
				fmt.Fprintf(&it.out, "%s\n", fmtEntry(e))
			} else {
				fmt.Fprintf(&it.out, "%d: -\n", s)
			}
		}
	default:
		it.t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
	}
	return it.out.String()
}

// stabilize is network.settle with a transcript.
func (it *interaction) stabilize() {
	nw := it.nw
	for range 1000 {
		moved := false
		for _, id := range nw.ids {
			before := len(nw.applied[id])
			rs := len(nw.reads[id])
			if nw.handleReady(id) {
				moved = true
			}
			for _, e := range nw.applied[id][min(before, len(nw.applied[id])):] {
				fmt.Fprintf(&it.out, "%d applied %s\n", id, fmtEntry(&e))
			}
			for _, r := range nw.reads[id][rs:] {
				fmt.Fprintf(&it.out, "%d read %d ready at %d\n", id, r.ID, r.Index)
			}
		}
		q := nw.queue
		nw.queue = nil
		for _, m := range q {
			moved = true
			if nw.down[m.To] || nw.cut[[2]NodeID{m.From, m.To}] {
				fmt.Fprintf(&it.out, "dropped %s\n", fmtMsg(&m))
				continue
			}
			if it.holds[holdKey{m.From, m.To, m.Type.String()}] {
				fmt.Fprintf(&it.out, "held %s\n", fmtMsg(&m))
				it.held = append(it.held, m)
				continue
			}
			fmt.Fprintf(&it.out, "%s\n", fmtMsg(&m))
			if err := nw.nodes[m.To].Step(m); err != nil {
				fmt.Fprintf(&it.out, "  error: %v\n", err)
			}
		}
		if !moved {
			return
		}
	}
	it.t.Fatal("did not stabilize")
}

func fmtBallot(b Ballot) string { return fmt.Sprintf("%d.%d", b.Round, b.Node) }

func fmtEntry(e *Entry) string {
	var v string
	switch e.Type {
	case EntryNoop:
		v = "noop"
		if len(e.Cmds) == 1 {
			v = "snapshot " + string(e.Cmds[0])
		}
	case EntryConfChange:
		cc, _ := entryConfChange(e)
		op := "add"
		if cc.Type == ConfRemoveNode {
			op = "remove"
		}
		v = fmt.Sprintf("conf %s %d", op, cc.Node)
	default:
		cs := make([]string, len(e.Cmds))
		for i, c := range e.Cmds {
			cs[i] = string(c)
		}
		v = "[" + strings.Join(cs, " ") + "]"
	}
	if e.Ballot.IsZero() {
		return fmt.Sprintf("%d: %s", e.Slot, v)
	}
	return fmt.Sprintf("%d@%s: %s", e.Slot, fmtBallot(e.Ballot), v)
}

func fmtMsg(m *Message) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d->%d %s", m.From, m.To, m.Type)
	if m.Reject {
		b.WriteString(" REJECT")
	}
	if !m.Ballot.IsZero() {
		fmt.Fprintf(&b, " b=%s", fmtBallot(m.Ballot))
	}
	switch m.Type {
	case MsgPreCheck, MsgPreCheckResp:
		fmt.Fprintf(&b, " round=%d commit=%d", m.Context, m.Commit)
	case MsgPrepare:
		fmt.Fprintf(&b, " from=%d", m.Slot)
	case MsgPromise:
		fmt.Fprintf(&b, " from=%d through=%d last=%d commit=%d", m.Slot, m.Index, m.Last, m.Commit)
	case MsgAccept, MsgCatchup:
		fmt.Fprintf(&b, " commit=%d", m.Commit)
	case MsgAccepted:
		fmt.Fprintf(&b, " slots=%d..%d commit=%d", m.Slot, m.Index, m.Commit)
	case MsgHeartbeat, MsgHeartbeatResp:
		fmt.Fprintf(&b, " seq=%d commit=%d", m.Context, m.Commit)
	case MsgSnapshot:
		fmt.Fprintf(&b, " snap=%d members=%v", m.Snapshot.Slot, m.Snapshot.Members)
	}
	if len(m.Entries) > 0 {
		es := make([]string, len(m.Entries))
		for i := range m.Entries {
			es[i] = fmtEntry(&m.Entries[i])
		}
		fmt.Fprintf(&b, " [%s]", strings.Join(es, ", "))
	}
	return b.String()
}
