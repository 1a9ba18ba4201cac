package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestUnfinishedTestShown: a package killed by the -timeout alarm reports
// no result for the test that hung; its output (the alarm's panic and
// the goroutine dump) must still be printed, with the test's name. Once
// it was not: CI printed only "FAIL synod/e2e 2405.1s" and "0 failed".
func TestUnfinishedTestShown(t *testing.T) {
	stream := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestOK"}`,
		`{"Action":"output","Package":"p","Test":"TestOK","Output":"=== RUN   TestOK\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestOK","Elapsed":0.1}`,
		`{"Action":"run","Package":"p","Test":"TestHang"}`,
		`{"Action":"output","Package":"p","Test":"TestHang","Output":"    hang_test.go:12: waiting\n"}`,
		`{"Action":"output","Package":"p","Test":"TestHang","Output":"panic: test timed out after 40m0s\n"}`,
		`{"Action":"output","Package":"p","Output":"FAIL\tp\t2400.0s\n"}`,
		`{"Action":"fail","Package":"p","Elapsed":2400}`,
	}, "\n")
	var out bytes.Buffer
	if rc := run(strings.NewReader(stream), &out); rc != 1 {
		t.Errorf("exit status %d, want 1", rc)
	}
	got := out.String()
	for _, want := range []string{"--- UNFINISHED p TestHang", "panic: test timed out after 40m0s", "hang_test.go:12: waiting", "FAIL p 2400.0s", "1 passed, 0 failed"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "UNFINISHED p TestOK") {
		t.Errorf("a passed test reported unfinished:\n%s", got)
	}
}
