// PowerSGD rank 2 (powersgd.hpp) on the 3x3 and 1x1 conv weights of a
// ResNet-18 (11.2 M floats, 45 MB: beyond the last-level cache), one core:
// one whole step of one rank (encode_p of every layer, encode_q of every
// layer, decode of every layer, the order of the exchange's rounds; the
// sums are the rank's own P and Q, the collectives are not timed) against
// the memory traffic the step must do, at the STREAM triad rate measured in
// the same run.
//
// Traffic counted per gradient element (bytes the step cannot avoid):
//     read the gradient G (4) + read the residual E (4) + write the new
//     residual (4) + write the output (4)                             = 16
// and, without the output, the issue's "read M and the residual, write the
// residual" = 12 (printed too). The kernels really move 28: M = G + E is
// written once (12: read G and E, write M) and read again for Q = M^T P^
// (4: the sum of P lies between), then the last pass reads M and writes E
// and the output (12); the small P and Q stay in cache.
//
//     RESULT powersgd_encode_vs_traffic <ratio> x
// is (16 bytes x n / triad rate) / step time: 1 means the step ran as fast as
// the triad moves its counted bytes. Both are timed in thread CPU time, best
// of interleaved rounds (bench::interleaved_best), so a shared machine's load
// changes hit them alike; the wall-time figures are printed too.
#include <gradcomp/powersgd.hpp>

#include "common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

using namespace gradcomp;

namespace {

struct conv {
  std::size_t out, in, k;
};

// ResNet-18's conv weights (torchvision resnet18), the stem's 7x7 included.
std::vector<conv> resnet18() {
  std::vector<conv> v{{64, 3, 7}};
  auto stage = [&](std::size_t in, std::size_t out, bool down) {
    v.push_back({out, in, 3});
    v.push_back({out, out, 3});
    if (down) v.push_back({out, in, 1});
    v.push_back({out, out, 3});
    v.push_back({out, out, 3});
  };
  stage(64, 64, false);
  stage(64, 128, true);
  stage(128, 256, true);
  stage(256, 512, true);
  return v;
}

}  // namespace

int main() {
  const int repeats = 7;
  const auto shapes = resnet18();
  std::size_t n = 0, pq = 0;
  powersgd_options o;
  o.rank = 2;
  std::vector<powersgd_compressor<bench::policy>> codecs;
  for (const auto& s : shapes) {
    codecs.emplace_back(layer_shape::conv(s.out, s.in, s.k, s.k), o);
    n += codecs.back().size();
    pq += codecs.back().p_length() + codecs.back().q_length();
  }
  const double triad = bench::single_core_header("PowerSGD rank 2, ResNet-18 conv weights", "", n, repeats);
  std::printf("%-40s %12zu layers, %zu floats, P + Q %zu floats (%.1fx smaller)\n", "model", codecs.size(), n, pq,
              double(n) / double(pq));

  std::vector<std::vector<float>> g, out, p, q;
  std::uint64_t seed = 1;
  for (auto& c : codecs) {
    g.push_back(bench::uniform_gradient(c.size()));
    for (auto& v : g.back()) v *= float(1 + (seed++ % 3));
    out.emplace_back(c.size());
    p.emplace_back(c.p_length());
    q.emplace_back(c.q_length());
  }
  auto encode_p = [&] {
    for (std::size_t l = 0; l < codecs.size(); ++l) codecs[l].encode_p(g[l], p[l]);
  };
  auto encode_q = [&] {
    for (std::size_t l = 0; l < codecs.size(); ++l) codecs[l].encode_q(p[l], q[l]);  // one rank: the sum is its own P
  };
  auto decode = [&] {
    for (std::size_t l = 0; l < codecs.size(); ++l) codecs[l].decode(q[l], out[l]);
  };
  const double t_step = bench::best_seconds(repeats, [&] {
    encode_p();
    encode_q();
    decode();
    bench::do_not_optimize(out.back()[7]);
  });
  // The three stages alone (each needs the previous one, untimed, first).
  double t_p = 1e300, t_q = 1e300, t_d = 1e300;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    encode_p();
    auto t1 = std::chrono::steady_clock::now();
    encode_q();
    auto t2 = std::chrono::steady_clock::now();
    decode();
    auto t3 = std::chrono::steady_clock::now();
    t_p = std::min(t_p, std::chrono::duration<double>(t1 - t0).count());
    t_q = std::min(t_q, std::chrono::duration<double>(t2 - t1).count());
    t_d = std::min(t_d, std::chrono::duration<double>(t3 - t2).count());
  }
  // The triad over n floats and the whole step, interleaved, in thread CPU time.
  std::vector<float> ta(n, 0.0f), tb(n, 1.0f), tc(n, 2.0f);
  const auto cpu = bench::interleaved_best(repeats, {[&] {
                                                       float* __restrict a = ta.data();
                                                       const float* __restrict b = tb.data();
                                                       const float* __restrict c = tc.data();
                                                       for (std::size_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
                                                       bench::do_not_optimize(a[n / 2]);
                                                     },
                                                     [&] {
                                                       encode_p();
                                                       encode_q();
                                                       decode();
                                                       bench::do_not_optimize(out.back()[7]);
                                                     }});
  const double triad_cpu = 12.0 * double(n) / cpu[0] / 1e9;
  const double ratio_cpu = (16.0 * double(n) / (triad_cpu * 1e9)) / cpu[1];
  const double floor16 = 16.0 * double(n) / (triad * 1e9), floor12 = 12.0 * double(n) / (triad * 1e9);
  const double moved = 28.0 * double(n);
  std::printf("%-40s %12.3f ms\n", "encode_p (M = G + E, P = M Q)", t_p * 1e3);
  std::printf("%-40s %12.3f ms\n", "encode_q (orthonormalise, Q = M^T P)", t_q * 1e3);
  std::printf("%-40s %12.3f ms\n", "decode (out = P Q^T, E = M - P Q_w^T)", t_d * 1e3);
  std::printf("%-40s %12.3f ms  (load average %.2f)\n", "whole step", t_step * 1e3, bench::load_average());
  std::printf("%-40s %12.3f ms  (16 bytes per element at triad)\n", "traffic floor", floor16 * 1e3);
  bench::row("bytes moved per second (28 per element)", moved / t_step / 1e9, "GB/s", triad, "triad");
  std::printf("%-40s %12.3f    (12 bytes: without the output write)\n", "step vs traffic (12 B), wall", floor12 / t_step);
  std::printf("%-40s %12.3f    (16 bytes)\n", "step vs traffic (16 B), wall", floor16 / t_step);
  std::printf("%-40s %12.4g GB/s, step %.3f ms: ratio %.3f (16 B), %.3f (12 B)\n", "thread CPU time: triad", triad_cpu,
              cpu[1] * 1e3, ratio_cpu, ratio_cpu * 12.0 / 16.0);
  bench::result("powersgd_encode_vs_traffic", ratio_cpu, "x");
  return 0;
}
