package sm

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"synod/kv/proto"
)

// TestWriteSeedCorpus regenerates testdata/fuzz/FuzzDecodeCommand/ when
// SYNOD_WRITE_CORPUS=1; otherwise it checks that the corpus exists.
func TestWriteSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeCommand")
	if os.Getenv("SYNOD_WRITE_CORPUS") != "1" {
		if ents, err := os.ReadDir(dir); err != nil || len(ents) == 0 {
			t.Fatalf("seed corpus %s missing (run with SYNOD_WRITE_CORPUS=1): %v", dir, err)
		}
		return
	}
	seeds := [][]byte{
		EncodeCommand(1, &proto.Request{Op: proto.OpPut, ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("v")}),
		EncodeCommand(2, &proto.Request{Op: proto.OpDelete, ClientID: 1, Seq: 2, FirstUnacked: 1, Key: []byte("k")}),
		EncodeCommand(3, &proto.Request{Op: proto.OpCAS, ClientID: 1, Seq: 3, FirstUnacked: 3, Key: []byte("k"), ExpectPresent: true, Expect: []byte("e"), Value: []byte("v")}),
		EncodeCommand(4, &proto.Request{Op: proto.OpBatch, ClientID: 1, Seq: 4, FirstUnacked: 4, Ops: []proto.BatchOp{
			{Op: proto.OpPut, Key: []byte("a"), Value: []byte("1")}, {Op: proto.OpDelete, Key: []byte("b")}}}),
		EncodeCommand(5, &proto.Request{Op: proto.OpBatch, ClientID: 1, Seq: 5, FirstUnacked: 5, Ops: []proto.BatchOp{
			{Op: proto.OpCAS, Key: []byte("b"), ExpectPresent: true, ExpectDigest: true, Expect: proto.ValueDigest([]byte("1")), Value: []byte{}},
			{Op: proto.OpDelete, Key: []byte("b")}}}),
		{1, 0, 0, 0, 0, byte(proto.OpPut)},
		{9},
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range seeds {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
