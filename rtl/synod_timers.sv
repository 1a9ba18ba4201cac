// synod_timers is the heartbeat and lease engine (accel.state.tick,
// heartbeat, heartbeatAck, resetElection, leaseHolds, dropLease). It holds
// the timer state; the register file (role, ballots, quorum, members) lives
// in the top and is an input here.
//
// Commands are one-cycle pulses, at most one per cycle, each applying one
// plane input; the events they cause are combinational outputs in that same
// cycle (the top latches them), and the state updates on the clock edge:
//   cmd_tick         leader: lease check (gained/lost), then a heartbeat
//                    when now >= next; follower: one election timeout when
//                    now reaches the deadline.
//   cmd_role         the role register changes to new_role: drop the lease,
//                    forget every ack; a new leader heartbeats on the next
//                    tick, a new follower restarts its election timer.
//   cmd_ballot       the leader's ballot changed: drop the lease, forget acks.
//   cmd_member       member entry member_idx was rewritten: forget its ack.
//   cmd_contact      the accept fast path accepted: restart the election timer.
//   cmd_heartbeat    a follower got a heartbeat (checked here).
//   cmd_hb_ack       the leader got a heartbeat ack (checked here).
// The lease holds when the leader plus every other member whose newest acked
// heartbeat was sent less than LeaseTicks-LeaseDriftTicks ago reach quorum.
// All time arithmetic wraps mod 2^64 exactly as the Go uint64 code does.
module synod_timers #(
  parameter int REPLICAS = 5,
  localparam int IDX_W = (REPLICAS > 1) ? $clog2(REPLICAS) : 1,
  localparam int Q_W = $clog2(REPLICAS + 1),
  localparam int T_W = synod_pkg::TIME_W,
  localparam int B_W = synod_pkg::BALLOT_W
) (
  input  logic                clk,
  input  logic                rst,
  // Spec (static after reset).
  input  logic [31:0]         cfg_heartbeat_ticks,
  input  logic [31:0]         cfg_lease_ticks,
  input  logic [31:0]         cfg_lease_drift_ticks,
  input  logic [31:0]         cfg_election_ticks,
  input  logic [31:0]         cfg_election_jitter_ticks,  // 0 or a power of two
  input  logic [31:0]         cfg_seed,
  // Registers.
  input  logic [T_W-1:0]      now,
  input  logic [1:0]          role,
  input  logic [B_W-1:0]      ballot,
  input  logic [B_W-1:0]      promised,
  input  logic [Q_W-1:0]      quorum,
  input  logic [REPLICAS-1:0] member_mask,
  input  logic                self_valid,
  input  logic [IDX_W-1:0]    self_idx,
  // Commands.
  input  logic                cmd_tick,
  input  logic                cmd_role,
  input  logic [1:0]          new_role,
  input  logic                cmd_ballot,
  input  logic                cmd_member,
  input  logic [IDX_W-1:0]    member_idx,
  input  logic                cmd_contact,
  input  logic                cmd_heartbeat,
  input  logic                cmd_hb_ack,
  input  logic [B_W-1:0]      in_ballot,
  input  logic [T_W-1:0]      in_sent_at,
  input  logic                in_member_hit,
  input  logic [IDX_W-1:0]    in_member_idx,
  // Events caused by this cycle's command.
  output logic                ev_lease_gained,
  output logic                ev_lease_lost,
  output logic                ev_heartbeat,      // Value = now
  output logic                ev_election,
  output logic                ev_hb_ack,         // echo the heartbeat
  output logic [7:0]          reason,            // hand-up (heartbeat, hb_ack)
  output logic                lease_valid
);
  localparam logic [31:0] SEED_DEFAULT = 32'h9E3779B9;

  logic [T_W-1:0]      next_hb;
  logic [REPLICAS-1:0] ack_seen;
  logic [T_W-1:0]      last_ack [0:REPLICAS-1];
  logic [T_W-1:0]      deadline;
  logic                fired;
  logic [31:0]         lfsr;

  // Marsaglia xorshift32 (13, 17, 5), one step.
  logic [31:0] x1, x2, x3;
  always_comb begin
    x1 = lfsr ^ (lfsr << 13);
    x2 = x1 ^ (x1 >> 17);
    x3 = x2 ^ (x2 << 5);
  end
  logic           jitter_on;
  logic [31:0]    jitter_mask, jitter;
  logic [T_W-1:0] reset_deadline;
  assign jitter_on   = (cfg_election_jitter_ticks != 32'd0);
  assign jitter_mask = cfg_election_jitter_ticks - 32'd1;
  assign jitter      = jitter_on ? (x3 & jitter_mask) : 32'd0;
  assign reset_deadline = now + T_W'(cfg_election_ticks) + T_W'(jitter);

  // Lease: count the leader and every fresh other member.
  logic [31:0]    span32;
  logic [T_W-1:0] span;
  logic [Q_W:0]   fresh;
  assign span32 = cfg_lease_ticks - cfg_lease_drift_ticks;
  logic           lease_holds;
  always_comb begin
    span  = T_W'(span32);
    fresh = (Q_W + 1)'(1);
    for (int i = 0; i < REPLICAS; i++) begin
      if (IDX_W'(i) != self_idx && member_mask[i] && ack_seen[i] && (last_ack[i] + span > now))
        fresh = fresh + 1'b1;
    end
    lease_holds = self_valid && (fresh >= {1'b0, quorum});
  end

  logic is_leader, is_follower;
  assign is_leader   = (role == synod_pkg::ROLE_LEADER);
  assign is_follower = (role == synod_pkg::ROLE_FOLLOWER);

  // Events and checks.
  always_comb begin
    ev_lease_gained = 1'b0;
    ev_lease_lost   = 1'b0;
    ev_heartbeat    = 1'b0;
    ev_election     = 1'b0;
    ev_hb_ack       = 1'b0;
    reason          = synod_pkg::R_NONE;
    if (cmd_tick) begin
      if (is_leader) begin
        ev_lease_gained = lease_holds && !lease_valid;
        ev_lease_lost   = !lease_holds && lease_valid;
        ev_heartbeat    = (now >= next_hb);
      end else if (is_follower) begin
        ev_election = !fired && (now >= deadline);
      end
    end
    if (cmd_role || cmd_ballot) ev_lease_lost = lease_valid;
    if (cmd_heartbeat) begin
      if (!is_follower)             reason = synod_pkg::R_ROLE;
      else if (in_ballot < promised)  reason = synod_pkg::R_STALE;
      else if (in_ballot != promised) reason = synod_pkg::R_HIGHER;
      else if (!in_member_hit)        reason = synod_pkg::R_MEMBER;
      else                            ev_hb_ack = 1'b1;
    end
    if (cmd_hb_ack) begin
      if (!is_leader)               reason = synod_pkg::R_ROLE;
      else if (in_ballot != ballot)   reason = synod_pkg::R_BALLOT;
      else if (in_sent_at > now)      reason = synod_pkg::R_FUTURE;
      else if (!in_member_hit)        reason = synod_pkg::R_MEMBER;
    end
  end

  logic reset_election;
  assign reset_election = (cmd_role && new_role == synod_pkg::ROLE_FOLLOWER)
                        || cmd_contact || ev_hb_ack;

  always_ff @(posedge clk) begin
    if (rst) begin
      next_hb     <= '0;
      ack_seen    <= '0;
      for (int i = 0; i < REPLICAS; i++) last_ack[i] <= '0;
      lease_valid <= 1'b0;
      deadline    <= '0;
      fired       <= 1'b0;
      lfsr        <= (cfg_seed == 32'd0) ? SEED_DEFAULT : cfg_seed;
    end else begin
      if (ev_lease_gained) lease_valid <= 1'b1;
      if (ev_lease_lost)   lease_valid <= 1'b0;
      if (ev_heartbeat)    next_hb <= now + T_W'(cfg_heartbeat_ticks);
      if (ev_election)     fired <= 1'b1;
      if (cmd_role || cmd_ballot) ack_seen <= '0;
      if (cmd_role && new_role == synod_pkg::ROLE_LEADER) next_hb <= now;
      if (cmd_member) ack_seen[member_idx] <= 1'b0;
      if (reset_election) begin
        deadline <= reset_deadline;
        fired    <= 1'b0;
        if (jitter_on) lfsr <= x3;
      end
      if (cmd_hb_ack && reason == synod_pkg::R_NONE) begin
        if (!ack_seen[in_member_idx] || in_sent_at > last_ack[in_member_idx])
          last_ack[in_member_idx] <= in_sent_at;
        ack_seen[in_member_idx] <= 1'b1;
      end
    end
  end
endmodule
