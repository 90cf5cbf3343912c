#pragma once
/// \file payloads/topk.hpp
/// The top-k selection shared by the sparse codecs and the DGS server: the
/// selection count k of R percent (DGS Table 1) and the top-k kernels of every
/// configured backend (topk_exact, topk_radix, topk_sampled and their
/// workspace, system/*/topk.hpp). The codecs select the k largest |r| of a
/// residual or velocity (Alg. 1 lines 9-10, Alg. 3 lines 8-9); the server
/// selects the k largest |G| for secondary compression (eq. 6a).

#include <algorithm>
#include <cmath>
#include <cstddef>

#include <gradcomp/abi.hpp>
#include <gradcomp/system/topk.hpp>

namespace gradcomp {

GRADCOMP_ABI_NAMESPACE_BEGIN
/// k = max(1, ceil(R/100 * n)), at most n (0 when n == 0): the entries sent
/// per step for R percent (DGS Table 1). R*n/100 is computed in double; a
/// value within 1e-9 (relative) of an integer counts as that integer, so
/// R = 0.1 on n = 1e7 gives 10000, not 10001.
inline std::size_t sparse_selection_count(std::size_t n, double ratio_percent) noexcept {
  if (n == 0) return 0;
  const double q = ratio_percent * double(n) / 100.0;
  const double nearest = std::round(q);
  const double kk = std::abs(q - nearest) <= 1e-9 * std::max(1.0, q) ? nearest : std::ceil(q);
  const std::size_t k = kk < 1.0 ? 1 : (kk >= double(n) ? n : static_cast<std::size_t>(kk));
  return std::min(k, n);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
