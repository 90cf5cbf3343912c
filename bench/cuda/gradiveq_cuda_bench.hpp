#pragma once
// GradiVeQ's encode/decode under seq and thrust_cuda for bench_thrust_cuda
// (in a file of its own because gradiveq.hpp pulls in Eigen, whose headers
// draw nvcc diagnostics that CMakeLists.txt silences for that file only).
#include <vector>

namespace gradcomp_bench {

struct gradiveq_times {
  double seq_encode = 0.0, cuda_encode = 0.0, seq_decode = 0.0, cuda_decode = 0.0;
  bool close = false;  ///< thrust_cuda's coefficients and decode within float rounding of seq's
};

/// linear_compressor (slices of 64, d capped at 8) fitted on 4 samples, then
/// timed encoding and decoding `g` under seq and thrust_cuda.
gradiveq_times time_gradiveq(const std::vector<float>& g, int repeats);

}  // namespace gradcomp_bench
