#pragma once
/// \file nn1d/tensor.hpp
/// The data types of nn1d: Eigen matrices, the batched 1-D signal `tensor`
/// and `parameter_ref` (a parameter with its gradient).

#include <cstddef>
#include <span>

#include <gradcomp/nn1d/detail/warnings_push.hpp>  // GCC bug 105593, see there

#include <Eigen/Core>

#include <gradcomp/abi.hpp>

namespace gradcomp::nn1d {
GRADCOMP_ABI_NAMESPACE_BEGIN

using index_type = Eigen::Index;
/// Column-major dynamic matrix.
template <class T>
using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
/// Dynamic column vector.
template <class T>
using vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;

/// A batch of 1-D signals: channels x (batch * length), sample b in columns [b*length, (b+1)*length).
template <class T>
struct tensor {
  matrix<T> data;
  index_type length = 0;  ///< samples' length L

  index_type channels() const noexcept { return data.rows(); }
  index_type batch() const noexcept { return length > 0 ? data.cols() / length : 0; }
  /// Resizes (keeping the allocation when the size is unchanged); contents unspecified.
  void resize(index_type channels, index_type len, index_type batch) {
    data.resize(channels, len * batch);
    length = len;
  }
};

/// A view of one parameter array and its gradient, for optimisers and (de)serialisation.
template <class T>
struct parameter_ref {
  std::span<T> value;
  std::span<T> grad;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::nn1d

#include <gradcomp/nn1d/detail/warnings_pop.hpp>
