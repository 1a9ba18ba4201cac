// synod_divu is a restoring unsigned divider, one quotient bit per cycle:
// quo = num / den after N_W cycles. den must not be zero (the shaper only
// divides by a non-zero rate). start is taken when !busy; done pulses for
// one cycle with quo valid, and quo holds until the next start.
module synod_divu #(
  parameter int N_W = 64,
  parameter int D_W = 33
) (
  input  logic           clk,
  input  logic           rst,
  input  logic           start,
  input  logic [N_W-1:0] num,
  input  logic [D_W-1:0] den,
  output logic           busy,
  output logic           done,
  output logic [N_W-1:0] quo
);
  localparam int C_W = $clog2(N_W + 1);

  logic [N_W-1:0] num_q;
  logic [D_W-1:0] den_q;
  logic [D_W-1:0] rem;
  logic [C_W-1:0] left;

  // rem < den, so rem_sh < 2*den; when rem_sh >= den the difference is
  // below den and fits D_W bits (the subtraction may drop the top bit).
  logic [D_W:0]   rem_sh;
  logic [D_W-1:0] rem_sub;
  always_comb begin
    rem_sh  = {rem, num_q[N_W-1]};
    rem_sub = rem_sh[D_W-1:0] - den_q;
  end

  always_ff @(posedge clk) begin
    if (rst) begin
      busy <= 1'b0;
      done <= 1'b0;
      left <= '0;
      rem  <= '0;
      quo  <= '0;
    end else begin
      done <= 1'b0;
      if (!busy && start) begin
        busy  <= 1'b1;
        num_q <= num;
        den_q <= den;
        rem   <= '0;
        quo   <= '0;
        left  <= C_W'(N_W);
      end else if (busy) begin
        num_q <= num_q << 1;
        if (rem_sh >= {1'b0, den_q}) begin
          rem <= rem_sub;
          quo <= {quo[N_W-2:0], 1'b1};
        end else begin
          rem <= rem_sh[D_W-1:0];
          quo <= {quo[N_W-2:0], 1'b0};
        end
        left <= left - 1'b1;
        if (left == C_W'(1)) begin
          busy <= 1'b0;
          done <= 1'b1;
        end
      end
    end
  end
endmodule
