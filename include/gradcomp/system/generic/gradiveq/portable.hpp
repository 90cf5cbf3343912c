#pragma once
/// \file system/generic/gradiveq/portable.hpp
/// GradiVeQ's seq kernels, part 1 of 3 (see system/generic/gradiveq.hpp,
/// whose comment gives the summation order): the instruction-set detection,
/// the constants and the portable reference kernels of eqs. 3 and 5.

#include <cmath>
#include <cstddef>
#include <cstdint>

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

/// A compact copy of a GradiVeQ basis whose every value the float basis
/// holds exactly, which the vector kernels read instead of it (eqs. 3 and 5
/// are memory-bound: the basis is K x d, the input and output K per slice):
/// IEEE binary16 bits (basis_precision::float16), or int8 values with one
/// power-of-two scale per column, u_j[i] = q_j[i] * scale[j]
/// (basis_precision::int8). Each load is widened to the float value itself
/// (an int8 times a power of two is a float exactly) before it is used, so
/// the kernels give the float kernels' bits on the float basis; builds
/// without the widening kernels read the float basis. Default: none.
struct gradiveq_narrow_basis {
  const std::uint16_t* f16 = nullptr;
  const std::int8_t* i8 = nullptr;
  const float* i8_scale = nullptr;  // d values, one per column

  gradiveq_narrow_basis() = default;
  /// A binary16 copy (or null: none).
  gradiveq_narrow_basis(const std::uint16_t* half) noexcept : f16(half) {}  // NOLINT: implicit, as the pointer it replaces
  /// An int8 copy and its column scales.
  gradiveq_narrow_basis(const std::int8_t* q, const float* scale) noexcept : i8(q), i8_scale(scale) {}
};

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

}  // namespace gradiveq_kernel

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
