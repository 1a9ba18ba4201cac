// Self-checking testbench for synod_accept_check: role, stale ballots
// (round and node order), the window's edges including one that wraps past
// 2^64, the WAL flag, check order, and raising the promise.
`timescale 1ns/1ps
module tb_accept_check;
  `include "tb_util.svh"
  localparam int W = 4096;

  logic [1:0] role;
  logic [127:0] promised, ballot;
  logic [63:0] base, slot;
  logic wal_failed, ok, raise;
  logic [7:0] reason;
  synod_accept_check #(.WINDOW_SLOTS(W)) dut (.role, .promised, .base, .slot, .ballot, .wal_failed,
    .ok, .reason, .raise_promised(raise));

  task automatic expect_(input logic [7:0] want, input logic want_raise, input string what);
    #1;
    `CHECK(reason == want && ok == (want == synod_pkg::R_NONE),
           $sformatf("%s: reason %0d ok %0d, want %0d", what, reason, ok, want))
    if (want == synod_pkg::R_NONE) begin
      `CHECK(raise == want_raise, $sformatf("%s: raise %0d, want %0d", what, raise, want_raise))
    end
  endtask

  initial begin
    role = synod_pkg::ROLE_FOLLOWER; promised = {64'd5, 64'd2}; base = 1000; wal_failed = 0;
    slot = 1000; ballot = {64'd5, 64'd2};
    expect_(synod_pkg::R_NONE, 0, "equal ballot at the base");
    ballot = {64'd5, 64'd3};
    expect_(synod_pkg::R_NONE, 1, "same round, higher node raises the promise");
    ballot = {64'd6, 64'd0};
    expect_(synod_pkg::R_NONE, 1, "higher round raises the promise");
    ballot = {64'd5, 64'd1};
    expect_(synod_pkg::R_STALE, 0, "same round, lower node is stale");
    ballot = {64'd4, 64'hFFFF_FFFF_FFFF_FFFF};
    expect_(synod_pkg::R_STALE, 0, "lower round is stale whatever the node");
    ballot = {64'd5, 64'd2};
    slot = 1000 + W - 1;
    expect_(synod_pkg::R_NONE, 0, "top slot of the window");
    slot = 1000 + W;
    expect_(synod_pkg::R_WINDOW, 0, "one past the window");
    slot = 999;
    expect_(synod_pkg::R_WINDOW, 0, "one below the base");
    base = 64'hFFFF_FFFF_FFFF_FF00; slot = 64'hFFFF_FFFF_FFFF_FFFF;
    expect_(synod_pkg::R_NONE, 0, "window reaching 2^64-1");
    slot = 5;
    expect_(synod_pkg::R_WINDOW, 0, "no wrap past 2^64 (slot - base >= W)");
    base = 1000; slot = 1001; wal_failed = 1;
    expect_(synod_pkg::R_WAL, 0, "WAL failure hands up");
    ballot = {64'd1, 64'd1};
    expect_(synod_pkg::R_STALE, 0, "stale is reported before the WAL");
    slot = 1; ballot = {64'd9, 64'd9};
    expect_(synod_pkg::R_WINDOW, 0, "window is reported before the WAL");
    wal_failed = 0; slot = 1001;
    role = synod_pkg::ROLE_LEADER;
    expect_(synod_pkg::R_ROLE, 0, "a leader hands accepts up");
    role = synod_pkg::ROLE_OFF;
    expect_(synod_pkg::R_ROLE, 0, "role off hands accepts up");
    `FINISH("tb_accept_check")
  end
endmodule
