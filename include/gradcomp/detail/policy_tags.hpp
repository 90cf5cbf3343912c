#pragma once
/// \file detail/policy_tags.hpp
/// The policy tag types (documented in execution.hpp), split out so kernel
/// headers under system/ can name them without including every kernel.
///
/// They live in the ABI namespace (abi.hpp): `gradcomp::execution::seq` is
/// `gradcomp::execution::abi_v0_1_..._::seq`, so every kernel overloaded on a
/// policy and every codec instantiated over one has a symbol of its own per
/// instruction-set configuration.

#include <concepts>
#include <type_traits>

#include <gradcomp/abi.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Generic scalar kernels; the fallback every other policy derives from.
struct seq {};

/// SIMD kernels written with xsimd. Without xsimd (no gradcomp::simd target)
/// every kernel falls back to seq; `simd_available` says which one runs.
struct simd : seq {};

/// True when execution::simd runs xsimd kernels in this translation unit's
/// configuration (GRADCOMP_HAS_XSIMD); per configuration, like the kernels.
#if defined(GRADCOMP_HAS_XSIMD)
inline constexpr bool simd_available = true;
#else
inline constexpr bool simd_available = false;
#endif

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution

namespace gradcomp {

/// A policy is an empty, trivially copyable tag derived from execution::seq
/// (execution.hpp). Declared here so concepts.hpp can name it without
/// including any kernel (and so xsimd or Thrust).
template <class P>
concept ExecutionPolicy = std::derived_from<P, execution::seq> && std::is_empty_v<P> &&
                          std::is_trivially_copyable_v<P> && std::default_initializable<P>;

}  // namespace gradcomp
