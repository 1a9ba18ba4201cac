// Self-checking testbench for synod_timers (3 replicas, quorum 2): the
// heartbeat period, lease gained from fresh acks and lost at exactly
// LeaseTicks-LeaseDriftTicks after the acked send, newest-ack tracking,
// ballot and role changes dropping the lease, ack checks (role, ballot,
// future, member), the follower's heartbeat checks, the election timeout at
// its deadline (once), restarts on leader contact, and the jitter drawn
// from the xorshift32 generator.
`timescale 1ns/1ps
module tb_timers;
  `include "tb_util.svh"
  localparam int R = 3;
  logic clk = 0, rst = 1;
  always #5 clk = ~clk;

  logic [31:0] jitter_ticks = 0;
  logic [63:0] now = 0;
  logic [1:0] role = synod_pkg::ROLE_OFF, new_role = 0;
  logic [127:0] ballot, promised, in_ballot = 0;
  logic [1:0] quorum = 2;
  logic [R-1:0] mask = '1;
  logic self_valid = 1, hit = 1;
  logic [1:0] self_idx = 0, member_idx = 0, in_idx = 0;
  logic [63:0] sent_at = 0;
  logic c_tick = 0, c_role = 0, c_ballot = 0, c_member = 0, c_contact = 0, c_hb = 0, c_ack = 0;
  logic ev_gained, ev_lost, ev_hb, ev_election, ev_hb_ack, lease_valid;
  logic [7:0] reason;

  localparam logic [127:0] B1 = {64'd1, 64'd1};
  localparam logic [127:0] B2 = {64'd2, 64'd2};
  localparam logic [127:0] B0 = {64'd0, 64'd9};

  synod_timers #(.REPLICAS(R)) dut (
    .clk, .rst, .cfg_heartbeat_ticks(32'd100), .cfg_lease_ticks(32'd1000), .cfg_lease_drift_ticks(32'd100),
    .cfg_election_ticks(32'd500), .cfg_election_jitter_ticks(jitter_ticks), .cfg_seed(32'd1),
    .now, .role, .ballot, .promised, .quorum, .member_mask(mask), .self_valid, .self_idx,
    .cmd_tick(c_tick), .cmd_role(c_role), .new_role, .cmd_ballot(c_ballot), .cmd_member(c_member),
    .member_idx, .cmd_contact(c_contact), .cmd_heartbeat(c_hb), .cmd_hb_ack(c_ack), .in_ballot,
    .in_sent_at(sent_at), .in_member_hit(hit), .in_member_idx(in_idx),
    .ev_lease_gained(ev_gained), .ev_lease_lost(ev_lost), .ev_heartbeat(ev_hb), .ev_election,
    .ev_hb_ack, .reason, .lease_valid);

  // Events seen during the last command.
  logic s_gained, s_lost, s_hb, s_election, s_hb_ack;
  logic [7:0] s_reason;

  // pulse raises one command for one clock at time t, sampling its events.
  localparam int TICK = 0, ROLE = 1, BALLOT = 2, MEMBER = 3, CONTACT = 4, HB = 5, ACK = 6;
  task automatic pulse(input int cmd, input logic [63:0] t);
    @(negedge clk);
    now = t;
    {c_tick, c_role, c_ballot, c_member, c_contact, c_hb, c_ack} = 7'b1000000 >> cmd;
    #1;
    {s_gained, s_lost, s_hb, s_election, s_hb_ack, s_reason} =
      {ev_gained, ev_lost, ev_hb, ev_election, ev_hb_ack, reason};
    @(negedge clk);
    {c_tick, c_role, c_ballot, c_member, c_contact, c_hb, c_ack} = '0;
  endtask
  task automatic tick(input logic [63:0] t);
    pulse(TICK, t);
  endtask
  task automatic set_role(input logic [1:0] r, input logic [63:0] t);
    new_role = r;
    pulse(ROLE, t);
    role = r;
  endtask
  task automatic ack(input logic [127:0] b, input int idx, input logic [63:0] at, input logic [63:0] t);
    in_ballot = b; in_idx = 2'(idx); sent_at = at;
    pulse(ACK, t);
  endtask
  task automatic hb(input logic [127:0] b, input logic [63:0] t);
    in_ballot = b; sent_at = t;
    pulse(HB, t);
  endtask

  function automatic logic [31:0] xorshift(input logic [31:0] x);
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return x;
  endfunction

  initial begin
    ballot = B1; promised = B1;
    repeat (2) @(posedge clk);
    #1 rst = 0;

    // Leader: first heartbeat on the first tick, then every 100 ticks.
    set_role(synod_pkg::ROLE_LEADER, 10);
    `CHECK(!s_lost, "no lease to lose yet")
    tick(10);
    `CHECK(s_hb && !s_gained, "first tick heartbeats; no acks, no lease")
    tick(109);
    `CHECK(!s_hb, "no heartbeat before the period")
    tick(110);
    `CHECK(s_hb, "heartbeat at the period")

    // Acks: checks first.
    ack(B2, 1, 110, 120);
    `CHECK(s_reason == synod_pkg::R_BALLOT, "ack for another ballot")
    ack(B1, 1, 500, 120);
    `CHECK(s_reason == synod_pkg::R_FUTURE, "ack of a heartbeat sent in the future")
    hit = 0;
    ack(B1, 1, 110, 120);
    `CHECK(s_reason == synod_pkg::R_MEMBER, "ack from a non-member")
    hit = 1;
    // Self's own ack never counts; one other member makes quorum 2.
    ack(B1, 0, 110, 120);
    `CHECK(s_reason == synod_pkg::R_NONE, "self ack is accepted")
    tick(121);
    `CHECK(!s_gained, "self ack does not make a lease")
    ack(B1, 1, 110, 125);
    ack(B1, 1, 10, 126);  // older: must not move lastAck back
    tick(130);
    `CHECK(s_gained && !s_lost, "lease gained with one fresh member")
    tick(1009);
    `CHECK(!s_lost, "lease still valid at sentAt + 900 - 1")
    tick(1010);
    `CHECK(s_lost, "lease lost at sentAt + LeaseTicks - LeaseDriftTicks")
    ack(B1, 2, 1000, 1011);
    tick(1012);
    `CHECK(s_gained, "a newer ack regains it")

    // A removed member's ack stops counting.
    member_idx = 2;
    pulse(MEMBER, 1013);
    tick(1014);
    `CHECK(s_lost, "forgetting the only fresh member drops the lease")
    ack(B1, 2, 1000, 1015);
    tick(1016);
    `CHECK(s_gained, "re-acked")

    // A ballot change drops the lease and forgets acks.
    ballot = B2;
    pulse(BALLOT, 1017);
    `CHECK(s_lost, "ballot change drops the lease")
    tick(1018);
    `CHECK(!s_gained, "acks were forgotten")

    // Follower: election timer.
    promised = B1;
    set_role(synod_pkg::ROLE_FOLLOWER, 2000);
    tick(2499);
    `CHECK(!s_election, "no timeout before the deadline")
    tick(2500);
    `CHECK(s_election, "timeout at now + ElectionTicks")
    tick(2600);
    `CHECK(!s_election, "the timeout fires once")
    hb(B0, 2700);
    `CHECK(s_reason == synod_pkg::R_STALE && !s_hb_ack, "stale heartbeat")
    hb(B2, 2700);
    `CHECK(s_reason == synod_pkg::R_HIGHER && !s_hb_ack, "heartbeat above the promise")
    hit = 0;
    hb(B1, 2700);
    `CHECK(s_reason == synod_pkg::R_MEMBER && !s_hb_ack, "heartbeat from a stranger")
    hit = 1;
    hb(B1, 2700);
    `CHECK(s_reason == synod_pkg::R_NONE && s_hb_ack, "heartbeat acked")
    tick(3199);
    `CHECK(!s_election, "heartbeat restarted the timer")
    tick(3200);
    `CHECK(s_election, "timeout 500 after the heartbeat")
    pulse(CONTACT, 3300);
    tick(3799);
    `CHECK(!s_election, "accept contact restarted the timer")
    ack(B1, 1, 10, 3800);
    `CHECK(s_reason == synod_pkg::R_ROLE, "a follower hands acks up")

    // Jitter: deadline = now + 500 + (xorshift(seed) & 63). Seed 1, and the
    // generator has not stepped yet (jitter was 0).
    jitter_ticks = 64;
    pulse(CONTACT, 4000);
    begin
      logic [63:0] d;
      d = 4000 + 500 + 64'(xorshift(32'd1) & 32'd63);
      tick(d - 1);
      `CHECK(!s_election, "no timeout before the jittered deadline")
      tick(d);
      `CHECK(s_election, $sformatf("timeout at the jittered deadline %0d", d))
      pulse(CONTACT, 5000);
      d = 5000 + 500 + 64'(xorshift(xorshift(32'd1)) & 32'd63);
      tick(d - 1);
      `CHECK(!s_election, "second draw: not before")
      tick(d);
      `CHECK(s_election, "second draw: at the deadline")
    end

    // Role off: ticks do nothing; heartbeats are handed up.
    set_role(synod_pkg::ROLE_OFF, 9000);
    tick(99999);
    `CHECK(!s_election && !s_hb, "role off runs no timers")
    hb(B1, 99999);
    `CHECK(s_reason == synod_pkg::R_ROLE, "role off hands heartbeats up")
    `FINISH("tb_timers")
  end
endmodule
