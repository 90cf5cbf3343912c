#pragma once
/// \file system/generic/qsgd.hpp
/// Generic (execution::seq) kernels of the QSGD codec (qsgd.hpp), and the
/// scalar pieces every policy shares so that all of them produce identical
/// bits: the per-element code, the decoded value, the bucket-norm rule and
/// the code layout.
///
/// Code of element i (b = 2, 4 or 8 bits): level in [0, s] in the low b-1
/// bits, sign in the top bit, set only when the level is non-zero.
///
/// Layout (docs/codecs.md): codes are packed into 32-bit little-endian words
/// in blocks of 16 words holding 16 * (32 / b) elements. Inside a block,
/// element 16k + j (row k, lane j) is in word j at bits [b*k, b*k + b). A
/// final partial block of m elements keeps only words 0 .. min(16, m) - 1.
/// This lane-interleaved order lets a SIMD kernel pack and unpack a row of 16
/// codes with whole-register shifts, whatever its width (4, 8 or 16 floats).

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/detail/random.hpp>

// GCC contracts a*b + c into a fused multiply-add whenever the target has one,
// even in ISO C++ mode, and may do it differently in a scalar loop and in an
// intrinsic SIMD loop. The norm's squares are therefore accumulated with an
// explicit fused multiply-add on targets that have one (in every policy), and
// with a separate multiply and add elsewhere (where nothing can fuse them).
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define GRADCOMP_QSGD_FUSED_SQUARES 1
#endif

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// acc + x*x, fused where the target has a fused multiply-add (see above).
inline float qsgd_add_square(float acc, float x) noexcept {
#if defined(GRADCOMP_QSGD_FUSED_SQUARES)
  return std::fma(x, x, acc);
#else
  const float sq = x * x;
  return acc + sq;
#endif
}

/// Lanes of the canonical norm reduction and of a packing row.
inline constexpr std::size_t qsgd_lanes = 16;

/// Number of 32-bit words holding n codes of `bits` bits (see the layout above).
constexpr std::uint64_t qsgd_word_count(std::uint64_t n, unsigned bits) noexcept {
  const std::uint64_t block = qsgd_lanes * (32 / bits);
  const std::uint64_t m = n % block;
  return qsgd_lanes * (n / block) + (m < qsgd_lanes ? m : qsgd_lanes);
}

/// Where the code of element e lives: word index and bit offset.
struct qsgd_slot {
  std::size_t word;
  unsigned shift;
};
constexpr qsgd_slot qsgd_slot_of(std::uint64_t e, unsigned bits) noexcept {
  const std::uint64_t block = qsgd_lanes * (32 / bits);
  const std::uint64_t o = e % block;
  return {static_cast<std::size_t>(qsgd_lanes * (e / block) + o % qsgd_lanes),
          static_cast<unsigned>(bits * (o / qsgd_lanes))};
}

/// Which norm of a bucket scales its levels (the scale is what the payload's
/// `norms` carry, so decoding never depends on it):
///  - l2: ||v||_2, QSGD eq. 3.1 as the paper writes it;
///  - max: max_i |v_i| (the l-infinity norm). Every a_i = |v_i| s / max is
///    still in [0, s], so the rounding stays unbiased, and since
///    max |v_i| <= ||v||_2 the level spacing is never wider: the variance
///    bound becomes n max^2 / (4 s^2) instead of min(n/s^2, sqrt(n)/s) ||v||_2^2.
enum class qsgd_norm : std::uint8_t { l2 = 0, max = 1 };

/// Parameters of one encode or decode.
struct qsgd_params {
  unsigned bits = 4;                 ///< code width: 2, 4 or 8
  unsigned levels = 7;               ///< s, in [1, 2^(bits-1) - 1]
  std::size_t bucket_size = 512;     ///< elements per norm
  std::uint64_t stream_key = 0;      ///< counter_stream key of this step (encode only)
  qsgd_norm norm = qsgd_norm::l2;    ///< the bucket scale (encode only)
};

/// The code of x (QSGD's Q_s, Alistarh et al. 2017, eq. 3.1): with
/// a = |x| * k, k = s / ||bucket||_2, the level is floor(a) + 1 with
/// probability a - floor(a) (u < a - floor(a)), else floor(a); clamped to s.
inline std::uint32_t qsgd_code(float x, float k, float s, unsigned bits, float u) noexcept {
  const float a = std::fabs(x) * k;  // in [0, s (1 + eps)]: |x| <= the bucket norm
  // floor(a) by truncation (a >= 0 and small): same value, and unlike
  // std::floor it does not stop GCC 12 from vectorising the caller's loop.
  const float l = static_cast<float>(static_cast<std::int32_t>(a));
  const float p = a - l;
  float level = l + (u < p ? 1.0f : 0.0f);
  level = level < s ? level : s;
  const auto lv = static_cast<std::uint32_t>(static_cast<std::int32_t>(level));
  const std::uint32_t sign = (std::bit_cast<std::uint32_t>(x) >> 31) & static_cast<std::uint32_t>(lv != 0);
  return lv | (sign << (bits - 1));
}

/// The decoded value of a code: sign * level * unit, unit = ||bucket|| / s.
/// The sign is applied to the bits, which also keeps a compiler from fusing
/// the product into a following addition (decode_add).
inline float qsgd_value(std::uint32_t code, float unit, unsigned bits) noexcept {
  const std::uint32_t level = code & ((std::uint32_t{1} << (bits - 1)) - 1u);
  const float v = static_cast<float>(level) * unit;
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) ^ (((code >> (bits - 1)) & 1u) << 31));
}

/// k = s / norm (0 for a zero norm, so every level is 0).
inline float qsgd_scale(float norm, unsigned levels) noexcept {
  return norm > 0.0f ? static_cast<float>(levels) / norm : 0.0f;
}
/// unit = norm / s.
inline float qsgd_unit(float norm, unsigned levels) noexcept { return norm / static_cast<float>(levels); }

/// First pass over a bucket: finiteness, max |x| and 16 float lanes of
/// squares (element i of the bucket adds x_i^2 into lane i % 16).
struct qsgd_bucket_stats {
  bool finite = true;
  float max_abs = 0.0f;
  float lanes[qsgd_lanes] = {};
};

/// The bucket scan. Every policy calls this one function (it is written
/// lane-wise, so compilers vectorise it): sharing it is what makes the norms
/// of all policies bit-identical, since an xsimd loop could be fused
/// differently (xsimd 8.1 has no fused multiply-add for AVX-512).
/// max |x| is taken on the float bits: for |x| the integer order is the value
/// order, and NaN/Inf have the largest patterns, so one integer max per lane
/// gives both the maximum and the finiteness verdict.
inline qsgd_bucket_stats qsgd_bucket_scan(seq, std::span<const float> bucket) noexcept {
  qsgd_bucket_stats st;
  const std::size_t n = bucket.size();
  const float* x = bucket.data();
  std::uint32_t mbits[qsgd_lanes] = {};
  std::size_t i = 0;
  for (; i + qsgd_lanes <= n; i += qsgd_lanes)
    for (std::size_t j = 0; j < qsgd_lanes; ++j) {
      const std::uint32_t a = std::bit_cast<std::uint32_t>(x[i + j]) & 0x7FFFFFFFu;
      mbits[j] = mbits[j] < a ? a : mbits[j];
      st.lanes[j] = qsgd_add_square(st.lanes[j], x[i + j]);
    }
  for (std::size_t j = 0; i + j < n; ++j) {
    const std::uint32_t a = std::bit_cast<std::uint32_t>(x[i + j]) & 0x7FFFFFFFu;
    mbits[j] = mbits[j] < a ? a : mbits[j];
    st.lanes[j] = qsgd_add_square(st.lanes[j], x[i + j]);
  }
  std::uint32_t m = 0;
  for (std::size_t j = 0; j < qsgd_lanes; ++j) m = m < mbits[j] ? mbits[j] : m;
  st.finite = m < 0x7F800000u;  // below the bits of +Inf
  st.max_abs = st.finite ? std::bit_cast<float>(m) : 0.0f;
  return st;
}

/// The bucket norm from its scan (shared by every policy):
///  - max |x| in [2^-40, 2^40]: sqrt of the 16 lanes summed in order in double
///    (each lane a float sum of squares, fused where the target has FMA);
///  - max |x| < 2^-100 (including an all-zero bucket): 0, the bucket is sent
///    as zeros (flush-to-zero, the one place QSGD here is not unbiased);
///  - otherwise: sqrt of the squares summed in index order in double (fused,
///    std::fma), which neither overflows nor underflows.
/// Sets `overflow` when the norm exceeds FLT_MAX (|x| near FLT_MAX).
/// With qsgd_norm::max the scale is max |x| itself, with the same flush to 0
/// below 2^-100; a max |x| of 2^127 or more sets `overflow`: its top level,
/// s * (max / s), can round past FLT_MAX when decoded.
inline float qsgd_finish_norm(const qsgd_bucket_stats& st, std::span<const float> bucket, bool& overflow,
                              qsgd_norm kind = qsgd_norm::l2) noexcept {
  overflow = false;
  if (kind == qsgd_norm::max) {
    if (st.max_abs >= 0x1p127f) {
      overflow = true;
      return 0.0f;
    }
    return st.max_abs < 0x1p-100f ? 0.0f : st.max_abs;
  }
  double sum = 0.0;
  if (st.max_abs >= 0x1p-40f && st.max_abs <= 0x1p40f) {
    for (std::size_t j = 0; j < qsgd_lanes; ++j) sum += static_cast<double>(st.lanes[j]);
  } else if (st.max_abs < 0x1p-100f) {
    return 0.0f;
  } else {
    for (const float v : bucket) sum = std::fma(static_cast<double>(v), static_cast<double>(v), sum);
  }
  const double norm = std::sqrt(sum);
  if (!(norm <= static_cast<double>(std::numeric_limits<float>::max()))) {
    overflow = true;
    return 0.0f;
  }
  const auto f = static_cast<float>(norm);
  if (!std::isfinite(f)) overflow = true;  // rounded up past FLT_MAX
  return f;
}

/// What an encode found wrong, if anything (npos = nothing).
struct qsgd_quantize_result {
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  std::size_t first_non_finite = npos;  ///< index of the first NaN/Inf
  std::size_t overflow_bucket = npos;   ///< a bucket whose norm overflows float
  bool ok() const noexcept { return first_non_finite == npos && overflow_bucket == npos; }
};

namespace qsgd_detail {
inline std::size_t first_non_finite_in(std::span<const float> x) noexcept {
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!(std::fabs(x[i]) <= std::numeric_limits<float>::max())) return i;
  return x.size();
}
}  // namespace qsgd_detail

namespace qsgd_detail {
/// Seq encode for one code width: per bucket the scan and norm, then the
/// codes of up to 256 elements at a time into a small buffer (an
/// element-wise loop the compiler vectorises), then their placement.
template <unsigned Bits>
qsgd_quantize_result quantize_seq(std::span<const float> x, const qsgd_params& p, std::span<float> norms,
                                  std::span<std::uint32_t> words) noexcept {
  const std::size_t n = x.size();
  const detail::counter_stream stream(p.stream_key);
  const std::uint32_t k_lo = stream.key_lo(), k_hi = stream.key_hi();
  const float s = static_cast<float>(p.levels);
  for (auto& w : words) w = 0u;
  constexpr std::size_t chunk = 256;
  std::uint32_t codes[chunk];
  for (std::size_t b = 0, start = 0; start < n; ++b, start += p.bucket_size) {
    const std::size_t len = n - start < p.bucket_size ? n - start : p.bucket_size;
    const auto bucket = x.subspan(start, len);
    const qsgd_bucket_stats st = qsgd_bucket_scan(seq{}, bucket);
    qsgd_quantize_result res;
    if (!st.finite) {
      res.first_non_finite = start + first_non_finite_in(bucket);
      return res;
    }
    bool overflow = false;
    const float norm = qsgd_finish_norm(st, bucket, overflow, p.norm);
    if (overflow) {
      res.overflow_bucket = b;
      return res;
    }
    norms[b] = norm;
    const float k = qsgd_scale(norm, p.levels);
    for (std::size_t c0 = start; c0 < start + len; c0 += chunk) {
      const std::size_t m = start + len - c0 < chunk ? start + len - c0 : chunk;
      const float* xc = x.data() + c0;
      const auto lo0 = static_cast<std::uint32_t>(c0);
      const auto hi0 = static_cast<std::uint32_t>(static_cast<std::uint64_t>(c0) >> 32);
      if (lo0 <= 0xFFFFFFFFu - m) {  // the chunk's indices share their high half
        for (std::uint32_t j = 0; j < static_cast<std::uint32_t>(m); ++j) {
          const std::uint32_t bits = detail::counter_stream::bits32_lanes<std::uint32_t>(lo0 + j, hi0, k_lo, k_hi);
          codes[j] = qsgd_code(xc[j], k, s, Bits, static_cast<float>(bits >> 8) * 0x1p-24f);
        }
      } else {
        for (std::size_t j = 0; j < m; ++j) codes[j] = qsgd_code(xc[j], k, s, Bits, stream.uniform_float(c0 + j));
      }
      for (std::size_t j = 0; j < m; ++j) {
        const qsgd_slot slot = qsgd_slot_of(c0 + j, Bits);
        words[slot.word] |= codes[j] << slot.shift;
      }
    }
  }
  return {};
}
}  // namespace qsgd_detail

/// QSGD encode of a whole tensor: per bucket the norm (written to `norms`,
/// ceil(n / bucket_size) entries), then every element's code into `words`
/// (qsgd_word_count(n, bits) entries, fully overwritten). Element i's random
/// draw is counter_stream(stream_key).uniform_float(i). Stops at the first
/// bad bucket and says why; `norms` and `words` are then unspecified.
[[nodiscard]] inline qsgd_quantize_result qsgd_quantize(seq, std::span<const float> x, const qsgd_params& p,
                                          std::span<float> norms, std::span<std::uint32_t> words) noexcept {
  switch (p.bits) {
    case 2: return qsgd_detail::quantize_seq<2>(x, p, norms, words);
    case 4: return qsgd_detail::quantize_seq<4>(x, p, norms, words);
    default: return qsgd_detail::quantize_seq<8>(x, p, norms, words);
  }
}

namespace qsgd_detail {
/// Seq decode for one code width: codes of up to 256 elements gathered into
/// a buffer, then an element-wise (vectorisable) loop for the values.
template <unsigned Bits, bool Add>
void dequantize_seq(std::span<const std::uint32_t> words, std::span<const float> norms, const qsgd_params& p,
                    std::span<float> out) noexcept {
  const std::size_t n = out.size();
  constexpr std::uint32_t mask = (std::uint32_t{1} << Bits) - 1u;
  constexpr std::size_t chunk = 256;
  std::uint32_t codes[chunk];
  float* o = out.data();
  for (std::size_t b = 0, start = 0; start < n; ++b, start += p.bucket_size) {
    const std::size_t end = n - start < p.bucket_size ? n : start + p.bucket_size;
    const float unit = qsgd_unit(norms[b], p.levels);
    for (std::size_t c0 = start; c0 < end; c0 += chunk) {
      const std::size_t m = end - c0 < chunk ? end - c0 : chunk;
      for (std::size_t j = 0; j < m; ++j) {
        const qsgd_slot slot = qsgd_slot_of(c0 + j, Bits);
        codes[j] = (words[slot.word] >> slot.shift) & mask;
      }
      float* oc = o + c0;
      for (std::size_t j = 0; j < m; ++j) {
        const float v = qsgd_value(codes[j], unit, Bits);
        if constexpr (Add)
          oc[j] = oc[j] + v;
        else
          oc[j] = v;
      }
    }
  }
}
}  // namespace qsgd_detail

/// QSGD decode: out[i] = sign * level * norm_b / s (Add = false) or
/// out[i] += that (Add = true). Sizes are checked by the caller.
template <bool Add>
inline void qsgd_dequantize_into(seq, std::span<const std::uint32_t> words, std::span<const float> norms,
                                 const qsgd_params& p, std::span<float> out) noexcept {
  switch (p.bits) {
    case 2: return qsgd_detail::dequantize_seq<2, Add>(words, norms, p, out);
    case 4: return qsgd_detail::dequantize_seq<4, Add>(words, norms, p, out);
    default: return qsgd_detail::dequantize_seq<8, Add>(words, norms, p, out);
  }
}

/// out = decode(words, norms).
inline void qsgd_dequantize(seq, std::span<const std::uint32_t> words, std::span<const float> norms,
                            const qsgd_params& p, std::span<float> out) noexcept {
  qsgd_dequantize_into<false>(seq{}, words, norms, p, out);
}
/// out += decode(words, norms) (decode-and-sum aggregation).
inline void qsgd_dequantize_add(seq, std::span<const std::uint32_t> words, std::span<const float> norms,
                                const qsgd_params& p, std::span<float> out) noexcept {
  qsgd_dequantize_into<true>(seq{}, words, norms, p, out);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
