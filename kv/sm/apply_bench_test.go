package sm

import (
	"fmt"
	"testing"

	"synod/kv/proto"
)

// BenchmarkApplyPuts applies slots of 16 puts of 128-byte values, to new
// keys and to keys already stored: what the state machine costs a write
// (the usage accounting's read of the old value included). "window-256"
// writes new keys from a client with ResultsPerClientMax writes
// unacknowledged, so each apply rewrites a full exactly-once entry.
func BenchmarkApplyPuts(b *testing.B) {
	for _, mode := range []string{"new-keys", "overwrites", "window-256"} {
		b.Run(mode, func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			const perSlot = 16
			value := make([]byte, 128)
			var seq uint64
			cmds := make([][]byte, perSlot)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range cmds {
					seq++
					k := seq
					if mode == "overwrites" {
						k = seq % 4096
					}
					unacked := seq
					if mode == "window-256" && seq > ResultsPerClientMax {
						unacked = seq - ResultsPerClientMax + 1
					}
					cmds[j] = EncodeCommand(1, &proto.Request{Op: proto.OpPut, ClientID: 1, Seq: seq, FirstUnacked: unacked,
						Key: fmt.Appendf(nil, "key-%012d", k), Value: value})
				}
				if _, err := s.Apply(uint64(i+1), cmds); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perSlot), "ns/put")
		})
	}
}

// BenchmarkApplyNewKeysStored applies slots of 16 puts of new keys to a
// store that already holds 200,000 keys in sstables (flushed and
// compacted into levels), about 30 MB against an 8 MiB block cache: the
// old-value read of each put misses, which is what the sstables' Bloom
// filters are for (pebbleOptions).
func BenchmarkApplyNewKeysStored(b *testing.B) {
	s, err := Open(b.TempDir(), Options{CacheBytes: 8 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const perSlot, stored = 16, 200_000
	value := make([]byte, 128)
	var seq, slot uint64
	cmds := make([][]byte, perSlot)
	applySlot := func(key func(seq uint64) []byte) {
		for j := range cmds {
			seq++
			cmds[j] = EncodeCommand(1, &proto.Request{Op: proto.OpPut, ClientID: 1, Seq: seq, FirstUnacked: seq, Key: key(seq), Value: value})
		}
		slot++
		if _, err := s.Apply(slot, cmds); err != nil {
			b.Fatal(err)
		}
	}
	// Stored keys are even numbers, new ones odd: the new keys fall inside
	// every sstable's key range, so only a filter can rule a table out.
	for seq < stored {
		applySlot(func(q uint64) []byte { return fmt.Appendf(nil, "key-%012d", 2*q) })
		if slot%2000 == 0 {
			if _, err := s.Flush(); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := s.Flush(); err != nil {
		b.Fatal(err)
	}
	base := seq
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Odd keys spread over the stored range (7919 is prime to it).
		applySlot(func(q uint64) []byte { return fmt.Appendf(nil, "key-%012d", 2*((q-base)*7919%stored)+1) })
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perSlot), "ns/put")
}
