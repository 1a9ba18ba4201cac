package replica

import (
	"fmt"
	"slices"
	"sync"

	"synod/paxos"
)

// simLog is the replica simulator's acceptor log: a simulated PMem region
// with power-loss semantics. Appended entries stay volatile until Persist;
// a crash (crash) keeps the promised ballot (SetPromised is durable when it
// returns) and the persisted entries only. It survives the Replica that
// uses it, as the region survives the process.
type simLog struct {
	mu        sync.Mutex // the accel fast path appends from the receive path
	promised  paxos.Ballot
	chosen    paxos.Slot // NoteChosen: durable when it returns
	durable   []paxos.Entry
	volatile  []paxos.Entry
	truncated paxos.Slot // entries below it are gone (1: nothing truncated)
	bytes     int64      // durable entry bytes, for Usage
	capacity  int64
	refuse    bool // refuseAppends
}

func newSimLog(capacity int64) *simLog { return &simLog{truncated: 1, capacity: capacity} }

var _ AcceptorLog = (*simLog)(nil)

func (l *simLog) SetPromised(b paxos.Ballot) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.promised.Less(b) {
		l.promised = b
	}
	return nil
}

// The simulated log notes chosen-through slots as PMemLog does, so the
// simulators' crashes exercise the restarts that commit them (chosen.go).
var _ chosenLog = (*simLog)(nil)

func (l *simLog) NoteChosen(s paxos.Slot) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.chosen = max(l.chosen, s)
	return nil
}

func (l *simLog) Chosen() paxos.Slot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.chosen
}

// refuseAppends makes the log refuse every append as full while on (the
// simulator's full-log fault), as a full ring does: nothing is appended.
func (l *simLog) refuseAppends(on bool) {
	l.mu.Lock()
	l.refuse = on
	l.mu.Unlock()
}

func (l *simLog) Append(es []paxos.Entry) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refuse {
		return fmt.Errorf("%w: the simulator's full-log fault", ErrLogFull)
	}
	for _, e := range es {
		c := cloneEntry(e)
		if !e.Held.IsZero() {
			c.Cmds = nil // a re-ballot: the ballot alone, as PMemLog stores it
		}
		l.volatile = append(l.volatile, c)
	}
	return nil
}

func (l *simLog) Persist() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.volatile {
		l.bytes += int64(len(paxos.AppendEntry(nil, &e)))
	}
	l.durable = append(l.durable, l.volatile...)
	l.volatile = nil
	return nil
}

// crash drops everything not persisted (a power loss).
func (l *simLog) crash() {
	l.mu.Lock()
	l.volatile = nil
	l.mu.Unlock()
}

func (l *simLog) Recover(applied paxos.Slot) (paxos.Ballot, []paxos.Entry, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	latest := map[paxos.Slot]paxos.Entry{}
	for _, e := range l.durable {
		if e.Slot <= applied || e.Slot < l.truncated {
			continue
		}
		if !e.Held.IsZero() {
			// A re-ballot, resolved as PMemLog.Recover does.
			if err := resolveReballot(latest, e); err != nil {
				return l.promised, nil, err
			}
			continue
		}
		latest[e.Slot] = cloneEntry(e)
	}
	out := make([]paxos.Entry, 0, len(latest))
	for _, e := range latest {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b paxos.Entry) int { return int(a.Slot) - int(b.Slot) })
	return l.promised, out, nil
}

func (l *simLog) TruncateBelow(s paxos.Slot) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s <= l.truncated {
		return nil
	}
	l.truncated = s
	l.bytes = 0
	l.durable = slices.DeleteFunc(l.durable, func(e paxos.Entry) bool { return e.Slot < s })
	for _, e := range l.durable {
		l.bytes += int64(len(paxos.AppendEntry(nil, &e)))
	}
	return nil
}

func (l *simLog) TruncatedBelow() paxos.Slot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.truncated
}

func (l *simLog) Usage() (int64, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bytes, l.capacity
}

func (l *simLog) Mode() string { return "sim" }
func (l *simLog) Close() error { return nil }

func cloneEntry(e paxos.Entry) paxos.Entry {
	out := e
	if len(e.Cmds) > 0 {
		out.Cmds = make([][]byte, len(e.Cmds))
		for i, c := range e.Cmds {
			out.Cmds[i] = append([]byte(nil), c...)
		}
	}
	return out
}
