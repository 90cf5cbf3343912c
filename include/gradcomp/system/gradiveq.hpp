#pragma once
/// \file system/gradiveq.hpp
/// GradiVeQ's projection kernels of every backend this build has: the generic
/// ones always, the xsimd ones with gradcomp::simd (GRADCOMP_HAS_XSIMD), the
/// Thrust ones with gradcomp::thrust (GRADCOMP_HAS_THRUST). Overload
/// resolution on the policy picks among them (docs/architecture.md).

#include <gradcomp/system/generic/gradiveq.hpp>
#if defined(GRADCOMP_HAS_THRUST)
#include <gradcomp/system/thrust/gradiveq.hpp>
#endif
