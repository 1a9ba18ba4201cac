// Package rtl holds the accel plane in synthesizable SystemVerilog (the
// *.sv files beside this one; see README.md) and the Go tests that hold it
// to the Go model in synod/accel: Icarus testbenches per module, Verilator
// lint, a Verilator co-simulation that replays traces recorded from the
// model and compares every output event, and a Yosys resource check.
//
// The package has no Go API: everything here is tests and their helpers.
package rtl
