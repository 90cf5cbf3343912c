// two_bit_quantizer encode / decode throughput on one core, against the STREAM
// triad bandwidth measured in the same run.
//
// Bytes counted per element, the same way STREAM counts triad (12 bytes: two
// 4-byte reads, one 4-byte write, no write-allocate traffic):
//   encode:     read g (4) + read r (4) + write r (4) + write codes (0.25) = 12.25
//   decode:     read codes (0.25) + write out (4)                           =  4.25
//   decode_add: read codes (0.25) + read out (4) + write out (4)            =  8.25
// The encoder's non-finite pre-scan reads g a second time; that read is paid
// for in the time but not counted as useful bytes.
// The RESULT lines use these counted bytes, as the issue's goal does ("a
// vectorised loop moves its bytes at about stream speed"); the "gradient only"
// rows give the same timings as gradient bytes (4 per element) per second,
// whose ceiling is about a third of triad for the encoder (it moves 12.25).
#include <gradcomp/detail/random.hpp>
#include <gradcomp/two_bit.hpp>

#include "common.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

using namespace gradcomp;

int main() {
  const std::size_t n = std::size_t{1} << 25;  // 32 Mi floats = 128 MiB per array: far beyond the 32 MiB L3
  const int repeats = 9;
  const double triad = bench::single_core_header("two-bit quantizer", "", n, repeats);

  const std::vector<float> g = bench::uniform_gradient(n);  // the scale of a small CNN's gradients

  const double enc_bytes = 12.25 * double(n), dec_bytes = 4.25 * double(n), add_bytes = 8.25 * double(n);
  const double grad_bytes = 4.0 * double(n);
  two_bit_payload p;

  auto run_encode = [&](auto& q, const char* name) {
    const double t = bench::best_seconds(repeats, [&] {
      q.encode(g, p);
      bench::do_not_optimize(p.words[n / 32]);
    });
    bench::row(name, enc_bytes / t / 1e9, "GB/s", triad, "triad");
    std::printf("%-40s %12.4g GB/s of gradient only (%.3f of triad), %.2f ms\n", "", grad_bytes / t / 1e9,
                grad_bytes / t / 1e9 / triad, t * 1e3);
    return enc_bytes / t / 1e9;
  };

  two_bit_quantizer<execution::simd> fixed_simd(n, two_bit_options::fixed(1e-3f));
  two_bit_quantizer<execution::seq> fixed_seq(n, two_bit_options::fixed(1e-3f));
  two_bit_quantizer<execution::simd> auto_simd(n, two_bit_options::automatic());
  const double enc_simd = run_encode(fixed_simd, "encode simd, fixed thr");
  run_encode(fixed_seq, "encode seq, fixed thr");
  run_encode(auto_simd, "encode simd, automatic thr");

  std::size_t nonzero = 0;
  for (auto w : p.words) nonzero += static_cast<std::size_t>(__builtin_popcount(w & 0xAAAAAAAAu));
  std::printf("%-40s %12.3f (automatic threshold %.3g)\n", "density of non-zero codes", double(nonzero) / n,
              p.threshold);

  std::vector<float> out(n);
  fixed_simd.encode(g, p);
  const double t_dec = bench::best_seconds(repeats, [&] {
    fixed_simd.decode(p, out);
    bench::do_not_optimize(out[n / 2]);
  });
  const double dec_simd = dec_bytes / t_dec / 1e9;
  bench::row("decode simd", dec_simd, "GB/s", triad, "triad");
  std::printf("%-40s %12.4g GB/s of gradient only (%.3f of triad), %.2f ms\n", "", grad_bytes / t_dec / 1e9,
              grad_bytes / t_dec / 1e9 / triad, t_dec * 1e3);
  const double t_dec_seq = bench::best_seconds(repeats, [&] {
    fixed_seq.decode(p, out);
    bench::do_not_optimize(out[n / 2]);
  });
  bench::row("decode seq", dec_bytes / t_dec_seq / 1e9, "GB/s", triad, "triad");
  const double t_add = bench::best_seconds(repeats, [&] {
    fixed_simd.decode_add(p, out);
    bench::do_not_optimize(out[n / 2]);
  });
  bench::row("decode_add simd", add_bytes / t_add / 1e9, "GB/s", triad, "triad");

  // The same two kernels and the triad timed in thread CPU time.
  const double triad_cpu = bench::stream_triad_cpu_gbps(n, repeats);
  const double enc_cpu = enc_bytes / bench::best_cpu_seconds(repeats, [&] {
    fixed_simd.encode(g, p);
    bench::do_not_optimize(p.words[n / 32]);
  }) / 1e9;
  const double dec_cpu = dec_bytes / bench::best_cpu_seconds(repeats, [&] {
    fixed_simd.decode(p, out);
    bench::do_not_optimize(out[n / 2]);
  }) / 1e9;
  std::printf("%-40s %12.4g GB/s\n", "stream triad, CPU time", triad_cpu);
  bench::row("encode simd, CPU time", enc_cpu, "GB/s", triad_cpu, "triad");
  bench::row("decode simd, CPU time", dec_cpu, "GB/s", triad_cpu, "triad");

  std::vector<std::byte> bytes;
  const double t_ser = bench::best_seconds(repeats, [&] {
    wire::serialize_into(p, bytes);
    bench::do_not_optimize(bytes[bytes.size() / 2]);
  });
  std::printf("%-40s %12.4g ms for %zu bytes (%.1fx smaller than float32)\n", "serialize (CRC-32C)", t_ser * 1e3,
              bytes.size(), grad_bytes / double(bytes.size()));

  bench::result("two_bit_encode_vs_triad", enc_simd / triad, "fraction");
  bench::result("two_bit_decode_vs_triad", dec_simd / triad, "fraction");
  return 0;
}
