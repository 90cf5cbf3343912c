#pragma once
/// \file system/generic/sparsify.hpp
/// Generic (execution::seq) kernels of the sparsifying codecs: the state
/// update y <- a*y + b*x fused with a pass of the top-k selection of |y|
/// (system/generic/topk.hpp), and the algorithm `axpby_topk` that combines them.
///
/// The three updates of the codecs are all of this form:
///   sparsifier_with_memory  r <- 1*r + eta*g              (DGS Alg. 1 line 6)
///   DGC momentum correction v <- 1*v + 1*u, u = m*u + eta*g (Lin et al.)
///   sa_momentum             u <- m*u + eta*g              (DGS Alg. 3 line 6, eq. 14)
/// a*y and b*x are rounded separately, then added (never fused into an FMA:
/// see no_contract), so every policy produces the same bits; multiplying by
/// 1 is exact.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/system/generic/topk.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace sparsify_detail {
/// Makes the compiler treat v as unknown, so a product stored in v is rounded
/// to float and cannot be fused with a later addition into an FMA. GCC
/// contracts a*b + c into an FMA by default in C++ (even across statements,
/// even with -std=c++20), and would do so differently in the scalar and the
/// SIMD kernels; the empty asm costs no instruction.
inline void no_contract(float& v) noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+x"(v));
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
  asm("" : "+w"(v));
#else
  volatile float t = v;  // forces the rounding through memory
  v = t;
#endif
}

/// a*y + b*x with each product rounded to float before the sum.
inline float axpby(float a, float y, float b, float x) noexcept {
  float ay = a * y;
  float bx = b * x;
  no_contract(ay);
  no_contract(bx);
  return ay + bx;
}
}  // namespace sparsify_detail

/// y[i] <- a*y[i] + b*x[i]. Sizes are checked by the caller.
inline void axpby_update(seq, std::span<float> y, std::span<const float> x, float a, float b) noexcept {
  float* py = y.data();
  const float* px = x.data();
  const std::size_t n = y.size();
  for (std::size_t i = 0; i < n; ++i) py[i] = sparsify_detail::axpby(a, py[i], b, px[i]);
}

/// y[i] <- a*y[i] + b*x[i], and the level-0 magnitude histogram of the new y
/// into ws.hist (the first pass of the radix select).
inline void axpby_histogram(seq, std::span<float> y, std::span<const float> x, float a, float b,
                            topk_workspace& ws) {
  constexpr std::size_t stride = topk_bins + 1;
  std::uint32_t* sub = ws.sub.data();
  float* py = y.data();
  const float* px = x.data();
  const std::size_t n = y.size();
  std::size_t i = 0;
  for (; i + topk_sub_histograms <= n; i += topk_sub_histograms)
    for (std::size_t h = 0; h < topk_sub_histograms; ++h) {
      const float v = sparsify_detail::axpby(a, py[i + h], b, px[i + h]);
      py[i + h] = v;
      ++sub[h * stride + (topk_key(v) >> topk_level_shift[0])];
    }
  for (; i < n; ++i) {
    const float v = sparsify_detail::axpby(a, py[i], b, px[i]);
    py[i] = v;
    ++sub[topk_key(v) >> topk_level_shift[0]];
  }
  topk_detail::reduce_sub_histograms(ws);
}

/// y[i] <- a*y[i] + b*x[i], appending i to `out` (increasing) when
/// key(new y[i]) >= key_lo (key_lo >= 1); entries not appended are then
/// multiplied by s (s == 1: left as updated).
inline void axpby_collect_ge(seq, std::span<float> y, std::span<const float> x, float a, float b,
                             std::uint32_t key_lo, float s, std::vector<std::uint32_t>& out) {
  float* py = y.data();
  const float* px = x.data();
  const std::size_t n = y.size();
  if (s == 1.0f) {
    for (std::size_t i = 0; i < n; ++i) {
      const float v = sparsify_detail::axpby(a, py[i], b, px[i]);
      py[i] = v;
      if (topk_key(v) >= key_lo) out.push_back(static_cast<std::uint32_t>(i));
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const float v = sparsify_detail::axpby(a, py[i], b, px[i]);
      if (topk_key(v) >= key_lo) {
        py[i] = v;
        out.push_back(static_cast<std::uint32_t>(i));
      } else {
        py[i] = v * s;
      }
    }
  }
}

/// Keys of a*y[i] + b*x[i] at the positions of topk_sample_keys (same
/// stratified counter-based sample), without changing y.
inline void axpby_sample_keys(seq, std::span<const float> y, std::span<const float> x, float a, float b,
                              std::uint64_t seed, std::uint64_t stream, std::span<std::uint32_t> out) {
  topk_detail::sample_keys_with(y.size(), seed, stream, out, [&](std::size_t i) {
    return topk_key(sparsify_detail::axpby(a, y[i], b, x[i]));
  });
}

/// y <- a*y + b*x, then the top-k of |y| (ties: lower index first) as
/// increasing indices in `out`; every entry not selected is multiplied by s
/// (s == 1: untouched). Returns the number selected.
///
/// exact (sampled == false): always exactly min(k, n), the same set as
/// topk_radix on the updated y. A sampled threshold t brackets the k-th
/// magnitude; one fused pass updates y and collects the entries >= t; when at
/// least k were collected the exact top-k among them is the answer (and, for
/// s != 1, one more pass scales the rest); otherwise, or when sampling does
/// not pay, the radix select runs on the updated y.
/// sampled (DGC): the same fused pass also scales the entries below t, and
/// when fewer than k were collected they are all the selection (no fallback).
template <class Policy>
std::size_t axpby_topk(Policy policy, std::span<float> y, std::span<const float> x, float a, float b, std::size_t k,
                       float s, bool sampled, std::uint64_t seed, std::uint64_t stream, topk_workspace& ws,
                       std::vector<std::uint32_t>& out) {
  const std::size_t n = y.size();
  out.clear();
  if (k >= n) {
    axpby_update(policy, y, x, a, b);
    out.resize(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint32_t>(i);
    return n;
  }
  const std::uint32_t t = topk_detail::sampled_threshold(
      policy, topk_plan_sample(n, k), ws, [&](std::span<std::uint32_t> keys) {
        axpby_sample_keys(policy, std::span<const float>(y), x, a, b, seed, stream, keys);
      });
  if (t != 0) {
    out.reserve(k + k / 2 + 64);
    const std::span<const float> cy(y);
    if (sampled) {
      axpby_collect_ge(policy, y, x, a, b, t, s, out);
      if (s == 1.0f)
        topk_keep_largest(policy, cy, out, k, ws, [](std::uint32_t) {});
      else
        topk_keep_largest(policy, cy, out, k, ws, [&](std::uint32_t i) { y[i] = y[i] * s; });
      return out.size();
    }
    axpby_collect_ge(policy, y, x, a, b, t, 1.0f, out);
    if (out.size() >= k) {
      topk_keep_largest(policy, cy, out, k, ws, [](std::uint32_t) {});
      if (s != 1.0f) topk_scale_unselected(policy, y, std::span<const std::uint32_t>(out), s);
      return out.size();
    }
    // The bracket missed (fewer than k above t): y is updated, select on it.
    topk_exact_levels(policy, y, k, s, false, ws, out);
    return out.size();
  }
  axpby_histogram(policy, y, x, a, b, ws);
  topk_exact_levels(policy, y, k, s, true, ws, out);
  return out.size();
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
