#pragma once
/// \file system/generic/powersgd.hpp
/// Generic (execution::seq) kernels of PowerSGD (Vogels, Karimireddy and
/// Jaggi, NeurIPS 2019, Algorithm 1 with the error feedback of Algorithm 2):
/// the three passes of a step over a layer's matrix.
///
/// Storage: a layer's matrix M is row-major rows x cols (exactly the
/// framework's memory of a [C_out, C_in, kH, kW] conv weight viewed as
/// C_out x (C_in kH kW), or of a [rows, cols] linear weight); P is
/// column-major rows x r and Q column-major cols x r (each column contiguous,
/// which the Gram-Schmidt orthonormalisation reads).
///
/// Why not Eigen's GEMM: with r = 1..8 the products are memory-bound
/// streams, and Eigen's general kernels (blocking and packing for large
/// inner dimensions) ran them 5-20x below the triad rate here (P Q^T, an
/// outer product with an inner dimension of 2, was the slowest). These loops
/// stream the big matrix once per pass, row by row, 16 columns at a time in
/// GCC's and Clang's generic vectors (for r = 1..4; plain loops for larger
/// r): pass 1 forms M = G + E (with its finiteness test), stores it and adds
/// the r products into 16-lane accumulators in one loop; pass 2 adds eight
/// rows at a time into Q (two groups of four, the same additions as four at
/// a time); pass 3 writes the output and the new residual, the residual over
/// M itself (the codec then swaps its M and residual buffers). Bytes per
/// element: pass 1 reads G and E and writes M (12), pass 2 reads M (4), pass
/// 3 reads M, writes E in place and writes the output (12): 28. Matrices of
/// at least stream_min_elements write M and the output with non-temporal
/// stores (no read of the destination line first), so the memory moves
/// those 28 bytes and not 36. Every sum runs in a fixed order (16 float
/// lanes in index order then a fixed pairwise sum; rows in order),
/// independent of threads and of the buffers' alignment (only where a
/// finished vector is stored depends on it).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include <gradcomp/detail/policy_tags.hpp>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace powersgd_detail {
// Matrices of at least this many elements (1 MiB of floats: a core's L2
// here) write their big outputs (M in pass 1, the output in pass 3) with
// non-temporal stores: such a matrix is out of cache by the next pass (the
// rounds of the whole bucket lie between), so a normal store would first
// read every destination line (write-allocate) for nothing.
inline constexpr std::size_t stream_min_elements = std::size_t(1) << 18;
// Orders the non-temporal stores before anything the caller does next.
inline void stream_fence() noexcept {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// m = g (+ e) over n columns, a plain stream the compiler vectorises; returns
// the OR of (exponent bits + 1 << 23): bit 31 set iff some m is not finite
// (Inf or NaN). An integer OR vectorises where a float test reduced into a
// bool does not.
template <bool HasE>
std::uint32_t form_block(const float* gi, const float* ei, float* mi, std::size_t n) noexcept {
  std::uint32_t bad = 0;
  for (std::size_t j = 0; j < n; ++j) {
    float x = gi[j];
    if constexpr (HasE) x += ei[j];
    mi[j] = x;
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    bad |= (u & 0x7F800000u) + 0x00800000u;
  }
  return bad;
}

// The r dot products <m_row, q_k> of a row: lane l of 16 takes the columns
// j = l mod 16 in index order, then the lanes are summed pairwise. 16 lanes
// fill one AVX-512 register, two AVX or four SSE ones: with 8, GCC 12's
// AVX-512 code ran 4x slower. (The r > 4 path; add() may be called on
// consecutive runs of a row that start at multiples of 16: the same lanes.)
template <std::size_t R>
struct row_dots {
  static constexpr std::size_t L = 16;
  float acc[R][L] = {};
  void add(const float* x, const float* q, std::size_t cols, std::size_t j0, std::size_t n) noexcept {
    std::size_t j = 0;
    for (; j + L <= n; j += L)
      for (std::size_t k = 0; k < R; ++k) {
        const float* qk = q + k * cols + j0 + j;
        for (std::size_t l = 0; l < L; ++l) acc[k][l] += x[j + l] * qk[l];
      }
    for (std::size_t k = 0; k < R; ++k) {
      const float* qk = q + k * cols + j0;
      for (std::size_t l = 0; j + l < n; ++l) acc[k][l] += x[j + l] * qk[j + l];
    }
  }
  void finish(float* p, std::size_t stride) noexcept {
    for (std::size_t k = 0; k < R; ++k) {
      for (std::size_t w = L / 2; w > 0; w /= 2)
        for (std::size_t l = 0; l < w; ++l) acc[k][l] += acc[k][l + w];
      p[k * stride] = acc[k][0];
    }
  }
};

// Index of the first non-finite element of row i of m (the row has one).
inline std::size_t first_bad(const float* mi, std::size_t i, std::size_t cols) noexcept {
  const float max_finite = std::numeric_limits<float>::max();
  for (std::size_t c = 0; c < cols; ++c)
    if (!(std::fabs(mi[c]) <= max_finite)) return i * cols + c;
  return i * cols + cols;
}

// Stores the 16 floats of x at dst: non-temporal when `nt` (dst is then
// 64-byte aligned), else plain. A store only: the bits are x's.
inline void store16(float* dst, const float* x, bool nt) noexcept {
#if defined(__AVX512F__)
  if (nt) {
    _mm512_stream_ps(dst, _mm512_loadu_ps(x));
    return;
  }
#elif defined(__AVX__)
  if (nt) {
    _mm256_stream_ps(dst, _mm256_loadu_ps(x));
    _mm256_stream_ps(dst + 8, _mm256_loadu_ps(x + 8));
    return;
  }
#elif defined(__SSE2__)
  if (nt) {
    for (int h = 0; h < 16; h += 4) _mm_stream_ps(dst + h, _mm_loadu_ps(x + h));
    return;
  }
#endif
  (void)nt;
  std::memcpy(dst, x, 16 * sizeof(float));
}

// True when rows of a matrix this large should be written with
// non-temporal stores and this row starts on a 64-byte boundary.
inline bool stream_row(const float* row, std::size_t elements) noexcept {
#if defined(__SSE2__)
  return elements >= stream_min_elements && reinterpret_cast<std::uintptr_t>(row) % 64 == 0;
#else
  (void)row;
  (void)elements;
  return false;
#endif
}

// 16 floats (and their bits) as one value: GCC's and Clang's generic
// vectors, lowered to whatever registers the target has (one AVX-512, two
// AVX or four SSE ones). Element-wise operations, so the lanes' arithmetic
// is exactly that of the scalar loops.
// (-Wpsabi: GCC notes that a 64-byte vector argument or result is passed
// differently without AVX-512; these inline functions live in the ABI
// namespace of the ISA they are compiled for, so no two such TUs share them.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
using vf16 = float __attribute__((vector_size(64)));
using vu16 = std::uint32_t __attribute__((vector_size(64)));
inline vf16 load16(const float* x) noexcept {
  vf16 v;
  std::memcpy(&v, x, sizeof v);
  return v;
}

// Pass 1 for r = R (1..4): one loop over each row, 16 columns at a time:
// form M (finiteness bits, store) and add the R products into R x 16 lane
// accumulators (lane l: the columns j = l mod 16 in index order), so the
// loads of G and E, the store of M and the products overlap in one stream.
template <bool HasE, std::size_t R>
std::size_t encode_p_fixed(const float* g, const float* e, float* m, std::size_t rows, std::size_t cols,
                           const float* q, float* p) noexcept {
  constexpr std::size_t L = 16;
  bool streamed = false;
  for (std::size_t i = 0; i < rows; ++i) {
    const float* gi = g + i * cols;
    const float* ei = HasE ? e + i * cols : nullptr;
    float* mi = m + i * cols;
    const bool nt = stream_row(mi, rows * cols);
    streamed = streamed || nt;
    vf16 acc[R];
    for (std::size_t k = 0; k < R; ++k) acc[k] = vf16{};
    vu16 badv = vu16{};
    std::size_t j = 0;
    for (; j + L <= cols; j += L) {
      vf16 x = load16(gi + j);
      if constexpr (HasE) x += load16(ei + j);
      vu16 u;
      std::memcpy(&u, &x, sizeof u);
      badv |= (u & 0x7F800000u) + 0x00800000u;
      float xs[L];
      std::memcpy(xs, &x, sizeof xs);
      store16(mi + j, xs, nt);
      for (std::size_t k = 0; k < R; ++k) acc[k] += x * load16(q + k * cols + j);
    }
    float lanes[R][L];
    for (std::size_t k = 0; k < R; ++k) std::memcpy(lanes[k], &acc[k], sizeof lanes[k]);
    std::uint32_t bad = 0;
    for (std::size_t l = 0; l < L; ++l) bad |= badv[l];
    if (j < cols) {
      bad |= form_block<HasE>(gi + j, HasE ? ei + j : nullptr, mi + j, cols - j);
      for (std::size_t k = 0; k < R; ++k) {
        const float* qk = q + k * cols;
        for (std::size_t l = 0; j + l < cols; ++l) lanes[k][l] += mi[j + l] * qk[j + l];
      }
    }
    if (bad >> 31) {
      if (streamed) stream_fence();
      return first_bad(mi, i, cols);
    }
    for (std::size_t k = 0; k < R; ++k) {
      for (std::size_t w = L / 2; w > 0; w /= 2)
        for (std::size_t l = 0; l < w; ++l) lanes[k][l] += lanes[k][l + w];
      p[k * rows + i] = lanes[k][0];
    }
  }
  if (streamed) stream_fence();
  return rows * cols;
}

// Pass 1 for any r (r > 4): form a row, then its r dots one column of Q at a time.
inline std::size_t encode_p_any(const float* g, const float* e, float* m, std::size_t rows, std::size_t cols,
                                const float* q, std::size_t r, float* p) noexcept {
  for (std::size_t i = 0; i < rows; ++i) {
    float* mi = m + i * cols;
    const std::uint32_t bad = e ? form_block<true>(g + i * cols, e + i * cols, mi, cols)
                                : form_block<false>(g + i * cols, nullptr, mi, cols);
    if (bad >> 31) return first_bad(mi, i, cols);
    for (std::size_t k = 0; k < r; ++k) {
      row_dots<1> dots;
      dots.add(mi, q + k * cols, cols, 0, cols);
      dots.finish(p + k * rows + i, rows);
    }
  }
  return rows * cols;
}

// Q += rows i..i+3 of M weighted by P: q_k[j] += (a0 m0[j] + a1 m1[j]) + (a2 m2[j] + a3 m3[j]).
// For a fixed R, two groups of four rows go through one read and write of Q
// (the same two additions into q_k[j], in the same order).
template <std::size_t R>
void back_project_fixed(const float* m, std::size_t rows, std::size_t cols, const float* p, float* q) noexcept {
  for (std::size_t x = 0; x < cols * R; ++x) q[x] = 0.0f;
  std::size_t i = 0;
  for (; i + 8 <= rows && cols >= 16; i += 8) {
    const float* x[8];
    for (std::size_t t = 0; t < 8; ++t) x[t] = m + (i + t) * cols;
    float a[R][8];
    for (std::size_t k = 0; k < R; ++k)
      for (std::size_t t = 0; t < 8; ++t) a[k][t] = p[k * rows + i + t];
    // 16 columns from j: both groups' sums into Q (lanes are independent,
    // so a last block ending at the row's end redoes no column: it adds only
    // the lanes from `lo` on).
    auto block16 = [&](std::size_t j, std::size_t lo) {
      const vf16 x0 = load16(x[0] + j), x1 = load16(x[1] + j), x2 = load16(x[2] + j), x3 = load16(x[3] + j);
      const vf16 x4 = load16(x[4] + j), x5 = load16(x[5] + j), x6 = load16(x[6] + j), x7 = load16(x[7] + j);
      for (std::size_t k = 0; k < R; ++k) {
        const float* ak = a[k];
        float* qk = q + k * cols + j;
        vf16 t = load16(qk);
        t += (ak[0] * x0 + ak[1] * x1) + (ak[2] * x2 + ak[3] * x3);
        t += (ak[4] * x4 + ak[5] * x5) + (ak[6] * x6 + ak[7] * x7);
        if (lo == 0) {
          std::memcpy(qk, &t, sizeof t);
        } else {
          float ts[16];
          std::memcpy(ts, &t, sizeof ts);
          std::memcpy(qk + lo, ts + lo, (16 - lo) * sizeof(float));
        }
      }
    };
    std::size_t j = 0;
    for (; j + 16 <= cols; j += 16) block16(j, 0);
    if (j < cols) block16(cols - 16, j - (cols - 16));
  }
  for (; i + 4 <= rows; i += 4) {
    const float* m0 = m + i * cols;
    const float* m1 = m0 + cols;
    const float* m2 = m1 + cols;
    const float* m3 = m2 + cols;
    for (std::size_t k = 0; k < R; ++k) {
      const float* pk = p + k * rows + i;
      const float a0 = pk[0], a1 = pk[1], a2 = pk[2], a3 = pk[3];
      float* __restrict qk = q + k * cols;
      for (std::size_t j = 0; j < cols; ++j) qk[j] += (a0 * m0[j] + a1 * m1[j]) + (a2 * m2[j] + a3 * m3[j]);
    }
  }
  for (; i < rows; ++i) {
    const float* mi = m + i * cols;
    for (std::size_t k = 0; k < R; ++k) {
      const float a = p[k * rows + i];
      float* __restrict qk = q + k * cols;
      for (std::size_t j = 0; j < cols; ++j) qk[j] += a * mi[j];
    }
  }
}

// The same sums for any r (r > 4): four rows per sweep of Q, then single rows.
inline void back_project_any(const float* m, std::size_t rows, std::size_t cols, const float* p, std::size_t r,
                             float* q) noexcept {
  for (std::size_t x = 0; x < cols * r; ++x) q[x] = 0.0f;
  std::size_t i = 0;
  for (; i + 4 <= rows; i += 4) {
    const float* m0 = m + i * cols;
    const float* m1 = m0 + cols;
    const float* m2 = m1 + cols;
    const float* m3 = m2 + cols;
    for (std::size_t k = 0; k < r; ++k) {
      const float* pk = p + k * rows + i;
      const float a0 = pk[0], a1 = pk[1], a2 = pk[2], a3 = pk[3];
      float* qk = q + k * cols;
      for (std::size_t j = 0; j < cols; ++j) qk[j] += (a0 * m0[j] + a1 * m1[j]) + (a2 * m2[j] + a3 * m3[j]);
    }
  }
  for (; i < rows; ++i) {
    const float* mi = m + i * cols;
    for (std::size_t k = 0; k < r; ++k) {
      const float a = p[k * rows + i];
      float* qk = q + k * cols;
      for (std::size_t j = 0; j < cols; ++j) qk[j] += a * mi[j];
    }
  }
}

// Pass 3 for r = R (1..4): one loop over each row, 16 columns at a time:
// the output (o = a0 s0 + a1 s1 + ...) and the residual (e = m - (a0 w0 +
// a1 w1 + ...)), element by element, so the bits do not depend on where the
// blocks start. When e == m the residual is written over M (the caller
// swaps the buffers). For a large matrix the output rows are written with
// non-temporal stores: a first block at column 0 is kept up to the row's
// first 64-byte boundary, the blocks from there on are aligned, and a last
// block ending at the row's end keeps the columns not yet written. Every
// column with cols >= 16 is computed by the same vector code.
template <std::size_t R>
void decode_fixed(const float* m, const float* __restrict p, std::size_t rows, const float* __restrict q_sum,
                  const float* __restrict q_w, std::size_t cols, float* __restrict out, float* e) noexcept {
  constexpr std::size_t L = 16;
  const bool large = rows * cols >= stream_min_elements;
  bool streamed = false;
  const float* s[R];
  const float* w[R];
  for (std::size_t k = 0; k < R; ++k) {
    s[k] = q_sum + k * cols;
    w[k] = q_w ? q_w + k * cols : nullptr;
  }
  for (std::size_t i = 0; i < rows; ++i) {
    float a[R];
    for (std::size_t k = 0; k < R; ++k) a[k] = p[k * rows + i];
    float* oi = out + i * cols;
    const float* mi = m + i * cols;
    float* ei = e ? e + i * cols : nullptr;
    // The 16 columns from j; stores the lanes [lo, hi) of the output and the
    // residual (all 16: the output non-temporally when nt). Lanes below lo
    // may read a residual already written over M: they are not stored.
    auto block16 = [&](std::size_t j, std::size_t lo, std::size_t hi, bool nt) {
      vf16 v = a[0] * load16(s[0] + j);
      for (std::size_t k = 1; k < R; ++k) v += a[k] * load16(s[k] + j);
      vf16 r{};
      if (ei) {
        vf16 u = a[0] * load16(w[0] + j);
        for (std::size_t k = 1; k < R; ++k) u += a[k] * load16(w[k] + j);
        r = load16(mi + j) - u;
      }
      float vs[L], rs[L];
      std::memcpy(vs, &v, sizeof vs);
      std::memcpy(rs, &r, sizeof rs);
      if (lo == 0 && hi == L) {
        store16(oi + j, vs, nt);
        if (ei) std::memcpy(ei + j, rs, sizeof rs);
      } else {
        std::memcpy(oi + j + lo, vs + lo, (hi - lo) * sizeof(float));
        if (ei) std::memcpy(ei + j + lo, rs + lo, (hi - lo) * sizeof(float));
      }
    };
    if (cols < L) {  // a narrow matrix: element by element (the same for every row and rank)
      for (std::size_t j = 0; j < cols; ++j) {
        float v = a[0] * s[0][j];
        for (std::size_t k = 1; k < R; ++k) v += a[k] * s[k][j];
        oi[j] = v;
        if (ei) {
          float u = a[0] * w[0][j];
          for (std::size_t k = 1; k < R; ++k) u += a[k] * w[k][j];
          ei[j] = mi[j] - u;
        }
      }
      continue;
    }
    std::size_t j = 0;
    bool nt = false;
    if (large && reinterpret_cast<std::uintptr_t>(oi) % sizeof(float) == 0) {
      const std::size_t head = ((64 - reinterpret_cast<std::uintptr_t>(oi) % 64) % 64) / sizeof(float);
      nt = head + L <= cols && stream_row(oi + head, rows * cols);
      if (nt && head > 0) {
        block16(0, 0, head, false);
        j = head;
      }
    }
    streamed = streamed || nt;
    for (; j + L <= cols; j += L) block16(j, 0, L, nt);
    if (j < cols) block16(cols - L, j - (cols - L), L, false);
  }
  if (streamed) stream_fence();
}

#pragma GCC diagnostic pop

// Pass 3 for any r (r > 4), row by row (e may equal m).
inline void decode_any(const float* m, const float* p, std::size_t rows, std::size_t r, const float* q_sum,
                       const float* q_w, std::size_t cols, float* out, float* e) noexcept {
  for (std::size_t i = 0; i < rows; ++i) {
    float* oi = out + i * cols;
    for (std::size_t j = 0; j < cols; ++j) oi[j] = p[i] * q_sum[j];
    for (std::size_t k = 1; k < r; ++k) {
      const float a = p[k * rows + i];
      for (std::size_t j = 0; j < cols; ++j) oi[j] += a * q_sum[k * cols + j];
    }
    if (!e) continue;
    const float* mi = m + i * cols;
    float* ei = e + i * cols;
    for (std::size_t j = 0; j < cols; ++j) {
      float w = p[i] * q_w[j];
      for (std::size_t k = 1; k < r; ++k) w += p[k * rows + i] * q_w[k * cols + j];
      ei[j] = mi[j] - w;
    }
  }
}

/// Calls f.template operator()<R>() with R = r for r in 1..4, else R = 0.
template <class F>
decltype(auto) with_rank(std::size_t r, F&& f) {
  switch (r) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 3: return f.template operator()<3>();
    case 4: return f.template operator()<4>();
    default: return f.template operator()<0>();
  }
}
}  // namespace powersgd_detail

/// Pass 1 (Algorithm 1, line 3): m = g + e (e may be null: m = g) and
/// P = M Q, Q column-major cols x r, P column-major rows x r. Returns the
/// index of the first non-finite element of m, or rows * cols when all are
/// finite (P is then meaningless; the caller throws before touching state).
[[nodiscard]] inline std::size_t powersgd_encode_p(seq, const float* g, const float* e, float* m, std::size_t rows,
                                                   std::size_t cols, const float* q, std::size_t r, float* p) noexcept {
  if (r == 0) {  // form and check M only
    for (std::size_t i = 0; i < rows; ++i) {
      float* mi = m + i * cols;
      const std::uint32_t bad = e ? powersgd_detail::form_block<true>(g + i * cols, e + i * cols, mi, cols)
                                  : powersgd_detail::form_block<false>(g + i * cols, nullptr, mi, cols);
      if (bad >> 31) return powersgd_detail::first_bad(mi, i, cols);
    }
    return rows * cols;
  }
  return powersgd_detail::with_rank(r, [&]<std::size_t R>() -> std::size_t {
    if constexpr (R == 0) {
      return powersgd_detail::encode_p_any(g, e, m, rows, cols, q, r, p);
    } else {
      return e ? powersgd_detail::encode_p_fixed<true, R>(g, e, m, rows, cols, q, p)
               : powersgd_detail::encode_p_fixed<false, R>(g, nullptr, m, rows, cols, q, p);
    }
  });
}

/// Pass 2 (Algorithm 1, line 6): Q = M^T P (P column-major rows x r,
/// orthonormal columns; Q column-major cols x r), rows accumulated in order
/// (four at a time: q += (a0 m0 + a1 m1) + (a2 m2 + a3 m3), then single rows).
inline void powersgd_back_project(seq, const float* m, std::size_t rows, std::size_t cols, const float* p,
                                  std::size_t r, float* q) noexcept {
  powersgd_detail::with_rank(r, [&]<std::size_t R>() {
    if constexpr (R == 0)
      powersgd_detail::back_project_any(m, rows, cols, p, r, q);
    else
      powersgd_detail::back_project_fixed<R>(m, rows, cols, p, q);
  });
}

/// Pass 3 (Algorithm 1, line 8, and Algorithm 2's memory): out = P Q_sum^T
/// and, when e is not null, e = M - P Q_w^T, row-major rows x cols, in one
/// pass over M. `e` may equal `m` (the residual is then written over M);
/// `out` must not alias m or e.
inline void powersgd_decode(seq, const float* m, const float* p, std::size_t rows, std::size_t r, const float* q_sum,
                            const float* q_w, std::size_t cols, float* out, float* e) noexcept {
  powersgd_detail::with_rank(r, [&]<std::size_t R>() {
    if constexpr (R == 0)
      powersgd_detail::decode_any(m, p, rows, r, q_sum, q_w, cols, out, e);
    else
      powersgd_detail::decode_fixed<R>(m, p, rows, q_sum, q_w, cols, out, e);
  });
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
