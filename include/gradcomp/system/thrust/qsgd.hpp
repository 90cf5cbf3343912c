#pragma once
/// \file system/thrust/qsgd.hpp
/// Thrust (execution::thrust<P>) kernels of the QSGD codec (qsgd.hpp; QSGD
/// eq. 3.1, Alistarh et al. 2017, ref. [24] of seed 002). Same norms and words
/// as the generic kernels, bit for bit:
///  - pass 1, one work item per run of buckets: the scan and norm. On the host
///    this calls the generic qsgd_bucket_scan / qsgd_finish_norm themselves
///    (their fixed 16-lane order is what makes every policy's norms equal);
///    parallelism is across buckets, so one huge bucket runs on one thread;
///  - pass 2, one work item per run of 16-word blocks of the code layout
///    (system/generic/qsgd.hpp): every element's code, with the random draw
///    counter_stream(key).uniform_float(i) (counter-based, so the item that
///    draws it does not matter), packed into whole words;
///  - decode is element-wise.
/// When pass 1 finds a bad bucket, the first one in index order is reported,
/// as seq does.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/system/generic/qsgd.hpp>
#include <gradcomp/system/thrust/common.hpp>
#include <gradcomp/system/thrust/elementwise.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace thrust_detail {

/// Where element e's code lives (qsgd_slot_of with a compile-time width).
template <unsigned Bits>
struct qsgd_layout {
  static constexpr std::size_t rows = 32 / Bits;
  static constexpr std::size_t block = qsgd_lanes * rows;  // elements per 16-word block
  GRADCOMP_HD static std::size_t word_of(std::size_t e) noexcept {
    return qsgd_lanes * (e / block) + (e % block) % qsgd_lanes;
  }
  GRADCOMP_HD static unsigned shift_of(std::size_t e) noexcept {
    return static_cast<unsigned>(Bits * ((e % block) / qsgd_lanes));
  }
};

#if defined(__CUDACC__)
// Device mirrors of the generic scalar functions (see common.hpp): each
// product and sum rounded on its own, as the host code does.
__device__ inline float qsgd_add_square_dev(float acc, float x) {
#if defined(GRADCOMP_QSGD_FUSED_SQUARES)
  return __fmaf_rn(x, x, acc);
#else
  return __fadd_rn(acc, __fmul_rn(x, x));
#endif
}
__device__ inline std::uint32_t qsgd_code_dev(float x, float k, float s, unsigned bits, float u) {
  const float a = __fmul_rn(bits_float(magnitude_key(x)), k);
  const float l = static_cast<float>(static_cast<std::int32_t>(a));
  const float p = __fsub_rn(a, l);
  float level = __fadd_rn(l, u < p ? 1.0f : 0.0f);
  level = level < s ? level : s;
  const auto lv = static_cast<std::uint32_t>(static_cast<std::int32_t>(level));
  const std::uint32_t sign = (float_bits(x) >> 31) & static_cast<std::uint32_t>(lv != 0);
  return lv | (sign << (bits - 1));
}
__device__ inline float qsgd_value_dev(std::uint32_t code, float unit, unsigned bits) {
  const std::uint32_t level = code & ((std::uint32_t{1} << (bits - 1)) - 1u);
  const float v = __fmul_rn(static_cast<float>(level), unit);
  return bits_float(float_bits(v) ^ (((code >> (bits - 1)) & 1u) << 31));
}
#endif

GRADCOMP_HD inline float qsgd_scale_hd(float norm, unsigned levels) noexcept {
#if defined(__CUDA_ARCH__)
  return norm > 0.0f ? __fdiv_rn(static_cast<float>(levels), norm) : 0.0f;
#else
  return qsgd_scale(norm, levels);
#endif
}
GRADCOMP_HD inline float qsgd_unit_hd(float norm, unsigned levels) noexcept {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(norm, static_cast<float>(levels));
#else
  return qsgd_unit(norm, levels);
#endif
}

/// Why pass 1 stopped, in the low two bits of an item's result.
inline constexpr std::uint64_t qsgd_bucket_non_finite = 1, qsgd_bucket_overflow = 2, qsgd_items_ok = ~std::uint64_t{0};

/// Pass 1: the norms of buckets [item * per_item, ...). The item's result is
/// qsgd_items_ok, or (b << 2 | why) for its first bucket b without a norm.
struct qsgd_norm_buckets {
  const float* x;
  float* norms;
  std::uint64_t* result;
  std::size_t n, bucket_size, buckets, per_item;
  qsgd_norm kind;

  GRADCOMP_HD std::uint64_t one(std::size_t b) const {
    const std::size_t start = b * bucket_size, len = min_size(bucket_size, n - start);
#if defined(__CUDA_ARCH__)
    const float* v = x + start;
    std::uint32_t mbits[qsgd_lanes] = {};
    float lanes[qsgd_lanes] = {};
    std::size_t i = 0;
    for (; i + qsgd_lanes <= len; i += qsgd_lanes)
      for (std::size_t j = 0; j < qsgd_lanes; ++j) {
        const std::uint32_t a = magnitude_key(v[i + j]);
        mbits[j] = mbits[j] < a ? a : mbits[j];
        lanes[j] = qsgd_add_square_dev(lanes[j], v[i + j]);
      }
    for (std::size_t j = 0; i + j < len; ++j) {
      const std::uint32_t a = magnitude_key(v[i + j]);
      mbits[j] = mbits[j] < a ? a : mbits[j];
      lanes[j] = qsgd_add_square_dev(lanes[j], v[i + j]);
    }
    std::uint32_t m = 0;
    for (std::size_t j = 0; j < qsgd_lanes; ++j) m = m < mbits[j] ? mbits[j] : m;
    if (m >= 0x7F800000u) return qsgd_bucket_non_finite;
    const float max_abs = bits_float(m);
    if (kind == qsgd_norm::max) {  // qsgd_finish_norm's max rule
      if (max_abs >= 0x1p127f) return qsgd_bucket_overflow;
      norms[b] = max_abs < 0x1p-100f ? 0.0f : max_abs;
      return 0;
    }
    double sum = 0.0;
    if (max_abs >= 0x1p-40f && max_abs <= 0x1p40f) {
      for (std::size_t j = 0; j < qsgd_lanes; ++j) sum += static_cast<double>(lanes[j]);
    } else if (max_abs < 0x1p-100f) {
      norms[b] = 0.0f;
      return 0;
    } else {
      for (std::size_t t = 0; t < len; ++t) sum = ::fma(static_cast<double>(v[t]), static_cast<double>(v[t]), sum);
    }
    const double norm = ::sqrt(sum);
    const auto f = static_cast<float>(norm);
    if (!(norm <= 3.4028234663852886e38) || magnitude_key(f) >= 0x7F800000u) return qsgd_bucket_overflow;
    norms[b] = f;
    return 0;
#else
    const std::span<const float> bucket(x + start, len);
    const qsgd_bucket_stats st = qsgd_bucket_scan(seq{}, bucket);
    if (!st.finite) return qsgd_bucket_non_finite;
    bool overflow = false;
    const float norm = qsgd_finish_norm(st, bucket, overflow, kind);
    if (overflow) return qsgd_bucket_overflow;
    norms[b] = norm;
    return 0;
#endif
  }

  GRADCOMP_HD void operator()(std::size_t item) const {
    const std::size_t end = min_size(buckets, (item + 1) * per_item);
    std::uint64_t r = qsgd_items_ok;
    for (std::size_t b = item * per_item; b < end; ++b)
      if (const std::uint64_t why = one(b); why != 0) {
        r = (std::uint64_t(b) << 2) | why;
        break;
      }
    result[item] = r;
  }
};

struct min_u64 {
  GRADCOMP_HD std::uint64_t operator()(std::uint64_t a, std::uint64_t b) const { return a < b ? a : b; }
};

/// Pass 2: the words of 16-word blocks [item * per_item, ...).
template <unsigned Bits>
struct qsgd_encode_blocks {
  using layout = qsgd_layout<Bits>;
  const float* x;
  const float* norms;
  std::uint32_t* words;
  std::size_t n, bucket_size, blocks, per_item;
  unsigned levels;
  counter_draws draws;

  GRADCOMP_HD std::uint32_t code(float v, float k, float s, float u) const {
#if defined(__CUDA_ARCH__)
    return qsgd_code_dev(v, k, s, Bits, u);
#else
    return qsgd_code(v, k, s, Bits, u);
#endif
  }

  GRADCOMP_HD void operator()(std::size_t item) const {
    const float s = static_cast<float>(levels);
    std::uint32_t codes[layout::block];
    const std::size_t blk_end = min_size(blocks, (item + 1) * per_item);
    for (std::size_t blk = item * per_item; blk < blk_end; ++blk) {
      const std::size_t base = blk * layout::block, m = min_size(layout::block, n - base);
      // Codes of the block, one bucket segment at a time (constant scale).
      for (std::size_t e = base; e < base + m;) {
        const std::size_t b = e / bucket_size;
        const std::size_t seg_end = min_size(base + m, (b + 1) * bucket_size);
        const float k = qsgd_scale_hd(norms[b], levels);
        for (; e < seg_end; ++e) codes[e - base] = code(x[e], k, s, draws.uniform_float(e));
      }
      // Row r of the block holds elements base + 16 r + lane in word `lane`.
      const std::size_t nw = min_size(qsgd_lanes, m);
      std::uint32_t* w = words + qsgd_lanes * blk;
      for (std::size_t lane = 0; lane < nw; ++lane) w[lane] = 0u;
      for (std::size_t r = 0; r < layout::rows && r * qsgd_lanes < m; ++r) {
        const std::size_t row_len = min_size(qsgd_lanes, m - r * qsgd_lanes);
        for (std::size_t lane = 0; lane < row_len; ++lane) w[lane] |= codes[r * qsgd_lanes + lane] << (Bits * r);
      }
    }
  }
};

/// Decode of elements [item * per_item, ...): out (=, or += with Add) value.
template <unsigned Bits, bool Add>
struct qsgd_decode_items {
  using layout = qsgd_layout<Bits>;
  const std::uint32_t* words;
  const float* norms;
  float* out;
  std::size_t n, bucket_size, per_item;
  unsigned levels;

  GRADCOMP_HD float value(std::uint32_t code, float unit) const {
#if defined(__CUDA_ARCH__)
    return qsgd_value_dev(code, unit, Bits);
#else
    return qsgd_value(code, unit, Bits);
#endif
  }

  GRADCOMP_HD void operator()(std::size_t item) const {
    constexpr std::uint32_t mask = (std::uint32_t{1} << Bits) - 1u;
    const std::size_t end = min_size(n, (item + 1) * per_item);
    for (std::size_t e = item * per_item; e < end;) {
      const std::size_t b = e / bucket_size;
      const std::size_t seg_end = min_size(end, (b + 1) * bucket_size);
      const float unit = qsgd_unit_hd(norms[b], levels);
      for (; e < seg_end; ++e) {
        const float v = value((words[layout::word_of(e)] >> layout::shift_of(e)) & mask, unit);
        if constexpr (Add)
          out[e] = out[e] + v;
        else
          out[e] = v;
      }
    }
  }
};

template <class P, unsigned Bits>
qsgd_quantize_result qsgd_quantize_bits(std::span<const float> x, const qsgd_params& p, std::span<float> norms,
                                        std::span<std::uint32_t> words) {
  using layout = qsgd_layout<Bits>;
  const std::size_t n = x.size();
  if (n == 0) return {};
  operand<P, const float> xs(x);
  operand<P, float, false> ns(norms);
  operand<P, std::uint32_t, false> ws(words);
  const std::size_t buckets = norms.size();
  const std::size_t buckets_per_item = p.bucket_size < item_elements<P> ? item_elements<P> / p.bucket_size : 1;
  const std::size_t norm_items = items(buckets, buckets_per_item);
  buffer<P, std::uint64_t> found(norm_items);
  for_each_index<P>(norm_items, n,
                    qsgd_norm_buckets{xs.data(), ns.data(), found.data(), n, p.bucket_size, buckets, buckets_per_item, p.norm});
  // The first bucket without a norm, in index order (as seq stops there).
  const std::uint64_t first_bad = combine_items<P>(found.data(), norm_items, qsgd_items_ok, min_u64{});
  if (first_bad != qsgd_items_ok) {
    qsgd_quantize_result res;
    const auto bad = static_cast<std::size_t>(first_bad >> 2);
    if ((first_bad & 3u) == qsgd_bucket_non_finite) {
      const std::size_t start = bad * p.bucket_size;
      res.first_non_finite = start + first_non_finite<P>(xs.data() + start, min_size(p.bucket_size, n - start));
    } else {
      res.overflow_bucket = bad;
    }
    return res;
  }
  const std::size_t blocks = items(n, layout::block);
  const std::size_t per = item_elements<P> / layout::block > 0 ? item_elements<P> / layout::block : 1;
  for_each_index<P>(items(blocks, per), n,
                    qsgd_encode_blocks<Bits>{xs.data(), ns.data(), ws.data(), n, p.bucket_size, blocks, per, p.levels,
                                             counter_draws{p.stream_key}});
  ns.commit();
  ws.commit();
  return {};
}

template <class P, unsigned Bits, bool Add>
void qsgd_dequantize_bits(std::span<const std::uint32_t> words, std::span<const float> norms, const qsgd_params& p,
                          std::span<float> out) {
  operand<P, const std::uint32_t> ws(words);
  operand<P, const float> ns(norms);
  operand<P, float, Add> os(out);
  constexpr std::size_t per = item_elements<P>;
  for_each_index<P>(
      items(out.size(), per), out.size(),
      qsgd_decode_items<Bits, Add>{ws.data(), ns.data(), os.data(), out.size(), p.bucket_size, per, p.levels});
  os.commit();
}

template <class P, bool Add>
void qsgd_dequantize_any(std::span<const std::uint32_t> words, std::span<const float> norms, const qsgd_params& p,
                         std::span<float> out) {
  switch (p.bits) {
    case 2: return qsgd_dequantize_bits<P, 2, Add>(words, norms, p, out);
    case 4: return qsgd_dequantize_bits<P, 4, Add>(words, norms, p, out);
    default: return qsgd_dequantize_bits<P, 8, Add>(words, norms, p, out);
  }
}

}  // namespace thrust_detail

/// QSGD encode with P's system: per bucket the norm, then every element's
/// code (draw of element i: counter_stream(p.stream_key).uniform_float(i)).
/// Same norms, words and error report as the seq kernel.
template <class P>
[[nodiscard]] qsgd_quantize_result qsgd_quantize(thrust<P>, std::span<const float> x, const qsgd_params& p,
                                                std::span<float> norms, std::span<std::uint32_t> words) {
  switch (p.bits) {
    case 2: return thrust_detail::qsgd_quantize_bits<P, 2>(x, p, norms, words);
    case 4: return thrust_detail::qsgd_quantize_bits<P, 4>(x, p, norms, words);
    default: return thrust_detail::qsgd_quantize_bits<P, 8>(x, p, norms, words);
  }
}

/// out = decode(words, norms) with P's system.
template <class P>
void qsgd_dequantize(thrust<P>, std::span<const std::uint32_t> words, std::span<const float> norms,
                     const qsgd_params& p, std::span<float> out) {
  thrust_detail::qsgd_dequantize_any<P, false>(words, norms, p, out);
}

/// out += decode(words, norms) with P's system (decode-and-sum aggregation).
template <class P>
void qsgd_dequantize_add(thrust<P>, std::span<const std::uint32_t> words, std::span<const float> norms,
                         const qsgd_params& p, std::span<float> out) {
  thrust_detail::qsgd_dequantize_any<P, true>(words, norms, p, out);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
