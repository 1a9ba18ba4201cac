// Command testreport condenses `go test -json` output for CI logs.
//
// It prints, as they arrive: every summary line a test prints (lines of the
// form "name: key=value ...", e.g. "paxossim: seeds=2000 ... violations=0"),
// each package's ok/FAIL/skip line, every skipped test with its reason, and
// the full output of every failed test, and of every test a failed package
// left unfinished (a panic or the -timeout alarm: its dump is there). It exits non-zero when any test or
// package failed, or when the stream held no test at all.
//
// Usage: go test -json ./... | go run ./internal/testreport
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

// summaryLine matches the one-line results the issues ask tests to print:
// "name: key=value ...", allowing a few words before the first key
// ("accel: sim seeds=500 ...", "accel: planted quorum-1 (synthetic): commits=...").
var summaryLine = regexp.MustCompile(`^[a-z][a-z0-9 _-]*: (\S+ ){0,3}[a-z_]+=\S+`)

// outputLinesMax bounds what is kept per test so a runaway test cannot
// exhaust memory; the tail is what matters for a failure.
const outputLinesMax = 400

func main() { os.Exit(run(os.Stdin, os.Stdout)) }

// run condenses the stream r into w and returns the exit status.
func run(r io.Reader, w io.Writer) int {
	outputs := map[string][]string{} // package/test -> output lines
	var passed, failed, skipped, failedPkgs int
	in := bufio.NewScanner(r)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		var e event
		if err := json.Unmarshal(in.Bytes(), &e); err != nil {
			fmt.Fprintln(w, in.Text()) // build errors and other non-JSON lines
			continue
		}
		key := e.Package + "/" + e.Test
		switch e.Action {
		case "build-output":
			fmt.Fprint(w, e.Output)
		case "build-fail":
			failedPkgs++
		case "output":
			line := strings.TrimRight(e.Output, "\n")
			if summaryLine.MatchString(strings.TrimSpace(line)) {
				fmt.Fprintln(w, strings.TrimSpace(line))
			}
			o := append(outputs[key], line)
			if len(o) > outputLinesMax {
				o = o[len(o)-outputLinesMax:]
			}
			outputs[key] = o
		case "pass":
			if e.Test != "" {
				passed++
			} else {
				fmt.Fprintf(w, "ok   %s %.1fs\n", e.Package, e.Elapsed)
			}
			delete(outputs, key)
		case "skip":
			if e.Test != "" {
				skipped++
				reason := ""
				for _, l := range outputs[key] {
					if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "=== ") && !strings.HasPrefix(t, "--- ") {
						reason = t
					}
				}
				fmt.Fprintf(w, "skip %s %s: %s\n", e.Package, e.Test, reason)
			} else {
				fmt.Fprintf(w, "?    %s [no test files]\n", e.Package)
			}
			delete(outputs, key)
		case "fail":
			if e.Test != "" {
				failed++
				fmt.Fprintf(w, "\n--- FAIL %s %s\n%s\n", e.Package, e.Test, strings.Join(outputs[key], "\n"))
			} else {
				failedPkgs++
				fmt.Fprintf(w, "FAIL %s %.1fs\n", e.Package, e.Elapsed)
				// A package that failed with tests still running (a panic,
				// the -timeout alarm) never reports them: their output,
				// which holds the panic and the goroutine dump, would be
				// lost with them.
				for _, k := range unfinished(outputs, e.Package) {
					fmt.Fprintf(w, "\n--- UNFINISHED %s %s\n%s\n", e.Package, strings.TrimPrefix(k, e.Package+"/"), strings.Join(outputs[k], "\n"))
					delete(outputs, k)
				}
				if len(outputs[key]) > 0 {
					fmt.Fprintln(w, strings.Join(outputs[key], "\n"))
				}
			}
			delete(outputs, key)
		}
	}
	fmt.Fprintf(w, "\n%d passed, %d failed, %d skipped\n", passed, failed, skipped)
	if failed > 0 || failedPkgs > 0 || passed == 0 {
		return 1
	}
	return 0
}

// unfinished returns, sorted, the keys of pkg's tests that produced output
// but neither passed, failed nor skipped.
func unfinished(outputs map[string][]string, pkg string) []string {
	var keys []string
	for k := range outputs {
		if strings.HasPrefix(k, pkg+"/") && k != pkg+"/" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}
