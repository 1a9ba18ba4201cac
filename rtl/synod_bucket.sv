// synod_bucket is the combinational arithmetic of one tenants.Bucket, in
// exactly the Go integers (ticks = microseconds, micro-tokens):
//   set:     SetRate(set_rate, set_burst, now) -> set_out
//   refill:  Refill(now) of ref_in               -> ref_out
//   check:   on chk_in (already refilled), for a frame of units:
//            cost = units > burst_tokens ? burst : units*10^6   (Cost)
//            need = rate != 0 && tokens < cost                  (Wait > 0)
//            num  = cost - tokens + rate - 1   (Wait = num / rate when need)
//            charged = chk_in less cost when rate != 0
// A bucket travels packed as {rate[33], burst_tokens[41], burst[60],
// tokens[60], last[64]}. Go's Cost is min(units*10^6, Burst) (units below
// 2^42; here at most 2^32). SetRate, the only writer of Burst, stores
// burst_tokens*10^6, so comparing units with burst_tokens picks the same
// branch with a 41-bit compare instead of a 60-bit one.
module synod_bucket #(
  localparam int RATE_W = 33,   // <= 2^32  (tenants.RatePerSecMax)
  localparam int BTOK_W = 41,   // <= 2^40  (tenants.BurstTokensMax)
  localparam int MICRO_W = 60,  // < 2^60   (BurstTokensMax * 10^6)
  localparam int T_W = synod_pkg::TIME_W,
  localparam int BUCKET_W = RATE_W + BTOK_W + MICRO_W + MICRO_W + T_W
) (
  input  logic [T_W-1:0]      now,
  input  logic [63:0]         set_rate,
  input  logic [63:0]         set_burst,
  output logic [BUCKET_W-1:0] set_out,
  input  logic [BUCKET_W-1:0] ref_in,
  output logic [BUCKET_W-1:0] ref_out,
  input  logic [BUCKET_W-1:0] chk_in,
  input  logic [31:0]         units,
  output logic                need,
  output logic [63:0]         num,
  output logic [RATE_W-1:0]   rate,
  output logic [BUCKET_W-1:0] charged
);
  localparam logic [63:0] RATE_MAX = 64'h1_0000_0000;        // 2^32
  localparam logic [63:0] BTOK_MAX = 64'h100_0000_0000;      // 2^40
  localparam logic [63:0] ELAPSED_MAX = 64'h4000_0000;       // 2^30 ticks
  localparam logic [19:0] MICRO = 20'd1_000_000;

  // Continuous assignments only: Icarus 11 re-evaluates an always_comb
  // block whose own intermediate variables it reads many times over, which
  // made the shaper bench crawl; the logic is the same either way.

  // SetRate: clamp the rate, default the burst to one second's worth, clamp
  // it, fill the bucket. A zero rate is the unlimited bucket {last: now}.
  logic [63:0] s_r, s_b0, s_b;
  logic [MICRO_W-1:0] s_micro;
  assign s_r  = (set_rate > RATE_MAX) ? RATE_MAX : set_rate;
  assign s_b0 = (s_r != 64'd0 && set_burst == 64'd0) ? s_r : set_burst;
  assign s_b  = (s_b0 > BTOK_MAX) ? BTOK_MAX : s_b0;
  assign s_micro = {19'd0, s_b[BTOK_W-1:0]} * {40'd0, MICRO};  // < 2^60
  assign set_out = (s_r == 64'd0) ? {RATE_W'(0), BTOK_W'(0), MICRO_W'(0), MICRO_W'(0), now}
                                  : {s_r[RATE_W-1:0], s_b[BTOK_W-1:0], s_micro, s_micro, now};
  logic unused_set;
  assign unused_set = ^{s_r[63:RATE_W], s_b[63:BTOK_W]};

  // Refill: nothing when now <= last; otherwise last = now and, for a
  // limited bucket, tokens = min(tokens + min(elapsed, 2^30) * rate, burst).
  logic [RATE_W-1:0]  r_rate;
  logic [BTOK_W-1:0]  r_btok;
  logic [MICRO_W-1:0] r_burst, r_tokens, r_tok;
  logic [T_W-1:0]     r_last;
  logic [63:0]        r_delta, r_elapsed, r_sum;
  assign {r_rate, r_btok, r_burst, r_tokens, r_last} = ref_in;
  assign r_delta   = now - r_last;
  assign r_elapsed = (r_delta > ELAPSED_MAX) ? ELAPSED_MAX : r_delta;
  // elapsed <= 2^30, rate <= 2^32, tokens < 2^60: the sum fits 64 bits.
  assign r_sum = {4'd0, r_tokens} + ({33'd0, r_elapsed[30:0]} * {31'd0, r_rate});
  assign r_tok = (r_rate == '0) ? r_tokens
               : (r_sum > {4'd0, r_burst}) ? r_burst : r_sum[MICRO_W-1:0];
  assign ref_out = (now <= r_last) ? ref_in : {r_rate, r_btok, r_burst, r_tok, now};
  logic unused_ref;
  assign unused_ref = ^{r_elapsed[63:31], r_sum[63:MICRO_W]};

  // Cost, Wait's numerator, charge.
  logic [BTOK_W-1:0]  c_btok;
  logic [MICRO_W-1:0] c_burst, c_tokens, c_cost;
  logic [T_W-1:0]     c_last;
  logic [51:0]        c_units_micro;
  assign {rate, c_btok, c_burst, c_tokens, c_last} = chk_in;
  assign c_units_micro = {20'd0, units} * {32'd0, MICRO};  // < 2^52
  assign c_cost  = ({9'd0, units} > c_btok) ? c_burst : MICRO_W'(c_units_micro);
  assign need    = (rate != '0) && (c_tokens < c_cost);
  assign num     = {4'd0, c_cost} - {4'd0, c_tokens} + 64'(rate) - 64'd1;
  assign charged = (rate != '0) ? {rate, c_btok, c_burst, c_tokens - c_cost, c_last} : chk_in;
endmodule
