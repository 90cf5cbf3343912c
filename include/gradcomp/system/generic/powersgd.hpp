#pragma once
/// \file system/generic/powersgd.hpp
/// Generic (execution::seq) kernels of PowerSGD (Vogels, Karimireddy and
/// Jaggi, NeurIPS 2019, Algorithm 1): the three rank-r products of a step,
/// written with Eigen maps over the codec's spans.
///
/// Storage: a layer's matrix M is row-major rows x cols (exactly the
/// framework's memory of a [C_out, C_in, kH, kW] conv weight viewed as
/// C_out x (C_in kH kW), or of a [rows, cols] linear weight); P is
/// column-major rows x r and Q column-major cols x r (each column contiguous,
/// which the Gram-Schmidt orthogonalisation reads).
///
/// Eigen multi-threads its products only in OpenMP builds; every result
/// these kernels produce is local to a rank (P before the sum, the rank's own
/// Q, the residual) or computed from agreed operands with the same build on
/// every rank (the output P Q_sum^T), so ranks agree bit for bit when they
/// run the same binary with the same thread count.

#include <cstddef>

// GCC 12's spurious -Wmaybe-uninitialized inside Eigen's GEMM packing (see
// system/generic/gradiveq.hpp).
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

namespace powersgd_detail {
using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
inline Eigen::Index idx(std::size_t v) noexcept { return static_cast<Eigen::Index>(v); }
}  // namespace powersgd_detail

/// P = M Q (Algorithm 1, line 3): M row-major rows x cols, Q column-major
/// cols x r, P column-major rows x r.
inline void powersgd_project(seq, const float* m, std::size_t rows, std::size_t cols, const float* q, std::size_t r,
                             float* p) {
  using namespace powersgd_detail;
  if (rows == 0 || r == 0) return;
  Eigen::Map<const row_major> M(m, idx(rows), idx(cols));
  Eigen::Map<const Eigen::MatrixXf> Q(q, idx(cols), idx(r));
  Eigen::Map<Eigen::MatrixXf> P(p, idx(rows), idx(r));
  P.noalias() = M * Q;
}

/// Q = M^T P (Algorithm 1, line 6): P column-major rows x r (orthonormal
/// columns), Q column-major cols x r.
inline void powersgd_back_project(seq, const float* m, std::size_t rows, std::size_t cols, const float* p,
                                  std::size_t r, float* q) {
  using namespace powersgd_detail;
  if (cols == 0 || r == 0) return;
  Eigen::Map<const row_major> M(m, idx(rows), idx(cols));
  Eigen::Map<const Eigen::MatrixXf> P(p, idx(rows), idx(r));
  Eigen::Map<Eigen::MatrixXf> Q(q, idx(cols), idx(r));
  Q.noalias() = M.transpose() * P;
}

/// out = P Q^T (Algorithm 1, line 8, the decompression), out row-major rows x cols.
inline void powersgd_expand(seq, const float* p, std::size_t rows, std::size_t r, const float* q, std::size_t cols,
                            float* out) {
  using namespace powersgd_detail;
  if (rows == 0 || cols == 0) return;
  Eigen::Map<row_major> O(out, idx(rows), idx(cols));
  if (r == 0) {
    O.setZero();
    return;
  }
  Eigen::Map<const Eigen::MatrixXf> P(p, idx(rows), idx(r));
  Eigen::Map<const Eigen::MatrixXf> Q(q, idx(cols), idx(r));
  O.noalias() = P * Q.transpose();
}

/// residual = M - P Q^T (the error feedback memory, Algorithm 2 line 6),
/// all row-major rows x cols; residual may be M itself.
inline void powersgd_residual(seq, const float* m, const float* p, std::size_t rows, std::size_t r, const float* q,
                              std::size_t cols, float* residual) {
  using namespace powersgd_detail;
  if (rows == 0 || cols == 0) return;
  Eigen::Map<row_major> E(residual, idx(rows), idx(cols));
  if (m != residual) E = Eigen::Map<const row_major>(m, idx(rows), idx(cols));
  if (r == 0) return;
  Eigen::Map<const Eigen::MatrixXf> P(p, idx(rows), idx(r));
  Eigen::Map<const Eigen::MatrixXf> Q(q, idx(cols), idx(r));
  E.noalias() -= P * Q.transpose();
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
