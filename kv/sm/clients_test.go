package sm

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/tenants"
)

// entry returns k's entry (nil when it has none).
func (s *SM) entry(k clientKey) *clientEntry {
	if tc := s.clients[k.tenant]; tc != nil {
		return tc.entries[k.client]
	}
	return nil
}

// tablesEqual compares two client tables, ignoring tenants with nothing.
func tablesEqual(a, b map[tenants.ID]*tenantClients) bool {
	nonEmpty := func(m map[tenants.ID]*tenantClients) int {
		n := 0
		for _, tc := range m {
			if len(tc.entries)+len(tc.tombs) > 0 {
				n++
			}
		}
		return n
	}
	if nonEmpty(a) != nonEmpty(b) {
		return false
	}
	for id, ta := range a {
		tb := b[id]
		if tb == nil {
			if len(ta.entries)+len(ta.tombs) > 0 {
				return false
			}
			continue
		}
		if len(ta.entries) != len(tb.entries) || len(ta.tombs) != len(tb.tombs) {
			return false
		}
		for c, ea := range ta.entries {
			eb := tb.entries[c]
			if eb == nil || !bytes.Equal(ea.encode(), eb.encode()) {
				return false
			}
		}
		for c, x := range ta.tombs {
			if y, ok := tb.tombs[c]; !ok || x != y {
				return false
			}
		}
	}
	return true
}

func openOpts(t *testing.T, dir string, opts Options) *SM {
	t.Helper()
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// write is one exactly-once write for the tests below.
type write struct {
	tenant           tenants.ID
	client, seq, fua uint64
	key, value       string
}

func (w write) cmd() []byte {
	fua := w.fua
	if fua == 0 {
		fua = w.seq
	}
	return EncodeCommand(w.tenant, &proto.Request{Op: proto.OpPut, ClientID: w.client, Seq: w.seq, FirstUnacked: fua,
		Key: []byte(w.key), Value: []byte(w.value)})
}

// slotWriter applies writes, one slot per call.
type slotWriter struct {
	t    *testing.T
	s    *SM
	slot uint64
}

func (sw *slotWriter) apply(ws ...write) []Result {
	sw.t.Helper()
	cmds := make([][]byte, len(ws))
	for i, w := range ws {
		cmds[i] = w.cmd()
	}
	sw.slot++
	res, err := sw.s.Apply(sw.slot, cmds)
	if err != nil {
		sw.t.Fatal(err)
	}
	return res
}

// flood applies n writes of tenant from fresh client ids (first..first+n-1),
// 128 per slot, as a tenant opening a new client per write does.
func (sw *slotWriter) flood(tenant tenants.ID, first uint64, n int) {
	sw.t.Helper()
	for i := 0; i < n; {
		var ws []write
		for ; i < n && len(ws) < 128; i++ {
			ws = append(ws, write{tenant: tenant, client: first + uint64(i), seq: 1, key: "flood", value: "x"})
		}
		for _, r := range sw.apply(ws...) {
			if r.Status != proto.StatusOK {
				sw.t.Fatalf("flood write: %v %s", r.Status, r.Message)
			}
		}
	}
}

// TestClientFloodCannotEvictOtherTenant is item 7 of the hostile-input
// review: 4600 writes from fresh client ids of one tenant evicted another
// tenant's entry (the table was global), and the victim's retried PUT was
// applied twice. Each tenant now has its own share.
func TestClientFloodCannotEvictOtherTenant(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	sw := &slotWriter{t: t, s: s}
	victim := write{tenant: 1, client: 77, seq: 1, key: "k", value: "first"}
	if r := sw.apply(victim); r[0].Status != proto.StatusOK {
		t.Fatal(r[0].Status)
	}
	sw.apply(write{tenant: 1, client: 78, seq: 1, key: "k", value: "second"})
	sw.flood(2, 1000, 4600)
	if n := len(s.clients[2].entries); n > ClientsPerTenantDefault {
		t.Fatalf("the flooding tenant holds %d entries, share %d", n, ClientsPerTenantDefault)
	}
	// The retry is answered from the table and not applied again.
	if r := sw.apply(victim); r[0].Status != proto.StatusOK {
		t.Fatalf("victim's retry: %v %s", r[0].Status, r[0].Message)
	}
	if v, _ := mustGet(t, s, 1, "k"); v != "second" {
		t.Fatalf("victim's retried PUT applied again: k = %q", v)
	}
	if s.entry(clientKey{1, 77}) == nil {
		t.Fatal("another tenant's flood evicted the victim")
	}
}

// TestEvictedRetryIsStale: a tenant over its share evicts its own oldest
// client; that client's retry gets SEQUENCE_STALE and is not applied, also
// after a restart and in a restored snapshot, while its new writes go on.
func TestEvictedRetryIsStale(t *testing.T) {
	const share = 16
	dir := t.TempDir()
	opts := Options{ClientsMax: map[tenants.ID]int{1: share}}
	s := openOpts(t, dir, opts)
	sw := &slotWriter{t: t, s: s}
	v1 := write{tenant: 1, client: 5, seq: 1, key: "k", value: "first"}
	v3 := write{tenant: 1, client: 5, seq: 3, fua: 2, key: "late", value: "late"}
	sw.apply(v1)
	sw.apply(v3) // seq 2 is still in flight (pipelined)
	sw.apply(write{tenant: 1, client: 6, seq: 1, key: "k", value: "second"})
	sw.flood(1, 100, share)
	if s.entry(clientKey{1, 5}) != nil {
		t.Fatal("client 5 was not evicted")
	}
	if tb := s.clients[1].tombs[5]; tb.next != 4 {
		t.Fatalf("tombstone %+v, want next 4", tb)
	}
	check := func(s *SM, sw *slotWriter, when string) {
		t.Helper()
		for _, w := range []write{v1, {tenant: 1, client: 5, seq: 2, fua: 2, key: "k", value: "two"}, v3} {
			if r := sw.apply(w); r[0].Status != proto.StatusSequenceStale {
				t.Fatalf("%s: retry of evicted seq %d answered %v, want SEQUENCE_STALE", when, w.seq, r[0].Status)
			}
		}
		if v, _ := mustGet(t, s, 1, "k"); v != "second" {
			t.Fatalf("%s: a stale retry was applied: k = %q", when, v)
		}
	}
	check(s, sw, "after eviction")

	// The tombstone is stored: it survives a restart and a snapshot.
	rc, _, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	stream, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openOpts(t, dir, opts)
	defer s.Close()
	sw.s = s
	check(s, sw, "after a restart")
	rs := openOpts(t, t.TempDir(), opts)
	defer rs.Close()
	if err := rs.Restore(bytes.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	rsw := &slotWriter{t: t, s: rs, slot: rs.Applied()}
	check(rs, rsw, "in a restored snapshot")

	// New writes of the evicted client work, and are exactly-once again.
	next := write{tenant: 1, client: 5, seq: 4, fua: 4, key: "k", value: "third"}
	for i := 0; i < 2; i++ {
		if r := sw.apply(next); r[0].Status != proto.StatusOK {
			t.Fatalf("new write of an evicted client: %v %s", r[0].Status, r[0].Message)
		}
	}
	sw.apply(write{tenant: 1, client: 6, seq: 2, key: "k", value: "fourth"})
	if r := sw.apply(next); r[0].Status != proto.StatusOK {
		t.Fatal(r[0].Status)
	}
	if v, _ := mustGet(t, s, 1, "k"); v != "fourth" {
		t.Fatalf("k = %q, want fourth", v)
	}
	if _, ok := s.clients[1].tombs[5]; ok {
		t.Fatal("client 5 has both an entry and a tombstone")
	}
	if e := s.entry(clientKey{1, 5}); e == nil || e.floor != 4 {
		t.Fatalf("client 5 back in the table: %+v", e)
	}
	if r := sw.apply(write{tenant: 1, client: 5, seq: 2, fua: 2, key: "k", value: "two"}); r[0].Status != proto.StatusSequenceStale {
		t.Fatalf("seq below the tombstone after re-entry: %v", r[0].Status)
	}
}

// TestTombstonesBounded: a tenant's tombstones stay within
// TombstonesPerShare x share; past it the oldest are forgotten.
func TestTombstonesBounded(t *testing.T) {
	const share = ClientsPerTenantMin
	s := openOpts(t, t.TempDir(), Options{ClientsDefault: share})
	defer s.Close()
	sw := &slotWriter{t: t, s: s}
	n := (TombstonesPerShare + 3) * share
	sw.flood(3, 1, n)
	tc := s.clients[3]
	if len(tc.entries) > share || len(tc.tombs) > TombstonesPerShare*share {
		t.Fatalf("%d entries, %d tombstones; share %d", len(tc.entries), len(tc.tombs), share)
	}
	st := s.ClientStats()
	if st.Forgotten == 0 || st.Evicted == 0 || st.Entries+st.Tombstones+int(st.Forgotten) != n {
		t.Fatalf("stats %+v after %d clients", st, n)
	}
	// The newest tombstones are kept, the oldest forgotten.
	if _, ok := tc.tombs[1]; ok {
		t.Fatal("the oldest tombstone was kept")
	}
	if _, ok := tc.tombs[uint64(n-share)]; !ok {
		t.Fatal("a recent tombstone was forgotten")
	}
}

// TestClientTableDeterminism: replicas applying the same commands end in the
// same state, answers included, whether or not one restarts in between.
// CLIENTS_SEED replays a seed.
func TestClientTableDeterminism(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CLIENTS_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d (replay: CLIENTS_SEED=%d go test ./kv/sm -run TestClientTableDeterminism)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	opts := Options{ClientsMax: map[tenants.ID]int{1: 16, 2: 24}, ClientsDefault: 16}
	dirC := t.TempDir()
	a, b, c := openOpts(t, t.TempDir(), opts), openOpts(t, t.TempDir(), opts), openOpts(t, dirC, opts)
	defer func() { a.Close(); b.Close(); c.Close() }()

	// Clients of three tenants; each has a next seq and sometimes retries
	// or reorders one of its recent writes.
	type cl struct {
		tenant tenants.ID
		id     uint64
		seq    uint64
	}
	var clients []*cl
	nextID := uint64(1)
	var slot uint64
	for round := 0; round < 1500; round++ {
		var cmds [][]byte
		for i := 0; i < 1+rng.IntN(8); i++ {
			var w write
			switch r := rng.IntN(10); {
			case r < 3 || len(clients) == 0: // a new client
				k := &cl{tenant: tenants.ID(1 + rng.IntN(3)), id: nextID}
				nextID++
				clients = append(clients, k)
				k.seq++
				w = write{tenant: k.tenant, client: k.id, seq: k.seq}
			case r < 8: // a new write of a known client
				k := clients[rng.IntN(len(clients))]
				k.seq++
				w = write{tenant: k.tenant, client: k.id, seq: k.seq, fua: max(1, k.seq-uint64(rng.IntN(3)))}
			default: // a retry or a late write of a known client
				k := clients[rng.IntN(len(clients))]
				seq := 1 + rng.Uint64N(k.seq+2)
				w = write{tenant: k.tenant, client: k.id, seq: seq, fua: 1 + rng.Uint64N(seq)}
			}
			w.key = fmt.Sprintf("k%d", rng.IntN(20))
			w.value = fmt.Sprintf("v%d.%d", slot, i)
			cmds = append(cmds, w.cmd())
		}
		slot++
		ra, err := a.Apply(slot, cmds)
		if err != nil {
			t.Fatal(err)
		}
		rb, err := b.Apply(slot, cmds)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := c.Apply(slot, cmds)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ra {
			if ra[i].Status != rb[i].Status || ra[i].Status != rc[i].Status {
				t.Fatalf("slot %d command %d: answers %v / %v / %v", slot, i, ra[i].Status, rb[i].Status, rc[i].Status)
			}
		}
		if round == 700 { // c restarts: its table comes back from Pebble
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			c = openOpts(t, dirC, opts)
		}
	}
	if st := a.ClientStats(); st.Evicted == 0 || st.Forgotten == 0 {
		t.Fatalf("the run did not evict and forget: %+v", st)
	}
	snap := func(s *SM) []byte {
		b, _ := snapshotBytes(t, s)
		return b
	}
	sa, sb, sc := snap(a), snap(b), snap(c)
	if !bytes.Equal(sa, sb) || !bytes.Equal(sa, sc) {
		t.Fatal("replicas applying the same commands differ")
	}
	if !tablesEqual(a.clients, b.clients) || !tablesEqual(a.clients, c.clients) {
		t.Fatal("client tables in memory differ")
	}
}

func TestClientSharesOptions(t *testing.T) {
	for _, bad := range []Options{
		{ClientsDefault: ClientsPerTenantMin - 1},
		{ClientsMax: map[tenants.ID]int{1: ClientsPerTenantMax + 1}},
		{ClientsMax: map[tenants.ID]int{1: 0}},
		{ClientsMax: map[tenants.ID]int{1: ClientsPerTenantMax, 2: ClientsTotalMax - ClientsPerTenantMax + 1}},
	} {
		if s, err := Open(t.TempDir(), bad); err == nil {
			s.Close()
			t.Fatalf("Open accepted %+v", bad)
		}
	}
	s := openOpts(t, t.TempDir(), Options{ClientsMax: map[tenants.ID]int{1: 100}, ClientsDefault: 20})
	defer s.Close()
	if s.share(1) != 100 || s.share(2) != 20 {
		t.Fatalf("shares %d %d", s.share(1), s.share(2))
	}
	d := openT(t, t.TempDir())
	defer d.Close()
	if d.share(9) != ClientsPerTenantDefault {
		t.Fatal(d.share(9))
	}
}

// TestSlotEvictsEntryItChanged: a client entry is written once per slot,
// after the slot's last command (writeDirty). An entry that the same slot
// changed and then evicted must stay deleted: one slot of 40 new clients
// of a tenant whose share is 16 evicts the slot's own first clients, and
// the table stored in Pebble must be the one in memory (a tombstone, not
// an entry brought back beside it).
func TestSlotEvictsEntryItChanged(t *testing.T) {
	dir := t.TempDir()
	opts := Options{ClientsDefault: ClientsPerTenantMin}
	s := openOpts(t, dir, opts)
	sw := &slotWriter{t: t, s: s}
	sw.flood(1, 1, 40)
	stored, err := loadClients(s.db)
	if err != nil {
		t.Fatalf("stored table: %v", err)
	}
	if !tablesEqual(stored, s.clients) {
		t.Fatalf("the stored table differs from memory: %d entries %d tombstones stored, %d and %d in memory",
			len(stored[1].entries), len(stored[1].tombs), len(s.clients[1].entries), len(s.clients[1].tombs))
	}
	if _, ok := s.clients[1].tombs[1]; !ok || s.entry(clientKey{1, 1}) != nil {
		t.Fatal("client 1, the slot's first, was not evicted: the test no longer covers an eviction inside one slot")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openOpts(t, dir, opts)
	defer s.Close()
	sw.s = s
	if r := sw.apply(write{tenant: 1, client: 1, seq: 1, key: "flood", value: "again"}); r[0].Status != proto.StatusSequenceStale {
		t.Fatalf("retry of an evicted client's write after a restart: %v, want SEQUENCE_STALE", r[0].Status)
	}
}

// TestClientEntryMatchesMapModel checks the sorted-slice entry against the
// map it replaced (kept here as the model): random puts in nearly
// increasing order with retries and reorders, floors that rise, and the
// ResultsPerClientMax trim; after every step the encodings must be equal
// and decode must give the entry back.
func TestClientEntryMatchesMapModel(t *testing.T) {
	type model struct {
		floor   uint64
		results map[uint64]cachedResult
	}
	encodeModel := func(m *model, lastSlot uint64) []byte {
		e := &clientEntry{floor: m.floor, lastSlot: lastSlot}
		for _, s := range slices.Sorted(maps.Keys(m.results)) {
			e.results = append(e.results, m.results[s])
		}
		return e.encode()
	}
	rng := rand.New(rand.NewPCG(7, 11))
	for run := 0; run < 200; run++ {
		e := &clientEntry{}
		m := &model{results: map[uint64]cachedResult{}}
		next := uint64(1)
		for step := 0; step < 600; step++ {
			seq := next
			switch r := rng.IntN(10); {
			case r < 7:
				next++
			case r < 9: // a reorder or a retry
				seq = next - min(next-1, rng.Uint64N(300))
			default: // a gap
				next += 1 + rng.Uint64N(40)
				seq = next
			}
			fua := seq - min(seq-1, rng.Uint64N(320))
			if rng.IntN(50) == 0 {
				fua = seq + 1 // a client that acknowledged past this write
			}
			res := cachedResult{seq: seq, status: proto.Status(rng.IntN(4)), failedOp: rng.Uint32N(3)}
			// The model: the code before the slice.
			m.results[seq] = res
			m.floor = max(m.floor, fua)
			for len(m.results) > ResultsPerClientMax {
				lowest := slices.Min(slices.Collect(maps.Keys(m.results)))
				m.floor = max(m.floor, lowest+1)
				delete(m.results, lowest)
			}
			maps.DeleteFunc(m.results, func(q uint64, _ cachedResult) bool { return q < m.floor })
			// The entry, as record changes it.
			e.put(res)
			e.raiseFloor(fua)
			if over := len(e.results) - ResultsPerClientMax; over > 0 {
				e.raiseFloor(e.results[over-1].seq + 1)
			}
			e.lastSlot = uint64(step)
			got, want := e.encode(), encodeModel(m, uint64(step))
			if !bytes.Equal(got, want) {
				t.Fatalf("run %d step %d (seq %d, first unacked %d): entry %d results floor %d, model %d results floor %d",
					run, step, seq, fua, len(e.results), e.floor, len(m.results), m.floor)
			}
			d, err := decodeClientEntry(got)
			if err != nil || !bytes.Equal(d.encode(), got) {
				t.Fatalf("run %d step %d: decode: %v", run, step, err)
			}
			if len(e.results) > 0 && cap(e.results) > 2*(ResultsPerClientMax+1)+64 {
				t.Fatalf("run %d step %d: %d results in a backing array of %d", run, step, len(e.results), cap(e.results))
			}
		}
	}
}

// TestDecodeClientEntryRejectsDisorder: a stored entry's results must be in
// strictly increasing order and at or above its floor (what encode writes);
// anything else is a corrupt store or snapshot, not a table to run on.
func TestDecodeClientEntryRejectsDisorder(t *testing.T) {
	enc := func(floor uint64, seqs ...uint64) []byte {
		e := &clientEntry{floor: floor}
		for _, s := range seqs {
			e.results = append(e.results, cachedResult{seq: s})
		}
		return e.encode()
	}
	if _, err := decodeClientEntry(enc(3, 3, 4, 9)); err != nil {
		t.Fatalf("a good entry: %v", err)
	}
	for name, b := range map[string][]byte{
		"duplicate":     enc(1, 4, 4),
		"decreasing":    enc(1, 5, 4),
		"below floor":   enc(5, 4, 6),
		"short":         enc(1, 4)[:20],
		"count too big": enc(1, 4)[:17],
	} {
		if _, err := decodeClientEntry(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// FuzzDecodeClientEntry: a stored entry comes from this node's Pebble or a
// peer's snapshot. Decoding must never panic, and whatever decodes is in
// the canonical form encode writes (so replicas that load it agree).
func FuzzDecodeClientEntry(f *testing.F) {
	good := &clientEntry{floor: 3, lastSlot: 9, results: []cachedResult{{seq: 3, status: 2, failedOp: 1}, {seq: 7}}}
	f.Add(good.encode())
	f.Add((&clientEntry{}).encode())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeClientEntry(b)
		if err != nil {
			return
		}
		if got := e.encode(); !bytes.Equal(got, b) {
			t.Fatalf("decoded %x, which encodes to %x", b, got)
		}
		for i, r := range e.results {
			if r.seq < e.floor || (i > 0 && r.seq <= e.results[i-1].seq) {
				t.Fatalf("decoded entry breaks its invariant at result %d: %+v", i, e)
			}
		}
	})
}
