#pragma once
/// \file samomentum.hpp
/// sa_momentum: Sparsification-Aware Momentum, the worker side of DGS
/// (Algorithm 3, eqs. 14-16). One instance per layer. Each encode:
///   u <- m*u + eta*grad                                   (Alg. 3 line 6)
///   mask <- the k = max(1, ceil(R% * n)) largest |u|       (lines 8-9, eq. 15 "> thr")
///   send g = u where mask                                 (line 10, eq. 14b)
///   u <- u * (1/m) where not mask                         (line 11, eq. 14a)
/// The sent velocity is kept (not zeroed). A coordinate sent at step c, unsent
/// at c+1..c+T-1 and sent at c+T sends m*u_c + eta*(grad_{c+1} + ... + grad_{c+T})
/// (eq. 16), u_c being its velocity after step c; with R = 100% every
/// coordinate is sent every step and u follows dense momentum SGD (eq. 8).
///
/// The payload is sparse_coo_payload (payloads/sparse_coo.hpp).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/detail/sparse_codec.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/payloads/sparse_coo.hpp>
#include <gradcomp/payloads/topk.hpp>
#include <gradcomp/sparsify.hpp>  // threshold_mode and the axpby_topk kernels

namespace gradcomp {

/// Options of sa_momentum.
struct sa_momentum_options {
  double ratio_percent = 1.0;                   ///< R: percent of the layer sent per step, in (0, 100]
  float momentum = 0.7f;                        ///< m in (0, 1) (DGS uses 0.7 on CIFAR-10 and ImageNet)
  float learning_rate = 1.0f;                   ///< eta > 0 (1: payloads in gradient units)
  threshold_mode mode = threshold_mode::exact;  ///< exact radix select or DGC's sampled threshold
  std::uint64_t seed = 0;                       ///< sampled mode: seed of the sample (stream = step)
};

/// SAMomentum encoder of one layer (DGS Algorithm 3, eqs. 14-15).
///
/// Rescaling: unsent coordinates are multiplied by the float 1/m (Alg. 3
/// line 11 writes u + (1/m - 1) u, which is the same value up to rounding).
/// Non-finite policy: a gradient holding NaN/Inf is rejected with
/// non_finite_error (naming the first bad index) before any state changes.
template <ExecutionPolicy Policy = execution::seq>
class sa_momentum {
 public:
  using payload_type = sparse_coo_payload;

  /// SAMomentum for a layer of `element_count` floats.
  explicit sa_momentum(std::size_t element_count, sa_momentum_options options = {})
      : n_(element_count), options_(options) {
    validate_options(options_, "sa_momentum");
    detail::check_sparse_length(n_, "sa_momentum");
    k_ = sparse_selection_count(n_, options_.ratio_percent);
    velocity_.assign(n_, 0.0f);
  }

  /// One step of Alg. 3 lines 6-11 on this layer; `out` receives g (eq. 14b).
  void encode(std::span<const float> gradient, payload_type& out) {
    if (gradient.size() != n_) throw size_mismatch_error("sa_momentum::encode", n_, gradient.size());
    if (const auto bad = find_non_finite(Policy{}, gradient); bad != gradient.size())
      throw non_finite_error("sa_momentum::encode", bad);
    const float inv_m = 1.0f / options_.momentum;
    last_selected_ = axpby_topk(Policy{}, std::span<float>(velocity_), gradient, options_.momentum,
                                options_.learning_rate, k_, inv_m, options_.mode == threshold_mode::sampled,
                                options_.seed, steps_, workspace_, out.indices);
    out.length = n_;
    out.values.resize(out.indices.size());
    for (std::size_t j = 0; j < out.indices.size(); ++j) out.values[j] = velocity_[out.indices[j]];
    ++steps_;
  }

  /// out = the dense g the payload stands for (zeros where not sent).
  void decode(const payload_type& p, std::span<float> out) const {
    detail::sparse_scatter<false>(p, out, "sa_momentum::decode");
  }
  /// out += decode(p).
  void decode_add(const payload_type& p, std::span<float> out) const {
    detail::sparse_scatter<true>(p, out, "sa_momentum::decode_add");
  }
  /// Exact bytes on the wire.
  std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }

  /// Saves the velocity u, step count and options.
  std::vector<std::byte> save_state() const {
    return detail::save_sparse_state(n_, detail::sparse_state_kind::sa_momentum, [&](wire::writer& w) {
      w.put<std::uint8_t>(static_cast<std::uint8_t>(options_.mode));
      w.put<std::uint16_t>(0);
      w.put<double>(options_.ratio_percent);
      w.put<float>(options_.momentum);
      w.put<float>(options_.learning_rate);
      w.put<std::uint64_t>(options_.seed);
      w.put<std::uint64_t>(steps_);
      w.put_array<float>(velocity_);
    });
  }

  /// Restores a state from save_state(); continues bit for bit. The state
  /// must come from a codec configured the same way (R, m, mode, seed), else
  /// option_mismatch_error (a state_error) naming the first option that
  /// differs; eta (set_learning_rate, a schedule value) is taken from the
  /// state. Throws wire_error for malformed bytes, size_mismatch_error for
  /// another layer size, state_error for another codec kind; on error
  /// nothing changes.
  void restore_state(std::span<const std::byte> bytes) {
    wire::reader r =
        detail::open_sparse_state(bytes, n_, detail::sparse_state_kind::sa_momentum, "sa_momentum::restore_state");
    sa_momentum_options o;
    const auto mode = r.get<std::uint8_t>();
    const auto reserved = r.get<std::uint16_t>();
    wire::reader::check(mode <= 1 && reserved == 0, "sa_momentum state: bad mode or flags");
    o.mode = static_cast<threshold_mode>(mode);
    o.ratio_percent = r.get<double>();
    o.momentum = r.get<float>();
    o.learning_rate = r.get<float>();
    o.seed = r.get<std::uint64_t>();
    const auto steps = r.get<std::uint64_t>();
    detail::validate_saved_options([&] { validate_options(o, "sa_momentum state"); });
    auto velocity = detail::read_finite_floats(r, n_, "velocity");
    r.expect_end();
    const char* who = "sa_momentum::restore_state";
    if (o.ratio_percent != options_.ratio_percent) throw option_mismatch_error(who, "ratio_percent");
    if (o.momentum != options_.momentum) throw option_mismatch_error(who, "momentum");
    if (o.mode != options_.mode) throw option_mismatch_error(who, "mode");
    if (o.seed != options_.seed) throw option_mismatch_error(who, "seed");
    options_.learning_rate = o.learning_rate;
    steps_ = steps;
    velocity_ = std::move(velocity);
    last_selected_ = 0;
  }

  /// Layer size n.
  std::size_t element_count() const noexcept { return n_; }
  /// k, the entries selected per step in exact mode (upper bound in sampled mode).
  std::size_t selection_size() const noexcept { return k_; }
  /// Entries sent by the last encode.
  std::size_t last_selected() const noexcept { return last_selected_; }
  /// Achieved density of the last encode, last_selected() / n.
  double last_density() const noexcept { return n_ == 0 ? 0.0 : double(last_selected_) / double(n_); }
  /// The velocity u (unsent coordinates already rescaled by 1/m).
  std::span<const float> velocity() const noexcept { return velocity_; }
  /// Encodes done so far (the sampled mode's stream number).
  std::uint64_t steps() const noexcept { return steps_; }
  const sa_momentum_options& options() const noexcept { return options_; }
  /// Changes eta (learning-rate schedule); the velocity is kept.
  void set_learning_rate(float eta) {
    detail::check_sparse_positive(eta, "learning rate (eta)", "sa_momentum::set_learning_rate");
    options_.learning_rate = eta;
  }

 private:
  static void validate_options(const sa_momentum_options& o, const char* who) {
    detail::check_sparse_ratio(o.ratio_percent, who);
    detail::check_sparse_momentum(o.momentum, who);
    detail::check_sparse_positive(o.learning_rate, "learning rate (eta)", who);
    if (o.mode != threshold_mode::exact && o.mode != threshold_mode::sampled)
      throw invalid_argument_error(std::string(who) + ": unknown threshold mode");
  }

  std::size_t n_;
  sa_momentum_options options_;
  std::size_t k_ = 0;
  std::vector<float> velocity_;
  std::uint64_t steps_ = 0;
  std::size_t last_selected_ = 0;
  execution::topk_workspace workspace_;
};

static_assert(StatefulCodec<sa_momentum<>> && DecodeAddCodec<sa_momentum<>>,
              "sa_momentum is a stateful codec with decode_add");

}  // namespace gradcomp
