package proto

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteSeedCorpus regenerates testdata/fuzz/Fuzz*/ from the sample
// frames when SYNOD_WRITE_CORPUS=1; otherwise it checks the corpus exists,
// so that `go test` always runs the seeds through the fuzz targets.
func TestWriteSeedCorpus(t *testing.T) {
	write := os.Getenv("SYNOD_WRITE_CORPUS") == "1"
	sets := map[string][][]byte{}
	for _, req := range sampleRequests() {
		sets["FuzzDecodeFrame"] = append(sets["FuzzDecodeFrame"], AppendRequest(nil, req))
	}
	trunc := AppendRequest(nil, sampleRequests()[4])
	sets["FuzzDecodeFrame"] = append(sets["FuzzDecodeFrame"], trunc[:len(trunc)-3], trunc[:HeaderBytes], []byte{0xff, 0xff, 0xff, 0xff, 3, 0, 0, 0})
	for _, resp := range sampleResponses() {
		sets["FuzzDecodeResponse"] = append(sets["FuzzDecodeResponse"], AppendResponse(nil, resp))
	}
	for name, seeds := range sets {
		dir := filepath.Join("testdata", "fuzz", name)
		if !write {
			ents, err := os.ReadDir(dir)
			if err != nil || len(ents) == 0 {
				t.Fatalf("seed corpus %s missing (run with SYNOD_WRITE_CORPUS=1): %v", dir, err)
			}
			continue
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
}
