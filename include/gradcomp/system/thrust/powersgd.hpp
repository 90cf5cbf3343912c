#pragma once
/// \file system/thrust/powersgd.hpp
/// Thrust (execution::thrust<P>) kernels of PowerSGD's rank-r products
/// (storage as in system/generic/powersgd.hpp).
///
/// Host systems (cpp, omp, tbb): the generic Eigen products, so results equal
/// execution::seq's bit for bit. CUDA (thrust_cuda, nvcc): cublasSgemm calls
/// (system/cuda/powersgd.hpp) on device copies of the operands, results
/// copied back to the codec's host memory. Link CUDA::cublas. Compiled by
/// tests/cuda; run only where a GPU is lent (docs/backends.md).

#include <cstddef>
#include <span>

#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/system/generic/powersgd.hpp>
#include <gradcomp/system/thrust/common.hpp>

#if defined(__CUDACC__)
#include <gradcomp/system/cuda/powersgd.hpp>
#endif

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// P = M Q with P's system (see the generic kernel).
template <class P>
void powersgd_project(thrust<P>, const float* m, std::size_t rows, std::size_t cols, const float* q, std::size_t r,
                      float* p) {
  if constexpr (thrust_detail::on_device<P>) {
#if defined(__CUDACC__)
    if (rows == 0 || r == 0) return;
    thrust_detail::operand<P, const float> ms(std::span<const float>(m, rows * cols));
    thrust_detail::operand<P, const float> qs(std::span<const float>(q, cols * r));
    thrust_detail::operand<P, float, false> ps(std::span<float>(p, rows * r));
    cuda_detail::powersgd_gemm_project(ms.data(), rows, cols, qs.data(), r, ps.data());
    ps.commit();
#endif
  } else {
    powersgd_project(seq{}, m, rows, cols, q, r, p);
  }
}

/// Q = M^T P with P's system.
template <class P>
void powersgd_back_project(thrust<P>, const float* m, std::size_t rows, std::size_t cols, const float* p,
                           std::size_t r, float* q) {
  if constexpr (thrust_detail::on_device<P>) {
#if defined(__CUDACC__)
    if (cols == 0 || r == 0) return;
    thrust_detail::operand<P, const float> ms(std::span<const float>(m, rows * cols));
    thrust_detail::operand<P, const float> ps(std::span<const float>(p, rows * r));
    thrust_detail::operand<P, float, false> qs(std::span<float>(q, cols * r));
    cuda_detail::powersgd_gemm_back_project(ms.data(), rows, cols, ps.data(), r, qs.data());
    qs.commit();
#endif
  } else {
    powersgd_back_project(seq{}, m, rows, cols, p, r, q);
  }
}

/// out = P Q^T with P's system.
template <class P>
void powersgd_expand(thrust<P>, const float* p, std::size_t rows, std::size_t r, const float* q, std::size_t cols,
                     float* out) {
  if constexpr (thrust_detail::on_device<P>) {
#if defined(__CUDACC__)
    if (rows == 0 || cols == 0) return;
    thrust_detail::operand<P, const float> ps(std::span<const float>(p, rows * r));
    thrust_detail::operand<P, const float> qs(std::span<const float>(q, cols * r));
    thrust_detail::operand<P, float, false> os(std::span<float>(out, rows * cols));
    cuda_detail::powersgd_gemm_expand(ps.data(), rows, r, qs.data(), cols, 0.0f, os.data());
    os.commit();
#endif
  } else {
    powersgd_expand(seq{}, p, rows, r, q, cols, out);
  }
}

/// residual = M - P Q^T with P's system.
template <class P>
void powersgd_residual(thrust<P>, const float* m, const float* p, std::size_t rows, std::size_t r, const float* q,
                       std::size_t cols, float* residual) {
  if constexpr (thrust_detail::on_device<P>) {
#if defined(__CUDACC__)
    if (rows == 0 || cols == 0) return;
    thrust_detail::operand<P, const float> ms(std::span<const float>(m, rows * cols));
    thrust_detail::operand<P, float, false> es(std::span<float>(residual, rows * cols));
    ::thrust::copy(P{}, ms.data(), ms.data() + rows * cols, es.data());  // device to device: E = M
    thrust_detail::operand<P, const float> ps(std::span<const float>(p, rows * r));
    thrust_detail::operand<P, const float> qs(std::span<const float>(q, cols * r));
    cuda_detail::powersgd_gemm_expand(ps.data(), rows, r, qs.data(), cols, 1.0f, es.data(), -1.0f);
    es.commit();
#endif
  } else {
    powersgd_residual(seq{}, m, p, rows, r, q, cols, residual);
  }
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
