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
// tokens[60], last[64]}. Go derives Burst/10^6 in Cost; SetRate is the only
// writer of Burst and stores burst_tokens*10^6, so keeping burst_tokens
// beside it gives the same quotient without a divider.
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

  // SetRate: clamp the rate, default the burst to one second's worth, clamp
  // it, fill the bucket. A zero rate is the unlimited bucket {last: now}.
  logic [63:0] s_r, s_b0, s_b;
  logic [MICRO_W-1:0] s_micro;
  always_comb begin
    s_r  = (set_rate > RATE_MAX) ? RATE_MAX : set_rate;
    s_b0 = (s_r != 64'd0 && set_burst == 64'd0) ? s_r : set_burst;
    s_b  = (s_b0 > BTOK_MAX) ? BTOK_MAX : s_b0;
    s_micro = {19'd0, s_b[BTOK_W-1:0]} * {40'd0, MICRO};  // < 2^60
    if (s_r == 64'd0) set_out = {RATE_W'(0), BTOK_W'(0), MICRO_W'(0), MICRO_W'(0), now};
    else              set_out = {s_r[RATE_W-1:0], s_b[BTOK_W-1:0], s_micro, s_micro, now};
  end
  logic unused_set;
  assign unused_set = ^{s_r[63:RATE_W], s_b[63:BTOK_W]};

  // Refill: nothing when now <= last; otherwise last = now and, for a
  // limited bucket, tokens = min(tokens + min(elapsed, 2^30) * rate, burst).
  logic [RATE_W-1:0]  r_rate;
  logic [BTOK_W-1:0]  r_btok;
  logic [MICRO_W-1:0] r_burst, r_tokens, r_tok;
  logic [T_W-1:0]     r_last;
  logic [63:0]        r_elapsed, r_sum;
  assign {r_rate, r_btok, r_burst, r_tokens, r_last} = ref_in;
  always_comb begin
    r_elapsed = now - r_last;
    if (r_elapsed > ELAPSED_MAX) r_elapsed = ELAPSED_MAX;
    // elapsed <= 2^30, rate <= 2^32, tokens < 2^60: the sum fits 64 bits.
    r_sum = {4'd0, r_tokens} + ({33'd0, r_elapsed[30:0]} * {31'd0, r_rate});
    r_tok = (r_sum > {4'd0, r_burst}) ? r_burst : r_sum[MICRO_W-1:0];
    if (r_rate == '0) r_tok = r_tokens;
    if (now <= r_last) ref_out = ref_in;
    else               ref_out = {r_rate, r_btok, r_burst, r_tok, now};
  end
  logic unused_ref;
  assign unused_ref = ^r_elapsed[63:31];

  // Cost, Wait's numerator, charge.
  logic [BTOK_W-1:0]  c_btok;
  logic [MICRO_W-1:0] c_burst, c_tokens, c_cost;
  logic [T_W-1:0]     c_last;
  logic [51:0]        c_units_micro;
  assign {rate, c_btok, c_burst, c_tokens, c_last} = chk_in;
  always_comb begin
    c_units_micro = {20'd0, units} * {32'd0, MICRO};  // < 2^52
    c_cost = ({9'd0, units} > c_btok) ? c_burst : MICRO_W'(c_units_micro);
    need = (rate != '0) && (c_tokens < c_cost);
    num  = {4'd0, c_cost} - {4'd0, c_tokens} + 64'(rate) - 64'd1;
    charged = chk_in;
    if (rate != '0) charged = {rate, c_btok, c_burst, c_tokens - c_cost, c_last};
  end
endmodule
