package main

// Seeing one node's stall from the others. A leader whose consensus loop
// sat idle through a stall was waiting on the other nodes, and its own
// trace cannot say why. Every trace carries the wall clock (its Sync
// events), and kvbench keeps each node's traces in a directory of its own
// (nodeN), so `kvbench stalls DIR` lines each episode up with the other
// nodes' traces of the same wall-clock window and says what their loops
// were doing: running, waiting for a CPU, in a system call, or idle.
// The clocks are one machine's (the embedded clusters share it); across
// machines, their skew shifts the windows.

import (
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// loopInterval is one loop goroutine's state over [start, end), trace
// clock.
type loopInterval struct {
	start, end  int64
	role, state uint8
}

// peerRoles are the loops a peer view reports, in print order.
var peerRoles = [...]int{roleConsensus, roleReceive, roleApply}

// peerIntervalsMax bounds the loop intervals kept per trace for peer
// views.
const peerIntervalsMax = 2_000_000

// loopIntervals returns the peer roles' intervals.
func (tp *traceParse) loopIntervals() []loopInterval {
	var out []loopInterval
	for _, iv := range tp.ivs {
		r := tp.roles[iv.g]
		if r != roleConsensus && r != roleReceive && r != roleApply {
			continue
		}
		if len(out) >= peerIntervalsMax {
			break
		}
		out = append(out, loopInterval{start: iv.start, end: iv.end, role: uint8(r), state: iv.state})
	}
	return out
}

// peerView is what another node's loops did during an episode's
// wall-clock window.
type peerView struct {
	node    string
	covered time.Duration // the part of the window its trace covers
	states  [rolesN][statesN]time.Duration
}

// nodeOf is the node a trace belongs to: its directory's name.
func nodeOf(file string) string { return filepath.Base(filepath.Dir(file)) }

// testingPeersByTraceClock plants the alignment the wall clock replaces:
// the other traces' windows taken at the same trace-clock times, as if
// every node's trace clock started together.
var testingPeersByTraceClock bool

// addPeers gives every episode of reps the view of each other node (the
// trace of that node that covers most of the episode's window).
func addPeers(reps []*traceReport) {
	for _, rep := range reps {
		if !rep.hasWall {
			continue
		}
		for _, sr := range rep.stalls {
			w0, w1 := sr.from+rep.wallOff, sr.to+rep.wallOff
			best := map[string]*peerView{}
			for _, o := range reps {
				if o == rep || !o.hasWall || nodeOf(o.file) == nodeOf(rep.file) {
					continue
				}
				a, b := w0-o.wallOff, w1-o.wallOff // the window on o's trace clock
				if testingPeersByTraceClock {
					a, b = sr.from-rep.firstT+o.firstT, sr.to-rep.firstT+o.firstT
				}
				cov := overlap(a, b, o.firstT, o.lastT)
				if cov == 0 {
					continue
				}
				node := nodeOf(o.file)
				if pv := best[node]; pv != nil && pv.covered >= cov {
					continue
				}
				pv := &peerView{node: node, covered: cov}
				for _, li := range o.loops {
					if d := overlap(li.start, li.end, a, b); d > 0 {
						pv.states[li.role][li.state] += d
					}
				}
				best[node] = pv
			}
			sr.peers = sr.peers[:0]
			for _, pv := range best {
				sr.peers = append(sr.peers, pv)
			}
			sort.Slice(sr.peers, func(i, j int) bool { return sr.peers[i].node < sr.peers[j].node })
		}
	}
}

// writePeers prints an episode's peer views.
func writePeers(w io.Writer, sr *stallReport) {
	win := time.Duration(sr.to - sr.from)
	for _, pv := range sr.peers {
		var loops []string
		for _, r := range peerRoles {
			var cells []string
			for s := 0; s < stOther; s++ {
				if d := pv.states[r][s]; d > 0 {
					cells = append(cells, fmt.Sprintf("%s %v", stateNames[s], d.Round(time.Microsecond)))
				}
			}
			if len(cells) > 0 {
				loops = append(loops, roleNames[r]+" "+strings.Join(cells, ", "))
			}
		}
		if len(loops) == 0 {
			loops = []string{"no loop seen"}
		}
		fmt.Fprintf(w, "    %s then (%v of %v traced): %s\n", pv.node, pv.covered.Round(time.Microsecond), win.Round(time.Microsecond), strings.Join(loops, "; "))
	}
}

// peersVerdict classes what the other nodes' consensus loops did during
// an episode, summed over them: their commonest state, or "not traced".
func peersVerdict(sr *stallReport) string {
	var by [statesN]time.Duration
	var total time.Duration
	for _, pv := range sr.peers {
		for s := 0; s < stOther; s++ {
			by[s] += pv.states[roleConsensus][s]
			total += pv.states[roleConsensus][s]
		}
	}
	if total == 0 {
		return "the others not traced then"
	}
	top := 0
	for s := 1; s < stOther; s++ {
		if by[s] > by[top] {
			top = s
		}
	}
	return "the others' consensus loops mostly " + stateNames[top]
}
