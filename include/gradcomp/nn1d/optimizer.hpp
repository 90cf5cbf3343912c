#pragma once
/// \file nn1d/optimizer.hpp
/// The optimisers of nn1d: `sgd` (seed 004, Section VI-A) and `adam`.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <gradcomp/nn1d/detail/warnings_push.hpp>  // GCC bug 105593, see there

#include <gradcomp/errors.hpp>
#include <gradcomp/nn1d/tensor.hpp>

namespace gradcomp::nn1d {
GRADCOMP_ABI_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------
// Optimisers. They hold per-parameter state, so one optimiser serves one
// fixed list of parameters (same order and sizes every step).

/// Stochastic gradient descent, optionally with (heavy-ball) momentum: v = m v + g; w -= lr v.
template <class T>
class sgd {
 public:
  explicit sgd(T lr = T(1e-3), T momentum = T(0)) : lr_(lr), momentum_(momentum) {
    if (!(lr > T(0)) || !std::isfinite(double(lr))) throw invalid_argument_error("sgd: learning rate must be positive");
    if (!(momentum >= T(0)) || !(momentum < T(1))) throw invalid_argument_error("sgd: momentum must be in [0, 1)");
  }
  T learning_rate() const noexcept { return lr_; }
  void step(const std::vector<parameter_ref<T>>& params) {
    if (momentum_ > T(0) && velocity_.size() != params.size()) {
      velocity_.clear();
      for (const auto& p : params) velocity_.emplace_back(p.value.size(), T(0));
    }
    for (std::size_t j = 0; j < params.size(); ++j) {
      auto& p = params[j];
      if (momentum_ > T(0)) {
        auto& v = velocity_[j];
        for (std::size_t i = 0; i < p.value.size(); ++i) {
          v[i] = momentum_ * v[i] + p.grad[i];
          p.value[i] -= lr_ * v[i];
        }
      } else {
        for (std::size_t i = 0; i < p.value.size(); ++i) p.value[i] -= lr_ * p.grad[i];
      }
    }
  }

 private:
  T lr_, momentum_;
  std::vector<std::vector<T>> velocity_;
};

/// Adam (Kingma & Ba), bias-corrected.
template <class T>
class adam {
 public:
  explicit adam(T lr = T(1e-3), T beta1 = T(0.9), T beta2 = T(0.999), T eps = T(1e-8))
      : lr_(lr), b1_(beta1), b2_(beta2), eps_(eps) {
    if (!(lr > T(0)) || !std::isfinite(double(lr))) throw invalid_argument_error("adam: learning rate must be positive");
    if (!(beta1 >= T(0) && beta1 < T(1)) || !(beta2 >= T(0) && beta2 < T(1)))
      throw invalid_argument_error("adam: betas must be in [0, 1)");
    if (!(eps > T(0))) throw invalid_argument_error("adam: eps must be positive");
  }
  T learning_rate() const noexcept { return lr_; }
  void step(const std::vector<parameter_ref<T>>& params) {
    if (m_.size() != params.size()) {
      m_.clear();
      v_.clear();
      for (const auto& p : params) {
        m_.emplace_back(p.value.size(), T(0));
        v_.emplace_back(p.value.size(), T(0));
      }
      t_ = 0;
    }
    ++t_;
    const double c1 = 1.0 - std::pow(double(b1_), double(t_)), c2 = 1.0 - std::pow(double(b2_), double(t_));
    const T step = static_cast<T>(double(lr_) * std::sqrt(c2) / c1);
    for (std::size_t j = 0; j < params.size(); ++j) {
      auto& p = params[j];
      auto& m = m_[j];
      auto& v = v_[j];
      for (std::size_t i = 0; i < p.value.size(); ++i) {
        const T g = p.grad[i];
        m[i] = b1_ * m[i] + (T(1) - b1_) * g;
        v[i] = b2_ * v[i] + (T(1) - b2_) * g * g;
        p.value[i] -= step * m[i] / (std::sqrt(v[i]) + eps_);
      }
    }
  }

 private:
  T lr_, b1_, b2_, eps_;
  std::uint64_t t_ = 0;
  std::vector<std::vector<T>> m_, v_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::nn1d

#include <gradcomp/nn1d/detail/warnings_pop.hpp>
