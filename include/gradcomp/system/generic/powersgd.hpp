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
/// stream the big matrix once per pass, row by row: pass 1 forms a row of
/// M = G + E (with its finiteness test) and takes its r dot products while
/// the row is in L1; pass 2 adds four rows at a time into Q; pass 3 writes a
/// row of the output and of the new residual. P, Q and a row stay in cache,
/// and the inner loops vectorise over the columns. Every sum runs in a fixed
/// order (16 float lanes in index order then a fixed pairwise sum; rows in
/// order), so results never depend on threads.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include <gradcomp/detail/policy_tags.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace powersgd_detail {
// m = g (+ e) over one row, a plain stream the compiler vectorises; false
// when some m is not finite. The test is on the bits (exponent all ones:
// Inf or NaN), OR-ed as integers, which vectorises where a float test
// reduced into a bool does not.
template <bool HasE>
bool form_row(const float* gi, const float* ei, float* mi, std::size_t cols) noexcept {
  std::uint32_t bad = 0;
  for (std::size_t j = 0; j < cols; ++j) {
    float x = gi[j];
    if constexpr (HasE) x += ei[j];
    mi[j] = x;
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    bad |= (u & 0x7F800000u) + 0x00800000u;  // bit 31 set iff the exponent is all ones
  }
  return (bad >> 31) == 0;
}

// The r dot products <m_row, q_k>, one column of Q at a time (the row is in
// L1): lane l of 16 takes the columns j = l mod 16 in index order, then the
// lanes are summed pairwise. 16 lanes fill one AVX-512 register, two AVX
// or four SSE ones: with 8, GCC 12's AVX-512 code ran 4x slower.
inline void row_dots(const float* mi, std::size_t cols, const float* q, std::size_t r, float* p,
                     std::size_t stride) noexcept {
  constexpr std::size_t L = 16;
  for (std::size_t k = 0; k < r; ++k) {
    const float* qk = q + k * cols;
    float acc[L] = {};
    std::size_t j = 0;
    for (; j + L <= cols; j += L)
      for (std::size_t l = 0; l < L; ++l) acc[l] += mi[j + l] * qk[j + l];
    for (std::size_t l = 0; j + l < cols; ++l) acc[l] += mi[j + l] * qk[j + l];
    for (std::size_t w = L / 2; w > 0; w /= 2)
      for (std::size_t l = 0; l < w; ++l) acc[l] += acc[l + w];
    p[k * stride] = acc[0];
  }
}

inline std::size_t encode_p(const float* g, const float* e, float* m, std::size_t rows, std::size_t cols,
                            const float* q, std::size_t r, float* p) noexcept {
  const float max_finite = std::numeric_limits<float>::max();
  for (std::size_t i = 0; i < rows; ++i) {
    const float* gi = g + i * cols;
    float* mi = m + i * cols;
    const bool finite = e ? form_row<true>(gi, e + i * cols, mi, cols) : form_row<false>(gi, nullptr, mi, cols);
    if (!finite)
      for (std::size_t c = 0; c < cols; ++c)
        if (!(std::fabs(mi[c]) <= max_finite)) return i * cols + c;
    row_dots(mi, cols, q, r, p + i, rows);
  }
  return rows * cols;
}

template <std::size_t R>
void back_project(const float* m, std::size_t rows, std::size_t cols, const float* p, std::size_t r, float* q) noexcept {
  const std::size_t rr = R ? R : r;
  for (std::size_t x = 0; x < cols * rr; ++x) q[x] = 0.0f;
  std::size_t i = 0;
  for (; i + 4 <= rows; i += 4) {  // four rows per sweep of Q: a quarter of Q's cache traffic
    const float* m0 = m + i * cols;
    const float* m1 = m0 + cols;
    const float* m2 = m1 + cols;
    const float* m3 = m2 + cols;
    for (std::size_t k = 0; k < rr; ++k) {
      const float* pk = p + k * rows + i;
      const float a0 = pk[0], a1 = pk[1], a2 = pk[2], a3 = pk[3];
      float* qk = q + k * cols;
      for (std::size_t j = 0; j < cols; ++j) qk[j] += (a0 * m0[j] + a1 * m1[j]) + (a2 * m2[j] + a3 * m3[j]);
    }
  }
  for (; i < rows; ++i) {
    const float* mi = m + i * cols;
    for (std::size_t k = 0; k < rr; ++k) {
      const float a = p[k * rows + i];
      float* qk = q + k * cols;
      for (std::size_t j = 0; j < cols; ++j) qk[j] += a * mi[j];
    }
  }
}

template <std::size_t R>
void decode(const float* __restrict m, const float* __restrict p, std::size_t rows, std::size_t r,
            const float* __restrict q_sum, const float* __restrict q_w, std::size_t cols, float* __restrict out,
            float* __restrict e) noexcept {
  const std::size_t rr = R ? R : r;
  for (std::size_t i = 0; i < rows; ++i) {
    float* oi = out + i * cols;
    float* ei = e ? e + i * cols : nullptr;
    const float* mi = m + i * cols;
    if constexpr (R != 0) {
      // Up to four columns, named: the loops below then vectorise over j.
      const float a0 = p[i], a1 = R > 1 ? p[rows + i] : 0.0f, a2 = R > 2 ? p[2 * rows + i] : 0.0f,
                  a3 = R > 3 ? p[3 * rows + i] : 0.0f;
      const float* s0 = q_sum;
      const float* s1 = q_sum + (R > 1 ? cols : 0);
      const float* s2 = q_sum + (R > 2 ? 2 * cols : 0);
      const float* s3 = q_sum + (R > 3 ? 3 * cols : 0);
      for (std::size_t j = 0; j < cols; ++j) {
        float o = a0 * s0[j];
        if constexpr (R > 1) o += a1 * s1[j];
        if constexpr (R > 2) o += a2 * s2[j];
        if constexpr (R > 3) o += a3 * s3[j];
        oi[j] = o;
      }
      if (ei) {
        const float* w0 = q_w;
        const float* w1 = q_w + (R > 1 ? cols : 0);
        const float* w2 = q_w + (R > 2 ? 2 * cols : 0);
        const float* w3 = q_w + (R > 3 ? 3 * cols : 0);
        for (std::size_t j = 0; j < cols; ++j) {
          float w = a0 * w0[j];
          if constexpr (R > 1) w += a1 * w1[j];
          if constexpr (R > 2) w += a2 * w2[j];
          if constexpr (R > 3) w += a3 * w3[j];
          ei[j] = mi[j] - w;
        }
      }
    } else {
      for (std::size_t j = 0; j < cols; ++j) oi[j] = rr ? p[i] * q_sum[j] : 0.0f;
      for (std::size_t k = 1; k < rr; ++k) {
        const float a = p[k * rows + i];
        for (std::size_t j = 0; j < cols; ++j) oi[j] += a * q_sum[k * cols + j];
      }
      if (!ei) continue;
      for (std::size_t j = 0; j < cols; ++j) ei[j] = rr ? p[i] * q_w[j] : 0.0f;
      for (std::size_t k = 1; k < rr; ++k) {
        const float a = p[k * rows + i];
        for (std::size_t j = 0; j < cols; ++j) ei[j] += a * q_w[k * cols + j];
      }
      for (std::size_t j = 0; j < cols; ++j) ei[j] = mi[j] - ei[j];
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
  return powersgd_detail::encode_p(g, e, m, rows, cols, q, r, p);
}

/// Pass 2 (Algorithm 1, line 6): Q = M^T P (P column-major rows x r,
/// orthonormal columns; Q column-major cols x r), rows accumulated in order.
inline void powersgd_back_project(seq, const float* m, std::size_t rows, std::size_t cols, const float* p,
                                  std::size_t r, float* q) noexcept {
  powersgd_detail::with_rank(r, [&]<std::size_t R>() { powersgd_detail::back_project<R>(m, rows, cols, p, r, q); });
}

/// Pass 3 (Algorithm 1, line 8, and Algorithm 2's memory): out = P Q_sum^T
/// and, when e is not null, e = M - P Q_w^T, row-major rows x cols, in one
/// pass over M. `out` must not alias m or e.
inline void powersgd_decode(seq, const float* m, const float* p, std::size_t rows, std::size_t r, const float* q_sum,
                            const float* q_w, std::size_t cols, float* out, float* e) noexcept {
  powersgd_detail::with_rank(
      r, [&]<std::size_t R>() { powersgd_detail::decode<R>(m, p, rows, r, q_sum, q_w, cols, out, e); });
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
