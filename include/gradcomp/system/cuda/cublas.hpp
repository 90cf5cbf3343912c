#pragma once
/// \file system/cuda/cublas.hpp
/// cuBLAS products of the GradiVeQ kernels under execution::thrust_cuda
/// (system/thrust/gradiveq.hpp). nvcc only; link CUDA::cublas and
/// CUDA::cudart. Compiled by tests/cuda here, never run (no GPU on the build
/// machine): see docs/backends.md.
///
/// Layouts are those of system/generic/gradiveq.hpp: slices are the rows of a
/// row-major S x K matrix X (column-major K x S, leading dimension K, to
/// cuBLAS), the basis U_d is column-major K x d, coefficients are a row-major
/// S x d matrix Y (column-major d x S, leading dimension d). All pointers are
/// device pointers.

#if !defined(__CUDACC__)
#error "gradcomp/system/cuda/cublas.hpp needs nvcc (CUDA)"
#endif

#include <climits>
#include <cstddef>
#include <string>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/errors.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN
namespace cuda_detail {

inline const char* cublas_status_text(cublasStatus_t s) noexcept {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "unknown cuBLAS status";
  }
}

/// Throws gradcomp::error naming the call when a cuBLAS call failed.
inline void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw gradcomp::error(std::string(what) + " failed: " + cublas_status_text(s));
}
/// Throws gradcomp::error naming the call when a CUDA runtime call failed.
inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw gradcomp::error(std::string(what) + " failed: " + cudaGetErrorString(e));
}

/// The calling thread's cuBLAS handle for the current device, created on
/// first use and destroyed when the thread ends.
inline cublasHandle_t cublas_handle() {
  struct handles {
    std::vector<cublasHandle_t> per_device;
    ~handles() {
      for (cublasHandle_t h : per_device)
        if (h != nullptr) cublasDestroy(h);
    }
  };
  thread_local handles cache;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (cache.per_device.size() <= static_cast<std::size_t>(device)) cache.per_device.resize(device + 1, nullptr);
  cublasHandle_t& h = cache.per_device[device];
  if (h == nullptr) check_cublas(cublasCreate(&h), "cublasCreate");
  return h;
}

inline int gemm_dim(std::size_t v, const char* what) {
  if (v > static_cast<std::size_t>(INT_MAX))
    throw invalid_argument_error(std::string("gradiveq (cuBLAS): ") + what + " exceeds INT_MAX");
  return static_cast<int>(v);
}

/// Y = X U (S x d, row-major) with cublasSgemm. Synchronises the device
/// afterwards, so the Thrust algorithms that follow (on any stream) see Y.
inline void gemm_slices_basis(const float* x, std::size_t slices, std::size_t k, const float* basis, std::size_t d,
                              float* y) {
  const int S = gemm_dim(slices, "slice count"), K = gemm_dim(k, "slice size"), D = gemm_dim(d, "dimension d");
  const float one = 1.0f, zero = 0.0f;
  // Column-major: Y^T (d x S) = U^T (d x K) * X^T (K x S).
  check_cublas(cublasSgemm(cublas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, D, S, K, &one, basis, K, x, K, &zero, y, D),
               "cublasSgemm (GradiVeQ compress)");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

/// O (=, or += when add) Y U^T (S x K, row-major) with cublasSgemm; synchronises as above.
inline void gemm_coefficients_basis(const float* y, std::size_t slices, std::size_t d, const float* basis,
                                    std::size_t k, bool add, float* out) {
  const int S = gemm_dim(slices, "slice count"), K = gemm_dim(k, "slice size"), D = gemm_dim(d, "dimension d");
  const float one = 1.0f, beta = add ? 1.0f : 0.0f;
  // Column-major: O^T (K x S) = U (K x d) * Y^T (d x S) + beta O^T.
  check_cublas(cublasSgemm(cublas_handle(), CUBLAS_OP_N, CUBLAS_OP_N, K, S, D, &one, basis, K, y, D, &beta, out, K),
               "cublasSgemm (GradiVeQ decompress)");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace cuda_detail
GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
