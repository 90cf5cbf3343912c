#pragma once
// Reference top-k selection for the sparsifier, SAMomentum and top-k kernel
// tests: a full sort, an O(n) check of a selection, and the positions the
// sampled threshold reads.

#include <gradcomp/payloads/topk.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace gradcomp::test_support {

/// The k largest |x|, lower index first among ties, as increasing indices (full sort).
inline std::vector<std::uint32_t> reference_topk(const std::vector<float>& x, std::size_t k) {
  std::vector<std::uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(std::min(k, x.size()));
  std::sort(order.begin(), order.end());
  return order;
}

/// O(n) check that `sel` (increasing indices) is the exact top-|sel| of |x|
/// with the lower-index tie rule: every selected magnitude >= every other,
/// and at the smallest selected magnitude no unselected index precedes a selected one.
inline bool is_exact_top(const std::vector<float>& x, const std::vector<std::uint32_t>& sel) {
  if (!std::is_sorted(sel.begin(), sel.end()) || std::adjacent_find(sel.begin(), sel.end()) != sel.end()) return false;
  if (sel.empty()) return true;
  std::vector<char> in(x.size(), 0);
  float t = std::numeric_limits<float>::infinity();
  for (auto i : sel) {
    in[i] = 1;
    t = std::min(t, std::fabs(x[i]));
  }
  std::size_t last_selected_tie = 0, first_unselected_tie = x.size();
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float a = std::fabs(x[i]);
    if (!in[i] && a > t) return false;
    if (a == t) {
      if (in[i]) last_selected_tie = i;
      else first_unselected_tie = std::min(first_unselected_tie, i);
    }
  }
  return first_unselected_tie > last_selected_tie;
}

/// Positions of the stratified sample the top-k kernels draw for (n, k, seed,
/// stream); requires that (n, k) is sampled, not exact.
inline std::vector<std::size_t> sample_positions(std::size_t n, std::size_t k, std::uint64_t seed,
                                                 std::uint64_t stream) {
  const auto plan = execution::topk_plan_sample(n, k);
  REQUIRE_FALSE(plan.use_exact);
  std::vector<std::size_t> pos(plan.samples);
  execution::topk_detail::sample_positions(n, plan.samples, 0, plan.samples,
                                           execution::topk_detail::sample_stream(seed, stream), pos.data());
  return pos;
}

}  // namespace gradcomp::test_support
