#pragma once
/// \file nn1d/sequential.hpp
/// `sequential<T>`: nn1d layers applied in order, with training and
/// inference passes, deterministic initialisation and parameter views.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <gradcomp/nn1d/detail/warnings_push.hpp>  // GCC bug 105593, see there

#include <gradcomp/errors.hpp>
#include <gradcomp/nn1d/activation.hpp>
#include <gradcomp/nn1d/conv.hpp>
#include <gradcomp/nn1d/tensor.hpp>

namespace gradcomp::nn1d {
GRADCOMP_ABI_NAMESPACE_BEGIN

template <class T>
using layer = std::variant<conv1d<T>, conv_transpose1d<T>, leaky_relu<T>>;

/// Layers applied in order. Copyable (a copy is an independent network: the
/// autoencoder trains on a copy and commits only finite weights).
template <class T>
class sequential {
 public:
  sequential() = default;

  /// Appends a layer.
  void add(layer<T> l) {
    layers_.push_back(std::move(l));
    acts_.resize(layers_.size());
  }
  std::size_t size() const noexcept { return layers_.size(); }
  const std::vector<layer<T>>& layers() const noexcept { return layers_; }
  std::vector<layer<T>>& layers() noexcept { return layers_; }

  /// Deterministic initialisation: layer i draws from stream (seed, stream_base + i) of a counter-based generator.
  void initialize(std::uint64_t seed, std::uint64_t stream_base = 0) {
    const gradcomp::detail::counter_rng rng(seed);
    double slope = 0.0;
    // Each weight layer is initialised for the activation that follows it.
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      slope = 1.0;  // linear output when no leaky_relu follows
      if (i + 1 < layers_.size())
        if (auto* a = std::get_if<leaky_relu<T>>(&layers_[i + 1])) slope = double(a->slope());
      const auto s = rng.stream(stream_base + i);
      std::visit(
          [&](auto& l) {
            if constexpr (!std::is_same_v<std::decay_t<decltype(l)>, leaky_relu<T>>) l.initialize(s, slope);
          },
          layers_[i]);
    }
  }

  /// Output length for an input of length `l` (throws when a layer would produce nothing).
  index_type output_length(index_type l) const {
    for (const auto& ly : layers_)
      std::visit(
          [&](const auto& x) {
            if constexpr (!std::is_same_v<std::decay_t<decltype(x)>, leaky_relu<T>>) l = x.output_length(l);
          },
          ly);
    return l;
  }

  /// Inference. `ws` holds the intermediate tensors, one per layer, so calls
  /// on inputs of the same shape reuse every allocation.
  struct workspace {
    std::vector<tensor<T>> acts;
    std::vector<matrix<T>> cols;
  };
  void infer(const tensor<T>& x, tensor<T>& y, workspace& ws) const {
    if (layers_.empty()) {
      y = x;
      return;
    }
    ws.acts.resize(layers_.size());
    ws.cols.resize(layers_.size());
    const tensor<T>* in = &x;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      // A convolution followed by a leaky ReLU runs as one layer: the
      // activation is applied in the convolution's bias pass (one pass over
      // the output instead of three), with the same bits.
      const leaky_relu<T>* act =
          (i + 1 < layers_.size() && !std::holds_alternative<leaky_relu<T>>(layers_[i]))
              ? std::get_if<leaky_relu<T>>(&layers_[i + 1])
              : nullptr;
      const T slope = act ? act->slope() : T(0);
      const std::size_t last = act ? i + 1 : i;
      tensor<T>& out = (last + 1 == layers_.size()) ? y : ws.acts[last];
      std::visit(
          [&](const auto& l) {
            if constexpr (std::is_same_v<std::decay_t<decltype(l)>, leaky_relu<T>>)
              l.infer(*in, out);
            else
              l.infer(*in, out, ws.cols[i], act ? &slope : nullptr);
          },
          layers_[i]);
      in = &out;
      i = last;
    }
  }
  void infer(const tensor<T>& x, tensor<T>& y) const {
    workspace ws;
    infer(x, y, ws);
  }

  /// Training pass; the returned output stays valid until the next forward.
  const tensor<T>& forward(const tensor<T>& x) {
    if (layers_.empty()) throw state_error("sequential::forward: no layers");
    const tensor<T>* in = &x;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      std::visit([&](auto& l) { l.forward(*in, acts_[i]); }, layers_[i]);
      in = &acts_[i];
    }
    return acts_.back();
  }

  /// Backward through every layer; accumulates parameter gradients; dL/dx into *dx when non-null.
  void backward(const tensor<T>& dy, tensor<T>* dx) {
    if (layers_.empty()) throw state_error("sequential::backward: no layers");
    const tensor<T>* g = &dy;
    for (std::size_t i = layers_.size(); i-- > 0;) {
      tensor<T>* out = (i == 0) ? dx : (g == &grad_a_ ? &grad_b_ : &grad_a_);
      if (i > 0 || dx) {
        std::visit([&](auto& l) { l.backward(*g, out); }, layers_[i]);
        g = out;
      } else {
        std::visit([&](auto& l) { l.backward(*g, nullptr); }, layers_[i]);
      }
    }
  }

  /// Every weight and bias with its gradient, in layer order.
  std::vector<parameter_ref<T>> parameters() {
    std::vector<parameter_ref<T>> out;
    for (auto& ly : layers_)
      std::visit(
          [&](auto& l) {
            if constexpr (!std::is_same_v<std::decay_t<decltype(l)>, leaky_relu<T>>) l.append_parameters(out);
          },
          ly);
    return out;
  }
  std::size_t parameter_count() {
    std::size_t n = 0;
    for (auto& p : parameters()) n += p.value.size();
    return n;
  }
  void zero_grad() {
    for (auto& p : parameters()) std::fill(p.grad.begin(), p.grad.end(), T(0));
  }

 private:
  std::vector<layer<T>> layers_;
  std::vector<tensor<T>> acts_;
  tensor<T> grad_a_, grad_b_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::nn1d

#include <gradcomp/nn1d/detail/warnings_pop.hpp>
