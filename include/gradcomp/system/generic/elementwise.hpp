#pragma once
/// \file system/generic/elementwise.hpp
/// Generic (execution::seq) element-wise kernels shared by codecs and drivers.
/// They are the fallback for every policy; see execution.hpp for dispatch.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <gradcomp/detail/policy_tags.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// acc[i] += x[i]. Sizes are checked by the caller.
inline void add_into(seq, std::span<float> acc, std::span<const float> x) noexcept {
  float* a = acc.data();
  const float* b = x.data();
  const std::size_t n = acc.size();
  for (std::size_t i = 0; i < n; ++i) a[i] += b[i];
}

/// dst[i] = src[i], with stores that bypass the caches where the CPU has
/// them (x86: non-temporal stores; elsewhere memcpy). For a destination
/// nobody reads again soon, such as an all-gather's copy into the caller's
/// vector: a cached store first reads each destination line (read for
/// ownership), so a copy moves 3 bytes per byte where this one moves 2. A
/// destination that is read right after (an addition's operand) wants
/// memcpy instead. Sizes are checked by the caller; no overlap. The same
/// bits as memcpy; every policy falls back to this one (a memory hint, not
/// arithmetic).
inline void copy_streaming(seq, std::span<float> dst, std::span<const float> src) noexcept {
  float* d = dst.data();
  const float* s = src.data();
  const std::size_t n = dst.size();
#if defined(__SSE2__)
  constexpr std::size_t width = 4;  // _mm_stream_ps: 16 bytes to a 16-byte aligned address
  std::size_t i = 0;
  while (i < n && (reinterpret_cast<std::uintptr_t>(d + i) % 16) != 0) {
    d[i] = s[i];
    ++i;
  }
  if (reinterpret_cast<std::uintptr_t>(d + i) % 16 == 0) {  // a float array not 4-byte aligned never gets there
    for (; i + width <= n; i += width) _mm_stream_ps(d + i, _mm_loadu_ps(s + i));
    _mm_sfence();  // the streamed lines are visible to other threads before anyone is told the copy is done
  }
  for (; i < n; ++i) d[i] = s[i];
#else
  if (n > 0) std::memcpy(d, s, n * sizeof(float));
#endif
}

/// Index of the first NaN or infinity in x, or x.size() when all are finite.
[[nodiscard]] inline std::size_t find_non_finite(seq, std::span<const float> x) noexcept {
  // Scan in blocks with a branch-free test so the common (all finite) case
  // vectorises; only a block that fails is searched element by element.
  constexpr std::size_t block = 1024;
  const float max_finite = std::numeric_limits<float>::max();
  for (std::size_t start = 0; start < x.size(); start += block) {
    const std::size_t end = start + block < x.size() ? start + block : x.size();
    bool all_finite = true;
    for (std::size_t i = start; i < end; ++i) all_finite &= (std::fabs(x[i]) <= max_finite);
    if (!all_finite) {
      for (std::size_t i = start; i < end; ++i)
        if (!(std::fabs(x[i]) <= max_finite)) return i;
    }
  }
  return x.size();
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
