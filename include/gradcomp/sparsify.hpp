#pragma once
/// \file sparsify.hpp
/// sparsifier_with_memory: per-layer top-R% sparsification with a residual
/// (DGS Algorithm 1, lines 6-12; Gradient Dropping, Aji & Heafield), with an
/// optional DGC mode (momentum correction and momentum-factor masking, Lin et
/// al.). Its payload, sparse_coo_payload, shared with sa_momentum and the
/// parameter servers, is in payloads/sparse_coo.hpp; the top-k kernels and the
/// selection count k are in payloads/topk.hpp.
///
/// One instance per layer. Each encode:
///   r <- r + eta * g                                  (Alg. 1 line 6)
///   mask <- the k = max(1, ceil(R% * n)) largest |r|   (lines 9-10, ties: lower index)
///   send r where mask, r <- r where not mask          (lines 11-12)
/// so the sum of everything decoded plus the final residual equals eta times
/// the sum of the gradients (up to float rounding of the additions).
///
/// docs/codecs.md describes the payload format, the index encodings, the
/// threshold modes and their tie rules.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/sparse_codec.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/wire.hpp>

#include <gradcomp/payloads/sparse_coo.hpp>
#include <gradcomp/payloads/topk.hpp>

#include <gradcomp/system/sparsify.hpp>

namespace gradcomp {

/// How the top-R% threshold is found (system/generic/topk.hpp, axpby_topk).
enum class threshold_mode : std::uint8_t {
  /// Exactly k entries: the k largest magnitudes, lower index first among
  /// equal magnitudes. A stratified sample brackets the threshold so that one
  /// fused pass collects a small candidate set holding the top k, which is
  /// then selected exactly; when the bracket holds fewer than k (rare) the
  /// radix select runs instead. The result never depends on the seed.
  exact = 0,
  /// DGC (Lin et al.): threshold from a stratified random sample, one fused
  /// pass, exact re-selection when more than k qualified; when fewer
  /// qualified they are sent as they are, so at most k entries (the exact
  /// top of their own number); last_density() reports what was achieved.
  sampled = 1,
};

/// Options of sparsifier_with_memory.
struct sparsifier_options {
  double ratio_percent = 1.0;                   ///< R: percent of the layer sent per step, in (0, 100]
  threshold_mode mode = threshold_mode::exact;  ///< exact radix select or DGC's sampled threshold
  std::uint64_t seed = 0;                       ///< sampled mode: seed of the sample (stream = step)
  float scale = 1.0f;                           ///< eta of Alg. 1 line 6 (r += eta * g); finite, > 0
  bool dgc_momentum = false;                    ///< DGC momentum correction and momentum-factor masking
  float momentum = 0.9f;                        ///< DGC momentum m in (0, 1); used only with dgc_momentum
};

/// Top-R% sparsifier with residual memory, one instance per layer
/// (DGS Algorithm 1; Gradient Dropping). encode: r += eta*g, send the k
/// largest |r| as COO, keep the rest in r.
///
/// DGC mode (`dgc_momentum`, Lin et al., Deep Gradient Compression): the
/// velocity u and the accumulation v replace r:
///   u <- m*u + eta*g;  v <- v + u;  send the top-k |v|;  zero u and v where sent.
/// (momentum correction: the accumulated velocity is sent; momentum-factor
/// masking: the sent coordinates' velocity is cleared.)
///
/// Non-finite policy: a gradient holding NaN/Inf is rejected with
/// non_finite_error (naming the first bad index) before any state changes.
template <ExecutionPolicy Policy = execution::seq>
class sparsifier_with_memory {
 public:
  using payload_type = sparse_coo_payload;

  /// A sparsifier for a layer of `element_count` floats.
  explicit sparsifier_with_memory(std::size_t element_count, sparsifier_options options = {})
      : n_(element_count), options_(options) {
    validate_options(options_, "sparsifier_with_memory");
    detail::check_sparse_length(n_, "sparsifier_with_memory");
    k_ = sparse_selection_count(n_, options_.ratio_percent);
    residual_.assign(n_, 0.0f);
    if (options_.dgc_momentum) velocity_.assign(n_, 0.0f);
  }

  /// One step of DGS Alg. 1 lines 6-12 on this layer: folds `gradient` into
  /// the residual and writes the selected entries into `out`.
  void encode(std::span<const float> gradient, payload_type& out) {
    if (gradient.size() != n_) throw size_mismatch_error("sparsifier_with_memory::encode", n_, gradient.size());
    if (const auto bad = find_non_finite(Policy{}, gradient); bad != gradient.size())
      throw non_finite_error("sparsifier_with_memory::encode", bad);
    const bool sampled = options_.mode == threshold_mode::sampled;
    std::span<float> r(residual_);
    if (options_.dgc_momentum) {
      std::span<float> u(velocity_);
      axpby_update(Policy{}, u, gradient, options_.momentum, options_.scale);
      last_selected_ = axpby_topk(Policy{}, r, std::span<const float>(u), 1.0f, 1.0f, k_, 1.0f, sampled,
                                  options_.seed, steps_, workspace_, out.indices);
    } else {
      last_selected_ = axpby_topk(Policy{}, r, gradient, 1.0f, options_.scale, k_, 1.0f, sampled, options_.seed,
                                  steps_, workspace_, out.indices);
    }
    out.length = n_;
    out.values.resize(out.indices.size());
    for (std::size_t j = 0; j < out.indices.size(); ++j) {
      const std::uint32_t i = out.indices[j];
      out.values[j] = residual_[i];
      residual_[i] = 0.0f;
    }
    if (options_.dgc_momentum)  // momentum-factor masking
      for (std::uint32_t i : out.indices) velocity_[i] = 0.0f;
    ++steps_;
  }

  /// out = the dense gradient the payload stands for (zeros where not sent).
  void decode(const payload_type& p, std::span<float> out) const {
    detail::sparse_scatter<false>(p, out, "sparsifier_with_memory::decode");
  }
  /// out += decode(p): decode-and-sum aggregation without a buffer.
  void decode_add(const payload_type& p, std::span<float> out) const {
    detail::sparse_scatter<true>(p, out, "sparsifier_with_memory::decode_add");
  }
  /// Exact bytes on the wire: header, flag byte, count, index block, values.
  std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }

  /// Saves residual (DGC: accumulation v and velocity u), step count and options.
  std::vector<std::byte> save_state() const {
    return detail::save_sparse_state(n_, detail::sparse_state_kind::sparsifier, [&](wire::writer& w) {
      w.put<std::uint8_t>(static_cast<std::uint8_t>(options_.mode));
      w.put<std::uint8_t>(options_.dgc_momentum ? 1 : 0);
      w.put<std::uint8_t>(0);
      w.put<double>(options_.ratio_percent);
      w.put<float>(options_.scale);
      w.put<float>(options_.momentum);
      w.put<std::uint64_t>(options_.seed);
      w.put<std::uint64_t>(steps_);
      w.put_array<float>(residual_);
      if (options_.dgc_momentum) w.put_array<float>(velocity_);
    });
  }

  /// Restores a state from save_state(): the codec then continues bit for bit
  /// as the saved one would. The state must come from a codec configured
  /// the same way (R, mode, seed, DGC flag and momentum), else
  /// option_mismatch_error (a state_error) naming the first option that differs;
  /// eta (set_scale, a schedule value) is taken from the state. Throws
  /// wire_error for malformed bytes, size_mismatch_error for another layer
  /// size, state_error for another codec kind. On error nothing changes.
  void restore_state(std::span<const std::byte> bytes) {
    wire::reader r = detail::open_sparse_state(bytes, n_, detail::sparse_state_kind::sparsifier,
                                               "sparsifier_with_memory::restore_state");
    sparsifier_options o;
    const auto mode = r.get<std::uint8_t>();
    const auto dgc = r.get<std::uint8_t>();
    const auto reserved = r.get<std::uint8_t>();
    wire::reader::check(mode <= 1 && dgc <= 1 && reserved == 0, "sparsifier state: bad mode or flags");
    o.mode = static_cast<threshold_mode>(mode);
    o.dgc_momentum = dgc != 0;
    o.ratio_percent = r.get<double>();
    o.scale = r.get<float>();
    o.momentum = r.get<float>();
    o.seed = r.get<std::uint64_t>();
    const auto steps = r.get<std::uint64_t>();
    detail::validate_saved_options([&] { validate_options(o, "sparsifier state"); });
    auto residual = detail::read_finite_floats(r, n_, "residual");
    std::vector<float> velocity;
    if (o.dgc_momentum) velocity = detail::read_finite_floats(r, n_, "velocity");
    r.expect_end();
    const char* who = "sparsifier_with_memory::restore_state";
    if (o.ratio_percent != options_.ratio_percent) throw option_mismatch_error(who, "ratio_percent");
    if (o.mode != options_.mode) throw option_mismatch_error(who, "mode");
    if (o.seed != options_.seed) throw option_mismatch_error(who, "seed");
    if (o.dgc_momentum != options_.dgc_momentum) throw option_mismatch_error(who, "dgc_momentum");
    if (o.dgc_momentum && o.momentum != options_.momentum) throw option_mismatch_error(who, "momentum");
    options_.scale = o.scale;
    steps_ = steps;
    residual_ = std::move(residual);
    velocity_ = std::move(velocity);
    last_selected_ = 0;
  }

  /// Layer size n.
  std::size_t element_count() const noexcept { return n_; }
  /// k, the entries selected per step in exact mode (upper bound in sampled mode).
  std::size_t selection_size() const noexcept { return k_; }
  /// Entries sent by the last encode (sampled mode may send fewer than k).
  std::size_t last_selected() const noexcept { return last_selected_; }
  /// Achieved density of the last encode, last_selected() / n.
  double last_density() const noexcept { return n_ == 0 ? 0.0 : double(last_selected_) / double(n_); }
  /// The residual r (DGC mode: the accumulation v).
  std::span<const float> residual() const noexcept { return residual_; }
  /// DGC mode: the velocity u (empty otherwise).
  std::span<const float> velocity() const noexcept { return velocity_; }
  /// Encodes done so far (the sampled mode's stream number).
  std::uint64_t steps() const noexcept { return steps_; }
  const sparsifier_options& options() const noexcept { return options_; }
  /// Changes eta (e.g. a learning-rate schedule); the residual is kept.
  void set_scale(float eta) {
    detail::check_sparse_positive(eta, "scale (eta)", "sparsifier_with_memory::set_scale");
    options_.scale = eta;
  }

 private:
  static void validate_options(const sparsifier_options& o, const char* who) {
    detail::check_sparse_ratio(o.ratio_percent, who);
    if (o.mode != threshold_mode::exact && o.mode != threshold_mode::sampled)
      throw invalid_argument_error(std::string(who) + ": unknown threshold mode");
    detail::check_sparse_positive(o.scale, "scale (eta)", who);
    if (o.dgc_momentum) detail::check_sparse_momentum(o.momentum, who);
  }

  std::size_t n_;
  sparsifier_options options_;
  std::size_t k_ = 0;
  std::vector<float> residual_;
  std::vector<float> velocity_;
  std::uint64_t steps_ = 0;
  std::size_t last_selected_ = 0;
  execution::topk_workspace workspace_;
};

static_assert(StatefulCodec<sparsifier_with_memory<>> && DecodeAddCodec<sparsifier_with_memory<>>,
              "sparsifier_with_memory is a stateful codec with decode_add");

}  // namespace gradcomp
