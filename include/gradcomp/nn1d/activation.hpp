#pragma once
/// \file nn1d/activation.hpp
/// The activation of nn1d: `leaky_relu` (seed 004, Tables I-II).

#include <gradcomp/nn1d/detail/warnings_push.hpp>  // GCC bug 105593, see there

#include <gradcomp/errors.hpp>
#include <gradcomp/nn1d/tensor.hpp>

namespace gradcomp::nn1d {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Leaky ReLU: y = x for x > 0, a x otherwise (He et al., seed 004 ref. [52]).
template <class T>
class leaky_relu {
 public:
  explicit leaky_relu(T slope = T(0.01)) : slope_(slope) {
    if (!(slope >= T(0)) || !(slope < T(1))) throw invalid_argument_error("leaky_relu: slope must be in [0, 1)");
  }
  T slope() const noexcept { return slope_; }

  void infer(const tensor<T>& x, tensor<T>& y) const {
    y.length = x.length;
    y.data = (x.data.array() > T(0)).select(x.data.array(), slope_ * x.data.array()).matrix();
  }
  void forward(const tensor<T>& x, tensor<T>& y) {
    cache_ = x;
    infer(x, y);
  }
  void backward(const tensor<T>& dy, tensor<T>* dx) {
    if (dy.data.rows() != cache_.data.rows() || dy.data.cols() != cache_.data.cols())
      throw state_error("leaky_relu::backward: gradient does not match the last forward pass");
    if (!dx) return;
    dx->length = dy.length;
    dx->data = (cache_.data.array() > T(0)).select(dy.data.array(), slope_ * dy.data.array()).matrix();
  }

 private:
  T slope_;
  tensor<T> cache_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::nn1d

#include <gradcomp/nn1d/detail/warnings_pop.hpp>
