#pragma once
/// \file system/simd/qsgd.hpp
/// xsimd (execution::simd) kernels of the QSGD codec. They produce the same
/// norms and words as the generic kernels bit for bit: the bucket norm comes
/// from the shared (compiler-vectorised) qsgd_bucket_scan and
/// qsgd_finish_norm, the random
/// draws come from the same counter hash evaluated lane-wise
/// (counter_stream::bits32_lanes), and every per-element step is the same
/// IEEE operation as qsgd_code / qsgd_value. A row of 16 codes is packed with
/// whole-register shifts thanks to the lane-interleaved layout
/// (system/generic/qsgd.hpp); rows that straddle two buckets, and the final
/// partial block, use the shared scalar code.

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/detail/random.hpp>

#include <xsimd/xsimd.hpp>

#include <gradcomp/system/generic/qsgd.hpp>

// GCC 12 reports -W(maybe-)uninitialized inside its own AVX-512 intrinsics
// (the _mm512_undefined_* placeholders; GCC bug 105593) wherever xsimd
// inlines them. Spurious: silenced for these kernels.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace qsgd_simd_detail {

using fbatch = xsimd::batch<float>;
using ubatch = xsimd::batch<std::uint32_t>;
using ibatch = xsimd::batch<std::int32_t>;
inline constexpr std::size_t width = fbatch::size;
static_assert(ubatch::size == width && ibatch::size == width, "float and int32 batches must have the same lanes");
static_assert(qsgd_lanes % width == 0, "a row of 16 codes must be a whole number of batches");
inline constexpr std::size_t per_row = qsgd_lanes / width;

inline ubatch iota() noexcept {
  alignas(64) std::uint32_t v[width];
  for (std::size_t j = 0; j < width; ++j) v[j] = static_cast<std::uint32_t>(j);
  return ubatch::load_aligned(v);
}

/// All-ones lanes where the mask is set (float select: compiles everywhere).
inline ubatch mask_bits(const fbatch::batch_bool_type& m) noexcept {
  return xsimd::bitwise_cast<ubatch>(xsimd::bitwise_cast(m));
}

/// Per-step constants of the code computation.
struct encode_consts {
  fbatch s, one, zero, inv24;
  ubatch lane;
  std::uint32_t key_lo, key_hi;
};

/// qsgd_code for the lanes of v, whose element indices are lo + 2^32 hi
/// (key_hi = the key's high half ^ hi * 0x9E3779B9, see code_batch).
template <unsigned Bits>
inline ubatch code_lanes(const fbatch& v, const ubatch& lo, const fbatch& k, std::uint32_t key_hi,
                         const encode_consts& c) noexcept {
  const fbatch a = xsimd::abs(v) * k;
  const fbatch l = xsimd::floor(a);
  const fbatch p = a - l;
  const ubatch rnd = detail::counter_stream::bits32_lanes<ubatch>(lo, ubatch(0u), c.key_lo, key_hi);
  const fbatch u = xsimd::to_float(xsimd::bitwise_cast<ibatch>(rnd >> 8)) * c.inv24;
  const fbatch level = xsimd::min(l + xsimd::select(u < p, c.one, c.zero), c.s);
  const ubatch lv = xsimd::bitwise_cast<ubatch>(xsimd::to_int(level));
  const ubatch sign = (xsimd::bitwise_cast<ubatch>(v) >> 31) & mask_bits(level > c.zero);
  return lv | (sign << static_cast<int>(Bits - 1));
}

/// qsgd_code for `width` consecutive elements starting at global index e.
template <unsigned Bits>
inline ubatch code_batch(const float* x, std::uint64_t e, float k, const encode_consts& c) noexcept {
  // Rows start at multiples of 16, so a batch never crosses a 2^32 boundary
  // and the index's high half is one scalar: bits32_lanes(lo, hi, kl, kh) ==
  // bits32_lanes(lo, 0, kl, kh ^ hi * 0x9E3779B9), which saves a vector multiply.
  const ubatch lo = ubatch(static_cast<std::uint32_t>(e)) + c.lane;
  const std::uint32_t key_hi = c.key_hi ^ (static_cast<std::uint32_t>(e >> 32) * 0x9E3779B9u);
  return code_lanes<Bits>(fbatch::load_unaligned(x), lo, fbatch(k), key_hi, c);
}

/// The codes of one block (16 words: `rows` rows of 16 elements starting at
/// x[e0], e0 a multiple of the block) whose elements all lie in one bucket of
/// scale k, OR-packed into `out`: code_lanes with the constants hoisted,
/// the bucket-aligned fast path of quantize.
template <unsigned Bits>
inline void code_block(const float* x, std::uint64_t e0, const fbatch& k, const encode_consts& c,
                       std::uint32_t* out) noexcept {
  constexpr unsigned rows = 32 / Bits;
  // A block is a power of two (<= 256) elements aligned on its size, so its
  // indices share their high half: one scalar key per block (see code_batch).
  const std::uint32_t key_hi = c.key_hi ^ (static_cast<std::uint32_t>(e0 >> 32) * 0x9E3779B9u);
  const ubatch base = ubatch(static_cast<std::uint32_t>(e0)) + c.lane;
  ubatch acc[per_row];
  for (auto& a : acc) a = ubatch(0u);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 8
#endif
  for (unsigned row = 0; row < rows; ++row) {
    for (std::size_t m = 0; m < per_row; ++m) {
      const std::size_t off = row * qsgd_lanes + m * width;
      const ubatch code = code_lanes<Bits>(fbatch::load_unaligned(x + off), base + ubatch(static_cast<std::uint32_t>(off)),
                                           k, key_hi, c);
      acc[m] = acc[m] | (code << static_cast<int>(Bits * row));
    }
  }
  for (std::size_t m = 0; m < per_row; ++m) acc[m].store_unaligned(out + m * width);
}

/// qsgd_value for a batch of codes.
template <unsigned Bits>
inline fbatch value_batch(const ubatch& code, const fbatch& unit) noexcept {
  const ubatch level = code & ubatch((std::uint32_t{1} << (Bits - 1)) - 1u);
  const fbatch v = xsimd::to_float(xsimd::bitwise_cast<ibatch>(level)) * unit;
  const ubatch sign = (code >> static_cast<int>(Bits - 1)) << 31;
  return xsimd::bitwise_cast<fbatch>(xsimd::bitwise_cast<ubatch>(v) ^ sign);
}

}  // namespace qsgd_simd_detail

namespace qsgd_simd_detail {

template <unsigned Bits>
qsgd_quantize_result quantize(std::span<const float> x, const qsgd_params& p, std::span<float> norms,
                              std::span<std::uint32_t> words) noexcept {
  constexpr unsigned rows = 32 / Bits;
  constexpr std::size_t block = qsgd_lanes * rows;
  const std::size_t n = x.size();
  const std::size_t bs = p.bucket_size;
  const detail::counter_stream stream(p.stream_key);
  const float s = static_cast<float>(p.levels);
  const encode_consts c{fbatch(s), fbatch(1.0f), fbatch(0.0f), fbatch(0x1p-24f), iota(), stream.key_lo(),
                        stream.key_hi()};

  std::size_t next_bucket = 0;  // buckets [0, next_bucket) have their norm
  // Scans (and checks) every bucket that starts before `end`.
  auto ensure_norms = [&](std::size_t end) -> qsgd_quantize_result {
    qsgd_quantize_result res;
    while (next_bucket * bs < end) {
      const std::size_t start = next_bucket * bs;
      const auto bucket = x.subspan(start, n - start < bs ? n - start : bs);
      const qsgd_bucket_stats st = qsgd_bucket_scan(seq{}, bucket);  // shared: identical norms
      if (!st.finite) {
        res.first_non_finite = start + qsgd_detail::first_non_finite_in(bucket);
        return res;
      }
      bool overflow = false;
      norms[next_bucket] = qsgd_finish_norm(st, bucket, overflow, p.norm);
      if (overflow) {
        res.overflow_bucket = next_bucket;
        return res;
      }
      ++next_bucket;
    }
    return res;
  };

  std::size_t cur = 0;  // bucket of the current row's first element
  float k_cur = 0.0f;
  bool k_valid = false;
  const std::size_t full_blocks = n / block;
  std::size_t blk = 0;
  // Fast path: buckets that are whole blocks (bucket_size a multiple of the
  // block, e.g. the default 512): per bucket the scan and norm, then its
  // blocks with no per-row bucket bookkeeping. The rest (a final partial
  // bucket, or every bucket when they do not align) takes the general loop.
  if (bs % block == 0) {
    const std::size_t aligned_buckets = n / bs;
    for (; next_bucket < aligned_buckets;) {
      const std::size_t b = next_bucket;
      if (auto r = ensure_norms(b * bs + 1); !r.ok()) return r;
      const fbatch k(qsgd_scale(norms[b], p.levels));
      for (std::size_t e0 = b * bs; e0 < (b + 1) * bs; e0 += block)
        code_block<Bits>(x.data() + e0, e0, k, c, words.data() + (e0 / block) * qsgd_lanes);
    }
    blk = aligned_buckets * (bs / block);
    cur = aligned_buckets;
  }
  for (; blk < full_blocks; ++blk) {
    ubatch acc[per_row];
    for (auto& a : acc) a = ubatch(0u);
    for (unsigned row = 0; row < rows; ++row) {
      const std::size_t e0 = blk * block + row * qsgd_lanes;
      if (auto r = ensure_norms(e0 + qsgd_lanes); !r.ok()) return r;
      while (e0 >= (cur + 1) * bs) {
        ++cur;
        k_valid = false;
      }
      ubatch codes[per_row];
      if (e0 + qsgd_lanes <= (cur + 1) * bs) {
        if (!k_valid) {
          k_cur = qsgd_scale(norms[cur], p.levels);
          k_valid = true;
        }
        for (std::size_t m = 0; m < per_row; ++m) codes[m] = code_batch<Bits>(x.data() + e0 + m * width, e0 + m * width, k_cur, c);
      } else {  // the row straddles a bucket boundary
        alignas(64) std::uint32_t tmp[qsgd_lanes];
        for (std::size_t j = 0; j < qsgd_lanes; ++j) {
          const std::size_t e = e0 + j;
          tmp[j] = qsgd_code(x[e], qsgd_scale(norms[e / bs], p.levels), s, Bits, stream.uniform_float(e));
        }
        for (std::size_t m = 0; m < per_row; ++m) codes[m] = ubatch::load_aligned(tmp + m * width);
      }
      for (std::size_t m = 0; m < per_row; ++m) acc[m] = acc[m] | (codes[m] << static_cast<int>(Bits * row));
    }
    for (std::size_t m = 0; m < per_row; ++m) acc[m].store_unaligned(words.data() + blk * qsgd_lanes + m * width);
  }
  const std::size_t tail = full_blocks * block;
  if (tail < n) {
    if (auto r = ensure_norms(n); !r.ok()) return r;
    for (std::size_t w = full_blocks * qsgd_lanes; w < words.size(); ++w) words[w] = 0u;
    for (std::size_t e = tail; e < n; ++e) {
      const qsgd_slot slot = qsgd_slot_of(e, Bits);
      words[slot.word] |= qsgd_code(x[e], qsgd_scale(norms[e / bs], p.levels), s, Bits, stream.uniform_float(e))
                          << slot.shift;
    }
  }
  return {};
}

template <unsigned Bits, bool Add>
void dequantize(std::span<const std::uint32_t> words, std::span<const float> norms, const qsgd_params& p,
                std::span<float> out) noexcept {
  constexpr unsigned rows = 32 / Bits;
  constexpr std::size_t block = qsgd_lanes * rows;
  constexpr std::uint32_t mask = (std::uint32_t{1} << Bits) - 1u;
  const std::size_t n = out.size();
  const std::size_t bs = p.bucket_size;
  float* o = out.data();
  auto store = [&](float* at, const fbatch& v) {
    if constexpr (Add)
      (fbatch::load_unaligned(at) + v).store_unaligned(at);
    else
      v.store_unaligned(at);
  };
  auto put = [&](std::size_t e, float v) {
    if constexpr (Add)
      o[e] = o[e] + v;
    else
      o[e] = v;
  };
  std::size_t cur = 0;
  fbatch unit_cur(qsgd_unit(norms.empty() ? 0.0f : norms[0], p.levels));
  const std::size_t full_blocks = n / block;
  for (std::size_t blk = 0; blk < full_blocks; ++blk) {
    ubatch w[per_row];
    for (std::size_t m = 0; m < per_row; ++m) w[m] = ubatch::load_unaligned(words.data() + blk * qsgd_lanes + m * width);
    for (unsigned row = 0; row < rows; ++row) {
      const std::size_t e0 = blk * block + row * qsgd_lanes;
      if (e0 >= (cur + 1) * bs) {
        while (e0 >= (cur + 1) * bs) ++cur;
        unit_cur = fbatch(qsgd_unit(norms[cur], p.levels));
      }
      if (e0 + qsgd_lanes <= (cur + 1) * bs) {
        for (std::size_t m = 0; m < per_row; ++m)
          store(o + e0 + m * width, value_batch<Bits>((w[m] >> static_cast<int>(Bits * row)) & ubatch(mask), unit_cur));
      } else {
        for (std::size_t j = 0; j < qsgd_lanes; ++j) {
          const std::size_t e = e0 + j;
          const std::uint32_t code = (words[blk * qsgd_lanes + j] >> (Bits * row)) & mask;
          put(e, qsgd_value(code, qsgd_unit(norms[e / bs], p.levels), Bits));
        }
      }
    }
  }
  for (std::size_t e = full_blocks * block; e < n; ++e) {
    const qsgd_slot slot = qsgd_slot_of(e, Bits);
    put(e, qsgd_value((words[slot.word] >> slot.shift) & mask, qsgd_unit(norms[e / bs], p.levels), Bits));
  }
}

}  // namespace qsgd_simd_detail

/// Vectorised qsgd_quantize (same norms and words as the seq kernel).
[[nodiscard]] inline qsgd_quantize_result qsgd_quantize(simd, std::span<const float> x, const qsgd_params& p,
                                          std::span<float> norms, std::span<std::uint32_t> words) noexcept {
  switch (p.bits) {
    case 2: return qsgd_simd_detail::quantize<2>(x, p, norms, words);
    case 4: return qsgd_simd_detail::quantize<4>(x, p, norms, words);
    default: return qsgd_simd_detail::quantize<8>(x, p, norms, words);
  }
}

/// Vectorised qsgd_dequantize.
inline void qsgd_dequantize(simd, std::span<const std::uint32_t> words, std::span<const float> norms,
                            const qsgd_params& p, std::span<float> out) noexcept {
  switch (p.bits) {
    case 2: return qsgd_simd_detail::dequantize<2, false>(words, norms, p, out);
    case 4: return qsgd_simd_detail::dequantize<4, false>(words, norms, p, out);
    default: return qsgd_simd_detail::dequantize<8, false>(words, norms, p, out);
  }
}

/// Vectorised qsgd_dequantize_add.
inline void qsgd_dequantize_add(simd, std::span<const std::uint32_t> words, std::span<const float> norms,
                                const qsgd_params& p, std::span<float> out) noexcept {
  switch (p.bits) {
    case 2: return qsgd_simd_detail::dequantize<2, true>(words, norms, p, out);
    case 4: return qsgd_simd_detail::dequantize<4, true>(words, norms, p, out);
    default: return qsgd_simd_detail::dequantize<8, true>(words, norms, p, out);
  }
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
