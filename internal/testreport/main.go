// Command testreport condenses `go test -json` output for CI logs.
//
// It prints, as they arrive: every summary line a test prints (lines of the
// form "name: key=value ...", e.g. "paxossim: seeds=2000 ... violations=0"),
// each package's ok/FAIL/skip line, every skipped test with its reason, and
// the full output of every failed test. It exits non-zero when any test or
// package failed, or when the stream held no test at all.
//
// Usage: go test -json ./... | go run ./internal/testreport
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
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

func main() {
	outputs := map[string][]string{} // package/test -> output lines
	var passed, failed, skipped, failedPkgs int
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		var e event
		if err := json.Unmarshal(in.Bytes(), &e); err != nil {
			fmt.Println(in.Text()) // build errors and other non-JSON lines
			continue
		}
		key := e.Package + "/" + e.Test
		switch e.Action {
		case "build-output":
			fmt.Print(e.Output)
		case "build-fail":
			failedPkgs++
		case "output":
			line := strings.TrimRight(e.Output, "\n")
			if summaryLine.MatchString(strings.TrimSpace(line)) {
				fmt.Println(strings.TrimSpace(line))
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
				fmt.Printf("ok   %s %.1fs\n", e.Package, e.Elapsed)
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
				fmt.Printf("skip %s %s: %s\n", e.Package, e.Test, reason)
			} else {
				fmt.Printf("?    %s [no test files]\n", e.Package)
			}
			delete(outputs, key)
		case "fail":
			if e.Test != "" {
				failed++
				fmt.Printf("\n--- FAIL %s %s\n%s\n", e.Package, e.Test, strings.Join(outputs[key], "\n"))
			} else {
				failedPkgs++
				fmt.Printf("FAIL %s %.1fs\n", e.Package, e.Elapsed)
				if len(outputs[key]) > 0 {
					fmt.Println(strings.Join(outputs[key], "\n"))
				}
			}
			delete(outputs, key)
		}
	}
	fmt.Printf("\n%d passed, %d failed, %d skipped\n", passed, failed, skipped)
	if failed > 0 || failedPkgs > 0 || passed == 0 {
		os.Exit(1)
	}
}
