// synod_accel_top is the accel plane: the register file software writes
// (role, ballot, promised ballot, quorum, member table, self index, window
// base, tenant table) and the four engines, driven by one stream of input
// events and producing one stream of output events. It is the RTL twin of
// accel.state.apply: for every input it emits exactly the outputs the Go
// model emits, in the same order, with the same fields.
//
// Interface. An input event is taken on in_valid && in_ready; its outputs
// follow on out_valid (held until out_ready), and in_ready rises again once
// the last of them has gone, so an input's outputs are exactly those seen
// between its acceptance and the next in_ready. Every output carries Now =
// the plane clock after its input (the largest in_now seen). After reset the
// slot and tenant tables are cleared (in_ready low for WINDOW_SLOTS cycles).
//
// Parameters size the fixed state and must equal the accel.Spec the trace or
// the software was built for: WINDOW_SLOTS (power of two), REPLICAS,
// TENANTS. The Spec's periods, initial quorum and jitter seed are the cfg_*
// ports, sampled at reset.
//
// Latency: 4 cycles for a register write or a timer tick, plus one per
// output; 5 for Arm/Accepted; 5 for a tenant write or an admitted frame,
// about 70 for a refused frame (the retry-after divisions).
module synod_accel_top #(
  parameter int WINDOW_SLOTS = 4096,
  parameter int REPLICAS = 5,
  parameter int TENANTS = 32,
  parameter bit PLANT_QUORUM_OFF_BY_ONE = 1'b0,  // co-simulation self-test only
  localparam int IDX_W = (REPLICAS > 1) ? $clog2(REPLICAS) : 1,
  localparam int Q_W = $clog2(REPLICAS + 1),
  localparam int S_W = synod_pkg::SLOT_W,
  localparam int B_W = synod_pkg::BALLOT_W,
  localparam int N_W = synod_pkg::NODE_W,
  localparam int T_W = synod_pkg::TIME_W
) (
  input  logic          clk,
  input  logic          rst,
  // Spec.
  input  logic [31:0]   cfg_quorum,
  input  logic [31:0]   cfg_heartbeat_ticks,
  input  logic [31:0]   cfg_lease_ticks,
  input  logic [31:0]   cfg_lease_drift_ticks,
  input  logic [31:0]   cfg_election_ticks,
  input  logic [31:0]   cfg_election_jitter_ticks,
  input  logic [31:0]   cfg_seed,
  // Input events (fields as in accel.Event).
  input  logic          in_valid,
  output logic          in_ready,
  input  logic [7:0]    in_kind,
  input  logic [7:0]    in_flags,
  input  logic [15:0]   in_index,
  input  logic [31:0]   in_len,
  input  logic [T_W-1:0] in_now,
  input  logic [S_W-1:0] in_slot,
  input  logic [B_W-1:0] in_ballot,   // {Round, Node}
  input  logic [N_W-1:0] in_node,
  input  logic [63:0]   in_value,
  input  logic [63:0]   in_value2,
  // Output events.
  output logic          out_valid,
  input  logic          out_ready,
  output logic [7:0]    out_kind,
  output logic [7:0]    out_flags,
  output logic [15:0]   out_index,
  output logic [31:0]   out_len,
  output logic [T_W-1:0] out_now,
  output logic [S_W-1:0] out_slot,
  output logic [B_W-1:0] out_ballot,
  output logic [N_W-1:0] out_node,
  output logic [63:0]   out_value,
  // Status for software.
  output logic          lease_valid
);
  // ---------------------------------------------------------------- registers
  logic [1:0]     role;
  logic [B_W-1:0] ballot, promised;
  logic [Q_W-1:0] quorum;
  logic [IDX_W-1:0] self_idx;
  logic           self_valid;
  logic [S_W-1:0] base;
  logic [T_W-1:0] now_q;

  // The input being executed.
  logic [7:0]     c_kind, c_flags;
  logic [15:0]    c_index;
  logic [31:0]    c_len;
  logic [S_W-1:0] c_slot;
  logic [B_W-1:0] c_ballot;
  logic [N_W-1:0] c_node;
  logic [63:0]    c_value, c_value2;

  typedef enum logic [2:0] {S_IDLE, S_EXEC, S_WAIT_AGG, S_WAIT_SHP, S_EMIT} state_t;
  state_t state;

  // ---------------------------------------------------------------- decode
  logic k_tick, k_role, k_ballot, k_promised, k_quorum, k_member, k_self, k_base;
  logic k_t_ops, k_t_bytes, k_arm, k_accepted, k_accept, k_hb, k_hb_ack, k_admit;
  always_comb begin
    k_tick     = c_kind == synod_pkg::K_TICK;
    k_role     = c_kind == synod_pkg::K_SET_ROLE;
    k_ballot   = c_kind == synod_pkg::K_SET_BALLOT;
    k_promised = c_kind == synod_pkg::K_SET_PROMISED;
    k_quorum   = c_kind == synod_pkg::K_SET_QUORUM;
    k_member   = c_kind == synod_pkg::K_SET_MEMBER;
    k_self     = c_kind == synod_pkg::K_SET_SELF;
    k_base     = c_kind == synod_pkg::K_SET_BASE;
    k_t_ops    = c_kind == synod_pkg::K_SET_T_OPS;
    k_t_bytes  = c_kind == synod_pkg::K_SET_T_BYTES;
    k_arm      = c_kind == synod_pkg::K_ARM;
    k_accepted = c_kind == synod_pkg::K_ACCEPTED;
    k_accept   = c_kind == synod_pkg::K_ACCEPT;
    k_hb       = c_kind == synod_pkg::K_HEARTBEAT;
    k_hb_ack   = c_kind == synod_pkg::K_HEARTBEAT_ACK;
    k_admit    = c_kind == synod_pkg::K_ADMIT;
  end
  logic exec;
  assign exec = (state == S_EXEC);

  logic idx_ok, quorum_ok, role_ok, role_change, ballot_change;
  always_comb begin
    idx_ok        = {16'd0, c_index} < 32'(REPLICAS);
    quorum_ok     = c_len >= 32'd1 && c_len <= 32'(REPLICAS);
    role_ok       = c_flags <= 8'(synod_pkg::ROLE_LEADER);
    role_change   = role_ok && c_flags[1:0] != role;
    ballot_change = c_ballot != ballot;
  end

  // ---------------------------------------------------------------- members
  logic             m_hit;
  logic [IDX_W-1:0] m_idx;
  logic [REPLICAS-1:0] m_mask;
  synod_members #(.REPLICAS(REPLICAS)) u_members (
    .clk, .rst,
    .wr_en(exec && k_member && idx_ok), .wr_idx(c_index[IDX_W-1:0]), .wr_node(c_node),
    .look_node(c_node), .look_hit(m_hit), .look_idx(m_idx), .mask(m_mask));

  // ---------------------------------------------------------------- accept path
  logic       acc_ok, acc_raise;
  logic [7:0] acc_reason;
  synod_accept_check #(.WINDOW_SLOTS(WINDOW_SLOTS)) u_accept (
    .role, .promised, .base, .slot(c_slot), .ballot(c_ballot),
    .wal_failed(c_flags[synod_pkg::FLAG_WAL_FAILED_BIT]),
    .ok(acc_ok), .reason(acc_reason), .raise_promised(acc_raise));

  // ---------------------------------------------------------------- aggregator
  logic           agg_ready, agg_rsp_valid, agg_commit;
  logic [7:0]     agg_reason;
  logic [S_W-1:0] agg_slot;
  logic [B_W-1:0] agg_ballot;
  synod_quorum_agg #(.WINDOW_SLOTS(WINDOW_SLOTS), .REPLICAS(REPLICAS),
                     .PLANT_QUORUM_OFF_BY_ONE(PLANT_QUORUM_OFF_BY_ONE)) u_agg (
    .clk, .rst, .ready(agg_ready),
    .req_valid(exec && (k_arm || k_accepted)), .req_arm(k_arm),
    .req_slot(c_slot), .req_ballot(c_ballot), .req_member_hit(m_hit), .req_member_idx(m_idx),
    .is_leader(role == synod_pkg::ROLE_LEADER), .cur_ballot(ballot), .self_valid, .self_idx, .base, .quorum,
    .member_mask(m_mask),
    .rsp_valid(agg_rsp_valid), .rsp_reason(agg_reason), .rsp_commit(agg_commit),
    .rsp_slot(agg_slot), .rsp_ballot(agg_ballot));

  // ---------------------------------------------------------------- timers
  logic       ev_gained, ev_lost, ev_hb, ev_election, ev_hb_ack;
  logic [7:0] tm_reason;
  synod_timers #(.REPLICAS(REPLICAS)) u_timers (
    .clk, .rst,
    .cfg_heartbeat_ticks, .cfg_lease_ticks, .cfg_lease_drift_ticks, .cfg_election_ticks,
    .cfg_election_jitter_ticks, .cfg_seed,
    .now(now_q), .role, .ballot, .promised, .quorum, .member_mask(m_mask), .self_valid, .self_idx,
    .cmd_tick(exec && k_tick),
    .cmd_role(exec && k_role && role_change), .new_role(c_flags[1:0]),
    .cmd_ballot(exec && k_ballot && ballot_change),
    .cmd_member(exec && k_member && idx_ok), .member_idx(c_index[IDX_W-1:0]),
    .cmd_contact(exec && k_accept && acc_ok),
    .cmd_heartbeat(exec && k_hb), .cmd_hb_ack(exec && k_hb_ack),
    .in_ballot(c_ballot), .in_sent_at(c_value), .in_member_hit(m_hit), .in_member_idx(m_idx),
    .ev_lease_gained(ev_gained), .ev_lease_lost(ev_lost), .ev_heartbeat(ev_hb),
    .ev_election, .ev_hb_ack, .reason(tm_reason), .lease_valid);

  // ---------------------------------------------------------------- shaper
  logic        shp_ready, shp_rsp_valid, shp_admit;
  logic [7:0]  shp_reason;
  logic [63:0] shp_wait;
  logic [1:0]  shp_op;
  assign shp_op = k_admit ? 2'd2 : (k_t_bytes ? 2'd1 : 2'd0);
  synod_shaper #(.TENANTS(TENANTS)) u_shaper (
    .clk, .rst, .ready(shp_ready),
    .req_valid(exec && (k_t_ops || k_t_bytes || k_admit)), .req_op(shp_op),
    .req_index(c_index), .req_value(c_value), .req_value2(c_value2), .req_len(c_len), .now(now_q),
    .rsp_valid(shp_rsp_valid), .rsp_reason(shp_reason), .rsp_admit(shp_admit), .rsp_wait(shp_wait));

  // ---------------------------------------------------------------- outputs
  // At most two outputs per input (lease + heartbeat on a tick, Accepted +
  // mirror on an accept). They are buffered as 4-bit codes, not as events:
  // every field an output carries is held stable until the next input (the
  // input's own fields, the registers, the plane clock, the shaper's
  // answer), so the fields are selected when the output is emitted. Note
  // the ballot register is already written when a SetBallot's LeaseLost
  // goes out, which is what the model emits (it writes the ballot first).
  localparam logic [3:0] C_LEASE_GAINED = 4'd0, C_LEASE_LOST = 4'd1, C_HEARTBEAT = 4'd2,
                         C_ELECTION = 4'd3, C_HANDUP = 4'd4, C_SEND_ACCEPTED = 4'd5,
                         C_MIRROR = 4'd6, C_HB_ACK = 4'd7, C_COMMIT = 4'd8, C_ADMIT = 4'd9;

  // The codes of the input being executed, decided in S_EXEC (register
  // writes, checks, timers) or when an engine answers (S_WAIT_*).
  logic [3:0] nx_code0, nx_code1;
  logic [1:0] nx_count;
  logic [7:0] nx_reason;
  always_comb begin
    nx_code0  = C_HANDUP;
    nx_code1  = C_HANDUP;
    nx_count  = 2'd0;
    nx_reason = synod_pkg::R_NONE;
    if (state == S_EXEC) begin
      if (k_tick) begin
        // The lease event precedes the heartbeat; a follower only times out.
        if (ev_gained || ev_lost) begin
          nx_code0 = ev_gained ? C_LEASE_GAINED : C_LEASE_LOST;
          nx_code1 = C_HEARTBEAT;
          nx_count = ev_hb ? 2'd2 : 2'd1;
        end else if (ev_hb) begin
          nx_code0 = C_HEARTBEAT;
          nx_count = 2'd1;
        end else if (ev_election) begin
          nx_code0 = C_ELECTION;
          nx_count = 2'd1;
        end
      end else if (k_role) begin
        if (!role_ok) nx_reason = synod_pkg::R_ROLE;
        else if (ev_lost) begin nx_code0 = C_LEASE_LOST; nx_count = 2'd1; end
      end else if (k_ballot) begin
        if (ev_lost) begin nx_code0 = C_LEASE_LOST; nx_count = 2'd1; end
      end else if (k_quorum) begin
        if (!quorum_ok) nx_reason = synod_pkg::R_BAD_QUORUM;
      end else if (k_member || k_self) begin
        if (!idx_ok) nx_reason = synod_pkg::R_BAD_INDEX;
      end else if (k_accept) begin
        if (acc_ok) begin
          nx_code0 = C_SEND_ACCEPTED;
          nx_code1 = C_MIRROR;
          nx_count = 2'd2;
        end else nx_reason = acc_reason;
      end else if (k_hb) begin
        if (ev_hb_ack) begin nx_code0 = C_HB_ACK; nx_count = 2'd1; end
        else nx_reason = tm_reason;
      end else if (k_hb_ack) begin
        nx_reason = tm_reason;
      end else if (!(k_promised || k_base || k_t_ops || k_t_bytes || k_admit || k_arm || k_accepted)) begin
        nx_reason = synod_pkg::R_UNKNOWN;
      end
    end else if (state == S_WAIT_AGG) begin
      nx_reason = agg_reason;
      if (agg_reason == synod_pkg::R_NONE && agg_commit) begin nx_code0 = C_COMMIT; nx_count = 2'd1; end
    end else if (state == S_WAIT_SHP) begin
      nx_reason = shp_reason;
      if (shp_reason == synod_pkg::R_NONE && k_admit) begin nx_code0 = C_ADMIT; nx_count = 2'd1; end
    end
    // A hand-up is the input's only output.
    if (nx_reason != synod_pkg::R_NONE) begin
      nx_code0 = C_HANDUP;
      nx_count = 2'd1;
    end
  end

  logic [3:0] o_code0, o_code1, o_code;
  logic [7:0] o_reason;
  logic [1:0] o_count, o_next;
  assign in_ready  = (state == S_IDLE) && agg_ready && shp_ready;
  assign out_valid = (state == S_EMIT) && (o_next != o_count);
  assign o_code    = o_next[0] ? o_code1 : o_code0;
  assign out_now   = now_q;

  // Field selection by code (accel/event.go lists what each kind carries;
  // unused fields are zero).
  always_comb begin
    out_kind   = synod_pkg::K_OUT_HANDUP;
    out_flags  = 8'd0;
    out_index  = 16'd0;
    out_len    = 32'd0;
    out_slot   = '0;
    out_ballot = '0;
    out_node   = '0;
    out_value  = 64'd0;
    case (o_code)
      C_LEASE_GAINED: begin out_kind = synod_pkg::K_OUT_LEASE_GAINED; out_ballot = ballot; end
      C_LEASE_LOST:   begin out_kind = synod_pkg::K_OUT_LEASE_LOST; out_ballot = ballot; end
      C_HEARTBEAT:    begin out_kind = synod_pkg::K_OUT_HEARTBEAT; out_ballot = ballot; out_value = now_q; end
      C_ELECTION:     begin out_kind = synod_pkg::K_OUT_ELECTION; out_ballot = promised; end
      C_HANDUP: begin
        // A hand-up echoes the input: reason, index, kind, slot, ballot, node.
        out_kind = synod_pkg::K_OUT_HANDUP; out_flags = o_reason; out_index = c_index;
        out_len = {24'd0, c_kind}; out_slot = c_slot; out_ballot = c_ballot; out_node = c_node;
      end
      C_SEND_ACCEPTED: begin
        out_kind = synod_pkg::K_OUT_SEND_ACCEPTED; out_slot = c_slot; out_ballot = c_ballot; out_node = c_node;
      end
      C_MIRROR: begin
        out_kind = synod_pkg::K_OUT_MIRROR; out_len = c_len; out_slot = c_slot; out_ballot = c_ballot;
        out_node = c_node;
      end
      C_HB_ACK: begin
        out_kind = synod_pkg::K_OUT_HEARTBEAT_ACK; out_ballot = c_ballot; out_node = c_node; out_value = c_value;
      end
      C_COMMIT: begin out_kind = synod_pkg::K_OUT_COMMIT; out_slot = agg_slot; out_ballot = agg_ballot; end
      C_ADMIT: begin
        out_kind = synod_pkg::K_OUT_ADMIT; out_flags = {7'd0, shp_admit}; out_index = c_index; out_len = c_len;
        out_value = shp_wait;
      end
      default: ;
    endcase
  end

  always_ff @(posedge clk) begin
    if (rst) begin
      state      <= S_IDLE;
      role       <= synod_pkg::ROLE_OFF;
      ballot     <= '0;
      promised   <= '0;
      quorum     <= cfg_quorum[Q_W-1:0];
      self_idx   <= '0;
      self_valid <= 1'b0;
      base       <= '0;
      now_q      <= '0;
      o_count    <= '0;
      o_next     <= '0;
    end else begin
      case (state)
        S_IDLE: if (in_valid && in_ready) begin
          c_kind   <= in_kind;
          c_flags  <= in_flags;
          c_index  <= in_index;
          c_len    <= in_len;
          c_slot   <= in_slot;
          c_ballot <= in_ballot;
          c_node   <= in_node;
          c_value  <= in_value;
          c_value2 <= in_value2;
          if (in_now > now_q) now_q <= in_now;
          state    <= S_EXEC;
        end
        S_EXEC: begin
          o_code0  <= nx_code0;
          o_code1  <= nx_code1;
          o_reason <= nx_reason;
          o_count  <= nx_count;
          o_next  <= '0;
          state   <= S_EMIT;
          if (k_role && role_change) role <= c_flags[1:0];
          if (k_ballot && ballot_change) ballot <= c_ballot;
          if (k_promised) promised <= c_ballot;
          if (k_quorum && quorum_ok) quorum <= c_len[Q_W-1:0];
          if (k_self && idx_ok) begin
            self_idx   <= c_index[IDX_W-1:0];
            self_valid <= 1'b1;
          end
          if (k_base) base <= c_slot;
          if (k_accept && acc_ok && acc_raise) promised <= c_ballot;
          if (k_t_ops || k_t_bytes || k_admit) state <= S_WAIT_SHP;
          if (k_arm || k_accepted) state <= S_WAIT_AGG;
        end
        S_WAIT_AGG: if (agg_rsp_valid) begin
          o_code0  <= nx_code0;
          o_reason <= nx_reason;
          o_count  <= nx_count;
          o_next  <= '0;
          state   <= S_EMIT;
        end
        S_WAIT_SHP: if (shp_rsp_valid) begin
          o_code0  <= nx_code0;
          o_reason <= nx_reason;
          o_count  <= nx_count;
          o_next  <= '0;
          state   <= S_EMIT;
        end
        S_EMIT: begin
          if (o_next == o_count) state <= S_IDLE;
          else if (out_ready) o_next <= o_next + 1'b1;
        end
        default: state <= S_IDLE;
      endcase
    end
  end
  logic unused_cfg;
  assign unused_cfg = ^cfg_quorum[31:Q_W];
endmodule
