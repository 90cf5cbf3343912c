#pragma once
/// \file system/thrust/sparsify.hpp
/// Thrust (execution::thrust<P>) kernels of the sparsifying codecs
/// (sparsifier_with_memory, DGS Alg. 1 lines 6-12; sa_momentum, DGS Alg. 3
/// lines 6-11, eqs. 14-15): the state update y <- a*y + b*x and `axpby_topk`,
/// the update fused with the top-k selection of |y|.
///
/// Results equal the generic kernels' bit for bit: the update is element-wise
/// with each product rounded before the sum (the generic axpby on the host,
/// __fmul_rn/__fadd_rn on a device); the selection is the same set (exact
/// mode: the exact top-k; sampled mode: the same stratified sample, hence the
/// same threshold and candidates); the rescaling of unselected entries by s
/// is the same float product. The structure follows the generic axpby_topk:
/// sampled threshold t, one fused pass that updates y and marks key >= t
/// (thrust_detail::compact), exact re-selection among the candidates, and
/// the radix select on the updated y when the bracket misses.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/system/generic/sparsify.hpp>
#include <gradcomp/system/thrust/common.hpp>
#include <gradcomp/system/thrust/elementwise.hpp>
#include <gradcomp/system/thrust/topk.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace thrust_detail {

/// a*y + b*x, each product rounded to float before the sum (sparsify_detail::axpby).
GRADCOMP_HD inline float axpby_value(float a, float y, float b, float x) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(a, y), __fmul_rn(b, x));
#else
  return sparsify_detail::axpby(a, y, b, x);
#endif
}

/// The updated value at i, without writing it (for the sample).
struct axpby_at {
  const float* y;
  const float* x;
  float a, b;
  GRADCOMP_HD float operator()(std::size_t i) const { return axpby_value(a, y[i], b, x[i]); }
};

struct axpby_items {
  float* y;
  const float* x;
  std::size_t n, per_item;
  float a, b;
  GRADCOMP_HD void operator()(std::size_t item) const {
    const std::size_t end = min_size(n, (item + 1) * per_item);
    for (std::size_t i = item * per_item; i < end; ++i) y[i] = axpby_value(a, y[i], b, x[i]);
  }
};

/// The fused pass: y[i] <- a*y[i] + b*x[i]; marks key(new y[i]) >= t; with
/// scale_rest the unmarked entries are also multiplied by s.
struct axpby_mark {
  float* y;
  const float* x;
  float a, b, s;
  std::uint32_t t;
  bool scale_rest;
  GRADCOMP_HD bool operator()(std::size_t i) const {
    const float v = axpby_value(a, y[i], b, x[i]);
    const bool take = magnitude_key(v) >= t;
    y[i] = (scale_rest && !take) ? v * s : v;
    return take;
  }
};

template <class P>
void axpby_in_place(float* y, const float* x, std::size_t n, float a, float b) {
  constexpr std::size_t per = item_elements<P>;
  for_each_index<P>(items(n, per), n, axpby_items{y, x, n, per, a, b});
}

}  // namespace thrust_detail

/// y[i] <- a*y[i] + b*x[i] with P's system. Sizes are checked by the caller.
template <class P>
void axpby_update(thrust<P>, std::span<float> y, std::span<const float> x, float a, float b) {
  thrust_detail::operand<P, float> ys(y);
  thrust_detail::operand<P, const float> xs(x);
  thrust_detail::axpby_in_place<P>(ys.data(), xs.data(), y.size(), a, b);
  ys.commit();
}

/// y <- a*y + b*x, then the top-k of |y| (ties: lower index first) as
/// increasing indices in `out`; every entry not selected is multiplied by s
/// (s == 1: untouched). Returns the number selected. Same contract and same
/// results as the generic axpby_topk (exact: min(k, n) entries; sampled:
/// DGC's threshold, at most k).
template <class P>
std::size_t axpby_topk(thrust<P>, std::span<float> y, std::span<const float> x, float a, float b, std::size_t k,
                       float s, bool sampled, std::uint64_t seed, std::uint64_t stream, topk_workspace& ws,
                       std::vector<std::uint32_t>& out) {
  using namespace thrust_detail;
  const std::size_t n = y.size();
  out.clear();
  operand<P, float> ys(y);
  operand<P, const float> xs(x);
  float* py = ys.data();
  const float* px = xs.data();
  if (k >= n) {
    axpby_in_place<P>(py, px, n, a, b);
    ys.commit();
    out.resize(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint32_t>(i);
    return n;
  }
  selection<P> sel(&ws);
  const std::uint32_t t = sampled_threshold<P>(topk_plan_sample(n, k), axpby_at{py, px, a, b}, n, seed, stream);
  bool scaled = false;  // unselected entries already multiplied by s
  if (t != 0) {
    compact(n, axpby_mark{py, px, a, b, s, t, sampled && s != 1.0f}, index_identity{}, sel.cand, sel.scratch);
    if (sampled) {
      if (s == 1.0f)
        keep_largest(py, sel, k, no_reject{});
      else
        keep_largest(py, sel, k, scale_at{py, s});
      scaled = true;
    } else if (sel.cand.size() >= k) {
      keep_largest(py, sel, k, no_reject{});
    } else {
      exact_top_k<P>(py, n, k, sel);  // the bracket missed: y is updated, select on it
    }
  } else {
    axpby_in_place<P>(py, px, n, a, b);
    exact_top_k<P>(py, n, k, sel);
  }
  if (!scaled && s != 1.0f) scale_unselected<P>(py, n, sel.cand, s);
  ys.commit();
  sel.cand.assign_to(out, sel.cand.size());
  return out.size();
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
