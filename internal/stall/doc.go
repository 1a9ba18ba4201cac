// Package stall keeps the evidence of a stall. A stage of a request's path
// (the replica runtime's persist, apply, accept round trip, ...) that takes
// longer than a threshold is a stall; the Detector then
//
//   - logs one line with the path, the stage, how long it took and the slot
//     (rate-limited: at most logLinesPerSecMax lines a second without a
//     trace, each with the count of lines suppressed before it);
//   - marks the moment in the Go execution trace (a trace.Log event of
//     category TraceCategory whose message names the stall), so that the
//     stalled window [mark - took, mark] can be found in the trace; at
//     most marksPerSecMax marks a second (an overloaded node stalls
//     every request);
//   - snapshots the runtime/trace FlightRecorder's moving window (the last
//     Config.Window of execution trace) into a file in Config.Dir, named
//     in the log line; at most one snapshot per Config.Every, one at a
//     time, written off the caller's goroutine.
//
// The directory is bounded: it never holds more than Config.FilesMax trace
// files nor more than Config.BytesMax bytes of them (the oldest are removed
// first; a snapshot is cut off at BytesMax/FilesMax bytes and then
// discarded). Read a trace with `go tool trace FILE`, or summarize every
// stall in it with `kvbench stalls FILE...`.
//
// Only one FlightRecorder may run in a process: the detectors of one
// process share it (the first one's window settings win) and it stops when
// the last of them closes.
//
// The hot path is the caller's: it compares a stage's duration with
// Threshold and calls Stalled only past it. Stalled never waits: not on
// I/O, and not on another Stalled call (a stall that finds one being
// recorded is only counted).
package stall
