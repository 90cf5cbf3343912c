#pragma once
/// \file system/simd/elementwise.hpp
/// xsimd (execution::simd) overloads of the element-wise kernels. Results are
/// bit-identical to the generic ones: every operation is element-wise.

#include <cstddef>
#include <limits>
#include <span>

#include <gradcomp/detail/policy_tags.hpp>

#include <xsimd/xsimd.hpp>

#include <gradcomp/system/generic/elementwise.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// acc[i] += x[i], vectorised.
inline void add_into(simd, std::span<float> acc, std::span<const float> x) noexcept {
  using batch = xsimd::batch<float>;
  constexpr std::size_t width = batch::size;
  const std::size_t n = acc.size();
  const std::size_t vec_end = n - n % width;
  float* a = acc.data();
  const float* b = x.data();
  for (std::size_t i = 0; i < vec_end; i += width) {
    (xsimd::load_unaligned(a + i) + xsimd::load_unaligned(b + i)).store_unaligned(a + i);
  }
  for (std::size_t i = vec_end; i < n; ++i) a[i] += b[i];
}

/// Index of the first NaN or infinity in x, or x.size(); vectorised scan.
[[nodiscard]] inline std::size_t find_non_finite(simd, std::span<const float> x) noexcept {
  using batch = xsimd::batch<float>;
  constexpr std::size_t width = batch::size;
  const batch max_finite(std::numeric_limits<float>::max());
  const std::size_t n = x.size();
  const std::size_t vec_end = n - n % width;
  for (std::size_t i = 0; i < vec_end; i += width) {
    // abs(NaN) <= max is false, so NaN and +-Inf both fail the test.
    if (!xsimd::all(xsimd::abs(xsimd::load_unaligned(x.data() + i)) <= max_finite))
      return i + find_non_finite(seq{}, x.subspan(i, width));
  }
  return vec_end + find_non_finite(seq{}, x.subspan(vec_end));
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
