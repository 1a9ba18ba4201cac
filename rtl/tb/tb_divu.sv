// Self-checking testbench for synod_divu: edge quotients and random ones
// against the simulator's own 64-bit division.
`timescale 1ns/1ps
module tb_divu;
  `include "tb_util.svh"
  logic clk = 0, rst = 1, start = 0, busy, done;
  logic [63:0] num, quo;
  logic [32:0] den;
  always #5 clk = ~clk;
  synod_divu #(.N_W(64), .D_W(33)) dut (.clk, .rst, .start, .num, .den, .busy, .done, .quo);

  task automatic div(input logic [63:0] n, input logic [32:0] d);
    logic [63:0] want;
    want = n / {31'd0, d};
    @(negedge clk);
    num = n; den = d; start = 1;
    @(negedge clk);
    start = 0;
    while (!done) @(negedge clk);
    `CHECK(quo == want, $sformatf("%0d / %0d = %0d, want %0d", n, d, quo, want))
  endtask

  initial begin
    repeat (2) @(posedge clk);
    #1 rst = 0;
    div(0, 1);
    div(1, 1);
    div(64'hFFFF_FFFF_FFFF_FFFF, 1);
    div(64'hFFFF_FFFF_FFFF_FFFF, 33'h1_0000_0000);
    div(1_000_009, 10);
    div(999_999, 1_000_000);
    div(64'h0FFF_FFFF_FFFF_FFFF, 33'h1_FFFF_FFFF);
    for (int i = 0; i < 200; i++) begin
      logic [32:0] d;
      d = {$urandom, $urandom} & ((33'd1 << ($urandom % 33 + 1)) - 1);
      if (d == 0) d = 1;
      div({$urandom, $urandom} >> ($urandom % 64), d);
    end
    `FINISH("tb_divu")
  end
endmodule
