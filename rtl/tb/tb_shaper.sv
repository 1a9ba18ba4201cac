// Self-checking testbench for synod_shaper (4 tenants): burst edges
// (exactly burst frames pass at once, the next waits), refill to the exact
// tick, the cap at the burst after a long idle, retry-after figures
// (ceil((cost - tokens) / rate)) for the ops and the bytes bucket and the
// longer of the two, a frame larger than the burst passing once the bucket
// is full, the default burst of one second, unlimited tenants and indexes
// past the table. Expected figures follow tenants.Bucket by hand.
`timescale 1ns/1ps
module tb_shaper;
  `include "tb_util.svh"
  logic clk = 0, rst = 1;
  always #5 clk = ~clk;

  logic ready, req_valid = 0;
  logic [1:0] op = 0;
  logic [15:0] index = 0;
  logic [63:0] value = 0, value2 = 0, now = 0;
  logic [31:0] len = 0;
  logic rsp_valid, rsp_admit;
  logic [7:0] rsp_reason;
  logic [63:0] rsp_wait;
  synod_shaper #(.TENANTS(4)) dut (.clk, .rst, .ready, .req_valid, .req_op(op), .req_index(index),
    .req_value(value), .req_value2(value2), .req_len(len), .now, .rsp_valid, .rsp_reason,
    .rsp_admit, .rsp_wait);

  task automatic req(input logic [1:0] o, input int t, input logic [63:0] v, input logic [63:0] v2,
      input logic [31:0] l, input logic [63:0] at);
    while (!ready) begin @(posedge clk); #1; end
    #1 op = o; index = 16'(t); value = v; value2 = v2; len = l; now = at; req_valid = 1;
    @(posedge clk);
    #1 req_valid = 0;
    // Sample just after each edge, once the clocked updates have settled.
    do begin @(posedge clk); #1; end while (!rsp_valid);
  endtask
  task automatic set_ops(input int t, input logic [63:0] rate, input logic [63:0] burst, input logic [63:0] at);
    req(0, t, rate, burst, 0, at);
    `CHECK(rsp_reason == synod_pkg::R_NONE, "set ops")
  endtask
  task automatic set_bytes(input int t, input logic [63:0] rate, input logic [63:0] burst, input logic [63:0] at);
    req(1, t, rate, burst, 0, at);
    `CHECK(rsp_reason == synod_pkg::R_NONE, "set bytes")
  endtask
  task automatic admit(input int t, input logic [31:0] bytes, input logic [63:0] at,
      input logic want_ok, input logic [63:0] want_wait, input string what);
    req(2, t, 0, 0, bytes, at);
    `CHECK(rsp_reason == synod_pkg::R_NONE && rsp_admit == want_ok && rsp_wait == want_wait,
           $sformatf("%s: reason %0d admit %0d wait %0d, want admit %0d wait %0d", what, rsp_reason,
                     rsp_admit, rsp_wait, want_ok, want_wait))
  endtask

  initial begin
    repeat (2) @(posedge clk);
    #1 rst = 0;

    // Tenant 0: 10 ops/s, burst 2; bytes unlimited.
    set_ops(0, 10, 2, 0);
    admit(0, 100, 0, 1, 0, "burst frame 1");
    admit(0, 100, 0, 1, 0, "burst frame 2");
    admit(0, 100, 0, 0, 100_000, "past the burst: wait 10^6/10 ticks");
    admit(0, 100, 50_000, 0, 50_000, "half refilled: wait the other half");
    admit(0, 100, 99_999, 0, 1, "one tick short");
    admit(0, 100, 100_000, 1, 0, "refilled to the tick");
    admit(0, 100, 10_000_000, 1, 0, "after a long idle: burst frame 1");
    admit(0, 100, 10_000_000, 1, 0, "burst frame 2");
    admit(0, 100, 10_000_000, 0, 100_000, "idle time does not exceed the burst");
    admit(0, 100, 10_000_001, 0, 99_999, "10 micro-tokens per tick");

    // Tenant 1: ops unlimited; 1000 bytes/s, burst 1500 bytes.
    set_bytes(1, 1000, 1500, 20_000_000);
    admit(1, 1000, 20_000_000, 1, 0, "1000 of 1500 bytes");
    admit(1, 1000, 20_000_000, 0, 500_000, "500 bytes short: wait 500 ms");
    admit(1, 0, 20_000_000, 1, 0, "an empty frame costs nothing");
    set_bytes(1, 1000, 1500, 20_000_001);  // refilled to full
    admit(1, 5000, 20_000_001, 1, 0, "a frame above the burst passes on a full bucket");
    admit(1, 5000, 20_000_001, 0, 1_500_000, "and then waits a whole burst");

    // Tenant 2: both limited; the longer wait wins and nothing is charged.
    set_ops(2, 1, 1, 30_000_000);
    set_bytes(2, 100, 100, 30_000_000);
    admit(2, 100, 30_000_000, 1, 0, "both buckets full");
    admit(2, 50, 30_000_000, 0, 1_000_000, "ops wait 1 s beats bytes wait 0.5 s");
    admit(2, 50, 30_500_000, 0, 500_000, "ops wait 0.5 s, bytes would pass");
    admit(2, 50, 31_000_000, 1, 0, "both refilled: the refused frames were not charged");

    // Default burst: rate 3, burst 0 means one second (3 ops).
    set_ops(3, 3, 0, 40_000_000);
    admit(3, 1, 40_000_000, 1, 0, "default burst 1");
    admit(3, 1, 40_000_000, 1, 0, "default burst 2");
    admit(3, 1, 40_000_000, 1, 0, "default burst 3");
    admit(3, 1, 40_000_000, 0, 333_334, "ceil(10^6 / 3)");
    // Rate 0 makes the tenant unlimited again.
    set_ops(3, 0, 7, 40_000_000);
    admit(3, 1, 40_000_000, 1, 0, "rate 0 is unlimited");
    // A rate past 2^32 is clamped: with a burst of 1 op, the wait after it
    // is ceil(10^6 / 2^32) = 1 either way, but the tokens refill in one tick.
    set_ops(3, 64'h10_0000_0000, 1, 40_000_000);
    admit(3, 1, 40_000_000, 1, 0, "clamped rate, burst 1");
    admit(3, 1, 40_000_000, 0, 1, "one tick to refill");
    admit(3, 1, 40_000_001, 1, 0, "refilled in one tick");

    // Indexes past the table.
    req(2, 4, 0, 0, 10, 50_000_000);
    `CHECK(rsp_reason == synod_pkg::R_TENANT, "admit past the table")
    req(0, 16'hFFFF, 5, 5, 0, 50_000_000);
    `CHECK(rsp_reason == synod_pkg::R_TENANT, "set past the table")
    `FINISH("tb_shaper")
  end
endmodule
