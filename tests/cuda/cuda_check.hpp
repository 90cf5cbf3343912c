#pragma once
// Helpers shared by the CUDA check program (tests/cuda).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <gradcomp/detail/random.hpp>

namespace cuda_check {

inline int failures = 0;

inline void expect(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAIL: %s\n", what);
    ++failures;
  }
}

inline std::vector<float> normal_floats(std::size_t n, std::uint64_t seed) {
  const auto s = gradcomp::detail::counter_rng(seed).stream(0);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double u1 = 1.0 - s.uniform_double(2 * i), u2 = s.uniform_double(2 * i + 1);
    v[i] = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return v;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// Runs linear_compressor<thrust_cuda> next to linear_compressor<seq> (cuda_gradiveq.cu).
void compare_gradiveq();
/// Runs powersgd_compressor<thrust_cuda> next to powersgd_compressor<seq> (cuda_powersgd.cu).
void compare_powersgd();
/// Runs nn1d::cuda::device_sequential next to nn1d::sequential::infer (cuda_nn1d.cu).
void compare_nn1d();
/// Runs lgc_device_network next to lgc_network's encode and decode (cuda_nn1d.cu).
void compare_lgc();

}  // namespace cuda_check
