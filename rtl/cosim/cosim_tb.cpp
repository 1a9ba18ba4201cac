// cosim_tb replays an accel trace (accel/trace.go format) through the
// Verilated synod_accel_top and writes a trace of its own: the same header,
// every input record as read, and after each input the outputs the RTL
// emitted for it (recorded outputs in the input file are skipped). The Go
// test (rtl/cosim_test.go) compares the two traces event by event.
//
//   cosim_tb IN.trace OUT.trace
//
// The build fixes the sizing parameters (-G...); a trace whose header asks
// for another sizing is refused. Exit status 0 on success, 2 on bad input.
#include "Vsynod_accel_top.h"
#include "verilated.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#ifndef COSIM_WINDOW_SLOTS
#error "build with -DCOSIM_WINDOW_SLOTS, -DCOSIM_REPLICAS, -DCOSIM_TENANTS"
#endif

namespace {

constexpr size_t kHeaderBytes = 64;
constexpr size_t kRecordBytes = 64;
// An input that has not finished after this many cycles is an RTL hang.
constexpr uint64_t kCyclesPerInputMax = 10000;

uint64_t le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
uint32_t le32(const unsigned char* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
void put64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
void put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

void setWide128(VlWide<4>& w, uint64_t hi, uint64_t lo) {
  w[0] = uint32_t(lo);
  w[1] = uint32_t(lo >> 32);
  w[2] = uint32_t(hi);
  w[3] = uint32_t(hi >> 32);
}

struct Sim {
  std::unique_ptr<VerilatedContext> ctx;
  std::unique_ptr<Vsynod_accel_top> top;
  uint64_t cycles = 0;

  Sim() : ctx(new VerilatedContext), top(new Vsynod_accel_top(ctx.get())) {}

  // One clock cycle. sample runs with the inputs settled before the edge.
  template <typename F>
  void cycle(F sample) {
    top->clk = 0;
    top->eval();
    sample();
    top->clk = 1;
    top->eval();
    cycles++;
  }
  void cycle() {
    cycle([] {});
  }
};

int fail(const char* msg) {
  fprintf(stderr, "cosim_tb: %s\n", msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: cosim_tb IN.trace OUT.trace");
  FILE* in = fopen(argv[1], "rb");
  if (!in) return fail("cannot open input");
  FILE* out = fopen(argv[2], "wb");
  if (!out) return fail("cannot open output");
  static char inbuf[1 << 20], outbuf[1 << 20];
  setvbuf(in, inbuf, _IOFBF, sizeof inbuf);
  setvbuf(out, outbuf, _IOFBF, sizeof outbuf);

  unsigned char h[kHeaderBytes];
  if (fread(h, 1, kHeaderBytes, in) != kHeaderBytes) return fail("short header");
  if (memcmp(h, "SYNACCEL", 8) != 0 || le32(h + 8) != 1 || le32(h + 12) != kRecordBytes)
    return fail("not a version-1 accel trace");
  if (le32(h + 16) != COSIM_WINDOW_SLOTS || le32(h + 20) != COSIM_REPLICAS || le32(h + 48) != COSIM_TENANTS) {
    fprintf(stderr, "cosim_tb: trace sized W=%u R=%u T=%u, build is W=%d R=%d T=%d\n", le32(h + 16),
            le32(h + 20), le32(h + 48), COSIM_WINDOW_SLOTS, COSIM_REPLICAS, COSIM_TENANTS);
    return 2;
  }
  fwrite(h, 1, kHeaderBytes, out);

  Sim sim;
  Vsynod_accel_top* t = sim.top.get();
  t->cfg_quorum = le32(h + 24);
  t->cfg_heartbeat_ticks = le32(h + 28);
  t->cfg_lease_ticks = le32(h + 32);
  t->cfg_lease_drift_ticks = le32(h + 36);
  t->cfg_election_ticks = le32(h + 40);
  t->cfg_election_jitter_ticks = le32(h + 44);
  t->cfg_seed = le32(h + 52);
  t->in_valid = 0;
  t->out_ready = 1;
  t->rst = 1;
  for (int i = 0; i < 4; i++) sim.cycle();
  t->rst = 0;
  // Table clears.
  for (uint64_t i = 0; !t->in_ready; i++) {
    if (i > 2 * (COSIM_WINDOW_SLOTS + COSIM_TENANTS) + 16) return fail("RTL never became ready after reset");
    sim.cycle();
  }

  unsigned char r[kRecordBytes], o[kRecordBytes];
  uint64_t inputs = 0, outputs = 0;
  while (true) {
    size_t n = fread(r, 1, kRecordBytes, in);
    if (n == 0) break;
    if (n != kRecordBytes) return fail("truncated record");
    uint8_t kind = r[8];
    if (kind >= 64) continue;  // a recorded output: the Go side compares
    uint64_t seq = le64(r);
    bool v2 = (kind == 9 || kind == 10);  // tenant writes carry Value2 in Slot
    t->in_kind = kind;
    t->in_flags = r[9];
    t->in_index = uint16_t(r[10] | r[11] << 8);
    t->in_len = le32(r + 12);
    t->in_now = le64(r + 16);
    t->in_slot = v2 ? 0 : le64(r + 24);
    t->in_value2 = v2 ? le64(r + 24) : 0;
    setWide128(t->in_ballot, le64(r + 32), le64(r + 40));
    t->in_node = le64(r + 48);
    t->in_value = le64(r + 56);
    fwrite(r, 1, kRecordBytes, out);
    inputs++;

    if (!t->in_ready) return fail("RTL not ready for the next input");
    t->in_valid = 1;
    sim.cycle();
    t->in_valid = 0;
    uint64_t c = 0;
    auto sample = [&] {
      if (!t->out_valid) return;
      memset(o, 0, sizeof o);
      put64(o, seq);
      o[8] = t->out_kind;
      o[9] = t->out_flags;
      o[10] = uint8_t(t->out_index);
      o[11] = uint8_t(t->out_index >> 8);
      put32(o + 12, t->out_len);
      put64(o + 16, t->out_now);
      put64(o + 24, t->out_slot);
      put64(o + 32, uint64_t(t->out_ballot[2]) | uint64_t(t->out_ballot[3]) << 32);
      put64(o + 40, uint64_t(t->out_ballot[0]) | uint64_t(t->out_ballot[1]) << 32);
      put64(o + 48, t->out_node);
      put64(o + 56, t->out_value);
      fwrite(o, 1, kRecordBytes, out);
      outputs++;
    };
    while (true) {
      sim.cycle(sample);
      if (t->in_ready) break;
      if (++c > kCyclesPerInputMax) {
        fprintf(stderr, "cosim_tb: input seq %llu kind %u did not finish\n", (unsigned long long)seq, kind);
        return 2;
      }
    }
  }
  if (fclose(out) != 0) return fail("writing output");
  fclose(in);
  sim.top->final();
  printf("cosim_tb: inputs=%llu outputs=%llu cycles=%llu\n", (unsigned long long)inputs,
         (unsigned long long)outputs, (unsigned long long)sim.cycles);
  return 0;
}
