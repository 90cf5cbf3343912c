#pragma once
/// \file system/generic/gradiveq/avx2.hpp
/// GradiVeQ's seq kernels, part 2 of 3 (see system/generic/gradiveq.hpp):
/// the 256-bit register blocks of eqs. 3 and 5 (AVX2 and FMA builds), in
/// the reference order.

#include <cstdint>
#include <type_traits>

#include <gradcomp/system/generic/gradiveq/portable.hpp>

#if defined(GRADCOMP_GRADIVEQ_AVX2)
// A basis stored as binary16 (gradiveq_options::basis_storage) is widened
// where the build has a conversion: F16C (x86-64-v3), or AVX-512 F.
#if defined(__F16C__) || defined(GRADCOMP_GRADIVEQ_AVX512)
#define GRADCOMP_GRADIVEQ_HALF_LOADS 1
#endif
namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace gradiveq_kernel {
// The register blocks' loops are unrolled (so the accumulators live in
// registers, not in a stack array rewritten every step).
#if defined(__clang__)
#define GRADCOMP_GRADIVEQ_UNROLL _Pragma("unroll")
#else
#define GRADCOMP_GRADIVEQ_UNROLL _Pragma("GCC unroll 16")
#endif
#if defined(__GNUC__)
#if defined(__AVX512VL__)
#define GRADCOMP_GRADIVEQ_IN_REGISTER(a) __asm__("" : "+v"(a))
#define GRADCOMP_GRADIVEQ_USE_REGISTER(a) __asm__("" ::"v"(a))
#else
#define GRADCOMP_GRADIVEQ_IN_REGISTER(a) __asm__("" : "+x"(a))
#endif
#else
#define GRADCOMP_GRADIVEQ_IN_REGISTER(a) ((void)0)
#endif
#if !defined(GRADCOMP_GRADIVEQ_USE_REGISTER)
#define GRADCOMP_GRADIVEQ_USE_REGISTER(a) GRADCOMP_GRADIVEQ_IN_REGISTER(a)
#endif
// 32 vector registers with AVX-512VL (the ymm forms reach ymm16-31), else 16:
// the register blocks below are sized to stay in registers (R x 4
// accumulators, R slice values and one basis vector: 16 for R = 3). Three
// rows without VL: a 3x3 conv layer's 3 slices then share one pass over its
// basis (K x d floats, often beyond the caches) instead of two.
#if defined(__AVX512VL__)
inline constexpr int compress_block_rows = 4;
inline constexpr int expand_block_rows = 4;
#else
inline constexpr int compress_block_rows = 3;
inline constexpr int expand_block_rows = 3;
#endif

/// Eq. 5's register blocks read each u_j in runs of a block's width, on as
/// many pages as d: the hardware prefetchers do not follow that many
/// streams, so each block prefetches the runs this many blocks ahead
/// (measured, 3 x 12288 floats, d = 443, one core of an EPYC: AVX2 3.1-4.2
/// -> 1.6-1.9 ms, AVX-512 1.6-2.0 -> 1.1-1.9 ms).
inline constexpr std::size_t expand_prefetch_blocks = 2;

/// Prefetches (into L1) the line `floats` past p. The address is formed as an
/// integer: it may lie past the end of the basis, which a prefetch may touch
/// (it never faults) but pointer arithmetic may not.
inline void prefetch_floats_ahead(const float* p, std::size_t floats) noexcept {
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(p) + floats * sizeof(float);
  _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T0);
}

/// Basis loads of 8 values of one column: floats, binary16 values widened to
/// float, or int8 values widened and multiplied by the column's power-of-two
/// scale `s` (gradiveq_narrow_basis: every result is exactly the float
/// basis' value), so a basis stored at half precision costs half the bytes,
/// at int8 a quarter, and each gives the float kernels' bits on the same
/// values. `s` is read only by the int8 load.
inline __m256 load_basis8(const float* p, const float* = nullptr) noexcept { return _mm256_loadu_ps(p); }
inline __m256 load_basis8(const std::int8_t* p, const float* s) noexcept {
  const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_broadcast_ss(s));
}
#if defined(GRADCOMP_GRADIVEQ_HALF_LOADS)
inline __m256 load_basis8(const std::uint16_t* p, const float* = nullptr) noexcept {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
#if defined(__F16C__)
  return _mm256_cvtph_ps(h);
#else  // AVX-512 F without F16C's flag: the 512-bit conversion's low half
  return _mm512_castps512_ps256(_mm512_cvtph_ps(_mm256_castsi128_si256(h)));
#endif
}
#endif

/// Column j's scale for the loads of a basis of U: int8 bases carry one
/// (`scales`), the others none (null, never dereferenced).
template <class U>
inline const float* column_scale(const float* scales, std::size_t j) noexcept {
  if constexpr (std::is_same_v<U, std::int8_t>) return scales + j;
  else return nullptr;
}

/// Prefetches (into L1) the line `elements` values of type U past p (see
/// prefetch_floats_ahead).
template <class U>
inline void prefetch_ahead(const U* p, std::size_t elements) noexcept {
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(p) + elements * sizeof(U);
  _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T0);
}

/// The lane sums of four accumulators, in lanes_sum's order: hadd pairs
/// (a0+a1, a2+a3 | a4+a5, a6+a7), then pairs of pairs, then the two halves.
inline __m128 lanes_sum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) noexcept {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/// Eq. 3 for slices [s, s + R) and columns [j, j + 4), k a multiple of 8.
template <int R, class U = float>
inline void compress_block(const float* x, std::size_t s, std::size_t k, const U* u, const float* scales,
                           std::size_t j, std::size_t d, const float* offset, float* y) noexcept {
  __m256 acc[R][4];
  GRADCOMP_GRADIVEQ_UNROLL
  for (int r = 0; r < R; ++r)
    GRADCOMP_GRADIVEQ_UNROLL
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_ps();
  const U* u0 = u + j * k;
  for (std::size_t i = 0; i < k; i += 8) {
    // The R slices' values first, then each basis column once for all of them.
    __m256 xv[R];
    GRADCOMP_GRADIVEQ_UNROLL
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(x + (s + std::size_t(r)) * k + i);
    GRADCOMP_GRADIVEQ_UNROLL
    for (int c = 0; c < 4; ++c) {
      __m256 v = load_basis8(u0 + std::size_t(c) * k + i, column_scale<U>(scales, j + std::size_t(c)));
      // Loaded once, used R times: without this GCC re-reads it from memory
      // as an FMA operand.
      GRADCOMP_GRADIVEQ_IN_REGISTER(v);
      GRADCOMP_GRADIVEQ_UNROLL
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], v, acc[r][c]);
    }
  }
  const __m128 off = _mm_loadu_ps(offset + j);
  GRADCOMP_GRADIVEQ_UNROLL
  for (int r = 0; r < R; ++r)
    _mm_storeu_ps(y + (s + std::size_t(r)) * d + j,
                  _mm_sub_ps(lanes_sum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), off));
}

/// Eq. 5 for slices [s, s + R) and columns [c, c + 8 CB); Stream: write
/// `out` with non-temporal stores (not `add`, rows on 64-byte lines).
template <int R, int CB, bool Stream, class U = float>
inline void expand_block(const float* y, std::size_t s, std::size_t d, const U* u, const float* scales, std::size_t k,
                         std::size_t c, const float* mu, float scale, bool add, float* out) noexcept {
  __m256 acc[R][CB];
  GRADCOMP_GRADIVEQ_UNROLL
  for (int r = 0; r < R; ++r)
    GRADCOMP_GRADIVEQ_UNROLL
    for (int b = 0; b < CB; ++b) acc[r][b] = _mm256_setzero_ps();
  for (std::size_t j = 0; j < d; ++j) {
    const U* uj = u + j * k + c;
    if constexpr (CB == 4)  // the block expand_prefetch_blocks ahead: two 64-byte lines (binary16, int8: one)
      for (std::size_t line = 0; line < (2 * sizeof(U) + 3) / 4; ++line)
        prefetch_ahead(uj, 32 * expand_prefetch_blocks + 64 / sizeof(U) * line);
    // The R slices' coefficients first, then each basis vector once for all of them.
    __m256 yv[R];
    GRADCOMP_GRADIVEQ_UNROLL
    for (int r = 0; r < R; ++r) yv[r] = _mm256_broadcast_ss(y + (s + std::size_t(r)) * d + j);
    GRADCOMP_GRADIVEQ_UNROLL
    for (int b = 0; b < CB; ++b) {
      const __m256 v = load_basis8(uj + 8 * std::size_t(b), column_scale<U>(scales, j));
      GRADCOMP_GRADIVEQ_UNROLL
      for (int r = 0; r < R; ++r) acc[r][b] = _mm256_fmadd_ps(yv[r], v, acc[r][b]);
    }
  }
  const __m256 sc = _mm256_set1_ps(scale);
  GRADCOMP_GRADIVEQ_UNROLL
  for (int b = 0; b < CB; ++b) {
    const __m256 m = _mm256_loadu_ps(mu + c + 8 * std::size_t(b));
    GRADCOMP_GRADIVEQ_UNROLL
    for (int r = 0; r < R; ++r) {
      float* o = out + (s + std::size_t(r)) * k + c + 8 * std::size_t(b);
      const __m256 t = add ? _mm256_add_ps(_mm256_loadu_ps(o), acc[r][b]) : acc[r][b];
      if constexpr (Stream) {  // past the caches (16-byte aligned; see expand_rows)
        const __m256 v = _mm256_fmadd_ps(sc, m, t);
        _mm_stream_ps(o, _mm256_castps256_ps128(v));
        _mm_stream_ps(o + 4, _mm256_extractf128_ps(v, 1));
      } else {
        _mm256_storeu_ps(o, _mm256_fmadd_ps(sc, m, t));
      }
    }
  }
}

/// Eq. 5 for slices [s, s + R), every column. `nb`: a narrow copy of the
/// basis, read by the vector blocks instead of u where the build widens it
/// (the last k % 8 columns read u, whose values are the same).
template <int R, bool Stream>
inline void expand_rows_block(const float* y, std::size_t s, std::size_t d, const float* u, std::size_t k,
                              const float* mu, float scale, bool add, float* out,
                              [[maybe_unused]] gradiveq_narrow_basis nb = {}) noexcept {
  std::size_t c = 0;
  auto vector_blocks = [&](const auto* ub, const float* scales) {
    for (; c + 32 <= k; c += 32) expand_block<R, 4, Stream>(y, s, d, ub, scales, k, c, mu, scale, add, out);
    for (; c + 8 <= k; c += 8) expand_block<R, 1, Stream>(y, s, d, ub, scales, k, c, mu, scale, add, out);
  };
  if (nb.i8) vector_blocks(nb.i8, nb.i8_scale);
#if defined(GRADCOMP_GRADIVEQ_HALF_LOADS)
  else if (nb.f16) vector_blocks(nb.f16, nullptr);
#endif
  else vector_blocks(u, nullptr);
  if (c < k) expand_rows_scalar(y, s, s + std::size_t(R), d, u, k, c, k, mu, scale, add, out);
}

/// Eq. 3, columns [j, j + 4), for the slices [s0, s1) left over by the
/// blocks of compress_block_rows, in one block of their count (a 3x3 conv
/// layer has 3): each basis value is then loaded once for all of them.
template <class U>
inline void compress_block_rest(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const U* u,
                                const float* scales, std::size_t j, std::size_t d, const float* offset,
                                float* y) noexcept {
  const std::size_t rest = s1 - s0;
  if constexpr (compress_block_rows > 3)
    if (rest == 3) return compress_block<3, U>(x, s0, k, u, scales, j, d, offset, y);
  if constexpr (compress_block_rows > 2)
    if (rest == 2) return compress_block<2, U>(x, s0, k, u, scales, j, d, offset, y);
  for (std::size_t s = s0; s < s1; ++s) compress_block<1, U>(x, s, k, u, scales, j, d, offset, y);
}

/// Eq. 5 for the slices [s0, s1) left over by the blocks of
/// expand_block_rows, in one block of their count (a 3x3 conv layer has 3):
/// each basis value is then loaded once for all of them.
template <bool Stream>
inline void expand_rows_rest(const float* y, std::size_t s0, std::size_t s1, std::size_t d, const float* u,
                             std::size_t k, const float* mu, float scale, bool add, float* out,
                             gradiveq_narrow_basis nb = {}) noexcept {
  const std::size_t rest = s1 - s0;
  if constexpr (expand_block_rows > 3)
    if (rest == 3) return expand_rows_block<3, Stream>(y, s0, d, u, k, mu, scale, add, out, nb);
  if constexpr (expand_block_rows > 2)
    if (rest == 2) return expand_rows_block<2, Stream>(y, s0, d, u, k, mu, scale, add, out, nb);
  for (std::size_t s = s0; s < s1; ++s) expand_rows_block<1, Stream>(y, s, d, u, k, mu, scale, add, out, nb);
}

/// Prefetches, into L2, the R slices compress_prefetch_floats ahead of the
/// block at slice s: each block is a page or less, and the hardware
/// prefetchers stop at page boundaries (measured: a 46 MB encode
/// 12.1-12.5 -> 10.7-11.2 ms).
inline void compress_prefetch(const float* x, std::size_t s, std::size_t rows, std::size_t k, std::size_t s1) noexcept {
  const std::size_t ahead = (s + rows) * k + compress_prefetch_floats;
  if (ahead + rows * k <= s1 * k)
    for (std::size_t b = 0; b < rows * k; b += 16) _mm_prefetch(reinterpret_cast<const char*>(x + ahead + b), _MM_HINT_T1);
}

/// Eq. 3 with 256-bit vectors for columns [j0, d) of slices [s0, s1): blocks
/// of 4 columns (from `ub`, the basis as floats, binary16 or int8 with its
/// column `scales`), the last d % 4 columns portable (from u, the same values
/// as floats). k a multiple of 8.
template <class U>
inline void compress_columns_avx2_from(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const float* u,
                                       const U* ub, const float* scales, std::size_t j0, std::size_t d,
                                       const float* offset, float* y) noexcept {
  constexpr auto R = static_cast<std::size_t>(compress_block_rows);
  const std::size_t d4 = j0 + (d - j0) - (d - j0) % 4;
  const std::size_t blocked = s1 - (s1 - s0) % R;  // slices [s0, blocked) in blocks of R
  for (std::size_t s = s0; s < blocked; s += R) {
    if (j0 == 0) compress_prefetch(x, s, R, k, s1);
    for (std::size_t j = j0; j < d4; j += 4) compress_block<compress_block_rows, U>(x, s, k, ub, scales, j, d, offset, y);
    if (d4 < d) compress_rows_scalar(x, s, s + R, k, u, d4, d, offset, y);
  }
  if (blocked < s1) {
    for (std::size_t j = j0; j < d4; j += 4) compress_block_rest<U>(x, blocked, s1, k, ub, scales, j, d, offset, y);
    if (d4 < d) compress_rows_scalar(x, blocked, s1, k, u, d4, d, offset, y);
  }
}

/// compress_columns_avx2_from with the float basis, or the narrow copy `nb`
/// where the build widens it.
inline void compress_columns_avx2(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const float* u,
                                  std::size_t j0, std::size_t d, const float* offset, float* y,
                                  [[maybe_unused]] gradiveq_narrow_basis nb = {}) noexcept {
  if (nb.i8) return compress_columns_avx2_from(x, s0, s1, k, u, nb.i8, nb.i8_scale, j0, d, offset, y);
#if defined(GRADCOMP_GRADIVEQ_HALF_LOADS)
  if (nb.f16) return compress_columns_avx2_from(x, s0, s1, k, u, nb.f16, nullptr, j0, d, offset, y);
#endif
  compress_columns_avx2_from(x, s0, s1, k, u, u, nullptr, j0, d, offset, y);
}

/// Eq. 5 with 256-bit vectors for columns [c0, k) of slices [s0, s1),
/// ordinary stores: blocks of 8 columns, the last k % 8 portable.
inline void expand_columns_avx2(const float* y, std::size_t s0, std::size_t s1, std::size_t d, const float* u,
                                std::size_t k, std::size_t c0, const float* mu, float scale, bool add,
                                float* out) noexcept {
  const std::size_t k8 = c0 + (k - c0) - (k - c0) % 8;
  for (std::size_t s = s0; s < s1; ++s) {
    for (std::size_t c = c0; c < k8; c += 8) expand_block<1, 1, false>(y, s, d, u, nullptr, k, c, mu, scale, add, out);
    if (k8 < k) expand_rows_scalar(y, s, s + 1, d, u, k, k8, k, mu, scale, add, out);
  }
}

}  // namespace gradiveq_kernel

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution

#endif  // GRADCOMP_GRADIVEQ_AVX2
