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
///
/// The tags and the kernels live in the ABI namespace (abi.hpp), so a program
/// whose units are built with different instruction sets runs each unit's own
/// kernels. `ExecutionPolicy<P>` (detail/policy_tags.hpp) is the concept a
/// policy satisfies.

#include <gradcomp/detail/policy_tags.hpp>

#include <gradcomp/system/elementwise.hpp>
