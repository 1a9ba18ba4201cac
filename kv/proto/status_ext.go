package proto

import (
	"encoding/binary"
	"math"
	"time"
)

// STATUS formats. A STATUS request with an empty body (every client before
// the extension) gets the basic reply; one whose body is the single byte
// StatusFormatProgress gets the basic reply followed by the progress
// extension. A server that predates the extension answers a non-empty
// STATUS body BAD_REQUEST (the connection stays open), and a client then
// asks again with an empty body. The values are part of the wire format.
const (
	StatusFormatBasic    uint8 = 1 // the version-1 body; same as an empty request body
	StatusFormatProgress uint8 = 2 // the version-1 body plus the progress extension
)

// Known says which figures of a STATUS member row the answering node
// knows. A figure whose bit is clear is unknown to it, and is zero on the
// wire (a decoder refuses a row that says otherwise). The values are part
// of the wire format.
type Known uint8

const (
	KnownRole      Known = 1 << 0 // Role and Ballot
	KnownCommit    Known = 1 << 1 // Commit
	KnownApplied   Known = 1 << 2 // Applied
	KnownReachable Known = 1 << 3 // Reachable
	KnownAcked     Known = 1 << 4 // Acked
	KnownHeard     Known = 1 << 5 // HeardAgo
	KnownLag       Known = 1 << 6 // Lag and LagAtLeast
	// knownLagAtLeast is the wire bit of MemberStatus.LagAtLeast.
	knownLagAtLeast = 1 << 7
	knownAll        = KnownRole | KnownCommit | KnownApplied | KnownReachable | KnownAcked | KnownHeard | KnownLag
)

// statusMillisMax is the largest millisecond count a time.Duration holds
// (about 292 years): longer ages are clipped to it on the wire.
const statusMillisMax = uint64(math.MaxInt64 / int64(time.Millisecond))

// statusExtRowBytes is the size of one member's extension row.
const statusExtRowBytes = 1 + 8 + 8 + 8

// maskUnknown returns members with every figure the row does not know
// zeroed, so the wire never carries a guess (the decoder checks it).
func maskUnknown(members []MemberStatus) []MemberStatus {
	out := make([]MemberStatus, len(members))
	for i, m := range members {
		m.Known &= knownAll
		if m.Known&KnownRole == 0 {
			m.Role, m.Ballot = RoleUnknown, Ballot{}
		}
		if m.Known&KnownCommit == 0 {
			m.Commit = 0
		}
		if m.Known&KnownApplied == 0 {
			m.Applied = 0
		}
		if m.Known&KnownReachable == 0 {
			m.Reachable = false
		}
		if m.Known&KnownAcked == 0 {
			m.Acked = 0
		}
		if m.Known&KnownHeard == 0 {
			m.HeardAgo = 0
		}
		if m.Known&KnownLag == 0 {
			m.Lag, m.LagAtLeast = 0, false
		}
		m.HeardAgo, m.Lag = wireMillis(m.HeardAgo), wireMillis(m.Lag)
		out[i] = m
	}
	return out
}

// wireMillis is d as the wire carries it: whole milliseconds, 0 for a
// negative d, at most statusMillisMax.
func wireMillis(d time.Duration) time.Duration {
	return time.Duration(durationMillis(d)) * time.Millisecond
}

func durationMillis(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return min(uint64(d/time.Millisecond), statusMillisMax)
}

// appendStatusExt appends the progress extension for members (already
// masked and clipped to MembersMax):
//
//	format u8 = StatusFormatProgress | count u16 (= the member count)
//	| count x (known u8 | acked slot u64 | heard ms u64 | lag ms u64)
func appendStatusExt(b []byte, members []MemberStatus) []byte {
	b = append(b, StatusFormatProgress)
	b = binary.BigEndian.AppendUint16(b, uint16(len(members)))
	for _, m := range members {
		k := byte(m.Known)
		if m.LagAtLeast {
			k |= knownLagAtLeast
		}
		b = append(b, k)
		b = binary.BigEndian.AppendUint64(b, m.Acked)
		b = binary.BigEndian.AppendUint64(b, durationMillis(m.HeardAgo))
		b = binary.BigEndian.AppendUint64(b, durationMillis(m.Lag))
	}
	return b
}

// readStatusExt reads the progress extension into cs, when the body has
// bytes left after the basic reply.
func readStatusExt(r *reader, cs *ClusterStatus) {
	if r.err != nil || r.off == len(r.b) {
		return
	}
	if f := r.u8("status extension format"); r.err == nil && f != StatusFormatProgress {
		r.fail("unknown status extension format %d", f)
		return
	}
	if n := int(r.u16("status extension count")); r.err == nil && n != len(cs.Members) {
		r.fail("status extension has %d rows for %d members", n, len(cs.Members))
		return
	}
	cs.Extended = true
	for i := range cs.Members {
		m := &cs.Members[i]
		k := r.u8("known")
		m.Known = Known(k) & knownAll
		m.LagAtLeast = k&knownLagAtLeast != 0
		m.Acked = r.u64("acked slot")
		heard, lag := r.u64("heard ms"), r.u64("lag ms")
		if r.err != nil {
			return
		}
		if heard > statusMillisMax || lag > statusMillisMax {
			r.fail("member %d: age of %d or %d ms exceeds %d", m.ID, heard, lag, statusMillisMax)
			return
		}
		m.HeardAgo, m.Lag = time.Duration(heard)*time.Millisecond, time.Duration(lag)*time.Millisecond
		if masked := maskUnknown([]MemberStatus{*m})[0]; masked != *m {
			r.fail("member %d: a figure its known bits %#x call unknown is not zero", m.ID, k)
			return
		}
	}
}
