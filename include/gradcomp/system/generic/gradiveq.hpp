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
/// with another -march may).

#include <cmath>
#include <cstddef>
#include <cstdint>

#if (defined(__AVX2__) && defined(__FMA__)) && !defined(GRADCOMP_GRADIVEQ_NO_INTRINSICS)
#include <immintrin.h>
#define GRADCOMP_GRADIVEQ_AVX2 1
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
/// non-temporal stores (AVX2 builds).
inline constexpr std::size_t stream_min_elements = std::size_t(1) << 16;

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
#else
#define GRADCOMP_GRADIVEQ_IN_REGISTERS(a, b, c, d) __asm__("" : "+x"(a), "+x"(b), "+x"(c), "+x"(d))
#define GRADCOMP_GRADIVEQ_IN_REGISTER(a) __asm__("" : "+x"(a))
#endif
#else
#define GRADCOMP_GRADIVEQ_IN_REGISTERS(a, b, c, d) ((void)0)
#define GRADCOMP_GRADIVEQ_IN_REGISTER(a) ((void)0)
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
/// `out` with non-temporal stores (not `add`, 16-byte aligned rows).
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
#endif

/// Eq. 3 for slices [s0, s1): y[s][j] = <x_s, u_j> - offset[j], every column.
inline void compress_rows(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const float* u, std::size_t d,
                          const float* offset, float* y) noexcept {
#if defined(GRADCOMP_GRADIVEQ_AVX2)
  if (k % 8 == 0 && d >= 4) {
    constexpr auto R = static_cast<std::size_t>(compress_block_rows);
    const std::size_t d4 = d - d % 4;
    const std::size_t blocked = s1 - (s1 - s0) % R;  // slices [s0, blocked) in blocks of R
    for (std::size_t s = s0; s < blocked; s += R) {
      // The slices compress_prefetch_floats ahead, into L2: each block of R
      // slices is a page or less, and the hardware prefetchers stop at page
      // boundaries (measured: a 46 MB encode 12.1-12.5 -> 10.7-11.2 ms).
      const std::size_t ahead = (s + R) * k + compress_prefetch_floats;
      if (ahead + R * k <= s1 * k)
        for (std::size_t b = 0; b < R * k; b += 16)
          _mm_prefetch(reinterpret_cast<const char*>(x + ahead + b), _MM_HINT_T1);
      for (std::size_t j = 0; j < d4; j += 4) compress_block<compress_block_rows>(x, s, k, u, j, d, offset, y);
      if (d4 < d) compress_rows_scalar(x, s, s + R, k, u, d4, d, offset, y);
    }
    if (blocked < s1) {
      for (std::size_t j = 0; j < d4; j += 4) compress_block_rest(x, blocked, s1, k, u, j, d, offset, y);
      if (d4 < d) compress_rows_scalar(x, blocked, s1, k, u, d4, d, offset, y);
    }
    return;
  }
#endif
  compress_rows_scalar(x, s0, s1, k, u, 0, d, offset, y);
}

/// Eq. 5 for slices [s0, s1): out (=, or += when `add`) Y U^T + 1 (scale mu)^T, every column.
inline void expand_rows(const float* y, std::size_t s0, std::size_t s1, std::size_t d, const float* u, std::size_t k,
                        const float* mu, float scale, bool add, float* out) noexcept {
#if defined(GRADCOMP_GRADIVEQ_AVX2)
  if (d > 0) {
    constexpr auto R = static_cast<std::size_t>(expand_block_rows);
    const std::size_t blocked = s1 - (s1 - s0) % R;  // slices [s0, blocked) in blocks of R
    // A large output (a ring segment or chunk) goes past the caches: it is
    // read back later, if at all, after other work has replaced it there, and
    // the stores then neither read the lines first nor evict the basis.
    const bool stream = !add && k % 4 == 0 && (s1 - s0) * k >= stream_min_elements &&
                        reinterpret_cast<std::uintptr_t>(out) % 16 == 0;
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
