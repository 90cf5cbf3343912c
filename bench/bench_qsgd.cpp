// qsgd encode / decode throughput on one core, against the STREAM triad
// bandwidth measured in the same run.
//
// Bytes counted per element the way STREAM counts triad (reads + writes, no
// write-allocate traffic): encode reads the gradient (4) and writes the
// payload (b/8 + 4/bucket); decode reads the payload and writes 4. The RESULT
// line uses these counted bytes; the "gradient only" rows give the same timings
// as gradient bytes (4 per element) per second.
#include <gradcomp/detail/random.hpp>
#include <gradcomp/qsgd.hpp>

#include "common.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

using namespace gradcomp;

int main() {
  const std::size_t n = std::size_t{1} << 25;  // 32 Mi floats = 128 MiB: far beyond the 32 MiB L3
  const int repeats = 9;
  const double triad = bench::single_core_header("qsgd", "bucket 512, ", n, repeats);

  const std::vector<float> g = bench::uniform_gradient(n);
  const double grad_bytes = 4.0 * double(n);

  double qsgd4_encode = 0.0;
  qsgd_payload p;
  std::vector<float> out(n);
  for (unsigned bits : {4u, 2u, 8u}) {
    qsgd_options o;
    o.bits = bits;
    qsgd<execution::simd> vec(o);
    qsgd<execution::seq> sca(o);
    vec.encode(g, p);
    const double payload_bytes = double(wire::serialized_size(p));
    const double enc_bytes = grad_bytes + payload_bytes;
    const std::string tag = std::to_string(bits) + "-bit";

    const double t_vec = bench::best_seconds(repeats, [&] {
      vec.encode(g, p);
      bench::do_not_optimize(p.words[p.words.size() / 2]);
    });
    bench::row("encode simd " + tag, enc_bytes / t_vec / 1e9, "GB/s", triad, "triad");
    std::printf("%-40s %12.4g GB/s of gradient only (%.3f of triad), %.2f ms\n", "", grad_bytes / t_vec / 1e9,
                grad_bytes / t_vec / 1e9 / triad, t_vec * 1e3);
    if (bits == 4) {
      qsgd4_encode = enc_bytes / t_vec / 1e9;
      const double t_sca = bench::best_seconds(repeats, [&] {
        sca.encode(g, p);
        bench::do_not_optimize(p.words[p.words.size() / 2]);
      });
      bench::row("encode seq " + tag, enc_bytes / t_sca / 1e9, "GB/s", triad, "triad");
    }
    const double t_dec = bench::best_seconds(repeats, [&] {
      vec.decode(p, out);
      bench::do_not_optimize(out[n / 2]);
    });
    bench::row("decode simd " + tag, enc_bytes / t_dec / 1e9, "GB/s", triad, "triad");
    std::printf("%-40s %12.4g x smaller than float32 (%.0f bytes)\n", "", grad_bytes / payload_bytes,
                payload_bytes);
  }

  // 4-bit encode and the triad timed in thread CPU time.
  {
    qsgd<execution::simd> vec;
    vec.encode(g, p);
    const double enc_bytes = grad_bytes + double(wire::serialized_size(p));
    const double triad_cpu = bench::stream_triad_cpu_gbps(n, repeats);
    const double enc_cpu = enc_bytes / bench::best_cpu_seconds(repeats, [&] {
      vec.encode(g, p);
      bench::do_not_optimize(p.words[p.words.size() / 2]);
    }) / 1e9;
    std::printf("%-40s %12.4g GB/s\n", "stream triad, CPU time", triad_cpu);
    bench::row("encode simd 4-bit, CPU time", enc_cpu, "GB/s", triad_cpu, "triad");
  }

  bench::result("qsgd4_encode_vs_triad", qsgd4_encode / triad, "fraction");
  return 0;
}
