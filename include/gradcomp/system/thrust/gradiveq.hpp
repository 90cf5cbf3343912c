#pragma once
/// \file system/thrust/gradiveq.hpp
/// Thrust (execution::thrust<P>) kernels of the GradiVeQ linear compressor
/// (seed 002): eq. 3 Y = X U_d - 1 offset^T and eq. 5 out (+)= Y U_d^T +
/// 1 (scale mu)^T over the S slices of a segment, storage as in
/// system/generic/gradiveq.hpp.
///
/// Host systems (cpp, omp, tbb): `thrust::for_each` over blocks of slices,
/// each running the generic row kernels (system/generic/gradiveq.hpp: one
/// fixed order per output element, 8 float lanes each accumulated in index
/// order with a fused multiply-add when the target has one, then summed
/// pairwise). So the results do not depend on the thread count or the Thrust
/// system, and equal seq's bit for bit (tests/unit/test_thrust_backend.cpp,
/// tests/unit/test_gradiveq_kernels.cpp).
///
/// CUDA (thrust_cuda, nvcc): the products are cublasSgemm calls
/// (system/cuda/cublas.hpp) on device copies of the operands, the offset and
/// mean terms Thrust transforms. Link CUDA::cublas. Compiled here, never run.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/system/generic/gradiveq.hpp>
#include <gradcomp/system/thrust/common.hpp>
#include <gradcomp/system/thrust/elementwise.hpp>

#if defined(__CUDACC__)
#include <thrust/fill.h>

#include <gradcomp/system/cuda/cublas.hpp>
#endif

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace thrust_detail {

/// Eq. 3 for slices [item * rows, ...): the generic row kernel (its order).
struct gradiveq_compress_rows {
  const float* x;
  const float* u;
  const float* offset;
  float* y;
  std::size_t slices, k, d, rows;
  gradiveq_narrow_basis narrow;  // a narrow copy of the basis, or none

  void operator()(std::size_t item) const {
    gradiveq_kernel::compress_rows(x, item * rows, min_size(slices, (item + 1) * rows), k, u, d, offset, y, narrow);
  }
};

/// Eq. 5 for slices [item * rows, ...): the generic row kernel (its order).
struct gradiveq_expand_rows {
  const float* y;
  const float* u;
  const float* mu;
  float* out;
  std::size_t slices, d, k, rows;
  float scale;
  bool add;
  gradiveq_narrow_basis narrow;  // a narrow copy of the basis, or none

  void operator()(std::size_t item) const {
    gradiveq_kernel::expand_rows(y, item * rows, min_size(slices, (item + 1) * rows), d, u, k, mu, scale, add, out, narrow);
  }
};

/// Slices per work item: about item_elements<P> * 4 floats of input.
template <class P>
std::size_t gradiveq_rows_per_item(std::size_t k) noexcept {
  const std::size_t r = (4 * item_elements<P>) / (k ? k : 1);
  return r ? r : 1;
}

#if defined(__CUDACC__)
struct subtract_column_offset {
  float* y;
  const float* offset;
  std::size_t d;
  GRADCOMP_HD void operator()(std::size_t i) const { y[i] = y[i] - offset[i % d]; }
};
struct add_scaled_mean {
  float* out;
  const float* mu;
  std::size_t k;
  float scale;
  GRADCOMP_HD void operator()(std::size_t i) const {
#if defined(__CUDA_ARCH__)
    out[i] = __fadd_rn(out[i], __fmul_rn(scale, mu[i % k]));
#else
    out[i] = out[i] + scale * mu[i % k];
#endif
  }
};
#endif

}  // namespace thrust_detail

/// Eq. 3 for S slices at once with P's system: Y = X U - 1 offset^T
/// (offset = U^T mu / N, precomputed by the caller). `narrow` (or none):
/// the same values as binary16 or int8 with column scales, which the host
/// systems' row kernels read where they can (the generic kernels); the
/// device reads `basis`.
template <class P>
void gradiveq_compress_slices(thrust<P>, const float* x, std::size_t slices, std::size_t k, const float* basis,
                              std::size_t d, const float* offset, float* y,
                              [[maybe_unused]] gradiveq_narrow_basis narrow = {}) {
  using namespace thrust_detail;
  if (slices == 0 || d == 0) return;
  if constexpr (on_device<P>) {
#if defined(__CUDACC__)
    operand<P, const float> xs(std::span<const float>(x, slices * k));
    operand<P, const float> us(std::span<const float>(basis, k * d));
    operand<P, const float> os(std::span<const float>(offset, d));
    operand<P, float, false> ys(std::span<float>(y, slices * d));
    cuda_detail::gemm_slices_basis(xs.data(), slices, k, us.data(), d, ys.data());
    for_each_index<P>(slices * d, slices * d, subtract_column_offset{ys.data(), os.data(), d});
    ys.commit();
#endif
  } else {
    const std::size_t rows = gradiveq_rows_per_item<P>(k);
    for_each_index<P>(items(slices, rows), slices * k * d,
                      gradiveq_compress_rows{x, basis, offset, y, slices, k, d, rows, narrow});
  }
}

/// Eq. 5 for S slices at once with P's system: out (=, or += when `add`)
/// Y U^T + 1 (scale mu)^T; scale is count/N (see the generic kernel).
/// `narrow`: as gradiveq_compress_slices.
template <class P>
void gradiveq_expand_slices(thrust<P>, const float* y, std::size_t slices, std::size_t d, const float* basis,
                            std::size_t k, const float* mu, float scale, bool add, float* out,
                            [[maybe_unused]] gradiveq_narrow_basis narrow = {}) {
  using namespace thrust_detail;
  if (slices == 0) return;
  if constexpr (on_device<P>) {
#if defined(__CUDACC__)
    operand<P, const float> ys(std::span<const float>(y, slices * d));
    operand<P, const float> us(std::span<const float>(basis, k * d));
    operand<P, const float> ms(std::span<const float>(mu, k));
    std::span<float> out_host(out, slices * k);
    if (add) {
      operand<P, float> os(out_host);
      if (d > 0) cuda_detail::gemm_coefficients_basis(ys.data(), slices, d, us.data(), k, true, os.data());
      for_each_index<P>(slices * k, slices * k, add_scaled_mean{os.data(), ms.data(), k, scale});
      os.commit();
    } else {
      operand<P, float, false> os(out_host);
      if (d > 0)
        cuda_detail::gemm_coefficients_basis(ys.data(), slices, d, us.data(), k, false, os.data());
      else
        ::thrust::fill(P{}, os.data(), os.data() + slices * k, 0.0f);
      for_each_index<P>(slices * k, slices * k, add_scaled_mean{os.data(), ms.data(), k, scale});
      os.commit();
    }
#endif
  } else {
    const std::size_t rows = gradiveq_rows_per_item<P>(k);
    for_each_index<P>(items(slices, rows), slices * k * (d + 1),
                      gradiveq_expand_rows{y, basis, mu, out, slices, d, k, rows, scale, add, narrow});
  }
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
