#pragma once
/// \file system/generic/elementwise.hpp
/// Generic (execution::seq) element-wise kernels shared by codecs and drivers.
/// They are the fallback for every policy; see execution.hpp for dispatch.

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>

#include <gradcomp/detail/policy_tags.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// acc[i] += x[i]. Sizes are checked by the caller.
inline void add_into(seq, std::span<float> acc, std::span<const float> x) noexcept {
  float* a = acc.data();
  const float* b = x.data();
  const std::size_t n = acc.size();
  for (std::size_t i = 0; i < n; ++i) a[i] += b[i];
}

/// Index of the first NaN or infinity in x, or x.size() when all are finite.
[[nodiscard]] inline std::size_t find_non_finite(seq, std::span<const float> x) noexcept {
  // Scan in blocks with a branch-free test so the common (all finite) case
  // vectorises; only a block that fails is searched element by element.
  constexpr std::size_t block = 1024;
  const float max_finite = std::numeric_limits<float>::max();
  for (std::size_t start = 0; start < x.size(); start += block) {
    const std::size_t end = start + block < x.size() ? start + block : x.size();
    bool all_finite = true;
    for (std::size_t i = start; i < end; ++i) all_finite &= (std::fabs(x[i]) <= max_finite);
    if (!all_finite) {
      for (std::size_t i = start; i < end; ++i)
        if (!(std::fabs(x[i]) <= max_finite)) return i;
    }
  }
  return x.size();
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
