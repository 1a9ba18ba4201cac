package resp

import (
	"bytes"
	"math/rand/v2"
	"sync"

	"synod/tenants"
)

// SCAN cursors. A SCAN resumes after the last key the previous call
// returned (the key order is the keyspace's; no key is skipped or
// returned twice unless it is written meanwhile). Clients parse the
// cursor as an unsigned 64-bit number (go-redis, redis-cli --scan), and a
// key of up to 1 KiB does not fit in one, so the cursor is a random
// number that stands for the last key: the node remembers, per tenant,
// its scanCursorsPerTenantMax most recent cursors. A cursor is good on
// the node that issued it, for any connection of the tenant (a client's
// pool may send the next SCAN on another connection); one that was
// evicted, or issued by another node, is answered "ERR invalid cursor".

// scanCursorsPerTenantMax bounds each tenant's remembered cursors: at
// most this many scans of one tenant can be in progress on one node at
// once. Memory: at most 32 keys of 1 KiB per tenant that scans.
const scanCursorsPerTenantMax = 32

type cursorTable struct {
	mu       sync.Mutex
	byTenant map[tenants.ID]*tenantCursors
}

// tenantCursors is a ring of the tenant's newest cursors.
type tenantCursors struct {
	ids  [scanCursorsPerTenantMax]uint64
	keys [scanCursorsPerTenantMax][]byte
	next int // Invariant: 0 <= next < scanCursorsPerTenantMax
}

func newCursorTable() *cursorTable {
	return &cursorTable{byTenant: map[tenants.ID]*tenantCursors{}}
}

// put remembers last for tenant and returns its cursor (never 0).
func (t *cursorTable) put(tenant tenants.ID, last []byte) uint64 {
	id := uint64(0)
	for id == 0 {
		id = rand.Uint64() >> 1 // below 2^63: fits a signed 64-bit integer too
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tc := t.byTenant[tenant]
	if tc == nil {
		tc = &tenantCursors{}
		t.byTenant[tenant] = tc
	}
	tc.ids[tc.next], tc.keys[tc.next] = id, bytes.Clone(last)
	tc.next = (tc.next + 1) % scanCursorsPerTenantMax
	return id
}

// get returns the last key cursor id of tenant stands for.
func (t *cursorTable) get(tenant tenants.ID, id uint64) ([]byte, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tc := t.byTenant[tenant]
	if tc == nil || id == 0 {
		return nil, false
	}
	for i, x := range tc.ids {
		if x == id {
			return tc.keys[i], true
		}
	}
	return nil, false
}

// matchPrefix parses a SCAN MATCH pattern. synod serves prefix patterns:
// "prefix*" (every key that starts with prefix), "*" (every key) and a
// literal key (no glob characters: that key only). A backslash escapes
// the next character. ok is false for anything else (a '*' before the
// end, '?', '['): a general glob would have to be matched against every
// key of the range, and a hostile one costs quadratic time per key.
func matchPrefix(pattern []byte) (prefix []byte, exact, ok bool) {
	out := make([]byte, 0, len(pattern))
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; c {
		case '\\':
			if i+1 == len(pattern) {
				return nil, false, false
			}
			i++
			out = append(out, pattern[i])
		case '*':
			if i != len(pattern)-1 {
				return nil, false, false
			}
			return out, false, true
		case '?', '[':
			return nil, false, false
		default:
			out = append(out, c)
		}
	}
	return out, true, true
}

// prefixEnd is the first key after every key that starts with prefix, or
// nil (the end of the keyspace) when there is none.
func prefixEnd(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
