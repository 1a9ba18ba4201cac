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
