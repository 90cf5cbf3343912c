#pragma once
/// \file system/qsgd.hpp
/// The QSGD kernels of every backend this build has: the generic
/// ones always, the xsimd ones with gradcomp::simd (GRADCOMP_HAS_XSIMD), the
/// Thrust ones with gradcomp::thrust (GRADCOMP_HAS_THRUST). Overload
/// resolution on the policy picks among them (docs/architecture.md).

#include <gradcomp/system/generic/qsgd.hpp>
#if defined(GRADCOMP_HAS_XSIMD)
#include <gradcomp/system/simd/qsgd.hpp>
#endif
#if defined(GRADCOMP_HAS_THRUST)
#include <gradcomp/system/thrust/qsgd.hpp>
#endif
