// fp16 / bf16 conversion throughput on one core (half.hpp, system/half.hpp),
// against the STREAM triad bandwidth measured in the same run.
//
// Bytes counted per element, as STREAM counts triad (no write-allocate traffic):
//   encode (float32 -> 16 bits):       read 4 + write 2          = 6
//   decode (16 bits -> float32):       read 2 + write 4          = 6
//   ring hop (add_raw_and_reencode):   read 2 + read 4 + write 2 = 8
// Serialisation (the wire header and CRC) is excluded: the kernels are timed
// on the payload's values. The encoder's non-finite pre-scan reads the input a
// second time; it is paid for in the time but not counted.
//
// The fp16 kernels are F16C's when this bench is compiled for it (bench/
// CMakeLists.txt adds -mf16c where the host runs it); the portable
// branch-free kernels are timed beside them either way.
// Ends with: RESULT fp16_encode_vs_triad (encode GB/s over triad GB/s).
#include <gradcomp/half.hpp>
#include <gradcomp/system/half.hpp>

#include "common.hpp"

#include <cstdio>
#include <span>
#include <vector>

using namespace gradcomp;

int main() {
  const std::size_t n = std::size_t{1} << 25;  // 32 Mi floats = 128 MiB: far beyond the caches
  const int repeats = 9;
  const double triad = bench::single_core_header("fp16 / bf16 conversion", "", n, repeats);
  std::printf("%-40s %12s\n", "fp16 kernels", execution::half_f16c ? "F16C" : "portable (not compiled for F16C)");

  std::vector<float> g = bench::uniform_gradient(n);
  fp16_payload h;
  bf16_payload b;
  fp16_codec<bench::policy> fp16;
  bf16_codec<bench::policy> bf16;
  const double six = 6.0 * double(n), eight = 8.0 * double(n);

  // The conversion kernel alone (what fp16_encode_vs_triad measures), then the codec's encode (with its checks).
  h.values.resize(n);
  const double t_conv = bench::best_seconds(repeats, [&] {
    execution::floats_to_half(g, h.values);
    bench::do_not_optimize(h.values[n / 2]);
  });
  const double enc = six / t_conv / 1e9;
  bench::row("fp16 encode (conversion)", enc, "GB/s", triad, "triad");
  const double t_conv_p = bench::best_seconds(repeats, [&] {
    execution::floats_to_half_portable(g, h.values);
    bench::do_not_optimize(h.values[n / 2]);
  });
  bench::row("fp16 encode, portable kernel", six / t_conv_p / 1e9, "GB/s", triad, "triad");
  const double t_codec = bench::best_seconds(repeats, [&] {
    fp16.encode(g, h);
    bench::do_not_optimize(h.values[n / 2]);
  });
  bench::row("fp16_codec::encode (+ finite check)", six / t_codec / 1e9, "GB/s", triad, "triad");

  std::vector<float> out(n);
  const double t_dec = bench::best_seconds(repeats, [&] {
    fp16.decode(h, out);
    bench::do_not_optimize(out[n / 2]);
  });
  bench::row("fp16 decode", six / t_dec / 1e9, "GB/s", triad, "triad");
  const double t_dec_p = bench::best_seconds(repeats, [&] {
    execution::half_to_floats_portable(h.values, out);
    bench::do_not_optimize(out[n / 2]);
  });
  bench::row("fp16 decode, portable kernel", six / t_dec_p / 1e9, "GB/s", triad, "triad");
  const double t_hop = bench::best_seconds(repeats, [&] {
    fp16.add_raw_and_reencode(h, g);
    bench::do_not_optimize(h.values[n / 2]);
  });
  bench::row("fp16 ring hop (add raw, re-encode)", eight / t_hop / 1e9, "GB/s", triad, "triad");

  const double t_b = bench::best_seconds(repeats, [&] {
    bf16.encode(g, b);
    bench::do_not_optimize(b.values[n / 2]);
  });
  bench::row("bf16_codec::encode (+ finite check)", six / t_b / 1e9, "GB/s", triad, "triad");
  const double t_bd = bench::best_seconds(repeats, [&] {
    bf16.decode(b, out);
    bench::do_not_optimize(out[n / 2]);
  });
  bench::row("bf16 decode", six / t_bd / 1e9, "GB/s", triad, "triad");
  const double t_bh = bench::best_seconds(repeats, [&] {
    bf16.add_raw_and_reencode(b, g);
    bench::do_not_optimize(b.values[n / 2]);
  });
  bench::row("bf16 ring hop (add raw, re-encode)", eight / t_bh / 1e9, "GB/s", triad, "triad");

  std::printf("load average %.1f\n", bench::load_average());
  bench::result("fp16_encode_vs_triad", enc / triad, "x");
  return 0;
}
