#pragma once
/// \file system/powersgd.hpp
/// PowerSGD's product kernels of every backend this build has: the generic
/// (Eigen) ones always, the Thrust ones with gradcomp::thrust
/// (GRADCOMP_HAS_THRUST: cuBLAS under execution::thrust_cuda, the generic
/// products on Thrust's host systems). Overload resolution on the policy
/// picks among them (docs/architecture.md).

#include <gradcomp/system/generic/powersgd.hpp>
#if defined(GRADCOMP_HAS_THRUST)
#include <gradcomp/system/thrust/powersgd.hpp>
#endif
