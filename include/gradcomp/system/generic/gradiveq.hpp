#pragma once
/// \file system/generic/gradiveq.hpp
/// Generic (execution::seq) kernels of the GradiVeQ linear compressor
/// (seed 002, eqs. 3 and 5): the two products over all slices of a layer
/// segment, on the calling thread only.
///
/// Storage: the slices of a segment are the rows of a row-major S x K matrix
/// (that is exactly the layer's memory, slice after slice); the basis U_d is
/// a column-major K x d matrix; the coefficients are a row-major S x d matrix
/// (slice after slice, d values each).
///
/// Threads: seq runs on the thread that calls it, whatever the program links
/// (until issue 21 these were Eigen GEMMs, which start an OpenMP team of
/// Eigen::nbThreads() threads per call in any build with OpenMP, e.g. one
/// that links gradcomp::thrust: four ring workers on two cores then ran eight
/// spinning GEMM threads). For a multi-threaded encode or decode of one
/// segment use execution::thrust_omp, which gives the same bits.
///
/// Order: every result element has one fixed summation order, independent of
/// the thread count, the CPU's cache sizes and the instruction set (the
/// AVX2/AVX-512 paths below compute exactly what the scalar path computes):
///  - eq. 3, y[s][j] = <x_s, u_j> - offset[j]: 8 float lanes, lane l summing
///    x[i] u[i] over i = l mod 8 in index order with one rounding per step
///    (a fused multiply-add where the target has FMA), then the lanes
///    ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then - offset[j];
///  - eq. 5, out[s][c] = sum_j y[s][j] u_j[c] (j in order, from 0, fused)
///    + scale mu[c] (fused), the sum added to out first when accumulating.
/// The Thrust host kernels (system/thrust/gradiveq.hpp) run these same row
/// kernels on their work items, so seq, thrust_cpp and thrust_omp agree bit
/// for bit. Builds with and without FMA differ by rounding (as every build
/// with another -march may); AVX2 and AVX-512 builds agree with each other
/// and with a portable build that has FMA.
///
/// Instruction sets (compile time: -mavx2 -mfma, or -march=native): AVX2
/// computes eq. 3 in blocks of 2-4 slices x 4 columns, eq. 5 in blocks of
/// 2-4 slices x 32 columns. AVX-512 (F, DQ, VL) keeps eq. 3's 8 lanes per
/// column and puts two columns in one 512-bit register (blocks of 6 slices
/// x 8 columns, over tiles of slices that share each block of the basis),
/// and eq. 5 in blocks of 4 slices x 64 columns, streaming whole 64-byte
/// lines at any output alignment (expand_line_stream).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#if (defined(__AVX2__) && defined(__FMA__)) && !defined(GRADCOMP_GRADIVEQ_NO_INTRINSICS)
#include <immintrin.h>
#define GRADCOMP_GRADIVEQ_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define GRADCOMP_GRADIVEQ_AVX512 1
#endif
#endif

#include <gradcomp/detail/policy_tags.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace gradiveq_kernel {

/// acc + a*b in one fixed way: fused where the target has an FMA, else a
/// product then a sum (where nothing can fuse them).
inline float madd(float a, float b, float acc) noexcept {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return std::fma(a, b, acc);
#else
  const float p = a * b;
  return acc + p;
#endif
}

/// How far ahead of the block it works on eq. 3 prefetches its input
/// (32 KiB; AVX2 builds).
inline constexpr std::size_t compress_prefetch_floats = std::size_t(1) << 13;

/// Outputs of eq. 5 from this many floats on (256 KiB) are written with
/// non-temporal stores (AVX2 builds: rows on 64-byte boundaries; AVX-512
/// builds: any float alignment, K a multiple of 16).
inline constexpr std::size_t stream_min_elements = std::size_t(1) << 16;

/// AVX-512 eq. 3 works on tiles of slices of at most this many floats
/// (16 KiB, in L1 beside an 8-column block of the basis): each block of the
/// basis then serves the whole tile, not one register block of slices
/// (measured, 46 MB at K = 256, d = 32: 14.5-15.2 -> 13.0-13.5 ms).
inline constexpr std::size_t compress_tile_floats = std::size_t(1) << 12;

/// Lanes of eq. 3's dot products.
inline constexpr std::size_t lanes = 8;

/// ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)).
inline float lanes_sum(const float* a) noexcept {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/// Slices computed together by the portable kernels: each basis value loaded
/// serves this many slices. A conv layer has few slices (K = W*D*F: H of
/// them, 3 for a 3x3 kernel) and a basis of K x d floats, often larger than
/// the caches, so reading it once per slice made the products memory-bound.
/// Each element's own summation order does not depend on the grouping.
inline constexpr std::size_t portable_group_rows = 4;

/// Eq. 3, the reference order, for columns [j0, d) of slices [s0, s1).
/// Portable code the compiler vectorises over the 8 lanes; up to
/// portable_group_rows slices share each load of u_j.
inline void compress_rows_scalar(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const float* u,
                                 std::size_t j0, std::size_t d, const float* offset, float* y) noexcept {
  constexpr std::size_t L = lanes, G = portable_group_rows;
  for (std::size_t sg = s0; sg < s1; sg += G) {
    const std::size_t g = s1 - sg < G ? s1 - sg : G;
    for (std::size_t j = j0; j < d; ++j) {
      const float* uj = u + j * k;
      float a[G][L] = {};
      std::size_t i = 0;
      for (; i + L <= k; i += L)
        for (std::size_t r = 0; r < g; ++r) {
          const float* xr = x + (sg + r) * k + i;
          for (std::size_t l = 0; l < L; ++l) a[r][l] = madd(xr[l], uj[i + l], a[r][l]);
        }
      for (std::size_t r = 0; r < g; ++r) {
        const float* xr = x + (sg + r) * k;
        for (std::size_t l = 0; i + l < k; ++l) a[r][l] = madd(xr[i + l], uj[i + l], a[r][l]);
        y[(sg + r) * d + j] = lanes_sum(a[r]) - offset[j];
      }
    }
  }
}

/// Eq. 5, the reference order, for columns [c0, c1) of slices [s0, s1).
/// Portable code the compiler vectorises over the columns (blocks of 1024:
/// each u_j is read in 4 KiB runs, which the prefetchers follow);
/// up to portable_group_rows slices share each load of a block of u_j.
inline void expand_rows_scalar(const float* y, std::size_t s0, std::size_t s1, std::size_t d, const float* u,
                               std::size_t k, std::size_t c0, std::size_t c1, const float* mu, float scale, bool add,
                               float* out) noexcept {
  constexpr std::size_t C = 1024, G = portable_group_rows;
  float t[G][C];
  for (std::size_t sg = s0; sg < s1; sg += G) {
    const std::size_t g = s1 - sg < G ? s1 - sg : G;
    for (std::size_t cb = c0; cb < c1; cb += C) {
      const std::size_t m = c1 - cb < C ? c1 - cb : C;
      const float* mc = mu + cb;
      if (d == 0) {
        for (std::size_t r = 0; r < g; ++r) {
          float* o = out + (sg + r) * k + cb;
          for (std::size_t c = 0; c < m; ++c) o[c] = madd(scale, mc[c], add ? o[c] : 0.0f);
        }
        continue;
      }
      for (std::size_t r = 0; r < g; ++r)
        for (std::size_t c = 0; c < m; ++c) t[r][c] = 0.0f;
      for (std::size_t j = 0; j < d; ++j) {
        const float* uc = u + j * k + cb;
        for (std::size_t r = 0; r < g; ++r) {
          const float yj = y[(sg + r) * d + j];
          for (std::size_t c = 0; c < m; ++c) t[r][c] = madd(yj, uc[c], t[r][c]);
        }
      }
      for (std::size_t r = 0; r < g; ++r) {
        float* o = out + (sg + r) * k + cb;
        if (add) {
          for (std::size_t c = 0; c < m; ++c) o[c] = madd(scale, mc[c], o[c] + t[r][c]);
        } else {
          for (std::size_t c = 0; c < m; ++c) o[c] = madd(scale, mc[c], t[r][c]);
        }
      }
    }
  }
}

#if defined(GRADCOMP_GRADIVEQ_AVX2)
// The register blocks' loops are unrolled (so the accumulators live in
// registers, not in a stack array rewritten every step).
#if defined(__clang__)
#define GRADCOMP_GRADIVEQ_UNROLL _Pragma("unroll")
#else
#define GRADCOMP_GRADIVEQ_UNROLL _Pragma("GCC unroll 16")
#endif
#if defined(__GNUC__)
#if defined(__AVX512VL__)
#define GRADCOMP_GRADIVEQ_IN_REGISTERS(a, b, c, d) __asm__("" : "+v"(a), "+v"(b), "+v"(c), "+v"(d))
#define GRADCOMP_GRADIVEQ_IN_REGISTER(a) __asm__("" : "+v"(a))
#define GRADCOMP_GRADIVEQ_USE_REGISTER(a) __asm__("" ::"v"(a))
#else
#define GRADCOMP_GRADIVEQ_IN_REGISTERS(a, b, c, d) __asm__("" : "+x"(a), "+x"(b), "+x"(c), "+x"(d))
#define GRADCOMP_GRADIVEQ_IN_REGISTER(a) __asm__("" : "+x"(a))
#endif
#else
#define GRADCOMP_GRADIVEQ_IN_REGISTERS(a, b, c, d) ((void)0)
#define GRADCOMP_GRADIVEQ_IN_REGISTER(a) ((void)0)
#endif
#if !defined(GRADCOMP_GRADIVEQ_USE_REGISTER)
#define GRADCOMP_GRADIVEQ_USE_REGISTER(a) GRADCOMP_GRADIVEQ_IN_REGISTER(a)
#endif
// 32 vector registers with AVX-512VL (the ymm forms reach ymm16-31), else 16:
// the register blocks below are sized to stay in registers.
#if defined(__AVX512VL__)
inline constexpr int compress_block_rows = 4;
inline constexpr int expand_block_rows = 4;
#else
inline constexpr int compress_block_rows = 2;
inline constexpr int expand_block_rows = 2;
#endif

/// The lane sums of four accumulators, in lanes_sum's order: hadd pairs
/// (a0+a1, a2+a3 | a4+a5, a6+a7), then pairs of pairs, then the two halves.
inline __m128 lanes_sum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) noexcept {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/// Eq. 3 for slices [s, s + R) and columns [j, j + 4), k a multiple of 8.
template <int R>
inline void compress_block(const float* x, std::size_t s, std::size_t k, const float* u, std::size_t j, std::size_t d,
                           const float* offset, float* y) noexcept {
  __m256 acc[R][4];
  GRADCOMP_GRADIVEQ_UNROLL
  for (int r = 0; r < R; ++r)
    GRADCOMP_GRADIVEQ_UNROLL
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_ps();
  const float* u0 = u + j * k;
  for (std::size_t i = 0; i < k; i += 8) {
    __m256 v0 = _mm256_loadu_ps(u0 + i), v1 = _mm256_loadu_ps(u0 + k + i), v2 = _mm256_loadu_ps(u0 + 2 * k + i),
                 v3 = _mm256_loadu_ps(u0 + 3 * k + i);
    // Loaded once, used R times: without this GCC re-reads each from memory
    // as an FMA operand (R + 4 loads per 4 R FMAs instead of R + 4 per 4 R).
    GRADCOMP_GRADIVEQ_IN_REGISTERS(v0, v1, v2, v3);
    GRADCOMP_GRADIVEQ_UNROLL
    for (int r = 0; r < R; ++r) {
      __m256 xv = _mm256_loadu_ps(x + (s + std::size_t(r)) * k + i);
      GRADCOMP_GRADIVEQ_IN_REGISTER(xv);
      acc[r][0] = _mm256_fmadd_ps(xv, v0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xv, v1, acc[r][1]);
      acc[r][2] = _mm256_fmadd_ps(xv, v2, acc[r][2]);
      acc[r][3] = _mm256_fmadd_ps(xv, v3, acc[r][3]);
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
template <int R, int CB, bool Stream>
inline void expand_block(const float* y, std::size_t s, std::size_t d, const float* u, std::size_t k, std::size_t c,
                         const float* mu, float scale, bool add, float* out) noexcept {
  __m256 acc[R][CB];
  GRADCOMP_GRADIVEQ_UNROLL
  for (int r = 0; r < R; ++r)
    GRADCOMP_GRADIVEQ_UNROLL
    for (int b = 0; b < CB; ++b) acc[r][b] = _mm256_setzero_ps();
  for (std::size_t j = 0; j < d; ++j) {
    __m256 v[CB];
    GRADCOMP_GRADIVEQ_UNROLL
    for (int b = 0; b < CB; ++b) {
      v[b] = _mm256_loadu_ps(u + j * k + c + 8 * std::size_t(b));
      GRADCOMP_GRADIVEQ_IN_REGISTER(v[b]);  // loaded once, used R times
    }
    GRADCOMP_GRADIVEQ_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 yv = _mm256_broadcast_ss(y + (s + std::size_t(r)) * d + j);
      GRADCOMP_GRADIVEQ_UNROLL
      for (int b = 0; b < CB; ++b) acc[r][b] = _mm256_fmadd_ps(yv, v[b], acc[r][b]);
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

/// Eq. 5 for slices [s, s + R), every column.
template <int R, bool Stream>
inline void expand_rows_block(const float* y, std::size_t s, std::size_t d, const float* u, std::size_t k,
                              const float* mu, float scale, bool add, float* out) noexcept {
  std::size_t c = 0;
  for (; c + 32 <= k; c += 32) expand_block<R, 4, Stream>(y, s, d, u, k, c, mu, scale, add, out);
  for (; c + 8 <= k; c += 8) expand_block<R, 1, Stream>(y, s, d, u, k, c, mu, scale, add, out);
  if (c < k) expand_rows_scalar(y, s, s + std::size_t(R), d, u, k, c, k, mu, scale, add, out);
}

/// Eq. 3, columns [j, j + 4), for the slices [s0, s1) left over by the
/// blocks of compress_block_rows, in one block of their count (a 3x3 conv
/// layer has 3): each basis value is then loaded once for all of them.
inline void compress_block_rest(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const float* u,
                                std::size_t j, std::size_t d, const float* offset, float* y) noexcept {
  const std::size_t rest = s1 - s0;
  if constexpr (compress_block_rows > 3)
    if (rest == 3) return compress_block<3>(x, s0, k, u, j, d, offset, y);
  if constexpr (compress_block_rows > 2)
    if (rest == 2) return compress_block<2>(x, s0, k, u, j, d, offset, y);
  for (std::size_t s = s0; s < s1; ++s) compress_block<1>(x, s, k, u, j, d, offset, y);
}

/// Eq. 5 for the slices [s0, s1) left over by the blocks of
/// expand_block_rows, in one block of their count (a 3x3 conv layer has 3):
/// each basis value is then loaded once for all of them.
template <bool Stream>
inline void expand_rows_rest(const float* y, std::size_t s0, std::size_t s1, std::size_t d, const float* u,
                             std::size_t k, const float* mu, float scale, bool add, float* out) noexcept {
  const std::size_t rest = s1 - s0;
  if constexpr (expand_block_rows > 3)
    if (rest == 3) return expand_rows_block<3, Stream>(y, s0, d, u, k, mu, scale, add, out);
  if constexpr (expand_block_rows > 2)
    if (rest == 2) return expand_rows_block<2, Stream>(y, s0, d, u, k, mu, scale, add, out);
  for (std::size_t s = s0; s < s1; ++s) expand_rows_block<1, Stream>(y, s, d, u, k, mu, scale, add, out);
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
/// of 4 columns, the last d % 4 columns portable. k a multiple of 8.
inline void compress_columns_avx2(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const float* u,
                                  std::size_t j0, std::size_t d, const float* offset, float* y) noexcept {
  constexpr auto R = static_cast<std::size_t>(compress_block_rows);
  const std::size_t d4 = j0 + (d - j0) - (d - j0) % 4;
  const std::size_t blocked = s1 - (s1 - s0) % R;  // slices [s0, blocked) in blocks of R
  for (std::size_t s = s0; s < blocked; s += R) {
    if (j0 == 0) compress_prefetch(x, s, R, k, s1);
    for (std::size_t j = j0; j < d4; j += 4) compress_block<compress_block_rows>(x, s, k, u, j, d, offset, y);
    if (d4 < d) compress_rows_scalar(x, s, s + R, k, u, d4, d, offset, y);
  }
  if (blocked < s1) {
    for (std::size_t j = j0; j < d4; j += 4) compress_block_rest(x, blocked, s1, k, u, j, d, offset, y);
    if (d4 < d) compress_rows_scalar(x, blocked, s1, k, u, d4, d, offset, y);
  }
}

/// Eq. 5 with 256-bit vectors for columns [c0, k) of slices [s0, s1),
/// ordinary stores: blocks of 8 columns, the last k % 8 portable.
inline void expand_columns_avx2(const float* y, std::size_t s0, std::size_t s1, std::size_t d, const float* u,
                                std::size_t k, std::size_t c0, const float* mu, float scale, bool add,
                                float* out) noexcept {
  const std::size_t k8 = c0 + (k - c0) - (k - c0) % 8;
  for (std::size_t s = s0; s < s1; ++s) {
    for (std::size_t c = c0; c < k8; c += 8) expand_block<1, 1, false>(y, s, d, u, k, c, mu, scale, add, out);
    if (k8 < k) expand_rows_scalar(y, s, s + 1, d, u, k, k8, k, mu, scale, add, out);
  }
}

#if defined(GRADCOMP_GRADIVEQ_AVX512)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's own AVX-512 intrinsics (broadcast, extract) start from
// _mm512_undefined_*, which -Wuninitialized reports once inlined at -O3
// (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// AVX-512: 512-bit vectors compute the very same order. Eq. 3 puts two
// columns' 8 lanes in one register (lanes 0-7 column j, 8-15 column j + 1),
// eq. 5 is vectorised over columns, whose order does not depend on the width.

/// Register blocks: eq. 3 six slices x 8 columns (24 accumulators), eq. 5
/// four slices x 64 columns (16 accumulators).
inline constexpr int compress_block_rows_512 = 6;
inline constexpr int expand_block_rows_512 = 4;

/// Eq. 3 for slices [s, s + R) and columns [j, j + 8), k a multiple of 8.
/// `u`: the basis, or with Packed its pairs of columns interleaved in runs
/// of 8 (pack_column_pairs: one load per register instead of two and a
/// shuffle; measured, 46 MB: 13.8 -> 11.7 ms).
template <int R, bool Packed = false>
inline void compress_block8(const float* x, std::size_t s, std::size_t k, const float* u, std::size_t j, std::size_t d,
                            const float* offset, float* y) noexcept {
  __m512 acc[R][4];
  GRADCOMP_GRADIVEQ_UNROLL
  for (int r = 0; r < R; ++r)
    GRADCOMP_GRADIVEQ_UNROLL
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  const float* u0 = u + j * k;
  for (std::size_t i = 0; i < k; i += 8) {
    __m512 v[4];  // columns (j + 2c, j + 2c + 1), lanes i .. i + 7 of each
    GRADCOMP_GRADIVEQ_UNROLL
    for (int c = 0; c < 4; ++c) {
      if constexpr (Packed)
        v[c] = _mm512_loadu_ps(u0 + std::size_t(2 * c) * k + 2 * i);
      else
        v[c] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(u0 + std::size_t(2 * c) * k + i)),
                                  _mm256_loadu_ps(u0 + std::size_t(2 * c + 1) * k + i), 1);
      // Built once, used R times: in a register (an input-only constraint:
      // measured 13.5 -> 12.5 ms against "+v", which helps eq. 5 instead).
      GRADCOMP_GRADIVEQ_USE_REGISTER(v[c]);
    }
    GRADCOMP_GRADIVEQ_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + (s + std::size_t(r)) * k + i));
      GRADCOMP_GRADIVEQ_UNROLL
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(xv, v[c], acc[r][c]);
    }
  }
  const __m256 off = _mm256_loadu_ps(offset + j);
  GRADCOMP_GRADIVEQ_UNROLL
  for (int r = 0; r < R; ++r) {
    const __m128 lo = lanes_sum4(_mm512_castps512_ps256(acc[r][0]), _mm512_extractf32x8_ps(acc[r][0], 1),
                                 _mm512_castps512_ps256(acc[r][1]), _mm512_extractf32x8_ps(acc[r][1], 1));
    const __m128 hi = lanes_sum4(_mm512_castps512_ps256(acc[r][2]), _mm512_extractf32x8_ps(acc[r][2], 1),
                                 _mm512_castps512_ps256(acc[r][3]), _mm512_extractf32x8_ps(acc[r][3], 1));
    _mm256_storeu_ps(y + (s + std::size_t(r)) * d + j,
                     _mm256_sub_ps(_mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1), off));
  }
}

/// Eq. 3, columns [j, j + 8), for fewer than compress_block_rows_512 slices.
template <bool Packed>
inline void compress_block8_rest(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const float* u,
                                 std::size_t j, std::size_t d, const float* offset, float* y) noexcept {
  static_assert(compress_block_rows_512 == 6);
  switch (s1 - s0) {
    case 5: return compress_block8<5, Packed>(x, s0, k, u, j, d, offset, y);
    case 4: return compress_block8<4, Packed>(x, s0, k, u, j, d, offset, y);
    case 3: return compress_block8<3, Packed>(x, s0, k, u, j, d, offset, y);
    case 2: return compress_block8<2, Packed>(x, s0, k, u, j, d, offset, y);
    case 1: return compress_block8<1, Packed>(x, s0, k, u, j, d, offset, y);
    default: return;
  }
}

/// Columns [0, d8) of the basis with each pair (2p, 2p + 1) interleaved in
/// runs of 8: packed[p][i / 8][16] = u_2p[i .. i + 8), u_2p+1[i .. i + 8).
inline void pack_column_pairs(const float* u, std::size_t k, std::size_t d8, float* packed) noexcept {
  for (std::size_t p = 0; p < d8 / 2; ++p)
    for (std::size_t i = 0; i < k; i += 8) {
      float* dst = packed + p * 2 * k + 2 * i;
      _mm256_storeu_ps(dst, _mm256_loadu_ps(u + 2 * p * k + i));
      _mm256_storeu_ps(dst + 8, _mm256_loadu_ps(u + (2 * p + 1) * k + i));
    }
}

/// A call covers at least this many slices per basis column before it packs
/// the basis (the packing reads and writes the basis once).
inline constexpr std::size_t pack_min_slices_per_column = 8;

/// Eq. 3 over the tiles and blocks of compress_rows_avx512, columns [0, d8).
template <bool Packed>
inline void compress_tiles512(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const float* u,
                              std::size_t d8, std::size_t d, const float* offset, float* y) noexcept {
  constexpr auto R = static_cast<std::size_t>(compress_block_rows_512);
  const std::size_t fit = compress_tile_floats / k / R * R;
  const std::size_t tile = fit ? fit : R;
  std::size_t s = s0;
  for (; s + tile <= s1; s += tile)
    for (std::size_t j = 0; j < d8; j += 8)
      for (std::size_t g = s; g < s + tile; g += R) {
        if (j == 0) compress_prefetch(x, g, R, k, s1);
        compress_block8<compress_block_rows_512, Packed>(x, g, k, u, j, d, offset, y);
      }
  for (; s + R <= s1; s += R) {
    compress_prefetch(x, s, R, k, s1);
    for (std::size_t j = 0; j < d8; j += 8) compress_block8<compress_block_rows_512, Packed>(x, s, k, u, j, d, offset, y);
  }
  if (s < s1)
    for (std::size_t j = 0; j < d8; j += 8) compress_block8_rest<Packed>(x, s, s1, k, u, j, d, offset, y);
}

/// Eq. 3 for slices [s0, s1), k a multiple of 8: tiles of slices that fit
/// compress_tile_floats, each 8-column block of the basis over the whole
/// tile (from a packed copy of the basis when the call is long enough to
/// pay for it: a buffer of this thread's, kept); the last d % 8 columns with
/// 256-bit vectors.
inline void compress_rows_avx512(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const float* u,
                                 std::size_t d, const float* offset, float* y) noexcept {
  const std::size_t d8 = d - d % 8;
  if (d8 > 0) {
    float* packed = nullptr;
    if (s1 - s0 >= pack_min_slices_per_column * d8) {
      thread_local std::vector<float> buffer;
      try {
        if (buffer.size() < k * d8) buffer.resize(k * d8);
        packed = buffer.data();
      } catch (...) {  // no memory for it: the unpacked loads give the same bits
      }
    }
    if (packed) {
      pack_column_pairs(u, k, d8, packed);
      compress_tiles512<true>(x, s0, s1, k, packed, d8, d, offset, y);
    } else {
      compress_tiles512<false>(x, s0, s1, k, u, d8, d, offset, y);
    }
  }
  if (d8 < d) compress_columns_avx2(x, s0, s1, k, u, d8, d, offset, y);
}

/// Eq. 5 for slices [s, s + R) and columns [c, c + 16 CB): each result
/// vector goes to sink(slice, r, column, value).
template <int R, int CB, class Sink>
inline void expand_block16(const float* y, std::size_t s, std::size_t d, const float* u, std::size_t k, std::size_t c,
                           const float* mu, float scale, bool add, const float* out, Sink& sink) noexcept {
  __m512 acc[R][CB];
  GRADCOMP_GRADIVEQ_UNROLL
  for (int r = 0; r < R; ++r)
    GRADCOMP_GRADIVEQ_UNROLL
    for (int b = 0; b < CB; ++b) acc[r][b] = _mm512_setzero_ps();
  for (std::size_t j = 0; j < d; ++j) {
    __m512 v[CB];
    GRADCOMP_GRADIVEQ_UNROLL
    for (int b = 0; b < CB; ++b) {
      v[b] = _mm512_loadu_ps(u + j * k + c + 16 * std::size_t(b));
      GRADCOMP_GRADIVEQ_IN_REGISTER(v[b]);  // loaded once, used R times
    }
    GRADCOMP_GRADIVEQ_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 yv = _mm512_set1_ps(y[(s + std::size_t(r)) * d + j]);
      GRADCOMP_GRADIVEQ_UNROLL
      for (int b = 0; b < CB; ++b) acc[r][b] = _mm512_fmadd_ps(yv, v[b], acc[r][b]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  GRADCOMP_GRADIVEQ_UNROLL
  for (int r = 0; r < R; ++r)
    GRADCOMP_GRADIVEQ_UNROLL
    for (int b = 0; b < CB; ++b) {
      const std::size_t col = c + 16 * std::size_t(b);
      const __m512 m = _mm512_loadu_ps(mu + col);
      const __m512 t = add ? _mm512_add_ps(_mm512_loadu_ps(out + (s + std::size_t(r)) * k + col), acc[r][b]) : acc[r][b];
      sink(s + std::size_t(r), r, col, _mm512_fmadd_ps(sc, m, t));
    }
}

/// Ordinary stores of eq. 5's vectors.
struct expand_store {
  float* out;
  std::size_t k;
  void begin_group(std::size_t, int) noexcept {}
  void operator()(std::size_t s, int, std::size_t col, __m512 v) const noexcept { _mm512_storeu_ps(out + s * k + col, v); }
};

/// Non-temporal stores of eq. 5's vectors into a region of whole rows of k
/// floats (k a multiple of 16) at any float alignment: each aligned 64-byte
/// line is assembled from the two result vectors it straddles (one
/// permute) and streamed whole; only the region's first and last partial
/// lines get ordinary (masked) stores. A partial-line non-temporal store is
/// a read-modify-write in memory (measured: 46 MB decoded 16 bytes off a
/// line, 22-24 ms against 14 ms aligned). Rows are contiguous, so the line
/// across two rows joins the last vector of one and the first of the next,
/// whichever of them the column blocks produce second.
struct expand_line_stream {
  static constexpr int max_rows = expand_block_rows_512;
  float* region;      // row s0 of the output
  std::size_t s0, k, rows_done = 0;
  unsigned h;         // columns before the first 64-byte boundary of a row
  __m512i join_index; // h, h + 1, ..., h + 15
  __m512 prev[max_rows], first[max_rows], last[max_rows], carry;
  bool has_first[max_rows] = {}, has_last[max_rows] = {}, has_carry = false;
  int group_rows = 0;

  expand_line_stream(float* region_, std::size_t s0_, std::size_t k_) noexcept
      : region(region_), s0(s0_), k(k_),
        h(static_cast<unsigned>((16 - (reinterpret_cast<std::uintptr_t>(region_) % 64) / 4) % 16)),
        join_index(_mm512_add_epi32(_mm512_set1_epi32(int(h)),
                                    _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))) {}

  /// Address of the line that ends h columns into column `col` of row s
  /// (computed as an integer: for the region's first line it precedes it).
  float* line(std::size_t s, std::size_t col) const noexcept {
    return reinterpret_cast<float*>(reinterpret_cast<std::uintptr_t>(region) +
                                    4 * ((s - s0) * k + col + h) - 64);
  }
  /// a[h..16) then b[0..h): the 16 floats of the line between them.
  __m512 join(__m512 a, __m512 b) const noexcept { return _mm512_permutex2var_ps(a, join_index, b); }

  void begin_group(std::size_t, int rows) noexcept {
    group_rows = rows;
    for (int r = 0; r < max_rows; ++r) has_first[r] = has_last[r] = false;
  }
  void operator()(std::size_t s, int r, std::size_t col, __m512 v) noexcept {
    if (col != 0) {
      _mm512_stream_ps(line(s, col), join(prev[r], v));
    } else if (r == 0) {
      if (has_carry) _mm512_stream_ps(line(s, 0), join(carry, v));
      else if (h != 0) _mm512_mask_storeu_ps(line(s, 0), __mmask16(0xFFFFu << (16 - h)), join(v, v));  // region start
    } else if (has_last[r - 1]) {
      _mm512_stream_ps(line(s, 0), join(last[r - 1], v));
    } else {
      first[r] = v;
      has_first[r] = true;
    }
    prev[r] = v;
    if (col + 16 == k) {
      if (r + 1 == group_rows) {
        carry = v;
        has_carry = true;
      } else if (r + 1 < max_rows && has_first[r + 1]) {
        _mm512_stream_ps(line(s + 1, 0), join(v, first[r + 1]));
      } else {
        last[r] = v;
        has_last[r] = true;
      }
    }
  }
  /// The region's last partial line (or whole one when h = 0), then a fence:
  /// the stores are visible before anything this thread does next.
  void finish(std::size_t s1) noexcept {
    if (has_carry) {
      if (h == 0) _mm512_stream_ps(line(s1, 0), carry);
      else _mm512_mask_storeu_ps(line(s1, 0), __mmask16((1u << (16 - h)) - 1u), join(carry, carry));
    }
    _mm_sfence();
  }
};

/// Eq. 5 for slices [s, s + R), columns [0, k - k % 16), into `sink`.
template <int R, class Sink>
inline void expand_group512(const float* y, std::size_t s, std::size_t d, const float* u, std::size_t k,
                            const float* mu, float scale, bool add, const float* out, Sink& sink) noexcept {
  sink.begin_group(s, R);
  const std::size_t k64 = k - k % 64, k16 = k - k % 16;
  std::size_t c = 0;
  for (; c < k64; c += 64) expand_block16<R, 4>(y, s, d, u, k, c, mu, scale, add, out, sink);
  for (; c < k16; c += 16) expand_block16<R, 1>(y, s, d, u, k, c, mu, scale, add, out, sink);
}

/// Eq. 5 for slices [s0, s1), columns [0, k - k % 16), in register blocks of
/// expand_block_rows_512 slices.
template <class Sink>
inline void expand_rows512(const float* y, std::size_t s0, std::size_t s1, std::size_t d, const float* u,
                           std::size_t k, const float* mu, float scale, bool add, const float* out,
                           Sink& sink) noexcept {
  static_assert(expand_block_rows_512 == 4);
  std::size_t s = s0;
  for (; s + 4 <= s1; s += 4) expand_group512<4>(y, s, d, u, k, mu, scale, add, out, sink);
  switch (s1 - s) {
    case 3: return expand_group512<3>(y, s, d, u, k, mu, scale, add, out, sink);
    case 2: return expand_group512<2>(y, s, d, u, k, mu, scale, add, out, sink);
    case 1: return expand_group512<1>(y, s, d, u, k, mu, scale, add, out, sink);
    default: return;
  }
}

/// Eq. 5 for slices [s0, s1), every column: non-temporal stores for a large
/// output (see expand_rows), the last k % 16 columns with 256-bit vectors.
inline void expand_rows_avx512(const float* y, std::size_t s0, std::size_t s1, std::size_t d, const float* u,
                               std::size_t k, const float* mu, float scale, bool add, float* out) noexcept {
  const bool stream = !add && k % 16 == 0 && (s1 - s0) * k >= stream_min_elements;
  if (stream) {
    expand_line_stream sink(out + s0 * k, s0, k);
    expand_rows512(y, s0, s1, d, u, k, mu, scale, add, out, sink);
    sink.finish(s1);
    return;
  }
  if (k >= 16) {
    expand_store sink{out, k};
    expand_rows512(y, s0, s1, d, u, k, mu, scale, add, out, sink);
  }
  if (k % 16 != 0) expand_columns_avx2(y, s0, s1, d, u, k, k - k % 16, mu, scale, add, out);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // GRADCOMP_GRADIVEQ_AVX512
#endif  // GRADCOMP_GRADIVEQ_AVX2

/// Eq. 3 for slices [s0, s1): y[s][j] = <x_s, u_j> - offset[j], every column.
inline void compress_rows(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const float* u, std::size_t d,
                          const float* offset, float* y) noexcept {
#if defined(GRADCOMP_GRADIVEQ_AVX512)
  if (k % 8 == 0 && d >= 4) return compress_rows_avx512(x, s0, s1, k, u, d, offset, y);
#elif defined(GRADCOMP_GRADIVEQ_AVX2)
  if (k % 8 == 0 && d >= 4) return compress_columns_avx2(x, s0, s1, k, u, 0, d, offset, y);
#endif
  compress_rows_scalar(x, s0, s1, k, u, 0, d, offset, y);
}

/// Eq. 5 for slices [s0, s1): out (=, or += when `add`) Y U^T + 1 (scale mu)^T, every column.
inline void expand_rows(const float* y, std::size_t s0, std::size_t s1, std::size_t d, const float* u, std::size_t k,
                        const float* mu, float scale, bool add, float* out) noexcept {
#if defined(GRADCOMP_GRADIVEQ_AVX512)
  if (d > 0) return expand_rows_avx512(y, s0, s1, d, u, k, mu, scale, add, out);
#elif defined(GRADCOMP_GRADIVEQ_AVX2)
  if (d > 0) {
    constexpr auto R = static_cast<std::size_t>(expand_block_rows);
    const std::size_t blocked = s1 - (s1 - s0) % R;  // slices [s0, blocked) in blocks of R
    // A large output (a ring segment or chunk) goes past the caches: it is
    // read back later, if at all, after other work has replaced it there, and
    // the stores then neither read the lines first nor evict the basis. Only
    // whole 64-byte lines: rows on line boundaries (the AVX-512 path streams
    // any alignment).
    const bool stream = !add && k % 16 == 0 && (s1 - s0) * k >= stream_min_elements &&
                        reinterpret_cast<std::uintptr_t>(out + s0 * k) % 64 == 0;
    if (stream) {
      for (std::size_t s = s0; s < blocked; s += R) expand_rows_block<expand_block_rows, true>(y, s, d, u, k, mu, scale, add, out);
      expand_rows_rest<true>(y, blocked, s1, d, u, k, mu, scale, add, out);
      _mm_sfence();  // the stores are visible before anything this thread does next
    } else {
      for (std::size_t s = s0; s < blocked; s += R) expand_rows_block<expand_block_rows, false>(y, s, d, u, k, mu, scale, add, out);
      expand_rows_rest<false>(y, blocked, s1, d, u, k, mu, scale, add, out);
    }
    return;
  }
#endif
  expand_rows_scalar(y, s0, s1, d, u, k, 0, k, mu, scale, add, out);
}

}  // namespace gradiveq_kernel

#undef GRADCOMP_GRADIVEQ_UNROLL
#undef GRADCOMP_GRADIVEQ_IN_REGISTERS
#undef GRADCOMP_GRADIVEQ_IN_REGISTER
#undef GRADCOMP_GRADIVEQ_USE_REGISTER

/// Eq. 3 for S slices at once: Y = X U - 1 offset^T, where offset = U^T mu / N
/// is precomputed by the caller (writing it as X*U - (mu U)/N avoids the
/// S x K temporary that (X - mu/N) U would make). On the calling thread, in
/// the order of the file comment.
inline void gradiveq_compress_slices(seq, const float* x, std::size_t slices, std::size_t k, const float* basis,
                                     std::size_t d, const float* offset, float* y) {
  if (slices == 0 || d == 0) return;
  gradiveq_kernel::compress_rows(x, 0, slices, k, basis, d, offset, y);
}

/// Eq. 5 for S slices at once: out (=, or += when `add`) Y U^T + 1 (scale mu)^T.
/// scale is count/N: N for a fully aggregated payload (eq. 5 proper), 1/N for
/// one node's own payload (the local reconstruction of eq. 7). On the calling
/// thread, in the order of the file comment.
inline void gradiveq_expand_slices(seq, const float* y, std::size_t slices, std::size_t d, const float* basis,
                                   std::size_t k, const float* mu, float scale, bool add, float* out) {
  if (slices == 0) return;
  gradiveq_kernel::expand_rows(y, 0, slices, d, basis, k, mu, scale, add, out);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
