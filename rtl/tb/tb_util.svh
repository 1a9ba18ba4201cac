// Shared by the self-checking testbenches: CHECK counts a failed
// expectation and reports where; FINISH prints the verdict line the Go test
// (rtl/tb_test.go) looks for and ends the simulation.
int tb_checks = 0;
int tb_errors = 0;
`define CHECK(cond, msg) \
  begin \
    tb_checks++; \
    if (!(cond)) begin \
      tb_errors++; \
      $display("FAIL %s:%0d: %s", `__FILE__, `__LINE__, msg); \
    end \
  end
`define FINISH(name) \
  begin \
    if (tb_errors == 0) $display("PASS %s checks=%0d", name, tb_checks); \
    else $display("FAIL %s errors=%0d checks=%0d", name, tb_errors, tb_checks); \
    $finish; \
  end
// A bench that stops making progress fails instead of running forever.
initial begin
  #20ms;
  $display("FAIL timeout after %0t: last check #%0d", $time, tb_checks);
  $finish;
end
