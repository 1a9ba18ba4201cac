package replica

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/paxos"
	"synod/pmem"
)

// The write path reuses its encoding buffers instead of allocating one a
// message (alloc profile of a loaded leader: the acceptor log's payloads,
// the side channel's seals and the datagrams' seals were together about
// a fifth of the bytes it allocated). These tests hold each reuse to
// what it promises: no allocation once warm, and bytes that still read
// back as what was written.

// TestPMemLogAppendReusesPayloads: once warm, appending a batch of entries
// allocates nothing per entry (PMemLog.payloads), and what Recover reads
// back is every entry as it was appended, re-ballots included.
func TestPMemLogAppendReusesPayloads(t *testing.T) {
	plog, _, err := OpenPMemLog(pmem.Options{Path: filepath.Join(t.TempDir(), "reuse.pmem"), SizeBytes: 64 << 20,
		Mode: pmem.ModeMsync, ClusterID: 9, NodeID: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer plog.Close()
	b1 := paxos.Ballot{Round: 1, Node: 1}
	b2 := paxos.Ballot{Round: 2, Node: 1}
	const perBatch = 16
	next := paxos.Slot(1)
	batch := make([]paxos.Entry, perBatch)
	// Commands of varying sizes (the buffer regrows), built before the
	// measurement.
	cmds := make([][][]byte, 64)
	for i := range cmds {
		cmds[i] = [][]byte{bytes.Repeat([]byte{byte(i)}, 100+i*7), []byte(fmt.Sprint(i))}
	}
	fill := func() {
		for i := range batch {
			batch[i] = paxos.Entry{Slot: next, Ballot: b1, Type: paxos.EntryNormal, Cmds: cmds[int(next)%len(cmds)]}
			next++
		}
	}
	fill()
	if err := plog.Append(batch); err != nil { // warm: the buffer grows once
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(50, func() {
		fill()
		if err := plog.Append(batch); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("appending %d entries allocated %.1f times, want 0", perBatch, allocs)
	}
	last := append([]paxos.Entry(nil), batch...)
	// A re-ballot of the batch's first slot, in a batch of its own kind.
	rb := last[0]
	rb.Ballot, rb.Held = b2, b1
	if err := plog.Append([]paxos.Entry{rb}); err != nil {
		t.Fatal(err)
	}
	_, got, err := plog.Recover(last[0].Slot - 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != perBatch {
		t.Fatalf("recovered %d entries above slot %d, want %d", len(got), last[0].Slot-1, perBatch)
	}
	for i, e := range got {
		want := last[i]
		if i == 0 {
			want.Ballot = b2
		}
		if e.Slot != want.Slot || e.Ballot != want.Ballot || len(e.Cmds) != 2 ||
			!bytes.Equal(e.Cmds[0], want.Cmds[0]) || !bytes.Equal(e.Cmds[1], want.Cmds[1]) {
			t.Fatalf("slot %d recovered as %+v, want %+v", want.Slot, e, want)
		}
	}
}

// TestSideFramesReuseBuffers: a side channel sender seals frame after
// frame in the one sealedFrame it keeps, without allocating and without a
// buffer the size of the payload, and each frame opens at the receiver as
// its payload.
func TestSideFramesReuseBuffers(t *testing.T) {
	tx := mustAuth(t, 9, 1, secretA)
	rx := mustAuth(t, 9, 2, secretA)
	s := &sideChannel{auth: tx}
	var f sealedFrame
	for _, n := range []int{0, 1, 300, 1452, 40 << 10, 3, 1<<20 + 5} {
		p := bytes.Repeat([]byte{byte(n)}, n)
		var w bytes.Buffer
		// The message in two parts, as the leader's Accepts come (a
		// head of their own, entries shared by every follower's).
		if err := s.writeFrame(&w, sideMsg{head: p[:n/3], body: p[n/3:]}, &f); err != nil {
			t.Fatal(err)
		}
		frame := w.Bytes()
		sealedLen, err := rx.openSideHead(frame[:sideFrameHeadBytes], sideFrameBytesMax)
		if err != nil {
			t.Fatalf("%d bytes: head: %v", n, err)
		}
		sealed := append(append([]byte(nil), frame[4:4+authHeaderBytes]...), frame[sideFrameHeadBytes:]...)
		if len(sealed) != sealedLen {
			t.Fatalf("%d bytes: sealed packet %d bytes, head says %d", n, len(sealed), sealedLen)
		}
		got, err := rx.openSideBody(sealed)
		if err != nil || !bytes.Equal(got, p) {
			t.Fatalf("%d bytes: opened %d bytes, err %v", n, len(got), err)
		}
	}
	p := make([]byte, 1<<20)
	if allocs := testing.AllocsPerRun(20, func() {
		if err := s.writeFrame(io.Discard, sideMsg{head: p[:100], body: p[100:]}, &f); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("writing a sealed frame of 1 MiB allocated %.1f times, want 0", allocs)
	}
}

// TestSealFrameEqualsReference: the frame sealFrame writes around a payload
// is, byte for byte, the frame of the sealed packet built whole (seal, then
// frameSealed), on both stream channels, at lengths around the tag's word
// boundaries, the payload given in two parts; and a receiver opens it. A tag over the wrong bytes (planted:
// the header left out of the digest) differs and is refused.
func TestSealFrameEqualsReference(t *testing.T) {
	tx := mustAuth(t, 9, 1, secretA)
	rx := mustAuth(t, 9, 2, secretA)
	for _, ch := range []byte{authChannelSide, authChannelSnapshot} {
		for n := 0; n <= 70; n++ {
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(i*13 + n)
			}
			var f sealedFrame
			before := tx.counter[ch].Load()
			tx.sealFrame(&f, ch, p[:n/2], p[n/2:])
			got := f.bytes(p)
			tx.counter[ch].Store(before)
			want := tx.frameSealed(nil, tx.seal(nil, ch, p))
			if !bytes.Equal(got, want) {
				t.Fatalf("channel %d, %d bytes:\n got %x\nwant %x", ch, n, got, want)
			}
			if _, err := rx.openFrameHead(got[:sideFrameHeadBytes], ch, sideFrameBytesMax); err != nil {
				t.Fatalf("channel %d, %d bytes: head refused: %v", ch, n, err)
			}
		}
	}
	// The plant: a tag over the payload alone.
	p := []byte("an accept batch")
	var f sealedFrame
	tx.sealFrame(&f, authChannelSide, p, nil)
	d := tx.keys[0][tx.self].Digest()
	d.Write(p)
	binary.LittleEndian.PutUint64(f.tag[:], d.Sum64())
	frame := f.bytes(p)
	if _, err := rx.openSideHead(frame[:sideFrameHeadBytes], sideFrameBytesMax); err != nil {
		t.Fatal(err)
	}
	sealed := append(append([]byte(nil), frame[4:4+authHeaderBytes]...), frame[sideFrameHeadBytes:]...)
	if _, err := rx.openSideBody(sealed); !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("a tag without the header opened: %v", err)
	}
}

// TestSealedDatagramsShareOneBuffer: the send loop seals every datagram of
// a batch into one buffer it reuses after each flush. Under pipelined
// writes from many clients (batches of several datagrams, the buffer
// growing in the middle of one) every datagram still opens at its
// receiver: no node refuses one, and every write commits.
func TestSealedDatagramsShareOneBuffer(t *testing.T) {
	c := newTestClusterWith(t, func(c *testCluster) { c.secret = secretA })
	c.put("warm", "up")
	l := c.leader()
	const writers, each = 12, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := uint64(1000 + w)
			for seq := uint64(1); seq <= each; seq++ {
				req := &proto.Request{Op: proto.OpPut, Tenant: testTenant, ClientID: id, Seq: seq, FirstUnacked: seq,
					Key: []byte(fmt.Sprintf("w%d-%d", w, seq)), Value: bytes.Repeat([]byte{byte(seq)}, 1+int(seq*37)%600)}
				if resp := c.do(l, req, 10*time.Second); resp.Status != proto.StatusOK {
					errs <- fmt.Errorf("writer %d seq %d: %v %s", w, seq, resp.Status, resp.Message)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var refused, side float64
	for _, n := range c.nodes {
		refused += counterValue(n.r.metrics.AuthRefused)
		side += counterValue(n.r.metrics.SideSent)
	}
	t.Logf("refused %.0f, side channel messages %.0f", refused, side)
	if refused != 0 {
		t.Fatalf("the nodes refused %.0f sealed messages from each other, want 0: a datagram's bytes changed between sealing and sending", refused)
	}
}

// TestCopyEntriesIsDeep: copyEntries' copy equals its source, shares no
// byte with it (paxos reuses its buffers after Advance), and appending to
// one copied command never changes the next.
func TestCopyEntriesIsDeep(t *testing.T) {
	src := []paxos.Entry{
		{Slot: 1, Type: paxos.EntryNoop},
		{Slot: 2, Type: paxos.EntryNormal, Cmds: [][]byte{[]byte("abc"), nil, []byte("de")}},
		{Slot: 3, Type: paxos.EntryNormal, Cmds: [][]byte{bytes.Repeat([]byte("x"), 1000)}},
		{Slot: 4, Type: paxos.EntryNormal, Cmds: [][]byte{[]byte("f"), []byte("g")}},
	}
	got := copyEntries(src)
	if !reflect.DeepEqual(got, src) {
		t.Fatalf("copy %+v, want %+v", got, src)
	}
	for i := range src {
		for j := range src[i].Cmds {
			if c := src[i].Cmds[j]; len(c) > 0 {
				c[0] ^= 0xff
			}
		}
	}
	if reflect.DeepEqual(got, src) {
		t.Fatal("the copy changed with its source: they share bytes")
	}
	_ = append(got[1].Cmds[0], 'Z')
	if string(got[1].Cmds[2]) != "de" {
		t.Fatalf("appending to a copied command changed the next one: %q", got[1].Cmds[2])
	}
	_ = append(got[1].Cmds, []byte("extra"))
	if string(got[3].Cmds[0]) != "f" {
		t.Fatalf("appending to an entry's commands changed the next entry's: %q", got[3].Cmds[0])
	}
}
