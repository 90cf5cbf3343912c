#pragma once
/// \file execution.hpp
/// Execution policies: empty tag types that select the backend of a kernel.
///
/// Kernels are free functions overloaded on the policy and called unqualified,
/// so argument-dependent lookup picks the most derived overload that exists
/// and the generic (seq) kernel is the fallback:
///
///     seq                 generic scalar C++ (system/generic/)   -- always there
///      +-- simd           xsimd kernels      (system/simd/)      -- GRADCOMP_HAS_XSIMD
///      +-- thrust<P>      Thrust kernels     (system/thrust/)    -- GRADCOMP_HAS_THRUST
///
/// A user (or a test) intercepts a kernel by deriving a policy from one of
/// these and declaring an overload for it in the policy's namespace.

#include <concepts>
#include <type_traits>

#include <gradcomp/detail/policy_tags.hpp>

namespace gradcomp {

/// A policy is an empty, trivially copyable tag derived from execution::seq.
template <class P>
concept ExecutionPolicy = std::derived_from<P, execution::seq> && std::is_empty_v<P> &&
                          std::is_trivially_copyable_v<P> && std::default_initializable<P>;

}  // namespace gradcomp

#include <gradcomp/system/generic/elementwise.hpp>
#if defined(GRADCOMP_HAS_XSIMD)
#include <gradcomp/system/simd/elementwise.hpp>
#endif
#if defined(GRADCOMP_HAS_THRUST)
#include <gradcomp/system/thrust/elementwise.hpp>
#endif
