#pragma once
/// \file system/thrust/elementwise.hpp
/// Thrust (execution::thrust<P>) overloads of the shared element-wise
/// kernels of system/generic/elementwise.hpp. Same results as seq: the sum is
/// element-wise, and the index of the first non-finite value is unique.

#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/system/generic/elementwise.hpp>
#include <gradcomp/system/thrust/common.hpp>

#include <thrust/transform_reduce.h>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace thrust_detail {

struct add_items {
  float* acc;
  const float* x;
  std::size_t n, per_item;
  GRADCOMP_HD void operator()(std::size_t item) const {
    const std::size_t end = min_size(n, (item + 1) * per_item);
    for (std::size_t i = item * per_item; i < end; ++i) acc[i] = acc[i] + x[i];
  }
};

/// Per item: the index of its first non-finite value, or n.
struct first_non_finite_of_item {
  const float* x;
  std::size_t n, per_item;
  GRADCOMP_HD std::size_t operator()(std::size_t item) const {
    const std::size_t begin = item * per_item, end = min_size(n, begin + per_item);
    // A branch-free pass (vectorises) and a search only when it failed.
    std::uint32_t worst = 0;
    for (std::size_t i = begin; i < end; ++i) {
      const std::uint32_t a = magnitude_key(x[i]);
      worst = worst < a ? a : worst;
    }
    if (worst < 0x7F800000u) return n;  // every |x| below the bits of +Inf
    for (std::size_t i = begin; i < end; ++i)
      if (magnitude_key(x[i]) >= 0x7F800000u) return i;
    return n;
  }
};

struct min_index {
  GRADCOMP_HD std::size_t operator()(std::size_t a, std::size_t b) const { return a < b ? a : b; }
};

/// find_non_finite on memory P's algorithms can read.
template <class P>
std::size_t first_non_finite(const float* x, std::size_t n) {
  if (n == 0) return 0;
  constexpr std::size_t per = item_elements<P>;
  const std::size_t count = items(n, per);
  if (run_serially<P>(count, n)) {
    std::size_t first = n;
    for (std::size_t i = 0; i < count && first == n; ++i) first = first_non_finite_of_item{x, n, per}(i);
    return first;
  }
  return ::thrust::transform_reduce(P{}, ::thrust::counting_iterator<std::size_t>(0),
                                    ::thrust::counting_iterator<std::size_t>(count),
                                    first_non_finite_of_item{x, n, per}, n, min_index{});
}

}  // namespace thrust_detail

/// acc[i] += x[i] with P's system. Sizes are checked by the caller.
template <class P>
void add_into(thrust<P>, std::span<float> acc, std::span<const float> x) {
  thrust_detail::operand<P, float> a(acc);
  thrust_detail::operand<P, const float> b(x);
  constexpr std::size_t per = thrust_detail::item_elements<P>;
  thrust_detail::for_each_index<P>(thrust_detail::items(acc.size(), per), acc.size(),
                                   thrust_detail::add_items{a.data(), b.data(), acc.size(), per});
  a.commit();
}

/// Index of the first NaN or infinity in x, or x.size() when all are finite.
template <class P>
[[nodiscard]] std::size_t find_non_finite(thrust<P>, std::span<const float> x) {
  thrust_detail::operand<P, const float> v(x);
  return thrust_detail::first_non_finite<P>(v.data(), x.size());
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
