// Self-checking testbench for synod_quorum_agg, run for REPLICAS=3 and 5
// (iverilog -P tb_quorum_agg.REPLICAS=N): quorum, duplicates, stale
// ballots, unarmed slots, window edges (above, below, below with a live
// tag, aliases), members, role, re-arming, the member mask, the quorum
// register. A 16-slot window keeps the edges close.
`timescale 1ns/1ps
module tb_quorum_agg;
  parameter int REPLICAS = 5;
  parameter bit PLANT = 1'b0;  // 1: the DUT commits one ack early; this bench must then fail
  localparam int W = 16;
  localparam int IDX_W = (REPLICAS > 1) ? $clog2(REPLICAS) : 1;
  localparam int Q_W = $clog2(REPLICAS + 1);
  `include "tb_util.svh"

  logic clk = 0, rst = 1;
  always #5 clk = ~clk;

  logic ready, req_valid = 0, req_arm = 0, hit = 1, is_leader = 1, self_valid = 1;
  logic [63:0] slot = 0, base = 100;
  logic [127:0] ballot = 0;
  // The ballot register: the request's ballot unless use_cur overrides it.
  logic use_cur = 0;
  logic [127:0] cur = 0;
  logic [IDX_W-1:0] midx = 0, self_idx = 0;
  logic [Q_W-1:0] quorum;
  logic [REPLICAS-1:0] mask = '1;
  logic rsp_valid, rsp_commit;
  logic [7:0] rsp_reason;
  logic [63:0] rsp_slot;
  logic [127:0] rsp_ballot;

  synod_quorum_agg #(.WINDOW_SLOTS(W), .REPLICAS(REPLICAS), .PLANT_QUORUM_OFF_BY_ONE(PLANT)) dut (
    .clk, .rst, .ready, .req_valid, .req_arm, .req_slot(slot), .req_ballot(ballot),
    .req_member_hit(hit), .req_member_idx(midx), .is_leader, .cur_ballot(use_cur ? cur : ballot), .self_valid, .self_idx, .base,
    .quorum, .member_mask(mask), .rsp_valid, .rsp_reason, .rsp_commit, .rsp_slot, .rsp_ballot);

  localparam logic [127:0] B0 = {64'd1, 64'd1};
  localparam logic [127:0] B1 = {64'd2, 64'd1};
  localparam logic [127:0] B2 = {64'd3, 64'd2};
  int q;

  // op issues one request and checks its response.
  task automatic op(input logic arm, input logic [63:0] s, input logic [127:0] b, input int idx,
      input logic [7:0] want_reason, input logic want_commit, input string what);
    while (!ready) begin @(posedge clk); #1; end
    req_arm = arm; slot = s; ballot = b; midx = IDX_W'(idx);
    req_valid = 1;
    @(posedge clk);
    #1 req_valid = 0;
    // Sample just after each edge, once the clocked updates have settled.
    do begin @(posedge clk); #1; end while (!rsp_valid);
    `CHECK(rsp_reason == want_reason, $sformatf("%s: reason %0d, want %0d", what, rsp_reason, want_reason))
    `CHECK(rsp_commit == want_commit, $sformatf("%s: commit %0d, want %0d", what, rsp_commit, want_commit))
    if (want_commit) begin
      `CHECK(rsp_slot == s && rsp_ballot == b, $sformatf("%s: commit carries slot %0d", what, rsp_slot))
    end
  endtask

  // arm_and_ack arms s with b and acks from members 1..n.
  task automatic arm_and_ack(input logic [63:0] s, input logic [127:0] b, input int n);
    op(1, s, b, 0, 0, q == 1, "arm");
    for (int i = 1; i <= n; i++) op(0, s, b, i, 0, i + 1 == q, $sformatf("ack %0d of slot %0d", i, s));
  endtask

  initial begin
    q = REPLICAS / 2 + 1;
    quorum = Q_W'(q);
    repeat (3) @(posedge clk);
    #1 rst = 0;

    // Quorum: self plus q-1 acks commit, exactly once.
    arm_and_ack(100, B1, q - 1);
    op(0, 100, B1, q - 1, 0, 0, "duplicate ack after commit");
    if (q < REPLICAS) op(0, 100, B1, q, 0, 0, "extra ack after commit");

    // Duplicates before the quorum do not count twice.
    op(1, 101, B1, 0, 0, 0, "arm 101");
    op(0, 101, B1, 1, 0, q == 2, "first ack 101");
    if (q > 2) begin
      op(0, 101, B1, 1, 0, 0, "duplicate ack 101 does not reach quorum");
      op(0, 101, B1, 2, 0, q == 3, "second distinct ack 101");
    end

    // A duplicate Arm keeps the acks already counted.
    op(1, 102, B1, 0, 0, 0, "arm 102");
    for (int i = 1; i <= q - 2; i++) op(0, 102, B1, i, 0, 0, "ack 102");
    op(1, 102, B1, 0, 0, 0, "duplicate arm 102");
    op(0, 102, B1, q - 1, 0, 1, "last ack 102 commits despite the duplicate arm");

    // Stale or different ballot, unarmed slot, unknown sender.
    op(1, 103, B1, 0, 0, 0, "arm 103");
    op(0, 103, B0, 1, synod_pkg::R_BALLOT, 0, "stale ballot");
    op(0, 103, B2, 1, synod_pkg::R_BALLOT, 0, "higher ballot");
    op(0, 104, B1, 1, synod_pkg::R_NOT_ARMED, 0, "unarmed slot");
    hit = 0;
    op(0, 103, B1, 1, synod_pkg::R_MEMBER, 0, "sender not a member");
    hit = 1;

    // Re-arming with a new ballot starts the count again.
    if (q > 2) begin
      op(0, 103, B1, 1, 0, 0, "ack 103 under B1");
      op(1, 103, B2, 0, 0, 0, "re-arm 103 under B2");
      op(0, 103, B2, 2, 0, 0, "one ack under B2 is not a quorum");
      op(0, 103, B1, 3, synod_pkg::R_BALLOT, 0, "B1 ack after re-arm");
    end

    // A row left at an older ballot of ours (armed, then we were
    // re-elected at a newer ballot without re-arming it): a late ack at
    // the row's ballot is handed up, not counted (paxossim seed 564).
    op(1, 112, B1, 0, 0, 0, "arm 112 under B1");
    use_cur = 1; cur = B2;
    op(0, 112, B1, 1, synod_pkg::R_BALLOT, 0, "late B1 ack while leading at B2");
    use_cur = 0;

    // Window: [base, base+W) = [100, 116).
    op(1, 115, B1, 0, 0, 0, "arm at the top edge");
    op(1, 116, B1, 0, synod_pkg::R_WINDOW, 0, "arm just above the window");
    op(1, 99, B1, 0, synod_pkg::R_WINDOW, 0, "arm just below the window");
    op(0, 116, B1, 1, synod_pkg::R_WINDOW, 0, "ack just above the window");
    op(0, 99, B1, 1, synod_pkg::R_WINDOW, 0, "ack below the window, row not holding it");
    op(0, 100 + W, B1, 1, synod_pkg::R_WINDOW, 0, "ack for an alias of slot 100");
    base = 101;  // slot 100 is below the base now but its row still holds it
    op(0, 100, B1, q, 0, 0, "late ack below base with a live tag is counted, no commit");
    base = 64'hFFFF_FFFF_FFFF_FFF8;  // base+W wraps past 2^64
    op(1, 64'hFFFF_FFFF_FFFF_FFFF, B1, 0, 0, 0, "arm at 2^64-1 inside a wrapping window");
    op(0, 64'hFFFF_FFFF_FFFF_FFFF, B1, 1, synod_pkg::R_WINDOW, 0,
       "ack at 2^64-1: slot >= base+W (mod 2^64), as the model computes it");
    base = 100;

    // The member mask: acks from removed members do not count.
    mask = '1;
    mask[1] = 1'b0;
    op(1, 105, B1, 0, 0, 0, "arm 105");
    op(0, 105, B1, 1, 0, 0, "ack from a removed member");
    for (int i = 2; i <= q - 1; i++) op(0, 105, B1, i, 0, 0, "ack 105");
    op(0, 105, B1, q, 0, 1, "quorum among present members");
    mask = '1;

    // Role and self.
    is_leader = 0;
    op(1, 106, B1, 0, synod_pkg::R_ROLE, 0, "arm as a follower");
    op(0, 105, B1, 1, synod_pkg::R_ROLE, 0, "ack as a follower");
    is_leader = 1;
    self_valid = 0;
    op(1, 106, B1, 0, synod_pkg::R_MEMBER, 0, "arm without self");
    self_valid = 1;

    // Quorum register 1: an Arm commits at once.
    quorum = 1;
    op(1, 107, B1, 0, 0, 1, "quorum 1 commits on arm");
    op(0, 107, B1, 1, 0, 0, "and only once");
    quorum = Q_W'(q);

    `FINISH($sformatf("tb_quorum_agg(R=%0d,quorum=%0d)", REPLICAS, q))
  end
endmodule
