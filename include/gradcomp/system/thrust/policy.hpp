#pragma once
/// \file system/thrust/policy.hpp
/// execution::thrust<ThrustPolicy>: the policy that runs gradcomp's kernels
/// with Thrust, on whichever Thrust system ThrustPolicy names:
///
///     execution::thrust_cpp    thrust::cpp::par   sequential, the calling thread
///     execution::thrust_omp    thrust::omp::par   OpenMP threads (OMP_NUM_THREADS)
///     execution::thrust_cuda   thrust::cuda::par  a CUDA GPU (only when compiled by nvcc)
///     execution::thrust<std::remove_cvref_t<decltype(thrust::tbb::par)>>   TBB (needs TBB; untested here)
///
/// Available with the gradcomp::thrust CMake component (GRADCOMP_HAS_THRUST):
/// Debian's libthrust-dev 1.17 with the OpenMP device system for the CPU, or
/// the CUDA toolkit's CCCL Thrust under nvcc. docs/backends.md explains which
/// kernel runs where and how results compare with execution::seq.
///
/// Like every policy it is an empty tag derived from execution::seq, so a
/// kernel without a Thrust overload falls back to the generic one. The Thrust
/// policy object is rebuilt by the kernels as `ThrustPolicy{}` (also
/// available as `thrust<P>::thrust_policy()`), so ThrustPolicy must be an
/// empty, default-constructible Thrust execution policy type: stateful
/// policies (`thrust::cuda::par.on(stream)`, a custom allocator) cannot be
/// carried by an empty tag and are not supported.
///
/// Memory: the codecs keep their state (residuals, velocities) in host
/// std::vectors. Systems whose algorithms read host memory (cpp, omp, tbb)
/// work on it in place; on CUDA every kernel copies its operands to device
/// memory and the results back (thrust_system_uses_host_memory says which).

#include <type_traits>

#include <gradcomp/detail/policy_tags.hpp>

#include <thrust/execution_policy.h>
#include <thrust/system/cpp/execution_policy.h>
#include <thrust/system/omp/execution_policy.h>
#if defined(__CUDACC__)
#include <thrust/system/cuda/execution_policy.h>
#endif

/// Marks functions and call operators that run on the host and, under nvcc,
/// on a CUDA device. Empty for host compilers.
#if defined(__CUDACC__)
#define GRADCOMP_HD __host__ __device__
#else
#define GRADCOMP_HD
#endif

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Kernels written with Thrust, run on the Thrust system of ThrustPolicy
/// (an empty Thrust execution policy type such as decltype(thrust::omp::par)).
template <class ThrustPolicy>
struct thrust : seq {
  static_assert(std::is_empty_v<ThrustPolicy> && std::is_default_constructible_v<ThrustPolicy>,
                "execution::thrust<P> needs an empty, default-constructible Thrust execution policy type");
  /// The wrapped Thrust execution policy type.
  using thrust_policy_type = ThrustPolicy;
  /// The Thrust policy object the kernels pass to Thrust algorithms.
  static ThrustPolicy thrust_policy() noexcept { return ThrustPolicy{}; }
};

/// Thrust's sequential CPU system (thrust::cpp::par): every algorithm on the calling thread.
using thrust_cpp = thrust<std::remove_cvref_t<decltype(::thrust::cpp::par)>>;
/// Thrust's OpenMP system (thrust::omp::par): OMP_NUM_THREADS threads.
using thrust_omp = thrust<std::remove_cvref_t<decltype(::thrust::omp::par)>>;
#if defined(__CUDACC__)
/// Thrust's CUDA system (thrust::cuda::par): the current CUDA device. Only under nvcc.
using thrust_cuda = thrust<std::remove_cvref_t<decltype(::thrust::cuda::par)>>;
#endif

/// True when the Thrust kernels are compiled in (always, once this header is included).
inline constexpr bool thrust_available = true;

namespace thrust_detail {
template <class P>
struct is_cuda_system : std::false_type {};
#if defined(__CUDACC__)
template <class P>
requires std::is_base_of_v<::thrust::cuda_cub::execution_policy<P>, P>
struct is_cuda_system<P> : std::true_type {
};
#endif
}  // namespace thrust_detail

/// True when ThrustPolicy's algorithms dereference host pointers (cpp, omp,
/// tbb): the kernels then run on the codecs' memory in place. False for
/// CUDA, where operands are staged through device memory.
template <class ThrustPolicy>
inline constexpr bool thrust_system_uses_host_memory = !thrust_detail::is_cuda_system<ThrustPolicy>::value;

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
