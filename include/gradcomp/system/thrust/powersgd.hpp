#pragma once
/// \file system/thrust/powersgd.hpp
/// Thrust (execution::thrust<P>) kernels of PowerSGD's three passes
/// (storage as in system/generic/powersgd.hpp).
///
/// Host systems (cpp, omp, tbb): the generic loops, so results equal
/// execution::seq's bit for bit. CUDA (thrust_cuda, nvcc): the rank-r
/// products are cublasSgemm calls (system/cuda/powersgd.hpp) on device copies
/// of the operands, results copied back to the codec's host memory; M = G + E
/// and its finiteness check stay on the host. Link CUDA::cublas. Compiled by
/// tests/cuda; run only where a GPU is lent (docs/backends.md).

#include <cstddef>
#include <span>

#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/system/generic/powersgd.hpp>
#include <gradcomp/system/thrust/common.hpp>

#if defined(__CUDACC__)
#include <thrust/copy.h>

#include <gradcomp/system/cuda/powersgd.hpp>
#endif

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Pass 1 with P's system: m = g + e and P = M Q (see the generic kernel).
template <class P>
[[nodiscard]] std::size_t powersgd_encode_p(thrust<P>, const float* g, const float* e, float* m, std::size_t rows,
                                            std::size_t cols, const float* q, std::size_t r, float* p) {
  if constexpr (thrust_detail::on_device<P>) {
#if defined(__CUDACC__)
    // M = G + E on the host (rank 0 makes the generic kernel form M and check it only).
    const std::size_t bad = powersgd_encode_p(seq{}, g, e, m, rows, cols, q, 0, p);
    if (bad != rows * cols || rows == 0 || r == 0) return bad;
    thrust_detail::operand<P, const float> ms(std::span<const float>(m, rows * cols));
    thrust_detail::operand<P, const float> qs(std::span<const float>(q, cols * r));
    thrust_detail::operand<P, float, false> ps(std::span<float>(p, rows * r));
    cuda_detail::powersgd_gemm_project(ms.data(), rows, cols, qs.data(), r, ps.data());
    ps.commit();
    return bad;
#else
    return 0;
#endif
  } else {
    return powersgd_encode_p(seq{}, g, e, m, rows, cols, q, r, p);
  }
}

/// Pass 2 with P's system: Q = M^T P.
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

/// Pass 3 with P's system: out = P Q_sum^T and, when e is not null, e = M - P Q_w^T.
template <class P>
void powersgd_decode(thrust<P>, const float* m, const float* p, std::size_t rows, std::size_t r, const float* q_sum,
                     const float* q_w, std::size_t cols, float* out, float* e) {
  if constexpr (thrust_detail::on_device<P>) {
#if defined(__CUDACC__)
    if (rows == 0 || cols == 0) return;
    thrust_detail::operand<P, const float> ps(std::span<const float>(p, rows * r));
    thrust_detail::operand<P, const float> ss(std::span<const float>(q_sum, cols * r));
    thrust_detail::operand<P, float, false> os(std::span<float>(out, rows * cols));
    cuda_detail::powersgd_gemm_expand(ps.data(), rows, r, ss.data(), cols, 0.0f, os.data());
    os.commit();
    if (e == nullptr) return;
    thrust_detail::operand<P, const float> ms(std::span<const float>(m, rows * cols));
    thrust_detail::operand<P, const float> ws(std::span<const float>(q_w, cols * r));
    thrust_detail::operand<P, float, false> es(std::span<float>(e, rows * cols));
    ::thrust::copy(P{}, ms.data(), ms.data() + rows * cols, es.data());  // device to device: E = M
    cuda_detail::powersgd_gemm_expand(ps.data(), rows, r, ws.data(), cols, 1.0f, es.data(), -1.0f);  // E -= P Q_w^T
    es.commit();
#endif
  } else {
    powersgd_decode(seq{}, m, p, rows, r, q_sum, q_w, cols, out, e);
  }
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
