// synod_pkg holds the constants the accel plane's RTL shares with the Go
// model in accel/ (event.go): event kinds, hand-up reasons and roles. The
// numeric values are part of the trace format, so they must never drift
// from the Go constants; the co-simulation compares them on every event.
//
// Yosys 0.23 accepts package-qualified names (synod_pkg::X) but not
// `import`, so every user spells the package out.
/* verilator lint_off UNUSEDPARAM */
package synod_pkg;
  // Fixed widths of the Go model's integers (paxos.Slot, Ballot.Round,
  // Ballot.Node, NodeID, plane ticks). A ballot travels as one
  // {round, node} vector, so Ballot.Less is an unsigned compare.
  localparam int SLOT_W   = 64;
  localparam int ROUND_W  = 64;
  localparam int NODE_W   = 64;
  localparam int BALLOT_W = ROUND_W + NODE_W;
  localparam int TIME_W   = 64;
  localparam int VALUE_W  = 64;

  // Input kinds.
  localparam logic [7:0] K_TICK          = 8'd1;
  localparam logic [7:0] K_SET_ROLE      = 8'd2;
  localparam logic [7:0] K_SET_BALLOT    = 8'd3;
  localparam logic [7:0] K_SET_PROMISED  = 8'd4;
  localparam logic [7:0] K_SET_QUORUM    = 8'd5;
  localparam logic [7:0] K_SET_MEMBER    = 8'd6;
  localparam logic [7:0] K_SET_SELF      = 8'd7;
  localparam logic [7:0] K_SET_BASE      = 8'd8;
  localparam logic [7:0] K_SET_T_OPS     = 8'd9;
  localparam logic [7:0] K_SET_T_BYTES   = 8'd10;
  localparam logic [7:0] K_ARM           = 8'd16;
  localparam logic [7:0] K_ACCEPTED      = 8'd17;
  localparam logic [7:0] K_ACCEPT        = 8'd18;
  localparam logic [7:0] K_HEARTBEAT     = 8'd19;
  localparam logic [7:0] K_HEARTBEAT_ACK = 8'd20;
  localparam logic [7:0] K_ADMIT         = 8'd21;

  // Output kinds.
  localparam logic [7:0] K_OUT_COMMIT        = 8'd64;
  localparam logic [7:0] K_OUT_HANDUP        = 8'd65;
  localparam logic [7:0] K_OUT_SEND_ACCEPTED = 8'd66;
  localparam logic [7:0] K_OUT_MIRROR        = 8'd67;
  localparam logic [7:0] K_OUT_HEARTBEAT     = 8'd68;
  localparam logic [7:0] K_OUT_HEARTBEAT_ACK = 8'd69;
  localparam logic [7:0] K_OUT_LEASE_GAINED  = 8'd70;
  localparam logic [7:0] K_OUT_LEASE_LOST    = 8'd71;
  localparam logic [7:0] K_OUT_ELECTION      = 8'd72;
  localparam logic [7:0] K_OUT_ADMIT         = 8'd73;

  // Hand-up reasons (OutHandUp.Flags).
  localparam logic [7:0] R_NONE         = 8'd0;
  localparam logic [7:0] R_ROLE         = 8'd1;
  localparam logic [7:0] R_WINDOW       = 8'd2;
  localparam logic [7:0] R_NOT_ARMED    = 8'd3;
  localparam logic [7:0] R_BALLOT       = 8'd4;
  localparam logic [7:0] R_STALE        = 8'd5;
  localparam logic [7:0] R_MEMBER       = 8'd6;
  localparam logic [7:0] R_WAL          = 8'd7;
  localparam logic [7:0] R_TENANT       = 8'd8;
  localparam logic [7:0] R_BAD_INDEX    = 8'd9;
  localparam logic [7:0] R_FUTURE       = 8'd10;
  localparam logic [7:0] R_HIGHER       = 8'd11;
  localparam logic [7:0] R_UNKNOWN      = 8'd12;
  localparam logic [7:0] R_BAD_QUORUM   = 8'd13;

  // Role register values.
  localparam logic [1:0] ROLE_OFF      = 2'd0;
  localparam logic [1:0] ROLE_FOLLOWER = 2'd1;
  localparam logic [1:0] ROLE_LEADER   = 2'd2;

  // InAccept flag: the WAL append or persist failed.
  localparam int FLAG_WAL_FAILED_BIT = 0;
endpackage
/* verilator lint_on UNUSEDPARAM */
