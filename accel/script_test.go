package accel

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"synod/paxos"
)

// TestScripts runs the directed cases in testdata/script: each command is
// one raw input (or "new" to build a plane), and the expected output lists
// the plane's outputs, one per line. These are the same corner cases the
// RTL testbenches exercise; rewrite with -rewrite after a deliberate change.
//
//	new replicas=5 quorum=3 window=16 tenants=4
//	arm now=5 slot=3 ballot=1.1
//	accepted slot=3 ballot=1.1 node=2
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/script", func(t *testing.T, path string) {
		var p *Plane
		var now uint64 // the script's clock, for the typed methods
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "new" {
				spec := DefaultSpec()
				spec.ElectionJitterTicks = 0
				for _, a := range d.CmdArgs {
					v, _ := strconv.Atoi(a.Vals[0])
					switch a.Key {
					case "replicas":
						spec.Replicas = v
					case "quorum":
						spec.Quorum = v
					case "window":
						spec.WindowSlots = v
					case "tenants":
						spec.TenantsMax = v
					case "heartbeat":
						spec.HeartbeatPeriodTicks = uint32(v)
					case "lease":
						spec.LeaseTicks = uint32(v)
					case "drift":
						spec.LeaseDriftTicks = uint32(v)
					case "election":
						spec.ElectionTicks = uint32(v)
					default:
						t.Fatalf("new: unknown arg %s", a.Key)
					}
				}
				var err error
				if p, err = New(spec, WithWAL(&fakeWAL{}), WithClock(func() uint64 { return now })); err != nil {
					return err.Error()
				}
				return ""
			}
			in, err := parseInput(d)
			if err != nil {
				t.Fatalf("%s: %v", d.Pos, err)
			}
			var out []Event
			now = in.Now
			if in.Kind == InAccept {
				out = p.OnAccept(nil, in.Slot, in.Ballot, in.Node, nil)
			} else {
				out = p.Apply(nil, in)
			}
			var sb strings.Builder
			for _, e := range out {
				sb.WriteString(formatOutput(e))
				sb.WriteByte('\n')
			}
			return sb.String()
		})
	})
}

var kindByName = func() map[string]Kind {
	m := map[string]Kind{}
	for k, n := range kindNames {
		if k.IsInput() {
			m[n] = k
		}
	}
	return m
}()

func parseInput(d *datadriven.TestData) (Event, error) {
	k, ok := kindByName[d.Cmd]
	if !ok {
		return Event{}, fmt.Errorf("unknown input %q", d.Cmd)
	}
	e := Event{Kind: k}
	for _, a := range d.CmdArgs {
		v := a.Vals[0]
		num := func() uint64 { n, _ := strconv.ParseUint(v, 10, 64); return n }
		switch a.Key {
		case "now":
			e.Now = num()
		case "slot":
			e.Slot = paxos.Slot(num())
		case "ballot":
			r, n, _ := strings.Cut(v, ".")
			rr, _ := strconv.ParseUint(r, 10, 64)
			nn, _ := strconv.ParseUint(n, 10, 64)
			e.Ballot = paxos.Ballot{Round: rr, Node: paxos.NodeID(nn)}
		case "node":
			e.Node = paxos.NodeID(num())
		case "index":
			e.Index = uint16(num())
		case "len":
			e.Len = uint32(num())
		case "role":
			e.Flags = map[string]uint8{"off": 0, "follower": 1, "leader": 2}[v]
		case "flags":
			e.Flags = uint8(num())
		case "value":
			e.Value = num()
		case "value2":
			e.Value2 = num()
		default:
			return e, fmt.Errorf("unknown arg %q", a.Key)
		}
	}
	return e, nil
}

var reasonNames = []string{"none", "role", "window", "not-armed", "ballot", "stale-ballot", "member", "wal",
	"tenant", "bad-index", "future", "higher-ballot", "unknown-input", "bad-quorum"}

func formatOutput(e Event) string {
	s := e.Kind.String()
	if e.Kind == OutHandUp {
		r := int(e.Flags)
		if r < len(reasonNames) {
			s += " reason=" + reasonNames[r]
		}
		s += " input=" + Kind(e.Len).String()
	}
	if e.Kind == OutAdmit {
		s += fmt.Sprintf(" ok=%d", e.Flags)
	}
	if e.Slot != 0 {
		s += fmt.Sprintf(" slot=%d", e.Slot)
	}
	if !e.Ballot.IsZero() {
		s += fmt.Sprintf(" ballot=%d.%d", e.Ballot.Round, e.Ballot.Node)
	}
	if e.Node != 0 {
		s += fmt.Sprintf(" node=%d", e.Node)
	}
	if e.Value != 0 {
		s += fmt.Sprintf(" value=%d", e.Value)
	}
	return s + fmt.Sprintf(" now=%d", e.Now)
}
