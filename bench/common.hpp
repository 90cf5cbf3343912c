#pragma once
// Shared helpers for the bench_* executables: timing (wall and CPU clocks),
// same-run baselines (stream triad, memcpy), machine load, the policy the
// benches run, counter-based hashing, and the `RESULT <name> <value> <unit>`
// lines. Benches measure; they never assert a speed.

#include <gradcomp/detail/random.hpp>
#include <gradcomp/execution.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <time.h>

#if defined(GRADCOMP_HAS_XSIMD)
#include <xsimd/xsimd.hpp>
#endif

namespace gradcomp::bench {

using clock = std::chrono::steady_clock;

/// Best (minimum) wall time in seconds of `fn` over `repeats` runs after one warm-up run.
/// The minimum is the least noisy estimate on a shared 2-core machine.
inline double best_seconds(int repeats, const std::function<void()>& fn) {
  fn();
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = clock::now();
    fn();
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    best = std::min(best, s);
  }
  return best;
}

/// n floats ~ Normal(0, sigma) from the counter RNG (Box-Muller), the same for a seed everywhere.
inline std::vector<float> normal_floats(std::size_t n, std::uint64_t seed, float sigma) {
  const auto s = gradcomp::detail::counter_rng(seed).stream(0);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double u1 = 1.0 - s.uniform_double(2 * i), u2 = s.uniform_double(2 * i + 1);
    v[i] = sigma * static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return v;
}

/// Keeps the optimiser from deleting a computation whose result is unused.
template <class T>
inline void do_not_optimize(const T& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

/// STREAM triad a[i] = b[i] + s*c[i] on one core; returns GB/s counting
/// 3 x 4 bytes per element (two reads, one write), as STREAM does.
inline double stream_triad_gbps(std::size_t n = std::size_t{1} << 25, int repeats = 5) {
  std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  const float s = 3.0f;
  const double t = best_seconds(repeats, [&] {
    float* __restrict pa = a.data();
    const float* __restrict pb = b.data();
    const float* __restrict pc = c.data();
    for (std::size_t i = 0; i < n; ++i) pa[i] = pb[i] + s * pc[i];
    do_not_optimize(pa[n / 2]);
  });
  return 3.0 * sizeof(float) * double(n) / t / 1e9;
}

/// memcpy bandwidth in GB/s counting the bytes copied once (as the ring's
/// "algorithm bandwidth" counts the gradient's bytes once).
inline double memcpy_gbps(std::size_t bytes = std::size_t{64} << 20, int repeats = 5) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const double t = best_seconds(repeats, [&] {
    std::memcpy(dst.data(), src.data(), bytes);
    do_not_optimize(dst[bytes / 2]);
  });
  return double(bytes) / t / 1e9;
}

/// CPU time of the calling thread in seconds: unlike the wall clock it does not
/// count the time the thread waits for a core, so on a shared machine it shows
/// what the code costs when it runs (memory contention from other jobs still shows).
inline double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

/// CPU time of the whole process (all its threads) in seconds.
inline double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

/// Best (minimum) thread CPU time in seconds of `fn` over `repeats` runs after one warm-up run.
template <class F>
double best_cpu_seconds(int repeats, F&& fn) {
  fn();
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = thread_cpu_seconds();
    fn();
    best = std::min(best, thread_cpu_seconds() - t0);
  }
  return best;
}

/// Best thread CPU time of each function over `rounds` interleaved rounds
/// (after one warm-up each): interleaving spreads the machine's load changes
/// over all the candidates alike. `before` (if set) runs, untimed, before
/// each timed call (for example to evict the caches).
inline std::vector<double> interleaved_best(int rounds, const std::vector<std::function<void()>>& fns,
                                            const std::function<void()>& before = {}) {
  std::vector<double> best(fns.size(), 1e300);
  for (const auto& f : fns) f();
  for (int r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < fns.size(); ++i) {
      if (before) before();
      const double t0 = thread_cpu_seconds();
      fns[i]();
      best[i] = std::min(best[i], thread_cpu_seconds() - t0);
    }
  return best;
}

/// The STREAM triad of stream_triad_gbps timed in thread CPU time (GB/s, 12 bytes per element).
inline double stream_triad_cpu_gbps(std::size_t n, int repeats) {
  std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  const double t = best_cpu_seconds(repeats, [&] {
    float* __restrict pa = a.data();
    const float* __restrict pb = b.data();
    const float* __restrict pc = c.data();
    for (std::size_t i = 0; i < n; ++i) pa[i] = pb[i] + 3.0f * pc[i];
    do_not_optimize(pa[n / 2]);
  });
  return 12.0 * double(n) / t / 1e9;
}

/// The 1-minute load average (/proc/loadavg; 0 if unreadable), printed next to figures taken on a shared machine.
inline double load_average() {
  double l = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = 0;
    std::fclose(f);
  }
  return l;
}

/// The CPU policy the benches measure: the xsimd kernels when configured, else seq.
#if defined(GRADCOMP_HAS_XSIMD)
using policy = gradcomp::execution::simd;
inline constexpr const char* policy_name = "simd";
#else
using policy = gradcomp::execution::seq;
inline constexpr const char* policy_name = "seq";
#endif

/// splitmix64 step (the golden-ratio increment, then the Mix13 finaliser): a
/// counter-based hash for synthetic data.
inline std::uint64_t splitmix(std::uint64_t z) { return gradcomp::detail::mix64(z + 0x9E3779B97F4A7C15ull); }

/// Prints a one-core kernel bench's first lines: "<what>, n = <n> floats,
/// <setup>one core, " and the xsimd batch width (or that there is no xsimd),
/// then the STREAM triad over n floats (the same-run baseline), which it returns.
inline double single_core_header(const char* what, const char* setup, std::size_t n, int repeats) {
#if defined(GRADCOMP_HAS_XSIMD)
  std::printf("%s, n = %zu floats, %sone core, xsimd batch of %zu floats\n", what, n, setup,
              xsimd::batch<float>::size);
#else
  std::printf("%s, n = %zu floats, %sone core, no xsimd (simd = seq)\n", what, n, setup);
#endif
  const double triad = stream_triad_gbps(n, repeats);
  std::printf("%-40s %12.4g GB/s\n", "stream triad (baseline)", triad);
  return triad;
}

/// n gradient values ~ U(-1e-3, 1e-3), the scale of a small CNN's gradients
/// (stream 0 of counter_rng(1)).
inline std::vector<float> uniform_gradient(std::size_t n) {
  std::vector<float> g(n);
  const auto s = gradcomp::detail::counter_rng(1).stream(0);
  for (std::size_t i = 0; i < n; ++i) g[i] = (2.0f * s.uniform_float(i) - 1.0f) * 1e-3f;
  return g;
}

/// Prints the headline line the bench harness collects.
inline void result(const std::string& name, double value, const std::string& unit) {
  std::printf("RESULT %s %.6g %s\n", name.c_str(), value, unit.c_str());
  std::fflush(stdout);
}

/// Prints a human-readable row: name, measured value, baseline, ratio.
inline void row(const std::string& name, double value, const std::string& unit, double baseline, const char* vs) {
  std::printf("%-40s %12.4g %-6s  (%s %.4g, ratio %.3f)\n", name.c_str(), value, unit.c_str(), vs, baseline,
              baseline > 0 ? value / baseline : 0.0);
}

}  // namespace gradcomp::bench
