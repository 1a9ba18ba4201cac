// synod_members is the member table: REPLICAS NodeID registers written by
// software (InSetMember), with a combinational lookup (a small CAM) that
// mirrors accel.state.memberIndex: NodeID 0 never matches, and the lowest
// matching index wins.
module synod_members #(
  parameter int REPLICAS = 5,
  localparam int IDX_W = (REPLICAS > 1) ? $clog2(REPLICAS) : 1
) (
  input  logic                          clk,
  input  logic                          rst,
  // Write port: entry wr_idx := wr_node (0 clears it).
  input  logic                          wr_en,
  input  logic [IDX_W-1:0]              wr_idx,
  input  logic [synod_pkg::NODE_W-1:0]  wr_node,
  // Lookup port.
  input  logic [synod_pkg::NODE_W-1:0]  look_node,
  output logic                          look_hit,
  output logic [IDX_W-1:0]              look_idx,
  // mask[i] is set iff entry i holds a non-zero NodeID.
  output logic [REPLICAS-1:0]           mask
);
  logic [synod_pkg::NODE_W-1:0] node_q [0:REPLICAS-1];

  always_ff @(posedge clk) begin
    if (rst) begin
      for (int i = 0; i < REPLICAS; i++) node_q[i] <= '0;
    end else if (wr_en) begin
      node_q[wr_idx] <= wr_node;
    end
  end

  always_comb begin
    look_hit = 1'b0;
    look_idx = '0;
    for (int i = REPLICAS - 1; i >= 0; i--) begin
      if (look_node != '0 && node_q[i] == look_node) begin
        look_hit = 1'b1;
        look_idx = IDX_W'(i);
      end
    end
    for (int i = 0; i < REPLICAS; i++) mask[i] = (node_q[i] != '0);
  end
endmodule
