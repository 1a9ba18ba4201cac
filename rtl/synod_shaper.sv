// synod_shaper is the per-tenant token-bucket shaper: a table of TENANTS
// rows, each an ops bucket and a bytes bucket (synod_bucket holds the
// arithmetic), implementing tenants.AdmitPair and tenants.Bucket.SetRate.
//
// Operations (req_op), one at a time, taken on req_valid && ready:
//   OP_SET_OPS / OP_SET_BYTES: SetRate(value, value2, now) on one bucket.
//   OP_ADMIT: refill both buckets to now; if both hold the frame's cost
//     (1 op; len bytes, capped at the burst) charge both and admit;
//     otherwise keep the refill, charge nothing and answer the longer wait,
//     ceil((cost - tokens) / rate), from two dividers running side by side.
// An index outside the table answers R_TENANT and touches nothing.
// rsp_valid pulses once per request: 2 cycles after a set, 3 after an
// admitted frame, about 68 after a refused one. now must stay stable while a
// request is in flight. The table is cleared after reset (ready low for
// TENANTS cycles), so every bucket starts unlimited at tick 0, as in Go.
module synod_shaper #(
  parameter int TENANTS = 32,
  localparam int TI_W = (TENANTS > 1) ? $clog2(TENANTS) : 1
) (
  input  logic                         clk,
  input  logic                         rst,
  output logic                         ready,
  input  logic                         req_valid,
  input  logic [1:0]                   req_op,
  input  logic [15:0]                  req_index,
  input  logic [63:0]                  req_value,   // rate, tokens per second
  input  logic [63:0]                  req_value2,  // burst, tokens
  input  logic [31:0]                  req_len,     // frame bytes
  input  logic [synod_pkg::TIME_W-1:0] now,
  output logic                         rsp_valid,
  output logic [7:0]                   rsp_reason,
  output logic                         rsp_admit,
  output logic [63:0]                  rsp_wait
);
  localparam logic [1:0] OP_SET_OPS = 2'd0;  // 2'd1: OP_SET_BYTES
  localparam logic [1:0] OP_ADMIT   = 2'd2;
  localparam int RATE_W   = 33;
  localparam int BUCKET_W = 33 + 41 + 60 + 60 + synod_pkg::TIME_W;
  localparam int ROW_W    = 2 * BUCKET_W;    // {ops, bytes}

  logic [ROW_W-1:0] mem [0:TENANTS-1];

  typedef enum logic [2:0] {S_CLEAR, S_IDLE, S_READ, S_CHECK, S_DIV} state_t;
  state_t state;
  logic [TI_W-1:0] clr_idx;

  logic [1:0]  op_q;
  logic [15:0] idx_q;
  logic [63:0] value_q, value2_q;
  logic [31:0] len_q;
  logic [ROW_W-1:0]    row_rd;
  logic [BUCKET_W-1:0] ops_q, bytes_q;   // refilled buckets, for S_CHECK

  assign ready = (state == S_IDLE);

  logic idx_ok;
  assign idx_ok = ({16'd0, idx_q} < 32'(TENANTS));

  logic [BUCKET_W-1:0] rd_ops, rd_bytes, set_b, set_unused;
  logic [BUCKET_W-1:0] ops_ref, bytes_ref, ops_charged, bytes_charged;
  logic                ops_need, bytes_need;
  logic [63:0]         ops_num, bytes_num;
  logic [RATE_W-1:0]   ops_rate, bytes_rate;
  assign rd_ops   = row_rd[ROW_W-1 -: BUCKET_W];
  assign rd_bytes = row_rd[BUCKET_W-1:0];

  synod_bucket u_ops (
    .now, .set_rate(value_q), .set_burst(value2_q), .set_out(set_b),
    .ref_in(rd_ops), .ref_out(ops_ref),
    .chk_in(ops_q), .units(32'd1), .need(ops_need), .num(ops_num), .rate(ops_rate),
    .charged(ops_charged));
  synod_bucket u_bytes (
    .now, .set_rate(value_q), .set_burst(value2_q), .set_out(set_unused),
    .ref_in(rd_bytes), .ref_out(bytes_ref),
    .chk_in(bytes_q), .units(len_q), .need(bytes_need), .num(bytes_num), .rate(bytes_rate),
    .charged(bytes_charged));
  logic unused;
  assign unused = ^set_unused;

  logic        div_start, ops_done, bytes_done, ops_busy, bytes_busy;
  logic [63:0] ops_quo, bytes_quo;
  logic        ops_used, bytes_used, ops_fin, bytes_fin;
  assign div_start = (state == S_CHECK) && (ops_need || bytes_need);
  synod_divu #(.N_W(64), .D_W(RATE_W)) u_div_ops (
    .clk, .rst, .start(div_start && ops_need), .num(ops_num), .den(ops_rate),
    .busy(ops_busy), .done(ops_done), .quo(ops_quo));
  synod_divu #(.N_W(64), .D_W(RATE_W)) u_div_bytes (
    .clk, .rst, .start(div_start && bytes_need), .num(bytes_num), .den(bytes_rate),
    .busy(bytes_busy), .done(bytes_done), .quo(bytes_quo));
  logic unused_busy;
  assign unused_busy = ops_busy ^ bytes_busy;

  logic [63:0] ops_wait, bytes_wait;
  assign ops_wait   = ops_used ? ops_quo : 64'd0;
  assign bytes_wait = bytes_used ? bytes_quo : 64'd0;

  // Table write port.
  logic             we;
  logic [TI_W-1:0]  waddr;
  logic [ROW_W-1:0] wdata;
  always_comb begin
    we    = 1'b0;
    waddr = idx_q[TI_W-1:0];
    wdata = row_rd;
    case (state)
      S_CLEAR: begin we = 1'b1; waddr = clr_idx; wdata = '0; end
      S_READ: if (idx_ok && op_q != OP_ADMIT) begin
        we    = 1'b1;
        wdata = (op_q == OP_SET_OPS) ? {set_b, rd_bytes} : {rd_ops, set_b};
      end
      S_CHECK: begin
        we    = 1'b1;
        wdata = (ops_need || bytes_need) ? {ops_q, bytes_q} : {ops_charged, bytes_charged};
      end
      default: ;
    endcase
  end
  always_ff @(posedge clk) begin
    if (we) mem[waddr] <= wdata;
    row_rd <= mem[req_index[TI_W-1:0]];
  end

  always_ff @(posedge clk) begin
    if (rst) begin
      state      <= S_CLEAR;
      clr_idx    <= '0;
      rsp_valid  <= 1'b0;
      rsp_reason <= synod_pkg::R_NONE;
      rsp_admit  <= 1'b0;
      rsp_wait   <= '0;
      ops_used   <= 1'b0;
      bytes_used <= 1'b0;
      ops_fin    <= 1'b0;
      bytes_fin  <= 1'b0;
    end else begin
      rsp_valid <= 1'b0;
      case (state)
        S_CLEAR: begin
          clr_idx <= clr_idx + 1'b1;
          if (clr_idx == TI_W'(TENANTS - 1)) state <= S_IDLE;
        end
        S_IDLE: if (req_valid) begin
          op_q     <= req_op;
          idx_q    <= req_index;
          value_q  <= req_value;
          value2_q <= req_value2;
          len_q    <= req_len;
          state    <= S_READ;
        end
        S_READ: begin
          if (!idx_ok || op_q != OP_ADMIT) begin
            rsp_valid  <= 1'b1;
            rsp_reason <= idx_ok ? synod_pkg::R_NONE : synod_pkg::R_TENANT;
            rsp_admit  <= 1'b0;
            rsp_wait   <= '0;
            state      <= S_IDLE;
          end else begin
            ops_q   <= ops_ref;
            bytes_q <= bytes_ref;
            state   <= S_CHECK;
          end
        end
        S_CHECK: begin
          if (ops_need || bytes_need) begin
            ops_used   <= ops_need;
            bytes_used <= bytes_need;
            ops_fin    <= !ops_need;
            bytes_fin  <= !bytes_need;
            state      <= S_DIV;
          end else begin
            rsp_valid  <= 1'b1;
            rsp_reason <= synod_pkg::R_NONE;
            rsp_admit  <= 1'b1;
            rsp_wait   <= '0;
            state      <= S_IDLE;
          end
        end
        S_DIV: begin
          if (ops_done)   ops_fin <= 1'b1;
          if (bytes_done) bytes_fin <= 1'b1;
          if ((ops_fin || ops_done) && (bytes_fin || bytes_done)) begin
            rsp_valid  <= 1'b1;
            rsp_reason <= synod_pkg::R_NONE;
            rsp_admit  <= 1'b0;
            rsp_wait   <= (ops_wait > bytes_wait) ? ops_wait : bytes_wait;
            state      <= S_IDLE;
          end
        end
        default: state <= S_IDLE;
      endcase
    end
  end
endmodule
