#pragma once
/// \file system/generic/two_bit.hpp
/// Generic (execution::seq) kernels of two_bit_quantizer (two_bit.hpp).
///
/// Bit order (docs/codecs.md): element i lives in 32-bit word i / 16, at bits
/// 2j (the "positive" bit) and 2j+1 (the "non-zero" bit), j = i % 16. So the
/// 2-bit code read as a number is 0b11 for +thr, 0b10 for -thr, 0b00 for 0,
/// the MXNet codes; 0b01 never occurs. Words are little-endian on the wire.
///
/// Every kernel here is element-wise or an order-independent max, except the
/// auto-threshold sum, which uses a fixed lane order (16 float lanes per block
/// of 1024 elements, lanes then blocks summed in index order into a double),
/// so the simd kernels reproduce these results bit for bit.

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include <gradcomp/detail/policy_tags.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// What the scan before a two-bit encode found.
struct two_bit_prescan_result {
  std::size_t first_non_finite;  ///< index of the first NaN/Inf in the gradient, or its size
  float max_abs_gradient;        ///< max |g_i| (meaningful only when all are finite)
  double sum_abs_accumulated;    ///< sum |r_i + g_i| in the canonical order (0 when r is empty)
};

/// Elements per block of the canonical reduction (and of the non-finite scan).
inline constexpr std::size_t two_bit_block = 1024;
/// Float lanes of the canonical reduction: element i adds into lane i % 16.
inline constexpr std::size_t two_bit_lanes = 16;

/// Scan before encoding: finiteness and max |g| of the gradient and, when
/// `residual` is not empty (automatic threshold), sum |r + g|. Reads g (and r)
/// once; changes nothing.
[[nodiscard]] inline two_bit_prescan_result two_bit_prescan(seq, std::span<const float> gradient,
                                              std::span<const float> residual) noexcept {
  const float max_finite = std::numeric_limits<float>::max();
  const std::size_t n = gradient.size();
  const float* g = gradient.data();
  const float* r = residual.data();
  const bool want_sum = !residual.empty();
  float gmax = 0.0f;
  double total = 0.0;
  for (std::size_t start = 0; start < n; start += two_bit_block) {
    const std::size_t end = start + two_bit_block < n ? start + two_bit_block : n;
    bool finite = true;
    float bmax = 0.0f;
    for (std::size_t i = start; i < end; ++i) {
      const float a = std::fabs(g[i]);
      finite &= (a <= max_finite);
      bmax = bmax < a ? a : bmax;
    }
    if (!finite) {
      for (std::size_t i = start; i < end; ++i)
        if (!(std::fabs(g[i]) <= max_finite)) return {i, 0.0f, 0.0};
    }
    gmax = gmax < bmax ? bmax : gmax;
    if (want_sum) {
      float acc[two_bit_lanes] = {};
      std::size_t i = start;
      for (; i + two_bit_lanes <= end; i += two_bit_lanes)
        for (std::size_t j = 0; j < two_bit_lanes; ++j) {
          const float x = r[i + j] + g[i + j];
          acc[j] = acc[j] + std::fabs(x);
        }
      for (std::size_t j = 0; i + j < end; ++j) {
        const float x = r[i + j] + g[i + j];
        acc[j] = acc[j] + std::fabs(x);
      }
      for (std::size_t j = 0; j < two_bit_lanes; ++j) total += static_cast<double>(acc[j]);
    }
  }
  return {n, gmax, total};
}

/// One pass of MXNet's two-bit quantization (seed 003, "Two Bit Quantization"):
/// x = r + g; code 11 if x >= thr, 10 if x <= -thr, 00 otherwise; r = x - decoded.
/// `words` has (n + 15) / 16 entries and is fully overwritten. Returns max |r|
/// after the update (order-independent, so every policy returns the same).
/// The caller guarantees finite inputs with |g| + |r| <= FLT_MAX and thr > 0.
[[nodiscard]] inline float two_bit_quantize(seq, std::span<const float> gradient, std::span<float> residual, float thr,
                              std::span<std::uint32_t> words) noexcept {
  const std::size_t n = gradient.size();
  const float* g = gradient.data();
  float* r = residual.data();
  // max |r| is tracked on the float bits: for non-negative floats the integer
  // order is the value order, and an integer max reduction vectorises.
  std::uint32_t rmax_bits = 0;
  const std::size_t full = n / 16;
  for (std::size_t w = 0; w < full; ++w) {
    const float* gw = g + w * 16;
    float* rw = r + w * 16;
    std::uint32_t word = 0;
    for (std::size_t j = 0; j < 16; ++j) {
      const float x = rw[j] + gw[j];
      const bool pos = x >= thr;
      const bool neg = x <= -thr;
      const float q = pos ? thr : (neg ? -thr : 0.0f);
      const float left = x - q;
      rw[j] = left;
      const std::uint32_t a = std::bit_cast<std::uint32_t>(left) & 0x7FFFFFFFu;
      rmax_bits = rmax_bits < a ? a : rmax_bits;
      word |= (static_cast<std::uint32_t>(pos) | (static_cast<std::uint32_t>(pos | neg) << 1)) << (2 * j);
    }
    words[w] = word;
  }
  if (full < words.size()) {
    std::uint32_t word = 0;
    for (std::size_t i = full * 16; i < n; ++i) {
      const float x = r[i] + g[i];
      const bool pos = x >= thr;
      const bool neg = x <= -thr;
      const float q = pos ? thr : (neg ? -thr : 0.0f);
      const float left = x - q;
      r[i] = left;
      const std::uint32_t a = std::bit_cast<std::uint32_t>(left) & 0x7FFFFFFFu;
      rmax_bits = rmax_bits < a ? a : rmax_bits;
      word |= (static_cast<std::uint32_t>(pos) | (static_cast<std::uint32_t>(pos | neg) << 1)) << (2 * (i % 16));
    }
    words[full] = word;
  }
  return std::bit_cast<float>(rmax_bits);
}

/// The value of one 2-bit code: +thr, -thr or 0.
inline float two_bit_code_value(std::uint32_t code, float thr) noexcept {
  return (code & 2u) ? ((code & 1u) ? thr : -thr) : 0.0f;
}

/// out[i] = value of code i (+thr / -thr / 0). words.size() == (out.size() + 15) / 16.
inline void two_bit_dequantize(seq, std::span<const std::uint32_t> words, float thr, std::span<float> out) noexcept {
  const std::size_t n = out.size();
  float* o = out.data();
  const std::size_t full = n / 16;
  for (std::size_t w = 0; w < full; ++w) {
    const std::uint32_t word = words[w];
    for (std::size_t j = 0; j < 16; ++j) o[w * 16 + j] = two_bit_code_value(word >> (2 * j), thr);
  }
  for (std::size_t i = full * 16; i < n; ++i) o[i] = two_bit_code_value(words[full] >> (2 * (i % 16)), thr);
}

/// out[i] += value of code i (decode-and-sum aggregation).
inline void two_bit_dequantize_add(seq, std::span<const std::uint32_t> words, float thr,
                                   std::span<float> out) noexcept {
  const std::size_t n = out.size();
  float* o = out.data();
  const std::size_t full = n / 16;
  for (std::size_t w = 0; w < full; ++w) {
    const std::uint32_t word = words[w];
    for (std::size_t j = 0; j < 16; ++j) o[w * 16 + j] = o[w * 16 + j] + two_bit_code_value(word >> (2 * j), thr);
  }
  for (std::size_t i = full * 16; i < n; ++i)
    o[i] = o[i] + two_bit_code_value(words[full] >> (2 * (i % 16)), thr);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
