#pragma once
/// \file exchange/lgc_bucket.hpp
/// LGC's ring form (seed 004, Section IV-B, Algorithm 2; protocols/lgc_ring.hpp)
/// as a bucket codec of the whole-model exchange: its three phases are rounds
/// of the bucket contract, and nothing is sent outside a round.
///
///  - phase 1 (full, eq. 14): one sum round of every layer's contribution
///    (the gradient, or the DGC velocity u = m u + g).
///  - phase 2 (top-k while the autoencoder trains, eq. 15): an all-gather of
///    the leader's index set (the leader is drawn from (seed, step); the other
///    ranks contribute nothing), an all-gather of every rank's top-k values
///    (the trainer's minibatch, eq. 11), then one sum round of the dense layer,
///    the top-k-only values and the autoencoder values.
///  - phase 3 (compressed, eqs. 16-19): an all-gather of the leader's index set
///    (at the first compressed step, and every lgc_options::retrain_period
///    compressed steps after it, the trainer's weights ride in the same
///    round), then one sum round of the dense layer, the top-k-only values and
///    the codes E(g / s); every rank decodes the average code once (eq. 19).
///    With retrain_period > 0 (beyond the paper) the trainer keeps training
///    on its own top-k vector of each compressed step.
///
/// All local work that can fail (accumulation, top-k selection, the leader's
/// index set) happens in prepare; the accumulator is snapshotted there so that
/// abandon() undoes the step. Link zlib (gradcomp::lgc): the index sets are
/// DEFLATE-compressed. A plan with LGC layers needs
/// `plan_options::lgc_factory = lgc_bucket_factory<Policy>()` (defined with
/// the parameter-server form, exchange/lgc_ps_bucket.hpp, included below).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/autoencoder.hpp>
#include <gradcomp/detail/random.hpp>
#include <gradcomp/exchange/bucket_codecs.hpp>
#include <gradcomp/exchange/contract.hpp>
#include <gradcomp/exchange/model.hpp>
#include <gradcomp/payloads/dense.hpp>
#include <gradcomp/protocols/lgc_common.hpp>

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Where the layers of an LGC bucket go (plan_options::lgc): LGC's dense
/// layer (the bucket's first layer with lgc.first_layer_dense, and its
/// tensor-rank-1 layers with lgc_rank1_dense, concatenated in model order),
/// the autoencoder layers, and the top-k-only layer (the last other layer,
/// with lgc.last_layer_topk_only and at least two other layers).
struct lgc_bucket_grouping {
  std::vector<std::size_t> dense;  ///< positions in the bucket, concatenated as LGC layer 0
  std::vector<std::size_t> coded;  ///< positions of the autoencoder layers
  std::ptrdiff_t last = -1;        ///< position of the top-k-only layer, or -1
  std::vector<std::size_t> sizes;  ///< LGC's layer sizes ([dense], coded..., [last])
  lgc_options options;             ///< plan_options::lgc with first/last flags matching the grouping

  lgc_bucket_grouping(const plan& p, const bucket_desc& b) : options(p.options().lgc) {
    std::vector<std::size_t> rest;
    for (std::size_t j = 0; j < b.layers.size(); ++j) {
      const auto& l = p.model()[b.layers[j]];
      const bool dense_role = (j == 0 && options.first_layer_dense) || (p.options().lgc_rank1_dense && l.tensor_rank == 1);
      (dense_role ? dense : rest).push_back(j);
    }
    if (options.last_layer_topk_only && rest.size() >= 2) {
      last = static_cast<std::ptrdiff_t>(rest.back());
      rest.pop_back();
    }
    coded = rest;
    options.first_layer_dense = !dense.empty();
    options.last_layer_topk_only = last >= 0;
    std::size_t dense_n = 0;
    for (auto j : dense) dense_n += p.model()[b.layers[j]].shape.size();
    if (dense_n) sizes.push_back(dense_n);
    for (auto j : coded) sizes.push_back(p.model()[b.layers[j]].shape.size());
    if (last >= 0) sizes.push_back(p.model()[b.layers[static_cast<std::size_t>(last)]].shape.size());
  }
};

namespace detail {

/// The accumulator part of an LGC bucket's saved state: u then v, each
/// layer's length and values (shared by the ring and parameter-server buckets).
template <class Accumulator>
void put_lgc_accumulator(wire::writer& w, const Accumulator& acc) {
  for (const auto* a : {&acc.u, &acc.v})
    for (const auto& l : *a) {
      w.put<std::uint64_t>(l.size());
      w.put_array<float>(l);
    }
}

/// Reads what put_lgc_accumulator wrote into copies of `acc`'s u and v
/// (layer lengths checked: layout_error naming `who`); the caller commits them.
template <class Accumulator>
std::pair<decltype(Accumulator::u), decltype(Accumulator::v)> get_lgc_accumulator(wire::reader& r,
                                                                                 const Accumulator& acc,
                                                                                 const char* who) {
  auto u = acc.u;
  auto v = acc.v;
  for (auto* a : {&u, &v})
    for (auto& l : *a) {
      if (r.get<std::uint64_t>() != l.size()) throw layout_error(std::string(who) + ": another accumulator");
      r.get_array<float>(l);
    }
  return {std::move(u), std::move(v)};
}

/// The trainer an LGC bucket restores: from `weights` (a network like
/// `shape`) when this rank `trains`, none otherwise; layout_error naming
/// `who` when the saved state has trainer weights exactly where it should not.
inline std::optional<lgc_trainer> restore_lgc_trainer(const lgc_network& shape, std::span<const std::byte> weights,
                                                      bool trains, const lgc_options& opt, const char* who) {
  if (trains != !weights.empty()) throw layout_error(std::string(who) + ": trainer weights where none belong");
  std::optional<lgc_trainer> trainer;
  if (trains) {
    lgc_network t(shape);
    t.load(weights);
    trainer.emplace(std::move(t), opt.optimizer, opt.learning_rate);
  }
  return trainer;
}

}  // namespace detail

/// The LGC ring form as a bucket codec (see the file comment). One per rank.
template <ExecutionPolicy Policy = execution::seq>
class lgc_ring_bucket final : public bucket_codec {
 public:
  using bucket_codec::absorb;
  using bucket_codec::contribute;

  lgc_ring_bucket(const plan& p, const bucket_desc& b, int rank, int ranks)
      : group_(p, b),
        opt_(group_.options),
        layout_(group_.sizes, opt_),
        rank_(rank),
        ranks_(ranks),
        net_(std::make_shared<lgc_network>(lgc_form::ring, 1, opt_.window, opt_.architecture, opt_.seed)) {
    if (ranks < 1 || rank < 0 || rank >= ranks) throw invalid_argument_error("lgc_ring_bucket: rank outside [0, ranks)");
    if (opt_.trainer_rank < 0 || opt_.trainer_rank >= ranks)
      throw invalid_argument_error("lgc_ring_bucket: trainer rank outside [0, ranks)");
    for (auto i : b.layers) lengths_.push_back(p.model()[i].shape.size());
    acc_.reset(layout_, opt_.momentum);
    if (rank_ == opt_.trainer_rank) trainer_.emplace(*net_, opt_.optimizer, opt_.learning_rate);
    codec_.emplace(net_, layout_.mu);
    bytes_.assign(lengths_.size(), 0);
  }

  /// LGC's layer layout (roles, top-k counts, mu) of the bucket.
  const lgc_layout& layout() const noexcept { return layout_; }
  /// plan_options::lgc with the first/last flags of the grouping.
  const lgc_options& options() const noexcept { return opt_; }
  /// Which bucket layer went where.
  const lgc_bucket_grouping& grouping() const noexcept { return group_; }
  /// Completed steps; the phase of the next one.
  std::uint64_t steps() const noexcept { return step_; }
  lgc_phase next_phase() const noexcept { return opt_.schedule.phase(step_); }
  /// The leader of step `step` (the same draw as lgc_ring_node::leader).
  int leader(std::uint64_t step) const noexcept {
    return static_cast<int>(gradcomp::detail::counter_rng(opt_.seed ^ 0x4C47435249ull).stream(step).below(0, std::uint64_t(ranks_)));
  }
  /// The weights in use for coding (the trained ones from the first compressed step on).
  const lgc_network& network() const noexcept { return *net_; }
  std::uint64_t training_steps() const noexcept { return training_steps_; }
  std::uint64_t rejected_training_steps() const noexcept { return rejected_; }
  float last_training_loss() const noexcept { return last_loss_; }
  /// Weight broadcasts so far (the first compressed step's and the retrained ones).
  std::uint64_t weight_broadcasts() const noexcept { return broadcasts_; }
  /// Compressed steps on which this rank fed its reconstruction error back
  /// (lgc_options::feedback_reconstruction_error, gated by feedback_max_error).
  std::uint64_t feedback_steps() const noexcept { return feedback_steps_; }
  /// This rank's relative reconstruction error of its own top-k vector at the
  /// last compressed step with feedback on (||x - D(E(x))||^2 / ||x||^2).
  float last_relative_error() const noexcept { return last_rel_error_; }
  /// Payload bytes of the last step as lgc_ring_node counts them (the paper's
  /// CR: every payload this rank produced, once; wire_bytes stays 0: the
  /// exchange's statistics have the wire).
  const lgc_traffic& last_traffic() const noexcept { return traffic_; }
  /// The unsent accumulation of LGC layer l (empty for the dense layer).
  std::span<const float> residual(std::size_t l) const { return acc_.v.at(l); }

  void begin(const step_context& ctx) override {
    if (ctx.ranks != ranks_ || ctx.rank != rank_) throw state_error("lgc_ring_bucket: another rank or world size");
    phase_ = opt_.schedule.phase(step_);
    first_compressed_ = phase_ == lgc_phase::compressed && step_ == opt_.schedule.first_compressed();
    weights_step_ = first_compressed_ || (phase_ == lgc_phase::compressed && opt_.retrain_period > 0 &&
                                          (step_ - opt_.schedule.first_compressed()) % opt_.retrain_period == 0);
    undo_u_.clear();
    undo_v_.clear();
    index_bytes_.clear();
    weights_bytes_.clear();
    gathered_mid_.clear();
    pending_net_.reset();
    pending_codec_.reset();
    traffic_ = {};
    traffic_.original_bytes = 4 * layout_.total;
    std::fill(bytes_.begin(), bytes_.end(), 0);
  }

  void prepare(const step_context&, std::span<const std::span<const float>> in) override {
    undo_u_ = acc_.u;
    undo_v_ = acc_.v;
    dense_in_.clear();
    for (auto j : group_.dense) dense_in_.insert(dense_in_.end(), in[j].begin(), in[j].end());
    buffer_.clear();
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      const std::span<const float> g = lgc_input(in, l);
      if (phase_ == lgc_phase::full || layout_.roles[l] == lgc_layer_role::dense)
        acc_.dense(l, g, buffer_);
      else
        acc_.accumulate(l, g);
    }
    dense_n_ = buffer_.size();
    if (phase_ == lgc_phase::full) {
      traffic_.payload_bytes += gradcomp::detail::lgc_dense_bytes(buffer_.size());
      return;
    }
    if (leader(step_) == rank_) {
      index_set_ = select_indices();
      index_bytes_ = wire::serialize(index_set_);
      traffic_.payload_bytes += index_bytes_.size();
    }
    if (weights_step_ && trainer_) {
      weights_bytes_ = trainer_->network().save();
      traffic_.payload_bytes += weights_bytes_.size();
    }
  }

  std::size_t rounds() const override {
    return phase_ == lgc_phase::full ? 1 : phase_ == lgc_phase::topk_training ? 3 : 2;
  }
  round_spec round(std::size_t r) const override {
    if (r + 1 < rounds())  // phases 2-3: the all-gathers before the sum round
      return {round_op::all_gather, buffer_element::float32, 0, after_reduce_check::none};
    const std::size_t coded = phase_ == lgc_phase::compressed ? codec_->code_length() : layout_.mu;
    const std::size_t n = phase_ == lgc_phase::full ? layout_.total : layout_.dense_values + layout_.topk_values + coded;
    return {round_op::sum, buffer_element::float32, n, after_reduce_check::finite};
  }

  std::vector<std::byte> contribute(std::size_t r) override {
    if (r == 0) {
      std::vector<std::byte> out = detail::pack_blobs({index_bytes_, weights_bytes_});
      attribute(index_bytes_.size() + weights_bytes_.size());
      return out;
    }
    auto bytes = wire::serialize(dense_payload{mid_});  // phase 2: the trainer's minibatch (eq. 11)
    attribute_values(bytes.size());
    return bytes;
  }

  void contribute(std::size_t, std::span<float> buffer) override {
    std::copy(buffer_.begin(), buffer_.end(), buffer.begin());
    std::size_t at = buffer_.size();
    if (phase_ == lgc_phase::full) {
      for (std::size_t j = 0; j < lengths_.size(); ++j) bytes_[j] += 4 * lengths_[j];
      return;
    }
    std::copy(last_vals_.begin(), last_vals_.end(), buffer.begin() + std::ptrdiff_t(at));
    at += last_vals_.size();
    const std::vector<float>& part = phase_ == lgc_phase::compressed ? code_.codes : mid_;
    std::copy(part.begin(), part.end(), buffer.begin() + std::ptrdiff_t(at));
    for (auto j : group_.dense) bytes_[j] += 4 * lengths_[j];
    if (group_.last >= 0) bytes_[std::size_t(group_.last)] += 4 * last_vals_.size();
    attribute_values(4 * part.size());
  }

  void absorb(std::size_t r, std::span<const std::vector<std::byte>> gathered) override {
    if (r == 0) {
      absorb_index_set(gathered);
      return;
    }
    gathered_mid_.assign(gathered.size(), {});  // phase 2, round 1: every rank's top-k values
    for (std::size_t k = 0; k < gathered.size(); ++k) {
      wire::parse_limits lim;
      lim.max_element_count = layout_.mu;
      auto p = wire::parse<dense_payload>(gathered[k], lim);
      if (p.values.size() != layout_.mu)
        throw size_mismatch_error("lgc_ring_bucket: training vector of rank " + std::to_string(k), layout_.mu,
                                  p.values.size());
      gathered_mid_[k] = std::move(p.values);
    }
  }

  void absorb(std::size_t, std::span<const float> reduced) override { reduced_ = reduced; }

  /// Writes the SUM over ranks into the bucket's layers and commits the step
  /// (the trainer's step in phase 2, the trained weights at the first compressed step).
  void finish(std::span<const std::span<float>> out) override {
    std::size_t at = 0;
    for (auto j : group_.dense) {  // the dense layer (every layer in phase 1)
      std::copy(reduced_.begin() + std::ptrdiff_t(at), reduced_.begin() + std::ptrdiff_t(at + lengths_[j]), out[j].begin());
      at += lengths_[j];
    }
    if (phase_ == lgc_phase::full) {
      for (std::size_t l = group_.dense.empty() ? 0 : 1; l < layout_.sizes.size(); ++l) {
        const auto& s = out[lgc_position(l)];
        std::copy(reduced_.begin() + std::ptrdiff_t(at), reduced_.begin() + std::ptrdiff_t(at + s.size()), s.begin());
        at += s.size();
      }
    } else {
      std::span<const float> values = reduced_.subspan(at + last_vals_.size());
      if (phase_ == lgc_phase::compressed) {  // eq. 19 on the average code, times N for the sum
        avg_.assign(values.begin(), values.end());
        for (float& c : avg_) c /= float(ranks_);
        decoded_.resize(layout_.mu);
        const auto& codec = pending_codec_ ? *pending_codec_ : *codec_;
        codec.decode(std::span<const float>(avg_), std::span<const float>(index_set_.scales), decoded_, decode_ws_);
        if (opt_.feedback_aggregate_error) aggregate_feedback();
        for (float& v : decoded_) v *= float(ranks_);
        values = decoded_;
      }
      std::size_t lv = at, v = 0;
      for (std::size_t l = 0, j = 0; l < layout_.sizes.size(); ++l) {
        if (layout_.roles[l] == lgc_layer_role::dense) continue;
        const auto& idx = index_set_.indices[j++];
        const auto& s = out[lgc_position(l)];
        std::fill(s.begin(), s.end(), 0.0f);
        if (layout_.roles[l] == lgc_layer_role::topk)
          for (std::uint32_t i : idx) s[i] = reduced_[lv++];
        else
          for (std::uint32_t i : idx) s[i] = values[v++];
      }
    }
    const bool retrain = phase_ == lgc_phase::compressed && opt_.retrain_period > 0;  // on its own vector
    if (trainer_ && (phase_ == lgc_phase::topk_training || retrain)) {
      std::vector<std::span<const float>> views(gathered_mid_.begin(), gathered_mid_.end());
      if (retrain) views.assign(1, std::span<const float>(mid_));
      try {
        last_loss_ = trainer_->step_ring(views, std::span<const float>(index_set_.scales));
        ++training_steps_;
      } catch (const non_finite_error&) {
        ++rejected_;  // rolled back by the trainer: the weights stay finite
      }
    }
    if (weights_step_) {
      net_ = std::move(pending_net_);
      codec_ = std::move(pending_codec_);
      ++broadcasts_;
      if (opt_.retrain_period == 0) trainer_.reset();
    }
    pending_net_.reset();
    pending_codec_.reset();
    undo_u_.clear();
    undo_v_.clear();
    ++step_;
  }

  void abandon() override {
    if (!undo_u_.empty() || !undo_v_.empty()) {
      acc_.u = std::move(undo_u_);
      acc_.v = std::move(undo_v_);
    }
    undo_u_.clear();
    undo_v_.clear();
    pending_net_.reset();
    pending_codec_.reset();
  }

  std::uint64_t digest() const override {
    return (step_ + 1) * 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(opt_.schedule.phase(step_));
  }

  /// The exact state: step and training counters, the accumulator, the
  /// weights in use and (on the trainer, until the weights are distributed)
  /// the trainer's weights. With lgc_optimizer::adam the trainer's moments are
  /// not part of it: save_state then throws state_error during phases 1-2.
  std::vector<std::byte> save_state() const override {
    if (trainer_ && opt_.optimizer != lgc_optimizer::sgd)
      throw state_error("lgc_ring_bucket::save_state: the Adam trainer's moments cannot be saved (use lgc_optimizer::sgd)");
    std::vector<std::vector<std::byte>> parts;
    parts.push_back(wire::serialize_state(wire::codec_id::autoencoder, layout_.total, [&](wire::writer& w) {
      w.put<std::uint64_t>(step_);
      w.put<std::uint64_t>(training_steps_);
      w.put<std::uint64_t>(rejected_);
      w.put<float>(last_loss_);
      detail::put_lgc_accumulator(w, acc_);
    }));
    parts.push_back(lgc_network(*net_).save());
    parts.push_back(trainer_ ? lgc_network(trainer_->network()).save() : std::vector<std::byte>{});
    return detail::pack_blobs(parts);
  }

  void restore_state(std::span<const std::byte> bytes) override {
    const auto parts = detail::unpack_blobs(bytes, 3, "lgc_ring_bucket state");
    wire::header h;
    wire::reader r = wire::parse_state(parts[0], wire::codec_id::autoencoder, &h);
    if (h.element_count != layout_.total) throw layout_error("lgc_ring_bucket state: another layout");
    const auto step = r.get<std::uint64_t>(), trained = r.get<std::uint64_t>(), rejected = r.get<std::uint64_t>();
    const float loss = r.get<float>();
    auto [u, v] = detail::get_lgc_accumulator(r, acc_, "lgc_ring_bucket state");
    r.expect_end();
    auto net = std::make_shared<lgc_network>(*net_);
    net->load(parts[1]);
    const bool trains =
        rank_ == opt_.trainer_rank && (step <= opt_.schedule.first_compressed() || opt_.retrain_period > 0);
    auto trainer = detail::restore_lgc_trainer(*net_, parts[2], trains, opt_, "lgc_ring_bucket state");
    std::optional<autoencoder_codec<Policy>> codec;
    codec.emplace(net, layout_.mu);
    acc_.u = std::move(u);
    acc_.v = std::move(v);
    net_ = std::move(net);
    codec_ = std::move(codec);
    trainer_ = std::move(trainer);
    step_ = step;
    training_steps_ = trained;
    rejected_ = rejected;
    last_loss_ = loss;
  }

  std::vector<std::size_t> layer_bytes() const override { return bytes_; }
  std::string phase() const override {
    switch (phase_) {
      case lgc_phase::full: return "lgc:full";
      case lgc_phase::topk_training: return "lgc:topk-training";
      case lgc_phase::compressed: return "lgc:compressed";
    }
    return "lgc";
  }

 private:
  /// The bucket position of LGC layer l (not the dense layer).
  std::size_t lgc_position(std::size_t l) const {
    const std::size_t first = group_.dense.empty() ? 0 : 1;
    if (l - first < group_.coded.size()) return group_.coded[l - first];
    return static_cast<std::size_t>(group_.last);
  }
  std::span<const float> lgc_input(std::span<const std::span<const float>> in, std::size_t l) const {
    if (!group_.dense.empty() && l == 0) return dense_in_;
    return in[lgc_position(l)];
  }

  /// Bytes of the leader's index set and the weights on the first non-dense layer.
  void attribute(std::size_t n) {
    const std::size_t first = group_.dense.empty() ? 0 : 1;
    if (first < layout_.sizes.size()) bytes_[lgc_position(first)] += n;
  }
  /// The autoencoder part's bytes over its layers, in proportion to their k.
  void attribute_values(std::size_t n) {
    std::size_t given = 0, last = 0;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l)
      if (layout_.roles[l] == lgc_layer_role::autoencoder) {
        const std::size_t share = n * layout_.k[l] / layout_.mu;
        bytes_[last = lgc_position(l)] += share;
        given += share;
      }
    bytes_[last] += n - given;
  }

  /// lgc_options::feedback_aggregate_error: v_k += x_k - D(average code) at
  /// the index set (decoded_ holds D(average code)), when the relative error
  /// ||x_k - D||^2 / ||x_k||^2 is at most feedback_max_error.
  void aggregate_feedback() { feed_back(decoded_); }

  /// v_k += mid_ - reconstruction at the autoencoder layers' index sets,
  /// when ||mid_ - reconstruction||^2 / ||mid_||^2 <= feedback_max_error
  /// (the autoencoder tracks its inputs); records that relative error.
  void feed_back(const std::vector<float>& reconstruction) {
    double err = 0.0, norm = 0.0;
    for (std::size_t e = 0; e < mid_.size(); ++e) {
      const double d = double(mid_[e]) - double(reconstruction[e]);
      err += d * d;
      norm += double(mid_[e]) * double(mid_[e]);
    }
    last_rel_error_ = norm > 0.0 ? float(err / norm) : 0.0f;
    if (!(last_rel_error_ <= opt_.feedback_max_error)) return;  // not tracking its inputs (yet)
    ++feedback_steps_;
    std::size_t at = 0;
    for (std::size_t l = 0, j = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense) continue;
      const auto& idx = index_set_.indices[j++];
      if (layout_.roles[l] != lgc_layer_role::autoencoder) continue;
      for (std::uint32_t i : idx) {
        acc_.v[l][i] += mid_[at] - reconstruction[at];
        ++at;
      }
    }
  }

  lgc_index_payload select_indices() {
    lgc_index_payload p;
    std::vector<float> mid_vals;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense) continue;
      p.layer_lengths.push_back(layout_.sizes[l]);
      std::vector<std::uint32_t> idx;
      topk_exact(Policy{}, std::span<const float>(acc_.v[l]), layout_.k[l], idx, ws_);
      if (layout_.roles[l] == lgc_layer_role::autoencoder)
        for (std::uint32_t i : idx) mid_vals.push_back(acc_.v[l][i]);
      p.indices.push_back(std::move(idx));
    }
    gradcomp::detail::lgc_window_scales<float>(mid_vals, opt_.window, p.scales);
    p.pack(opt_.deflate_level);
    return p;
  }

  // Round 0 of phases 2-3: the leader's index set (and the trainer's weights
  // at the first compressed step); then every rank takes its values there.
  void absorb_index_set(std::span<const std::vector<std::byte>> gathered) {
    const int lead = leader(step_);
    const auto from_leader = detail::unpack_blobs(gathered[std::size_t(lead)], 2, "lgc_ring_bucket round 0");
    if (lead != rank_) {
      index_set_ = wire::parse<lgc_index_payload>(from_leader[0]);
      check_index_set(index_set_);
    }
    if (weights_step_) {
      const auto from_trainer = detail::unpack_blobs(gathered[std::size_t(opt_.trainer_rank)], 2, "lgc_ring_bucket round 0");
      auto fresh = std::make_shared<lgc_network>(trainer_ ? trainer_->network() : *net_);
      if (!trainer_) fresh->load(from_trainer[1]);
      pending_net_ = fresh;
      pending_codec_.emplace(pending_net_, layout_.mu);
    }
    mid_.clear();
    last_vals_.clear();
    for (std::size_t l = 0, j = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense) continue;
      acc_.take(l, index_set_.indices[j++], layout_.roles[l] == lgc_layer_role::topk ? last_vals_ : mid_);
    }
    if (phase_ == lgc_phase::topk_training) {
      traffic_.payload_bytes += gradcomp::detail::lgc_dense_bytes(dense_n_) + gradcomp::detail::lgc_dense_bytes(last_vals_.size()) +
                                gradcomp::detail::lgc_dense_bytes(mid_.size());
      return;
    }
    auto& codec = pending_codec_ ? *pending_codec_ : *codec_;
    codec.encode(mid_, std::span<const float>(index_set_.scales), code_, false);
    traffic_.payload_bytes += gradcomp::detail::lgc_dense_bytes(dense_n_) + gradcomp::detail::lgc_dense_bytes(last_vals_.size()) +
                              wire::serialized_size(code_);
    if (opt_.feedback_reconstruction_error) {  // beyond the paper (lgc_options): v += mid - decode(own code)
      own_.resize(layout_.mu);
      codec.decode(std::span<const float>(code_.codes), std::span<const float>(index_set_.scales), own_, decode_ws_);
      feed_back(own_);
    }
  }

  void check_index_set(const lgc_index_payload& p) const {
    std::size_t j = 0;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense) continue;
      if (j >= p.layer_lengths.size() || p.layer_lengths[j] != layout_.sizes[l] || p.indices[j].size() != layout_.k[l])
        throw size_mismatch_error("lgc_ring_bucket: index set of layer " + std::to_string(l), layout_.k[l],
                                  j < p.indices.size() ? p.indices[j].size() : 0);
      ++j;
    }
    if (j != p.layer_lengths.size()) throw size_mismatch_error("lgc_ring_bucket: index set layers", j, p.layer_lengths.size());
    if (p.scales.size() != layout_.windows(opt_.window))
      throw size_mismatch_error("lgc_ring_bucket: index set scales", layout_.windows(opt_.window), p.scales.size());
  }

  lgc_bucket_grouping group_;
  lgc_options opt_;
  lgc_layout layout_;
  int rank_, ranks_;
  std::vector<std::size_t> lengths_;
  std::shared_ptr<const lgc_network> net_, pending_net_;
  std::optional<autoencoder_codec<Policy>> codec_, pending_codec_;
  typename autoencoder_codec<Policy>::workspace decode_ws_;
  std::optional<lgc_trainer> trainer_;
  gradcomp::detail::lgc_accumulator<Policy> acc_;
  std::vector<std::vector<float>> undo_u_, undo_v_;
  execution::topk_workspace ws_;
  std::uint64_t step_ = 0, training_steps_ = 0, rejected_ = 0, broadcasts_ = 0, feedback_steps_ = 0;
  float last_loss_ = 0.0f, last_rel_error_ = 0.0f;
  lgc_phase phase_ = lgc_phase::full;
  bool first_compressed_ = false, weights_step_ = false;
  std::size_t dense_n_ = 0;
  lgc_traffic traffic_;
  lgc_index_payload index_set_;
  lgc_code_payload code_;
  std::vector<std::byte> index_bytes_, weights_bytes_;
  std::vector<std::vector<float>> gathered_mid_;
  std::vector<float> dense_in_, buffer_, mid_, last_vals_, avg_, decoded_, own_;
  std::span<const float> reduced_;
  std::vector<std::size_t> bytes_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange

// The parameter-server form and lgc_bucket_factory (which makes either form).
#include <gradcomp/exchange/lgc_ps_bucket.hpp>
