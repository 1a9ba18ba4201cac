package replica

import (
	"errors"
	"fmt"
	"slices"

	"synod/paxos"
	"synod/pmem"
)

// PMemLog adapts a pmem.Log to AcceptorLog: one RecordEntry per accepted
// entry, its payload the paxos.AppendEntry encoding, or, for an entry
// whose value the log holds already under another ballot (Entry.Held,
// paxos reballot.go), a re-ballot: the new ballot alone (reballot
// payload, below).
type PMemLog struct {
	l   *pmem.Log
	buf []pmem.Record
	// payloads holds the encoded payloads of buf, one after the other:
	// pmem.Log.Append copies them, so the buffer is reused call after call
	// and an accepted entry costs no allocation to encode (it held a third
	// of a loaded leader's allocated bytes). A batch that grew it past
	// pmemPayloadsBytesMax gives it back.
	payloads []byte
}

var _ AcceptorLog = (*PMemLog)(nil)

// OpenPMemLog opens (or creates) the acceptor log described by opts.
func OpenPMemLog(opts pmem.Options) (*PMemLog, pmem.Recovery, error) {
	l, rec, err := pmem.Open(opts)
	if err != nil {
		return nil, rec, err
	}
	return &PMemLog{l: l}, rec, nil
}

// Log is the underlying pmem log.
func (p *PMemLog) Log() *pmem.Log { return p.l }

// SetPromised implements AcceptorLog.
func (p *PMemLog) SetPromised(b paxos.Ballot) error {
	return p.l.SetPromised(pmem.Ballot{Round: b.Round, Node: uint64(b.Node)})
}

// Append implements AcceptorLog. A full log maps to ErrLogFull; a batch
// split across several pmem.Append calls may leave a prefix appended, which
// is harmless: a later record for a slot supersedes an earlier one.
func (p *PMemLog) Append(entries []paxos.Entry) error {
	for len(entries) > 0 {
		n := min(len(entries), pmem.AppendBatchRecordsMax)
		p.buf, p.payloads = p.buf[:0], p.payloads[:0]
		size := 0
		for i := range entries[:n] {
			size += entryPayloadSize(&entries[i])
		}
		p.payloads = slices.Grow(p.payloads, size)
		for i := range entries[:n] {
			e := &entries[i]
			start := len(p.payloads)
			p.payloads = appendEntryPayload(p.payloads, e)
			p.buf = append(p.buf, pmem.Record{
				Type:    pmem.RecordEntry,
				Slot:    uint64(e.Slot),
				Ballot:  pmem.Ballot{Round: e.Ballot.Round, Node: uint64(e.Ballot.Node)},
				Payload: p.payloads[start:len(p.payloads):len(p.payloads)],
			})
		}
		err := p.l.Append(p.buf)
		if cap(p.payloads) > pmemPayloadsBytesMax {
			p.payloads = nil
		}
		if err != nil {
			if errors.Is(err, pmem.ErrFull) {
				return fmt.Errorf("%w: %v", ErrLogFull, err)
			}
			return err
		}
		entries = entries[n:]
	}
	clear(p.buf) // drop payload references
	return nil
}

// Persist implements AcceptorLog.
func (p *PMemLog) Persist() error { return p.l.Persist() }

// Recover implements AcceptorLog: the last record of each slot above
// applied wins; a re-ballot gives the value of the slot's record it names
// a new ballot, and is an error when the log holds no such record (which
// Append's order rules out: the named record came first in the ring); one
// older than the slot's record so far changes nothing.
func (p *PMemLog) Recover(applied paxos.Slot) (paxos.Ballot, []paxos.Entry, error) {
	pb := p.l.Promised()
	promised := paxos.Ballot{Round: pb.Round, Node: paxos.NodeID(pb.Node)}
	latest := map[paxos.Slot]paxos.Entry{}
	err := p.l.Iterate(uint64(applied)+1, func(rec pmem.Record) error {
		if rec.Type != pmem.RecordEntry {
			return nil
		}
		if rb, ok := decodeReballot(rec.Payload); ok {
			if uint64(rb.Slot) != rec.Slot {
				return fmt.Errorf("record of slot %d holds a re-ballot of slot %d", rec.Slot, rb.Slot)
			}
			return resolveReballot(latest, rb)
		}
		// The payload aliases the region; the entry does not
		// (UnmarshalEntry's contract), so no copy before decoding.
		e, err := paxos.UnmarshalEntry(rec.Payload)
		if err != nil {
			return fmt.Errorf("decoding the entry of slot %d: %w", rec.Slot, err)
		}
		if uint64(e.Slot) != rec.Slot {
			return fmt.Errorf("record of slot %d holds an entry of slot %d", rec.Slot, e.Slot)
		}
		latest[e.Slot] = e
		return nil
	})
	if err != nil {
		return promised, nil, err
	}
	out := make([]paxos.Entry, 0, len(latest))
	for _, e := range latest {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b paxos.Entry) int {
		switch {
		case a.Slot < b.Slot:
			return -1
		case a.Slot > b.Slot:
			return 1
		}
		return 0
	})
	return promised, out, nil
}

// TruncateBelow implements AcceptorLog.
func (p *PMemLog) TruncateBelow(slot paxos.Slot) error { return p.l.TruncateBelow(uint64(slot)) }

// NoteChosen notes in the header that every record through slot holds a
// chosen value (chosen.go).
func (p *PMemLog) NoteChosen(slot paxos.Slot) error { return p.l.NoteChosen(uint64(slot)) }

// Chosen is the slot noted last (0: none).
func (p *PMemLog) Chosen() paxos.Slot { return paxos.Slot(p.l.Chosen()) }

// TruncatedBelow implements AcceptorLog.
func (p *PMemLog) TruncatedBelow() paxos.Slot { return paxos.Slot(max(p.l.TruncatedBelow(), 1)) }

// Usage implements AcceptorLog.
func (p *PMemLog) Usage() (used, capacity int64) { return p.l.Space() }

// Mode implements AcceptorLog.
func (p *PMemLog) Mode() string { return string(p.l.Mode()) }

// Close implements AcceptorLog.
func (p *PMemLog) Close() error { return p.l.Close() }
