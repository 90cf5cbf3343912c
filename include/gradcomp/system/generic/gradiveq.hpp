#pragma once
/// \file system/generic/gradiveq.hpp
/// Generic (execution::seq) kernels of the GradiVeQ linear compressor
/// (seed 002, eqs. 3 and 5): the two dense products over all slices of a
/// layer segment at once, written with Eigen (the library's hard dependency).
/// Eigen multi-threads them when the program is built with OpenMP
/// (Eigen::setNbThreads); results depend on the thread count only through
/// Eigen's blocking, so every node of a job must use the same build and count.
///
/// Storage: the slices of a segment are the rows of a row-major S x K matrix
/// (that is exactly the layer's memory, slice after slice); the basis U_d is
/// a column-major K x d matrix; the coefficients are a row-major S x d matrix
/// (slice after slice, d values each).

#include <cstddef>

// GCC 12 reports -Wmaybe-uninitialized inside its AVX-512 intrinsics as
// inlined into Eigen's GEMM packing (a false positive, GCC bug 105593, fixed
// in GCC 13). The warning is attributed to Eigen's own function definitions,
// so it is silenced where Eigen is first included; user code is unaffected.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <gradcomp/detail/policy_tags.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Eq. 3 for S slices at once: Y = X U - 1 offset^T, where offset = U^T mu / N
/// is precomputed by the caller (writing it as X*U - (mu U)/N avoids the
/// S x K temporary that (X - mu/N) U would make).
inline void gradiveq_compress_slices(seq, const float* x, std::size_t slices, std::size_t k, const float* basis,
                                     std::size_t d, const float* offset, float* y) {
  if (slices == 0 || d == 0) return;
  using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const auto S = static_cast<Eigen::Index>(slices), K = static_cast<Eigen::Index>(k), D = static_cast<Eigen::Index>(d);
  Eigen::Map<const row_major> X(x, S, K);
  Eigen::Map<const Eigen::MatrixXf> U(basis, K, D);
  Eigen::Map<row_major> Y(y, S, D);
  Y.noalias() = X * U;
  Y.rowwise() -= Eigen::Map<const Eigen::RowVectorXf>(offset, D);
}

/// Eq. 5 for S slices at once: out (=, or += when `add`) Y U^T + 1 (scale mu)^T.
/// scale is count/N: N for a fully aggregated payload (eq. 5 proper), 1/N for
/// one node's own payload (the local reconstruction of eq. 7).
inline void gradiveq_expand_slices(seq, const float* y, std::size_t slices, std::size_t d, const float* basis,
                                   std::size_t k, const float* mu, float scale, bool add, float* out) {
  if (slices == 0) return;
  using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const auto S = static_cast<Eigen::Index>(slices), K = static_cast<Eigen::Index>(k), D = static_cast<Eigen::Index>(d);
  Eigen::Map<const row_major> Y(y, S, D);
  Eigen::Map<const Eigen::MatrixXf> U(basis, K, D);
  Eigen::Map<row_major> O(out, S, K);
  const Eigen::Map<const Eigen::RowVectorXf> m(mu, K);
  if (add) {
    if (D > 0) O.noalias() += Y * U.transpose();
    O.rowwise() += scale * m;
  } else {
    if (D > 0) O.noalias() = Y * U.transpose();
    else O.setZero();
    O.rowwise() += scale * m;
  }
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
