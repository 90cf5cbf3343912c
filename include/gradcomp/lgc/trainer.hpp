#pragma once
/// \file lgc/trainer.hpp
/// Online, transactional training of the LGC autoencoder (seed 004,
/// Section V-B): `basic_lgc_trainer<T>`.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/lgc/network.hpp>
#include <gradcomp/lgc/windows.hpp>

namespace gradcomp {

/// Optimiser of the online training.
enum class lgc_optimizer : std::uint8_t {
  sgd = 0,   ///< the paper's choice (Section VI-A): SGD, lr 1e-3, batch 1
  adam = 1,  ///< Adam (Kingma & Ba); converges faster on small budgets
};

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Online training of an LGC network (Section V-B): one step per training
/// iteration on that iteration's vectors (batch 1; the iteration's windows
/// form the minibatch). Steps are transactional: inputs are checked finite
/// before anything changes, and a step whose loss, gradients or updated
/// weights are not finite is rolled back (weights and optimiser state) and
/// reported with non_finite_error, so a diverging step never poisons the weights.
template <class T>
class basic_lgc_trainer {
 public:
  basic_lgc_trainer(basic_lgc_network<T> initial, lgc_optimizer opt = lgc_optimizer::sgd, T learning_rate = T(1e-3))
      : net_(std::move(initial)), kind_(opt), sgd_(learning_rate), adam_(learning_rate) {}

  /// The network being trained.
  [[nodiscard]] const basic_lgc_network<T>& network() const noexcept { return net_; }
  [[nodiscard]] basic_lgc_network<T>& network() noexcept { return net_; }
  /// Steps taken (committed).
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  /// Steps rolled back (non-finite loss, gradient or weight).
  [[nodiscard]] std::uint64_t rejected_steps() const noexcept { return rejected_; }
  /// Loss of the last committed step.
  [[nodiscard]] T last_loss() const noexcept { return last_loss_; }

  /// One ring step (eqs. 9-11) on K node vectors of equal length (>= one
  /// window), each divided per window by `scales` (one per window; empty =
  /// the RMS of the first vector's windows). Returns the loss.
  T step_ring(std::span<const std::span<const T>> nodes, std::span<const float> scales = {}) {
    const prepared p = prepare(nodes, scales, "step_ring");
    return transact([&] { return net_.ring_loss_backward(p.x, nodes.size(), p.valid); });
  }

  /// One parameter-server step (eq. 7) on K node vectors and their
  /// innovation vectors (same length, zeros off the innovation), with the
  /// code of node r fed to every decoder.
  T step_ps(std::span<const std::span<const T>> nodes, std::span<const std::span<const T>> innovations, std::size_t r,
            std::span<const float> scales = {}, T lambda1 = T(1), T lambda2 = T(0.5)) {
    const prepared p = prepare(nodes, scales, "step_ps");
    const auto& x = p.x;
    if (innovations.size() != nodes.size())
      throw size_mismatch_error("lgc trainer: innovation vectors", nodes.size(), innovations.size());
    const std::size_t w = net_.window();
    nn1d::matrix<T> h(1, x.data.cols());
    for (std::size_t k = 0; k < nodes.size(); ++k) {
      if (innovations[k].size() != nodes[k].size())
        throw size_mismatch_error("lgc trainer: innovation vector", nodes[k].size(), innovations[k].size());
      if (auto bad = first_non_finite(innovations[k]); bad != innovations[k].size())
        throw non_finite_error("lgc trainer: innovation", bad);
      detail::lgc_to_windows<T, T>(innovations[k], p.scales, w, h,
                                   nn1d::index_type(k) * (x.data.cols() / nn1d::index_type(nodes.size())));
    }
    return transact([&] { return net_.ps_loss_backward(p.x, h, nodes.size(), r, p.valid, lambda1, lambda2); });
  }

 private:
  struct prepared {
    nn1d::tensor<T> x;
    nn1d::index_type valid;
    std::vector<float> scales;
  };
  static std::size_t first_non_finite(std::span<const T> v) {
    for (std::size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(double(v[i]))) return i;
    return v.size();
  }
  prepared prepare(std::span<const std::span<const T>> nodes, std::span<const float> scales, const char* who) {
    if (nodes.empty()) throw invalid_argument_error(std::string("lgc trainer ") + who + ": no vectors");
    const std::size_t n = nodes[0].size(), w = net_.window();
    if (n < w)
      throw invalid_argument_error(std::string("lgc trainer ") + who + ": input of " + std::to_string(n) +
                                   " values is shorter than one window (" + std::to_string(w) + ")");
    for (const auto& v : nodes) {
      if (v.size() != n) throw size_mismatch_error(std::string("lgc trainer ") + who + ": vector", n, v.size());
      if (auto bad = first_non_finite(v); bad != v.size()) throw non_finite_error(std::string("lgc trainer ") + who, bad);
    }
    const std::size_t windows = detail::lgc_window_count(n, w);
    prepared p;
    if (scales.empty()) {
      detail::lgc_window_scales<T>(nodes[0], w, p.scales);
    } else {
      if (scales.size() != windows) throw size_mismatch_error(std::string("lgc trainer ") + who + ": scales", windows, scales.size());
      for (float s : scales)
        if (!(s > 0.0f) || !std::isfinite(s)) throw invalid_argument_error("lgc trainer: scales must be finite and > 0");
      p.scales.assign(scales.begin(), scales.end());
    }
    const auto block = nn1d::index_type(windows * w);
    p.x.resize(1, nn1d::index_type(w), nn1d::index_type(windows * nodes.size()));
    for (std::size_t k = 0; k < nodes.size(); ++k)
      detail::lgc_to_windows<T, T>(nodes[k], p.scales, w, p.x.data, nn1d::index_type(k) * block);
    p.valid = nn1d::index_type(n);
    return p;
  }

  template <class F>
  T transact(F&& loss_backward) {
    // Snapshot weights and optimiser, so any non-finite outcome can be undone.
    auto params = net_.parameters();
    std::vector<T> saved;
    for (const auto& p : params) saved.insert(saved.end(), p.value.begin(), p.value.end());
    const auto sgd_saved = sgd_;
    const auto adam_saved = adam_;
    const T loss = loss_backward();
    std::size_t bad = std::numeric_limits<std::size_t>::max();
    if (!std::isfinite(double(loss))) bad = 0;
    std::size_t at = 0;
    for (const auto& p : params) {
      if (bad != std::numeric_limits<std::size_t>::max()) break;
      for (std::size_t i = 0; i < p.grad.size(); ++i)
        if (!std::isfinite(double(p.grad[i]))) {
          bad = at + i;
          break;
        }
      at += p.grad.size();
    }
    if (bad == std::numeric_limits<std::size_t>::max()) {
      if (kind_ == lgc_optimizer::sgd)
        sgd_.step(params);
      else
        adam_.step(params);
      at = 0;
      for (const auto& p : params) {
        for (std::size_t i = 0; i < p.value.size(); ++i)
          if (!std::isfinite(double(p.value[i]))) {
            bad = at + i;
            break;
          }
        if (bad != std::numeric_limits<std::size_t>::max()) break;
        at += p.value.size();
      }
    }
    if (bad != std::numeric_limits<std::size_t>::max()) {
      at = 0;
      for (const auto& p : params) {
        std::copy(saved.begin() + std::ptrdiff_t(at), saved.begin() + std::ptrdiff_t(at + p.value.size()), p.value.begin());
        at += p.value.size();
      }
      sgd_ = sgd_saved;
      adam_ = adam_saved;
      ++rejected_;
      throw non_finite_error("lgc trainer: diverging step rolled back (loss, gradient or weight)", bad);
    }
    ++steps_;
    last_loss_ = loss;
    return loss;
  }

  basic_lgc_network<T> net_;
  lgc_optimizer kind_;
  nn1d::sgd<T> sgd_;
  nn1d::adam<T> adam_;
  std::uint64_t steps_ = 0, rejected_ = 0;
  T last_loss_ = T(0);
};

GRADCOMP_ABI_NAMESPACE_END
using lgc_trainer = basic_lgc_trainer<float>;

}  // namespace gradcomp
