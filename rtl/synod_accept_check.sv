// synod_accept_check is the follower's accept fast path decision, a pure
// function of the registers and one InAccept (accel.state.acceptCheck and
// accel.state.accept): the role must be follower, the ballot at least the
// promised register, the slot inside [base, base+WINDOW_SLOTS), and the WAL
// write (done before this check's outcome is used, recorded as a flag) must
// have succeeded. The checks run in that order; the first failing one is the
// hand-up reason. On success the caller sends Accepted, mirrors the Accept to
// software, restarts the election timer and, when raise_promised is set,
// writes the ballot into the promised register (accepting b promises b).
module synod_accept_check #(
  parameter int WINDOW_SLOTS = 4096
) (
  input  logic [1:0]                      role,
  input  logic [synod_pkg::BALLOT_W-1:0]  promised,
  input  logic [synod_pkg::SLOT_W-1:0]    base,
  input  logic [synod_pkg::SLOT_W-1:0]    slot,
  input  logic [synod_pkg::BALLOT_W-1:0]  ballot,
  input  logic                            wal_failed,
  output logic                            ok,
  output logic [7:0]                      reason,
  output logic                            raise_promised
);
  localparam logic [synod_pkg::SLOT_W-1:0] WINDOW = synod_pkg::SLOT_W'(WINDOW_SLOTS);

  logic in_window;
  // slot-base < W, computed modulo 2^64 exactly as the Go expression is.
  assign in_window = (slot >= base) && ((slot - base) < WINDOW);

  always_comb begin
    reason = synod_pkg::R_NONE;
    if (role != synod_pkg::ROLE_FOLLOWER)  reason = synod_pkg::R_ROLE;
    else if (ballot < promised)            reason = synod_pkg::R_STALE;
    else if (!in_window)                   reason = synod_pkg::R_WINDOW;
    else if (wal_failed)                   reason = synod_pkg::R_WAL;
    ok = (reason == synod_pkg::R_NONE);
    raise_promised = promised < ballot;
  end
endmodule
