// Thrust backend throughput: two-bit encode, QSGD encode and one SAMomentum
// step under execution::thrust_omp (Thrust's OpenMP system) on 2 threads,
// against execution::seq (the baseline of every ratio) and execution::simd
// in the same run; thrust_omp on 1 thread and thrust_cpp show what the
// Thrust formulation itself costs. Results are bit-identical across the
// policies (tests/unit/test_thrust_backend.cpp); this bench checks the
// payloads agree once more and only measures.
//
// Wall time, best of `repeats` after a warm-up (the time a multi-threaded
// policy takes is wall time). The same run measures an OpenMP STREAM triad
// on 1 and 2 threads: these encoders move about as many bytes per element
// as the triad, so its 2-thread gain bounds theirs. The machine is shared:
// the load average is printed before and after, and OpenMP's default
// (active) waiting suffers badly when other jobs hold the cores -- set
// OMP_WAIT_POLICY=passive to see the difference.
//
//   build/bench/bench_thrust [n]        n floats per layer (default 2^23)

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gradcomp/detail/random.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/samomentum.hpp>
#include <gradcomp/two_bit.hpp>
#include <gradcomp/wire.hpp>

#include <omp.h>

#include "common.hpp"

using namespace gradcomp;
namespace ex = gradcomp::execution;

namespace {

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

struct variant {
  const char* name = "";
  double seconds = 0.0;
  std::vector<std::byte> first_payload;
};

// Best wall time of one codec.encode under Policy; `threads` sets OpenMP's
// team size for the thrust_omp runs (0: leave it).
template <class Codec>
variant time_encode(const char* name, Codec codec, const std::vector<float>& g, int repeats, int threads) {
  if (threads > 0) omp_set_num_threads(threads);
  variant v;
  v.name = name;
  typename Codec::payload_type p;
  codec.encode(g, p);
  v.first_payload = wire::serialize(p);
  v.seconds = bench::best_seconds(repeats, [&] {
    codec.encode(g, p);
    bench::do_not_optimize(p);
  });
  return v;
}

// Prints the rows of one codec and returns seq time / thrust_omp(2) time.
double report(const char* codec, const std::vector<variant>& vs, std::size_t n) {
  const double seq = vs[0].seconds;
  double omp2 = 0.0;
  std::printf("%s, %zu floats:\n", codec, n);
  for (const auto& v : vs) {
    const bool same = v.first_payload == vs[0].first_payload;
    std::printf("  %-26s %9.3f ms  %7.3f Gfloat/s  speedup vs seq %6.3f x  %s\n", v.name, 1e3 * v.seconds,
                double(n) / v.seconds / 1e9, seq / v.seconds, same ? "" : "PAYLOAD DIFFERS FROM SEQ");
    if (std::string(v.name) == "thrust_omp, 2 threads") omp2 = v.seconds;
  }
  return seq / omp2;
}

// STREAM triad with an OpenMP team of `threads`: the machine's memory
// bandwidth ceiling for 1 and 2 threads, measured in the same run.
double omp_triad_gbps(std::size_t n, int threads, int repeats) {
  omp_set_num_threads(threads);
  std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  float* pa = a.data();
  const float* pb = b.data();
  const float* pc = c.data();
  const auto count = static_cast<std::ptrdiff_t>(n);
  const double t = bench::best_seconds(repeats, [&] {
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < count; ++i) pa[i] = pb[i] + 3.0f * pc[i];
    bench::do_not_optimize(pa[n / 2]);
  });
  omp_set_num_threads(2);
  return 12.0 * double(n) / t / 1e9;
}

template <class Make>
std::vector<variant> all_policies(Make make, const std::vector<float>& g, int repeats) {
  std::vector<variant> vs;
  vs.push_back(time_encode("seq", make.template operator()<ex::seq>(), g, repeats, 0));
  vs.push_back(time_encode(ex::simd_available ? "simd" : "simd (= seq, no xsimd)", make.template operator()<ex::simd>(),
                           g, repeats, 0));
  vs.push_back(time_encode("thrust_omp, 2 threads", make.template operator()<ex::thrust_omp>(), g, repeats, 2));
  vs.push_back(time_encode("thrust_omp, 1 thread", make.template operator()<ex::thrust_omp>(), g, repeats, 1));
  vs.push_back(time_encode("thrust_cpp", make.template operator()<ex::thrust_cpp>(), g, repeats, 0));
  omp_set_num_threads(2);
  return vs;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{1} << 23;
  const int repeats = 9;
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  std::printf("Thrust OpenMP backend vs seq and simd; load average before: %s; OMP_WAIT_POLICY=%s\n",
              load_average().c_str(), wait ? wait : "(unset: active)");
  const auto g = bench::normal_floats(n, 1, 1e-3f);
  const double triad1 = omp_triad_gbps(n, 1, repeats), triad2 = omp_triad_gbps(n, 2, repeats);
  std::printf("baseline: OpenMP STREAM triad %.1f GB/s on 1 thread, %.1f GB/s on 2 threads (x %.2f)\n", triad1, triad2,
              triad2 / triad1);

  const double two_bit = report(
      "two-bit encode (fixed threshold 1e-3)",
      all_policies([n]<class P>() { return two_bit_quantizer<P>(n, two_bit_options::fixed(1e-3f)); }, g, repeats), n);
  const double q = report("QSGD encode (4 bits, buckets of 512)",
                          all_policies(
                              []<class P>() {
                                return qsgd<P>(qsgd_options{4, 0, 512, 7});
                              },
                              g, repeats),
                          n);
  sa_momentum_options so;
  so.ratio_percent = 1.0;
  so.momentum = 0.7f;
  so.learning_rate = 0.1f;
  const double sam = report("SAMomentum step (R = 1%, exact top-k)",
                            all_policies([&]<class P>() { return sa_momentum<P>(n, so); }, g, repeats), n);

  std::printf("load average after: %s\n", load_average().c_str());
  bench::result("thrust_omp_qsgd_vs_seq", q, "x");
  bench::result("thrust_omp_samomentum_vs_seq", sam, "x");
  bench::result("thrust_omp_two_bit_vs_seq", two_bit, "x");
  return 0;
}
