#pragma once
/// \file system/simd/topk.hpp
/// xsimd (execution::simd) overloads of the top-k selection kernels. They
/// select exactly what the generic kernels select (integer key comparisons)
/// and scale with the same float multiplications, so results are identical.
/// The collecting scans test a whole batch at once and only look at single
/// lanes in the rare batches holding a candidate. The histogram pass has no
/// simd overload: the generic scalar one is faster (see generic/topk.hpp).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include <gradcomp/detail/policy_tags.hpp>

#include <xsimd/xsimd.hpp>

#include <gradcomp/system/generic/topk.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace topk_simd_detail {

using fbatch = xsimd::batch<float>;
using ibatch = xsimd::batch<std::int32_t>;
inline constexpr std::size_t width = fbatch::size;
static_assert(width <= 32, "lane masks are 32-bit");

// Comparing register types like __m128i in std::is_same_v drops their
// vector attributes, which GCC reports (-Wignored-attributes); the comparison
// itself is what we want.
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
#endif
/// Bit j set when lane j of m is true.
template <class T, class A>
inline std::uint32_t lane_bits(const xsimd::batch_bool<T, A>& m) noexcept {
  using reg = typename xsimd::batch_bool<T, A>::register_type;
  if constexpr (std::is_integral_v<reg>) {  // AVX-512 mask register
    return static_cast<std::uint32_t>(m.data);
  }
#if defined(__AVX__)
  else if constexpr (std::is_same_v<reg, __m256>) {
    return static_cast<std::uint32_t>(_mm256_movemask_ps(m.data));
  } else if constexpr (std::is_same_v<reg, __m256i>) {
    return static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(m.data)));
  }
#endif
#if defined(__SSE2__)
  else if constexpr (std::is_same_v<reg, __m128>) {
    return static_cast<std::uint32_t>(_mm_movemask_ps(m.data));
  } else if constexpr (std::is_same_v<reg, __m128i>) {
    return static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(m.data)));
  }
#endif
  else {
    constexpr std::size_t lanes = xsimd::batch_bool<T, A>::size;
    alignas(64) bool b[lanes];
    m.store_aligned(b);
    std::uint32_t bits = 0;
    for (std::size_t j = 0; j < lanes; ++j) bits |= std::uint32_t(b[j]) << j;
    return bits;
  }
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/// Keys (bits of |v|) of a batch, as signed 32-bit integers (all >= 0).
inline ibatch keys_of(const fbatch& v) noexcept {
  return xsimd::bitwise_cast<ibatch>(v) & ibatch(0x7FFFFFFF);
}

/// Vectorised form of topk_detail::collect: take key > t, or key == t while
/// need_eq > 0; with Scale multiply the rest by s.
template <bool Scale, class T>
void collect(std::span<T> x, std::uint32_t t, std::size_t need_eq, float s, std::vector<std::uint32_t>& out) {
  const std::size_t n = x.size();
  const std::size_t vec_end = n - n % width;
  const ibatch tb(static_cast<std::int32_t>(t));
  const fbatch sb(s);
  T* p = x.data();
  auto scalar = [&](std::size_t i) {
    const std::uint32_t key = topk_key(p[i]);
    bool take = key > t;
    if (key == t && need_eq > 0) {
      take = true;
      --need_eq;
    }
    if (take) {
      out.push_back(static_cast<std::uint32_t>(i));
    } else if constexpr (Scale) {
      p[i] = p[i] * s;
    }
  };
  for (std::size_t i = 0; i < vec_end; i += width) {
    const fbatch v = xsimd::load_unaligned(p + i);
    const auto hit = keys_of(v) >= tb;
    if (!xsimd::any(hit)) {
      if constexpr (Scale) (v * sb).store_unaligned(p + i);
      continue;
    }
    if constexpr (Scale) {
      for (std::size_t j = 0; j < width; ++j) scalar(i + j);
    } else {
      for (std::uint32_t bits = lane_bits(hit); bits != 0; bits &= bits - 1)
        scalar(i + static_cast<std::size_t>(std::countr_zero(bits)));
    }
  }
  for (std::size_t i = vec_end; i < n; ++i) scalar(i);
}

}  // namespace topk_simd_detail

/// Vectorised topk_scale_unselected: multiplies the runs between selected indices.
inline void topk_scale_unselected(simd, std::span<float> y, std::span<const std::uint32_t> selected, float s) {
  using namespace topk_simd_detail;
  const fbatch sb(s);
  float* p = y.data();
  auto scale_range = [&](std::size_t begin, std::size_t end) {
    std::size_t i = begin;
    for (; i + width <= end; i += width) (xsimd::load_unaligned(p + i) * sb).store_unaligned(p + i);
    for (; i < end; ++i) p[i] = p[i] * s;
  };
  std::size_t from = 0;
  for (std::uint32_t i : selected) {
    scale_range(from, i);
    from = std::size_t{i} + 1;
  }
  scale_range(from, y.size());
}

/// Vectorised topk_collect_ge.
inline void topk_collect_ge(simd, std::span<const float> x, std::uint32_t key_lo, std::vector<std::uint32_t>& out) {
  if (key_lo == 0) {
    topk_collect_ge(seq{}, x, key_lo, out);
    return;
  }
  topk_simd_detail::collect<false>(x, key_lo - 1, 0, 1.0f, out);
}

/// Vectorised topk_collect_ge_scale_rest.
inline void topk_collect_ge_scale_rest(simd, std::span<float> x, std::uint32_t key_lo, float s,
                                       std::vector<std::uint32_t>& out) {
  if (key_lo == 0) {
    topk_collect_ge_scale_rest(seq{}, x, key_lo, s, out);
    return;
  }
  topk_simd_detail::collect<true>(x, key_lo - 1, 0, s, out);
}

/// Vectorised topk_collect_final.
inline void topk_collect_final(simd, std::span<const float> x, std::uint32_t t, std::size_t need_eq,
                               std::vector<std::uint32_t>& out) {
  topk_simd_detail::collect<false>(x, t, need_eq, 1.0f, out);
}

/// Vectorised topk_collect_final_scale_rest.
inline void topk_collect_final_scale_rest(simd, std::span<float> x, std::uint32_t t, std::size_t need_eq, float s,
                                          std::vector<std::uint32_t>& out) {
  topk_simd_detail::collect<true>(x, t, need_eq, s, out);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
