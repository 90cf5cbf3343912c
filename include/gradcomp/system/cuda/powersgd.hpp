#pragma once
/// \file system/cuda/powersgd.hpp
/// cuBLAS products of PowerSGD under execution::thrust_cuda
/// (system/thrust/powersgd.hpp). nvcc only; link CUDA::cublas and
/// CUDA::cudart. Compiled by tests/cuda; run only where a GPU is lent.
///
/// Layouts are those of system/generic/powersgd.hpp: M row-major rows x cols
/// (to cuBLAS, column-major cols x rows with leading dimension cols), P
/// column-major rows x r, Q column-major cols x r. All pointers are device
/// pointers. Each call synchronises the device afterwards.

#if !defined(__CUDACC__)
#error "gradcomp/system/cuda/powersgd.hpp needs nvcc (CUDA)"
#endif

#include <cstddef>

#include <gradcomp/abi.hpp>
#include <gradcomp/system/cuda/cublas.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN
namespace cuda_detail {

/// P = M Q with cublasSgemm: column-major P (rows x r) = (M^T)^T Q.
inline void powersgd_gemm_project(const float* m, std::size_t rows, std::size_t cols, const float* q, std::size_t r,
                                  float* p) {
  const int R = gemm_dim(rows, "rows"), C = gemm_dim(cols, "cols"), K = gemm_dim(r, "rank");
  const float one = 1.0f, zero = 0.0f;
  check_cublas(cublasSgemm(cublas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, R, K, C, &one, m, C, q, C, &zero, p, R),
               "cublasSgemm (PowerSGD P = M Q)");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

/// Q = M^T P with cublasSgemm: column-major Q (cols x r) = M^T (cols x rows) P.
inline void powersgd_gemm_back_project(const float* m, std::size_t rows, std::size_t cols, const float* p,
                                       std::size_t r, float* q) {
  const int R = gemm_dim(rows, "rows"), C = gemm_dim(cols, "cols"), K = gemm_dim(r, "rank");
  const float one = 1.0f, zero = 0.0f;
  check_cublas(cublasSgemm(cublas_handle(), CUBLAS_OP_N, CUBLAS_OP_N, C, K, R, &one, m, C, p, R, &zero, q, C),
               "cublasSgemm (PowerSGD Q = M^T P)");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

/// out = beta out + alpha P Q^T, out row-major rows x cols (column-major
/// out^T = Q P^T, leading dimension cols).
inline void powersgd_gemm_expand(const float* p, std::size_t rows, std::size_t r, const float* q, std::size_t cols,
                                 float beta, float* out, float alpha = 1.0f) {
  const int R = gemm_dim(rows, "rows"), C = gemm_dim(cols, "cols"), K = gemm_dim(r, "rank");
  check_cublas(cublasSgemm(cublas_handle(), CUBLAS_OP_N, CUBLAS_OP_T, C, R, K, &alpha, q, C, p, R, &beta, out, C),
               "cublasSgemm (PowerSGD P Q^T)");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace cuda_detail
GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
