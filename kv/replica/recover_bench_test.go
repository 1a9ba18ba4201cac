package replica

import (
	"path/filepath"
	"testing"

	"synod/paxos"
	"synod/pmem"
)

// BenchmarkRecoverAcceptorLog times what a restart spends reading the
// acceptor log back into entries: 20,000 slots of four 256-byte commands
// (about 20 MiB, the catch-up tail a busy node keeps), recovered whole.
func BenchmarkRecoverAcceptorLog(b *testing.B) {
	const slots, cmdsPerSlot, cmdBytes = 20_000, 4, 256
	plog, _, err := OpenPMemLog(pmem.Options{Path: filepath.Join(b.TempDir(), "bench.pmem"), SizeBytes: 64 << 20,
		Mode: pmem.ModeShm, ClusterID: 9, NodeID: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer plog.Close()
	ballot := paxos.Ballot{Round: 1, Node: 1}
	cmds := make([][]byte, cmdsPerSlot)
	for i := range cmds {
		cmds[i] = make([]byte, cmdBytes)
	}
	for s := 1; s <= slots; s += 100 {
		entries := make([]paxos.Entry, 0, 100)
		for i := s; i < s+100; i++ {
			entries = append(entries, paxos.Entry{Slot: paxos.Slot(i), Ballot: ballot, Type: paxos.EntryNormal, Cmds: cmds})
		}
		if err := plog.Append(entries); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(slots * cmdsPerSlot * cmdBytes)
	for b.Loop() {
		_, got, err := plog.Recover(0)
		if err != nil || len(got) != slots {
			b.Fatalf("recovered %d entries, %v", len(got), err)
		}
	}
}
