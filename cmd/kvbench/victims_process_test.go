package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestVictimsChildRefusesBadSpec: the victims' child checks its spec
// before it dials anything, and says what is wrong.
func TestVictimsChildRefusesBadSpec(t *testing.T) {
	good := victimSpec{Endpoints: []string{"127.0.0.1:1"}, Rate: 200, ReadRatio: 0.7, ValueBytes: 128,
		Warmup: time.Second, Duration: time.Second, Concurrency: 16}
	if err := good.check(); err != nil {
		t.Fatalf("the good spec: %v", err)
	}
	for name, c := range map[string]struct {
		plant func(s *victimSpec)
		want  string
	}{
		"no endpoints": {func(s *victimSpec) { s.Endpoints = nil }, "no endpoints"},
		"rate":         {func(s *victimSpec) { s.Rate = 0 }, "rate"},
		"read ratio":   {func(s *victimSpec) { s.ReadRatio = 1.5 }, "read ratio"},
		"value":        {func(s *victimSpec) { s.ValueBytes = valueBytesMax + 1 }, "value bytes"},
		"duration":     {func(s *victimSpec) { s.Duration = 0 }, "duration"},
		"concurrency":  {func(s *victimSpec) { s.Concurrency = 0 }, "concurrency"},
	} {
		s := good
		c.plant(&s)
		line, _ := json.Marshal(s)
		var out bytes.Buffer
		if err := victimsMain(bytes.NewReader(append(line, '\n')), &out); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var ready victimReady
		if err := json.Unmarshal(out.Bytes(), &ready); err != nil || !strings.Contains(ready.Error, c.want) {
			t.Errorf("%s: answered %q (%v), want an error with %q", name, out.String(), err, c.want)
		}
	}
	var out bytes.Buffer
	if err := victimsMain(strings.NewReader("{not json\n"), &out); err == nil || !strings.Contains(err.Error(), "spec") {
		t.Errorf("a malformed spec: %v", err)
	}
	if err := victimsMain(strings.NewReader(""), &out); err == nil || !strings.Contains(err.Error(), "no spec") {
		t.Errorf("no spec: %v", err)
	}
}

// TestVictimsParentRefusesBadAnswer: kvbench checks what its child
// answers: a line that is not JSON, a histogram that is not one, a
// negative count, or no answer at all is an error, never a figure.
func TestVictimsParentRefusesBadAnswer(t *testing.T) {
	for name, c := range map[string]struct{ line, want string }{
		"not json":       {"{oops\n", "its answer"},
		"no answer":      {"", "EOF"},
		"child's error":  {`{"error":"dial failed"}` + "\n", "dial failed"},
		"bad histogram":  {`{"result":{"hists":[{"key":{"Class":"read","Tenant":2},"hist":{"hdr":{"LowestTrackableValue":1,"HighestTrackableValue":60000000,"SignificantFigures":3,"Counts":[1,2]}}}]}}` + "\n", "counts, want"},
		"negative count": {`{"result":{"hists":[]},"throttled":[0,-1,0,0]}` + "\n", "negative"},
	} {
		p := &victimProc{sc: bufio.NewScanner(strings.NewReader(c.line)), enc: json.NewEncoder(&bytes.Buffer{}),
			spec: victimSpec{Duration: time.Second}}
		_, _, err := p.run(context.Background(), "quiet", nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
	}
}
