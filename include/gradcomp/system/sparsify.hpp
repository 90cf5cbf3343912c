#pragma once
/// \file system/sparsify.hpp
/// The sparse codecs' update kernels (axpby_update, axpby_topk) of every backend this build has: the generic
/// ones always, the xsimd ones with gradcomp::simd (GRADCOMP_HAS_XSIMD), the
/// Thrust ones with gradcomp::thrust (GRADCOMP_HAS_THRUST). Overload
/// resolution on the policy picks among them (docs/architecture.md).

#include <gradcomp/system/generic/sparsify.hpp>
#if defined(GRADCOMP_HAS_XSIMD)
#include <gradcomp/system/simd/sparsify.hpp>
#endif
#if defined(GRADCOMP_HAS_THRUST)
#include <gradcomp/system/thrust/sparsify.hpp>
#endif
