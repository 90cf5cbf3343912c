#pragma once
/// \file system/topk.hpp
/// The top-k selection kernels of every backend this build has: the generic
/// ones always, the xsimd ones with gradcomp::simd (GRADCOMP_HAS_XSIMD), the
/// Thrust ones with gradcomp::thrust (GRADCOMP_HAS_THRUST). Overload
/// resolution on the policy picks among them (docs/architecture.md).

#include <gradcomp/system/generic/topk.hpp>
#if defined(GRADCOMP_HAS_XSIMD)
#include <gradcomp/system/simd/topk.hpp>
#endif
#if defined(GRADCOMP_HAS_THRUST)
#include <gradcomp/system/thrust/topk.hpp>
#endif
