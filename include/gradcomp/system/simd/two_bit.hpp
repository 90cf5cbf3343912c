#pragma once
/// \file system/simd/two_bit.hpp
/// xsimd (execution::simd) kernels of two_bit_quantizer. They produce the
/// same words, residuals, maxima and sums as the generic kernels bit for bit:
/// the per-element arithmetic is the same IEEE operations, the word is built
/// with disjoint bits (so the horizontal sum is an OR), and the auto-threshold
/// sum keeps the generic kernel's 16-lane order (16 / batch size batches).

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include <gradcomp/detail/policy_tags.hpp>

#include <xsimd/xsimd.hpp>

#include <gradcomp/system/generic/two_bit.hpp>

// GCC 12 reports -W(maybe-)uninitialized inside its own AVX-512 intrinsics
// (the _mm512_undefined_* placeholders of masked max/extract/shift; GCC bug
// 105593) wherever xsimd inlines them. Spurious: silenced for these kernels.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace two_bit_simd_detail {

using fbatch = xsimd::batch<float>;
using ubatch = xsimd::batch<std::uint32_t>;
inline constexpr std::size_t width = fbatch::size;
static_assert(ubatch::size == width, "float and uint32 batches must have the same lane count");
static_assert(two_bit_lanes % width == 0, "a 16-element word must be a whole number of batches");
inline constexpr std::size_t per_word = two_bit_lanes / width;

/// Lane j of the k-th batch of a word holds element k*width + j: its code bit b
/// (1 = positive, 2 = non-zero) sits at b << 2(k*width + j).
inline ubatch lane_bits(std::size_t k, std::uint32_t b) noexcept {
  alignas(64) std::uint32_t v[width];
  for (std::size_t j = 0; j < width; ++j) v[j] = b << (2 * (k * width + j));
  return ubatch::load_aligned(v);
}

/// All-ones lanes where the mask is set.
inline ubatch mask_bits(const fbatch::batch_bool_type& m) noexcept {
  return xsimd::bitwise_cast<ubatch>(xsimd::bitwise_cast(m));
}

inline float horizontal_max(const fbatch& v) noexcept {
  alignas(64) float lanes[width];
  v.store_aligned(lanes);
  float m = 0.0f;
  for (std::size_t j = 0; j < width; ++j) m = m < lanes[j] ? lanes[j] : m;
  return m;
}

}  // namespace two_bit_simd_detail

/// Vectorised two_bit_prescan (same result as the seq kernel, bit for bit).
[[nodiscard]] inline two_bit_prescan_result two_bit_prescan(simd, std::span<const float> gradient,
                                              std::span<const float> residual) noexcept {
  using namespace two_bit_simd_detail;
  const fbatch max_finite(std::numeric_limits<float>::max());
  const std::size_t n = gradient.size();
  const float* g = gradient.data();
  const float* r = residual.data();
  const bool want_sum = !residual.empty();
  fbatch vmax(0.0f);
  float tail_max = 0.0f;
  double total = 0.0;
  for (std::size_t start = 0; start < n; start += two_bit_block) {
    const std::size_t end = start + two_bit_block < n ? start + two_bit_block : n;
    const std::size_t vec_end = start + (end - start) / width * width;
    fbatch::batch_bool_type finite(true);
    for (std::size_t i = start; i < vec_end; i += width) {
      const fbatch a = xsimd::abs(fbatch::load_unaligned(g + i));
      finite = finite & (a <= max_finite);
      vmax = xsimd::max(vmax, a);
    }
    bool tail_finite = true;
    for (std::size_t i = vec_end; i < end; ++i) {
      const float a = std::fabs(g[i]);
      tail_finite &= (a <= std::numeric_limits<float>::max());
      tail_max = tail_max < a ? a : tail_max;
    }
    if (!xsimd::all(finite) || !tail_finite) {
      for (std::size_t i = start; i < end; ++i)
        if (!(std::fabs(g[i]) <= std::numeric_limits<float>::max())) return {i, 0.0f, 0.0};
    }
    if (want_sum) {
      fbatch acc[per_word];
      for (auto& a : acc) a = fbatch(0.0f);
      std::size_t i = start;
      for (; i + two_bit_lanes <= end; i += two_bit_lanes)
        for (std::size_t k = 0; k < per_word; ++k) {
          const fbatch x = fbatch::load_unaligned(r + i + k * width) + fbatch::load_unaligned(g + i + k * width);
          acc[k] = acc[k] + xsimd::abs(x);
        }
      alignas(64) float lanes[two_bit_lanes];
      for (std::size_t k = 0; k < per_word; ++k) acc[k].store_aligned(lanes + k * width);
      for (std::size_t j = 0; i + j < end; ++j) {
        const float x = r[i + j] + g[i + j];
        lanes[j] = lanes[j] + std::fabs(x);
      }
      for (std::size_t j = 0; j < two_bit_lanes; ++j) total += static_cast<double>(lanes[j]);
    }
  }
  const float vm = horizontal_max(vmax);
  return {n, vm < tail_max ? tail_max : vm, total};
}

/// Vectorised two_bit_quantize: one pass over gradient and residual.
[[nodiscard]] inline float two_bit_quantize(simd, std::span<const float> gradient, std::span<float> residual, float thr,
                              std::span<std::uint32_t> words) noexcept {
  using namespace two_bit_simd_detail;
  const std::size_t n = gradient.size();
  const float* g = gradient.data();
  float* r = residual.data();
  const fbatch pt(thr), nt(-thr), zero(0.0f);
  ubatch pos_bit[per_word], nz_bit[per_word];
  for (std::size_t k = 0; k < per_word; ++k) {
    pos_bit[k] = lane_bits(k, 1u);
    nz_bit[k] = lane_bits(k, 2u);
  }
  fbatch vmax(0.0f);
  const std::size_t full = n / two_bit_lanes;
  for (std::size_t w = 0; w < full; ++w) {
    ubatch acc(0u);
    for (std::size_t k = 0; k < per_word; ++k) {
      const std::size_t i = w * two_bit_lanes + k * width;
      const fbatch x = fbatch::load_unaligned(r + i) + fbatch::load_unaligned(g + i);
      const auto pos = x >= pt;
      const auto neg = x <= nt;
      const fbatch left = x - xsimd::select(pos, pt, xsimd::select(neg, nt, zero));
      left.store_unaligned(r + i);
      vmax = xsimd::max(vmax, xsimd::abs(left));
      acc = acc | (mask_bits(pos) & pos_bit[k]) | (mask_bits(pos | neg) & nz_bit[k]);
    }
    words[w] = xsimd::hadd(acc);  // disjoint bits: the sum is the OR
  }
  const std::size_t done = full * two_bit_lanes;
  const float tail_max = two_bit_quantize(seq{}, gradient.subspan(done), residual.subspan(done), thr,
                                          words.subspan(full));
  const float vm = horizontal_max(vmax);
  return vm < tail_max ? tail_max : vm;
}

namespace two_bit_simd_detail {
/// Lane multipliers 2^(top - 2(k*width + j)): multiplying a broadcast word by
/// them moves lane j's code bit (bit 0 or 1 of its pair) to bit 31. A multiply
/// by a power of two is a per-lane left shift, and avoids xsimd 8.1's integer
/// select, which does not compile for AVX-512 at -O0.
inline ubatch lane_to_top(std::size_t k, unsigned top) noexcept {
  alignas(64) std::uint32_t v[width];
  for (std::size_t j = 0; j < width; ++j) v[j] = std::uint32_t{1} << (top - 2 * (k * width + j));
  return ubatch::load_aligned(v);
}

/// Float bits of the codes of one batch: thr, -thr or +0.
inline ubatch code_values(const ubatch& word, const ubatch& pos_to_top, const ubatch& nz_to_top,
                          const ubatch& thr_bits) noexcept {
  const ubatch sign(0x80000000u);
  const ubatch pos_top = word * pos_to_top;                     // bit 31 = positive bit
  const ubatch nz_all = ubatch(0u) - ((word * nz_to_top) >> 31);  // all ones where non-zero
  return nz_all & (thr_bits | (sign & ~pos_top));
}

/// two_bit_dequantize (Add: two_bit_dequantize_add, out += decoded).
template <bool Add>
void dequantize(std::span<const std::uint32_t> words, float thr, std::span<float> out) noexcept {
  const std::size_t n = out.size();
  float* o = out.data();
  ubatch pos_to_top[per_word], nz_to_top[per_word];
  for (std::size_t k = 0; k < per_word; ++k) {
    pos_to_top[k] = lane_to_top(k, 31);
    nz_to_top[k] = lane_to_top(k, 30);
  }
  const ubatch thr_bits(std::bit_cast<std::uint32_t>(thr));
  const std::size_t full = n / two_bit_lanes;
  for (std::size_t w = 0; w < full; ++w) {
    const ubatch word(words[w]);
    for (std::size_t k = 0; k < per_word; ++k) {
      float* p = o + w * two_bit_lanes + k * width;
      const fbatch v = xsimd::bitwise_cast<fbatch>(code_values(word, pos_to_top[k], nz_to_top[k], thr_bits));
      if constexpr (Add)
        (fbatch::load_unaligned(p) + v).store_unaligned(p);
      else
        v.store_unaligned(p);
    }
  }
  if constexpr (Add)
    two_bit_dequantize_add(seq{}, words.subspan(full), thr, out.subspan(full * two_bit_lanes));
  else
    two_bit_dequantize(seq{}, words.subspan(full), thr, out.subspan(full * two_bit_lanes));
}
}  // namespace two_bit_simd_detail

/// Vectorised two_bit_dequantize.
inline void two_bit_dequantize(simd, std::span<const std::uint32_t> words, float thr, std::span<float> out) noexcept {
  two_bit_simd_detail::dequantize<false>(words, thr, out);
}

/// Vectorised two_bit_dequantize_add (out += decoded).
inline void two_bit_dequantize_add(simd, std::span<const std::uint32_t> words, float thr,
                                   std::span<float> out) noexcept {
  two_bit_simd_detail::dequantize<true>(words, thr, out);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
