#pragma once
// Shared helpers for the bench_* executables: timing, same-run baselines
// (stream triad, memcpy), and the `RESULT <name> <value> <unit>` lines.
// Benches measure; they never assert a speed.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

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
