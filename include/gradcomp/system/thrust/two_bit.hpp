#pragma once
/// \file system/thrust/two_bit.hpp
/// Thrust (execution::thrust<P>) kernels of two_bit_quantizer (two_bit.hpp,
/// MXNet's two-bit quantization, seed 003). Same words, residuals, maxima and
/// sums as the generic kernels, bit for bit:
///  - quantize and dequantize are element-wise (one work item = a run of
///    whole 32-bit words, so no two items write the same word);
///  - max |r| and max |g| are order-independent maxima of the float bits;
///  - the automatic threshold's sum |r + g| keeps the canonical order of
///    system/generic/two_bit.hpp: each 1024-element block's 16 float lanes
///    are summed in parallel, then the n/64 lane sums are added into a double
///    in index order on the host (a sequential pass over 1/64 of the data).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/system/generic/two_bit.hpp>
#include <gradcomp/system/thrust/common.hpp>
#include <gradcomp/system/thrust/elementwise.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace thrust_detail {

/// two_bit_code_value for host and device.
GRADCOMP_HD inline float two_bit_value(std::uint32_t code, float thr) noexcept {
  return (code & 2u) ? ((code & 1u) ? thr : -thr) : 0.0f;
}

struct max_u32 {
  GRADCOMP_HD std::uint32_t operator()(std::uint32_t a, std::uint32_t b) const { return a < b ? b : a; }
};

/// Prescan of one 1024-element block: max of |g|'s bits and, with a residual,
/// the block's 16 lane sums of |r + g| (lane j: elements j, j + 16, ... in order).
struct two_bit_prescan_blocks {
  const float* g;
  const float* r;  // null: no sum
  std::uint32_t* block_max;
  float* lanes;  // 16 per block (when r)
  std::size_t n;
  GRADCOMP_HD void operator()(std::size_t block) const {
    constexpr std::size_t L = two_bit_lanes;
    const std::size_t start = block * two_bit_block, end = min_size(n, start + two_bit_block);
    std::uint32_t m = 0;
    for (std::size_t i = start; i < end; ++i) {
      const std::uint32_t a = magnitude_key(g[i]);
      m = m < a ? a : m;
    }
    block_max[block] = m;
    if (r == nullptr) return;
    float acc[L] = {};
    std::size_t i = start;
    for (; i + L <= end; i += L)
      for (std::size_t j = 0; j < L; ++j) acc[j] = acc[j] + bits_float(magnitude_key(r[i + j] + g[i + j]));
    for (std::size_t j = 0; i + j < end; ++j) acc[j] = acc[j] + bits_float(magnitude_key(r[i + j] + g[i + j]));
    for (std::size_t j = 0; j < L; ++j) lanes[block * L + j] = acc[j];
  }
};

/// Quantizes words [item * per_item, ...) and records the item's max |r| bits.
struct two_bit_quantize_items {
  const float* g;
  float* r;
  std::uint32_t* words;
  std::uint32_t* item_max;
  std::size_t n, nwords, per_item;
  float thr;

  GRADCOMP_HD static std::uint32_t code_bits(float x, float thr, float& left) noexcept {
    const bool pos = x >= thr;
    const bool neg = x <= -thr;
    const float q = pos ? thr : (neg ? -thr : 0.0f);
    left = x - q;
    return static_cast<std::uint32_t>(pos) | (static_cast<std::uint32_t>(pos | neg) << 1);
  }

  GRADCOMP_HD void operator()(std::size_t item) const {
    std::uint32_t rmax = 0;
    const std::size_t w_end = min_size(nwords, (item + 1) * per_item);
    for (std::size_t w = item * per_item; w < w_end; ++w) {
      const std::size_t base = w * 16;
      const float* gw = g + base;
      float* rw = r + base;
      std::uint32_t word = 0;
      if (base + 16 <= n) {
        for (std::size_t j = 0; j < 16; ++j) {
          float left;
          const std::uint32_t c = code_bits(rw[j] + gw[j], thr, left);
          rw[j] = left;
          const std::uint32_t a = magnitude_key(left);
          rmax = rmax < a ? a : rmax;
          word |= c << (2 * j);
        }
      } else {
        for (std::size_t j = 0; base + j < n; ++j) {
          float left;
          const std::uint32_t c = code_bits(rw[j] + gw[j], thr, left);
          rw[j] = left;
          const std::uint32_t a = magnitude_key(left);
          rmax = rmax < a ? a : rmax;
          word |= c << (2 * j);
        }
      }
      words[w] = word;
    }
    item_max[item] = rmax;
  }
};

/// out[i] (=, or += with Add) the value of code i, for the words of one item.
template <bool Add>
struct two_bit_dequantize_items {
  const std::uint32_t* words;
  float* out;
  std::size_t n, nwords, per_item;
  float thr;
  GRADCOMP_HD void operator()(std::size_t item) const {
    const std::size_t w_end = min_size(nwords, (item + 1) * per_item);
    for (std::size_t w = item * per_item; w < w_end; ++w) {
      const std::uint32_t word = words[w];
      const std::size_t base = w * 16, m = min_size(16, n - base);
      float* o = out + base;
      for (std::size_t j = 0; j < m; ++j) {
        const float v = two_bit_value(word >> (2 * j), thr);
        if constexpr (Add)
          o[j] = o[j] + v;
        else
          o[j] = v;
      }
    }
  }
};

template <class P, bool Add>
void two_bit_dequantize_impl(std::span<const std::uint32_t> words, float thr, std::span<float> out) {
  operand<P, const std::uint32_t> w(words);
  operand<P, float, Add> o(out);
  const std::size_t per = item_elements<P> / 16;
  for_each_index<P>(items(words.size(), per), out.size(),
                    two_bit_dequantize_items<Add>{w.data(), o.data(), out.size(), words.size(), per, thr});
  o.commit();
}

}  // namespace thrust_detail

/// two_bit_prescan with P's system: finiteness and max |g| of the gradient
/// and, when `residual` is not empty, sum |r + g| in the canonical order.
template <class P>
[[nodiscard]] two_bit_prescan_result two_bit_prescan(thrust<P>, std::span<const float> gradient,
                                                    std::span<const float> residual) {
  using namespace thrust_detail;
  const std::size_t n = gradient.size();
  const bool want_sum = !residual.empty();
  operand<P, const float> g(gradient);
  operand<P, const float> r(want_sum ? residual : std::span<const float>());
  const std::size_t blocks = items(n, two_bit_block);
  buffer<P, std::uint32_t> block_max(blocks);
  buffer<P, float> lanes(want_sum ? blocks * two_bit_lanes : 0);
  for_each_index<P>(blocks, n,
                    two_bit_prescan_blocks{g.data(), want_sum ? r.data() : nullptr, block_max.data(), lanes.data(), n});
  const std::uint32_t m = combine_items<P>(block_max.data(), blocks, std::uint32_t{0}, max_u32{});
  if (m >= 0x7F800000u) return {first_non_finite<P>(g.data(), n), 0.0f, 0.0};
  double total = 0.0;
  if (want_sum) {
    std::vector<float> host(lanes.size());
    lanes.copy_to_host(host.data(), host.size());
    for (const float v : host) total += static_cast<double>(v);
  }
  return {n, bits_float(m), total};
}

/// One pass of MXNet's two-bit quantization (seed 003) with P's system:
/// x = r + g; code 11 if x >= thr, 10 if x <= -thr, 00 otherwise; r = x -
/// decoded. Returns max |r| after the update. Preconditions as for seq.
template <class P>
[[nodiscard]] float two_bit_quantize(thrust<P>, std::span<const float> gradient, std::span<float> residual, float thr,
                       std::span<std::uint32_t> words) {
  using namespace thrust_detail;
  const std::size_t n = gradient.size();
  operand<P, const float> g(gradient);
  operand<P, float> r(residual);
  operand<P, std::uint32_t, false> w(words);
  const std::size_t per = item_elements<P> / 16;
  const std::size_t count = items(words.size(), per);
  buffer<P, std::uint32_t> item_max(count);
  for_each_index<P>(count, n,
                    two_bit_quantize_items{g.data(), r.data(), w.data(), item_max.data(), n, words.size(), per, thr});
  const std::uint32_t m = combine_items<P>(item_max.data(), count, std::uint32_t{0}, max_u32{});
  r.commit();
  w.commit();
  return bits_float(m);
}

/// out[i] = value of code i (+thr / -thr / 0).
template <class P>
void two_bit_dequantize(thrust<P>, std::span<const std::uint32_t> words, float thr, std::span<float> out) {
  thrust_detail::two_bit_dequantize_impl<P, false>(words, thr, out);
}

/// out[i] += value of code i (decode-and-sum aggregation).
template <class P>
void two_bit_dequantize_add(thrust<P>, std::span<const std::uint32_t> words, float thr, std::span<float> out) {
  thrust_detail::two_bit_dequantize_impl<P, true>(words, thr, out);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
