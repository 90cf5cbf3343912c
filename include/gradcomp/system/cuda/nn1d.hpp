#pragma once
/// \file system/cuda/nn1d.hpp
/// CUDA kernels of nn1d's inference (nn1d/cuda.hpp) and of the LGC
/// autoencoder on a GPU (lgc/cuda.hpp): im2col, the transposed
/// convolution's gather, bias + leaky ReLU, the innovation channel, and the
/// column-major cuBLAS product the convolutions use. nvcc only; link
/// CUDA::cublas and CUDA::cudart. Layouts are nn1d::tensor's: channels x
/// (batch * length), column-major. Grid-stride loops; launches are checked
/// with check_launch.

#if !defined(__CUDACC__)
#error "gradcomp/system/cuda/nn1d.hpp needs nvcc (CUDA)"
#endif

#include <cstddef>

#include <gradcomp/abi.hpp>
#include <gradcomp/system/cuda/cublas.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN
namespace cuda_detail {

/// Blocks of 256 threads for n elements (grid-stride loops cover the rest).
inline unsigned blocks_for(std::size_t n) {
  const std::size_t b = (n + 255) / 256;
  return unsigned(b < 65535 ? (b == 0 ? 1 : b) : 65535);
}

/// im2col as nn1d::detail::im2col: col((k*C + c), b*L_col + t) = src(c, b*L_src + t*S + k - P), 0 outside.
template <class T>
__global__ void im2col_kernel(const T* src, std::ptrdiff_t c_in, std::ptrdiff_t l_src, std::ptrdiff_t l_col, std::ptrdiff_t batch,
                              std::ptrdiff_t kernel, std::ptrdiff_t stride, std::ptrdiff_t padding, T* col) {
  const std::ptrdiff_t rows = kernel * c_in, n = rows * l_col * batch;
  for (std::ptrdiff_t i = std::ptrdiff_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::ptrdiff_t(gridDim.x) * blockDim.x) {
    const std::ptrdiff_t r = i % rows, j = i / rows;
    const std::ptrdiff_t k = r / c_in, c = r % c_in, b = j / l_col, t = j % l_col;
    const std::ptrdiff_t p = t * stride + k - padding;
    col[i] = (p >= 0 && p < l_src) ? src[c + (b * l_src + p) * c_in] : T(0);
  }
}

/// The transposed convolution's gather: dst(o, b*L_dst + p) = sum over the
/// taps (t, k) with t*S + k - P == p of col(k*C + o, b*L_col + t), in
/// increasing t as nn1d::detail::col2im_add adds them.
template <class T>
__global__ void col2im_gather_kernel(const T* col, std::ptrdiff_t c_out, std::ptrdiff_t l_dst, std::ptrdiff_t l_col,
                                     std::ptrdiff_t batch, std::ptrdiff_t kernel, std::ptrdiff_t stride, std::ptrdiff_t padding,
                                     T* dst) {
  const std::ptrdiff_t n = c_out * l_dst * batch, rows = kernel * c_out;
  for (std::ptrdiff_t i = std::ptrdiff_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::ptrdiff_t(gridDim.x) * blockDim.x) {
    const std::ptrdiff_t o = i % c_out, j = i / c_out, b = j / l_dst, p = j % l_dst;
    T acc = T(0);
    for (std::ptrdiff_t k = kernel - 1; k >= 0; --k) {  // t = (p + P - k) / S grows as k falls
      const std::ptrdiff_t q = p + padding - k;
      if (q < 0 || q % stride != 0) continue;
      const std::ptrdiff_t t = q / stride;
      if (t < l_col) acc += col[(k * c_out + o) + (b * l_col + t) * rows];
    }
    dst[i] = acc;
  }
}

/// y = act(y + bias[row]) with act a leaky ReLU of `slope` when `leaky`, as nn1d::detail::add_bias_activate.
template <class T>
__global__ void bias_activate_kernel(T* y, const T* bias, std::ptrdiff_t rows, std::ptrdiff_t n, bool leaky, T slope) {
  for (std::ptrdiff_t i = std::ptrdiff_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::ptrdiff_t(gridDim.x) * blockDim.x) {
    T v = y[i] + bias[i % rows];
    if (leaky) v = v > T(0) ? v : slope * v;
    y[i] = v;
  }
}

/// y = leaky_relu(x) for a leaky ReLU that follows no convolution.
template <class T>
__global__ void leaky_kernel(const T* x, T* y, std::ptrdiff_t n, T slope) {
  for (std::ptrdiff_t i = std::ptrdiff_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::ptrdiff_t(gridDim.x) * blockDim.x)
    y[i] = x[i] > T(0) ? x[i] : slope * x[i];
}

/// Throws gradcomp::error naming the kernel when its launch failed.
inline void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

/// y (m x n) = a (m x k) * b (k x n), every matrix column-major and packed.
inline void gemm(const float* a, const float* b, float* y, std::ptrdiff_t m, std::ptrdiff_t n, std::ptrdiff_t k, const char* what) {
  const int M = gemm_dim(std::size_t(m), "rows"), N = gemm_dim(std::size_t(n), "columns"),
            K = gemm_dim(std::size_t(k), "inner dimension");
  const float one = 1.0f, zero = 0.0f;
  check_cublas(
      cublasSgemm(cublas_handle(), CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &one, a, M, b, K, &zero,
                  y, M),
      what);
}


/// out ((C+1) x n) = [body (C x n); innovation (1 x n)], column-major, as lgc_network's concat (the parameter-server decoders' innovation channel).
template <class T>
__global__ void append_channel_kernel(const T* body, const T* innovation, T* out, std::ptrdiff_t c,
                                      std::ptrdiff_t n) {
  const std::ptrdiff_t rows = c + 1, total = rows * n;
  for (std::ptrdiff_t i = std::ptrdiff_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += std::ptrdiff_t(gridDim.x) * blockDim.x) {
    const std::ptrdiff_t r = i % rows, j = i / rows;
    out[i] = r < c ? body[r + j * c] : innovation[j];
  }
}

}  // namespace cuda_detail
GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
