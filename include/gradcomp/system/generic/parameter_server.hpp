#pragma once
/// \file system/generic/parameter_server.hpp
/// Generic (execution::seq) kernels of the parameter-server drivers
/// (parameter_server.hpp, dgs_server.hpp): the server's model update (seed 001
/// eq. 1), the model-difference scan of eqs. 3 and 6a, and the gather/assign
/// steps of eqs. 5 and 6b. They are plain loops the compiler vectorises; a
/// policy may override any of them (see execution.hpp).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <gradcomp/detail/policy_tags.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// theta[i] -= g[i] (seed 001 eq. 1 with theta = theta_0 + M, Alg. 2 line 3).
/// Sizes are checked by the caller.
inline void ps_subtract(seq, std::span<float> theta, std::span<const float> g) noexcept {
  float* t = theta.data();
  const float* x = g.data();
  const std::size_t n = theta.size();
  for (std::size_t i = 0; i < n; ++i) t[i] -= x[i];
}

/// out[i] = s * x[i], the product rounded to float (a worker's eta * gradient).
inline void ps_scale(seq, std::span<float> out, std::span<const float> x, float s) noexcept {
  float* o = out.data();
  const float* p = x.data();
  const std::size_t n = out.size();
  for (std::size_t i = 0; i < n; ++i) o[i] = s * p[i];
}

/// out[i] = a[i] - b[i]: the model difference G = theta - w_k of eq. 3.
inline void ps_difference(seq, std::span<float> out, std::span<const float> a, std::span<const float> b) noexcept {
  float* o = out.data();
  const float* pa = a.data();
  const float* pb = b.data();
  const std::size_t n = out.size();
  for (std::size_t i = 0; i < n; ++i) o[i] = pa[i] - pb[i];
}

/// Appends to `out`, increasing, every i whose bit patterns differ (a[i] vs b[i]):
/// the entries where worker k's model is not yet the server's (eq. 3 without
/// secondary compression). Bitwise, so +0 and -0 count as different.
inline void ps_collect_changed(seq, std::span<const float> a, std::span<const float> b,
                               std::vector<std::uint32_t>& out) {
  const float* pa = a.data();
  const float* pb = b.data();
  const std::size_t n = a.size();
  constexpr std::size_t block = 256;
  for (std::size_t start = 0; start < n; start += block) {
    const std::size_t end = start + block < n ? start + block : n;
    // Branch-free test of a whole block first: most blocks are unchanged or all changed.
    std::uint32_t any = 0;
    for (std::size_t i = start; i < end; ++i) any |= std::bit_cast<std::uint32_t>(pa[i]) ^ std::bit_cast<std::uint32_t>(pb[i]);
    if (!any) continue;
    for (std::size_t i = start; i < end; ++i)
      if (std::bit_cast<std::uint32_t>(pa[i]) != std::bit_cast<std::uint32_t>(pb[i]))
        out.push_back(static_cast<std::uint32_t>(i));
  }
}

/// values[j] = src[indices[j]]. Indices are checked by the caller.
inline void ps_gather(seq, std::span<const float> src, std::span<const std::uint32_t> indices,
                      std::span<float> values) noexcept {
  const std::size_t m = indices.size();
  for (std::size_t j = 0; j < m; ++j) values[j] = src[indices[j]];
}

/// dst[indices[j]] = values[j] (eqs. 5 and 6b: the worker's model, and the
/// server's copy of it, take the server's values at the sent indices).
inline void ps_assign_at(seq, std::span<float> dst, std::span<const std::uint32_t> indices,
                         std::span<const float> values) noexcept {
  const std::size_t m = indices.size();
  for (std::size_t j = 0; j < m; ++j) dst[indices[j]] = values[j];
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
