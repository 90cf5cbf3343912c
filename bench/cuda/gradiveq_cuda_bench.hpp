#pragma once
// Shared by bench_thrust_cuda.cu and gradiveq_cuda_bench.cu: a wall-clock
// timer, and GradiVeQ's encode/decode under seq and thrust_cuda (in a file of
// its own because gradiveq.hpp pulls in Eigen, whose headers draw nvcc
// diagnostics that CMakeLists.txt silences for that file only).
#include <algorithm>
#include <chrono>
#include <vector>

namespace gradcomp_bench {

/// Best wall time (seconds) of fn over `repeats` runs after one warm-up.
template <class Fn>
double best_wall_seconds(int repeats, Fn&& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

struct gradiveq_times {
  double seq_encode = 0.0, cuda_encode = 0.0, seq_decode = 0.0, cuda_decode = 0.0;
  bool close = false;  ///< thrust_cuda's coefficients and decode within float rounding of seq's
};

/// linear_compressor (slices of 64, d capped at 8) fitted on 4 samples, then
/// timed encoding and decoding `g` under seq and thrust_cuda.
gradiveq_times time_gradiveq(const std::vector<float>& g, int repeats);

}  // namespace gradcomp_bench
