#pragma once
/// \file nn1d/loss.hpp
/// The losses of nn1d: mean squared error (seed 004, eqs. 6 and 11) and the
/// similarity loss (eq. 5), each with its gradient.

#include <algorithm>
#include <cstddef>
#include <string>

#include <gradcomp/nn1d/detail/warnings_push.hpp>  // GCC bug 105593, see there

#include <gradcomp/errors.hpp>
#include <gradcomp/nn1d/tensor.hpp>

namespace gradcomp::nn1d {
GRADCOMP_ABI_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------
// Losses. The paper writes squared L2 norms (eqs. 5, 6, 11); gradcomp divides
// each by the number of elements it sums (PyTorch's MSELoss reduction), so a
// learning rate does not depend on the vector length.

/// Mean squared error (1/N) sum_i (pred_i - target_i)^2 over the first `valid`
/// columns (all when valid < 0; N counts the summed elements): eqs. 6 and 11 per element. Writes dL/dpred into *grad (zero on the ignored columns) when non-null.
template <class T>
T mse_loss(const matrix<T>& pred, const matrix<T>& target, matrix<T>* grad, index_type valid = -1) {
  if (pred.rows() != target.rows() || pred.cols() != target.cols())
    throw size_mismatch_error("mse_loss", std::size_t(target.size()), std::size_t(pred.size()));
  const index_type cols = valid < 0 ? pred.cols() : std::min(valid, pred.cols());
  const double n = double(cols * pred.rows());
  if (n <= 0) {
    if (grad) *grad = matrix<T>::Zero(pred.rows(), pred.cols());
    return T(0);
  }
  const auto diff = (pred.leftCols(cols) - target.leftCols(cols)).eval();
  if (grad) {
    grad->resize(pred.rows(), pred.cols());
    grad->setZero();
    grad->leftCols(cols) = diff * T(2.0 / n);
  }
  return static_cast<T>(diff.squaredNorm() / n);
}

/// Similarity loss of seed 004 eq. (5) per element: (1/E) sum_k sum_{m != k} ||c_k - c_m||^2,
/// where `codes` holds K equal blocks of columns (block k = c_k, E elements each).
/// Writes dL/dcodes = (4/E)(K c_k - sum_m c_m) into *grad when non-null.
template <class T>
T similarity_loss(const matrix<T>& codes, index_type blocks, matrix<T>* grad) {
  if (blocks <= 0 || codes.cols() % blocks != 0)
    throw invalid_argument_error("similarity_loss: columns are not " + std::to_string(blocks) + " equal blocks");
  const index_type w = codes.cols() / blocks;
  const double e = double(w * codes.rows());
  matrix<T> sum = matrix<T>::Zero(codes.rows(), w);
  for (index_type k = 0; k < blocks; ++k) sum += codes.middleCols(k * w, w);
  // sum_k sum_{m!=k} ||c_k - c_m||^2 = 2 K sum_k ||c_k||^2 - 2 ||sum_k c_k||^2
  double sq = 0.0;
  for (index_type k = 0; k < blocks; ++k) sq += double(codes.middleCols(k * w, w).squaredNorm());
  const double loss = e > 0 ? (2.0 * double(blocks) * sq - 2.0 * double(sum.squaredNorm())) / e : 0.0;
  if (grad) {
    grad->resize(codes.rows(), codes.cols());
    for (index_type k = 0; k < blocks; ++k)
      grad->middleCols(k * w, w) = (T(blocks) * codes.middleCols(k * w, w) - sum) * T(e > 0 ? 4.0 / e : 0.0);
  }
  return static_cast<T>(std::max(0.0, loss));
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::nn1d

#include <gradcomp/nn1d/detail/warnings_pop.hpp>
