#pragma once
/// \file detail/policy_tags.hpp
/// The policy tag types (documented in execution.hpp), split out so kernel
/// headers under system/ can name them without including every kernel.

namespace gradcomp::execution {

/// Generic scalar kernels; the fallback every other policy derives from.
struct seq {};

/// SIMD kernels written with xsimd. Without xsimd (no gradcomp::simd target)
/// every kernel falls back to seq; `simd_available` says which one runs.
struct simd : seq {};

#if defined(GRADCOMP_HAS_XSIMD)
inline constexpr bool simd_available = true;
#else
inline constexpr bool simd_available = false;
#endif

}  // namespace gradcomp::execution
