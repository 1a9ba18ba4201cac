// synod_quorum_agg is the leader's quorum aggregator (accel.state.arm,
// accel.state.accepted, accel.state.maybeCommit): a table of WINDOW_SLOTS
// rows in block RAM, row = slot mod WINDOW_SLOTS, each {tag, ballot, ack
// mask, valid, committed}.
//
//   Arm(slot, b):      role leader, self set, slot in [base, base+W); a row
//                      already armed for (slot, b) is left alone (its acks
//                      stay counted); otherwise the row becomes {slot, b,
//                      mask = 1<<self}.
//   Accepted(slot, b): role leader; slot below base+W (mod 2^64), and a slot
//                      below base only if its row still holds that tag; the
//                      row armed for slot with ballot b; sender in the
//                      member table; its bit is ORed into the mask.
// Either way, when the row is not committed and popcount(mask & member mask)
// reaches the quorum register, the row is marked committed and one commit
// (tag, ballot) is emitted: exactly one per armed row. A failed check is a
// hand-up with the reason, checked in the Go model's order.
//
// Timing: a request is taken when req_valid && ready; the row is read on
// that edge, checked and written back on the next, and the response is
// valid (one cycle) on the edge after that. One request is in flight at a
// time (ready is low meanwhile), so no read/write forwarding is needed.
// After reset the table is cleared one row per cycle (ready low for
// WINDOW_SLOTS cycles): block RAM has no reset, and the model's table
// starts all zero.
//
// Tags store only the slot bits above the row index: a written row's low
// tag bits always equal its index, so comparing the high bits is exact.
module synod_quorum_agg #(
  parameter int WINDOW_SLOTS = 4096,
  parameter int REPLICAS = 5,
  // PLANT_QUORUM_OFF_BY_ONE=1 commits one ack early. It exists only so the
  // co-simulation can show it catches a divergence; never set it otherwise.
  parameter bit PLANT_QUORUM_OFF_BY_ONE = 1'b0,
  localparam int IB = $clog2(WINDOW_SLOTS),
  localparam int IDX_W = (REPLICAS > 1) ? $clog2(REPLICAS) : 1,
  localparam int Q_W = $clog2(REPLICAS + 1),
  localparam int TAG_W = synod_pkg::SLOT_W - IB
) (
  input  logic                            clk,
  input  logic                            rst,
  output logic                            ready,
  input  logic                            req_valid,
  input  logic                            req_arm,     // 1: Arm, 0: Accepted
  input  logic [synod_pkg::SLOT_W-1:0]    req_slot,
  input  logic [synod_pkg::BALLOT_W-1:0]  req_ballot,
  input  logic                            req_member_hit,
  input  logic [IDX_W-1:0]                req_member_idx,
  // Registers (stable while a request is in flight).
  input  logic                            is_leader,
  input  logic [synod_pkg::BALLOT_W-1:0]  cur_ballot,  // the ballot register (what we lead with)
  input  logic                            self_valid,
  input  logic [IDX_W-1:0]                self_idx,
  input  logic [synod_pkg::SLOT_W-1:0]    base,
  input  logic [Q_W-1:0]                  quorum,
  input  logic [REPLICAS-1:0]             member_mask,
  // Response.
  output logic                            rsp_valid,
  output logic [7:0]                      rsp_reason,  // R_NONE: handled here
  output logic                            rsp_commit,
  output logic [synod_pkg::SLOT_W-1:0]    rsp_slot,
  output logic [synod_pkg::BALLOT_W-1:0]  rsp_ballot
);
  localparam int ROW_W = TAG_W + synod_pkg::BALLOT_W + REPLICAS + 2;
  localparam logic [synod_pkg::SLOT_W-1:0] WINDOW = synod_pkg::SLOT_W'(WINDOW_SLOTS);

  logic [ROW_W-1:0] mem [0:WINDOW_SLOTS-1];

  // Clear sweep after reset.
  logic          clearing;
  logic [IB-1:0] clr_idx;

  // Request pipeline.
  logic                           busy;      // a request was read this edge
  logic                           arm_q;
  logic [synod_pkg::SLOT_W-1:0]   slot_q;
  logic [synod_pkg::BALLOT_W-1:0] ballot_q;
  logic                           hit_q;
  logic [IDX_W-1:0]               midx_q;
  logic [ROW_W-1:0]               row_rd;

  assign ready = !clearing && !busy && !rsp_valid;

  // Row fields as read.
  logic [TAG_W-1:0]               r_tag;
  logic [synod_pkg::BALLOT_W-1:0] r_ballot;
  logic [REPLICAS-1:0]            r_mask;
  logic                           r_valid, r_committed;
  assign {r_committed, r_valid, r_mask, r_ballot, r_tag} = row_rd;

  // The check and the new row, computed in the cycle after the read.
  logic [7:0]          reason;
  logic                wr_row;
  logic [REPLICAS-1:0] new_mask;
  logic                new_committed, commit;
  logic                tag_match, in_window, above_window;
  logic [Q_W:0]        acks;

  always_comb begin
    tag_match    = r_valid && (r_tag == slot_q[synod_pkg::SLOT_W-1:IB]);
    in_window    = (slot_q >= base) && ((slot_q - base) < WINDOW);
    above_window = slot_q >= (base + WINDOW);  // wraps mod 2^64, as in Go
    reason   = synod_pkg::R_NONE;
    wr_row   = 1'b0;
    new_mask = r_mask;
    if (arm_q) begin
      if (!is_leader)       reason = synod_pkg::R_ROLE;
      else if (!self_valid) reason = synod_pkg::R_MEMBER;
      else if (!in_window)  reason = synod_pkg::R_WINDOW;
      else if (!(tag_match && r_ballot == ballot_q)) begin
        wr_row   = 1'b1;
        new_mask = REPLICAS'(1) << self_idx;
      end
    end else begin
      if (!is_leader)                                  reason = synod_pkg::R_ROLE;
      else if (above_window || (slot_q < base && !tag_match)) reason = synod_pkg::R_WINDOW;
      else if (!tag_match)                             reason = synod_pkg::R_NOT_ARMED;
      else if (r_ballot != ballot_q || ballot_q != cur_ballot) reason = synod_pkg::R_BALLOT;
      else if (!hit_q)                                 reason = synod_pkg::R_MEMBER;
      else begin
        wr_row   = 1'b1;
        new_mask = r_mask | (REPLICAS'(1) << midx_q);
      end
    end
    acks = '0;
    for (int i = 0; i < REPLICAS; i++) acks = acks + {{Q_W{1'b0}}, new_mask[i] & member_mask[i]};
    if (PLANT_QUORUM_OFF_BY_ONE) acks = acks + 1'b1;
    // A freshly armed row starts uncommitted; an acked row keeps its flag.
    new_committed = (arm_q ? 1'b0 : r_committed);
    commit = wr_row && !new_committed && (acks >= {1'b0, quorum});
    if (commit) new_committed = 1'b1;
  end

  always_ff @(posedge clk) begin
    if (rst) begin
      clearing  <= 1'b1;
      clr_idx   <= '0;
      busy      <= 1'b0;
      rsp_valid <= 1'b0;
    end else begin
      rsp_valid <= 1'b0;
      if (clearing) begin
        clr_idx <= clr_idx + 1'b1;
        if (clr_idx == IB'(WINDOW_SLOTS - 1)) clearing <= 1'b0;
      end else if (busy) begin
        busy       <= 1'b0;
        rsp_valid  <= 1'b1;
        rsp_reason <= reason;
        rsp_commit <= commit;
        rsp_slot   <= slot_q;
        rsp_ballot <= ballot_q;
      end else if (req_valid && ready) begin
        busy     <= 1'b1;
        arm_q    <= req_arm;
        slot_q   <= req_slot;
        ballot_q <= req_ballot;
        hit_q    <= req_member_hit;
        midx_q   <= req_member_idx;
      end
    end
  end

  // The table: one synchronous read port, one write port (block RAM).
  logic          we;
  logic [IB-1:0] waddr;
  logic [ROW_W-1:0] wdata;
  always_comb begin
    we    = clearing || (busy && wr_row);
    waddr = clearing ? clr_idx : slot_q[IB-1:0];
    wdata = clearing ? '0
          : {new_committed, 1'b1, new_mask, ballot_q, slot_q[synod_pkg::SLOT_W-1:IB]};
  end
  always_ff @(posedge clk) begin
    if (we) mem[waddr] <= wdata;
    row_rd <= mem[req_slot[IB-1:0]];
  end
endmodule
