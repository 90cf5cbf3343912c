#pragma once
/// \file exchange/lgc_ps_bucket.hpp
/// LGC's parameter-server form (seed 004, Section IV-A, Algorithm 1;
/// protocols/lgc_ps.hpp) as a bucket codec: every rank is a worker and every
/// rank runs the server's aggregation on the all-gathered payloads (the same
/// bits everywhere), so no rank is set apart as the server.
///
///  - phase 1 (full, eq. 14): one sum round of every layer's contribution.
///  - phase 2 (eq. 15): one sum round of the dense layer, one all-gather of
///    every rank's own top-k (the top-k-only layer and the autoencoder layers
///    as sparse COO); the trainer rank trains the encoder and the K decoders
///    on them (eq. 7).
///  - phase 3 (eqs. 12-13): at the first compressed step an all-gather of the
///    trained network (the trainer's; every rank decodes, so every rank needs
///    the decoders), one sum round of the dense layer, one all-gather of the
///    top-k-only values and the innovations (with the common worker's index
///    set and code); every rank reconstructs D_c^k(code, innovation_k) for
///    every k and sums.
/// Included by exchange/lgc_bucket.hpp (whose factory makes it for codec_kind::lgc_ps).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/exchange/lgc_bucket.hpp>
#include <gradcomp/payloads/sparse_coo.hpp>

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The LGC parameter-server form as a bucket codec (see the file comment).
template <ExecutionPolicy Policy = execution::seq>
class lgc_ps_bucket final : public bucket_codec {
 public:
  using bucket_codec::absorb;
  using bucket_codec::contribute;

  lgc_ps_bucket(const plan& p, const bucket_desc& b, int rank, int ranks)
      : group_(p, b), opt_(group_.options), layout_(group_.sizes, opt_), rank_(rank), ranks_(ranks),
        net_(std::make_shared<lgc_network>(lgc_form::parameter_server, std::size_t(ranks), opt_.window,
                                           opt_.architecture, opt_.seed)) {
    if (ranks < 1 || rank < 0 || rank >= ranks) throw invalid_argument_error("lgc_ps_bucket: rank outside [0, ranks)");
    if (opt_.trainer_rank < 0 || opt_.trainer_rank >= ranks || opt_.common_worker < 0 || opt_.common_worker >= ranks)
      throw invalid_argument_error("lgc_ps_bucket: trainer rank or common worker outside [0, ranks)");
    for (auto i : b.layers) lengths_.push_back(p.model()[i].shape.size());
    acc_.reset(layout_, opt_.momentum);
    if (rank_ == opt_.trainer_rank) trainer_.emplace(*net_, opt_.optimizer, opt_.learning_rate);
    bytes_.assign(lengths_.size(), 0);
  }

  /// LGC's layer layout of the bucket.
  const lgc_layout& layout() const noexcept { return layout_; }
  /// plan_options::lgc with the first/last flags of the grouping.
  const lgc_options& options() const noexcept { return opt_; }
  /// Completed steps; the phase of the next one.
  std::uint64_t steps() const noexcept { return step_; }
  lgc_phase next_phase() const noexcept { return opt_.schedule.phase(step_); }
  std::uint64_t training_steps() const noexcept { return training_steps_; }
  std::uint64_t rejected_training_steps() const noexcept { return rejected_; }
  float last_training_loss() const noexcept { return last_loss_; }
  /// Payload bytes of the last step, the paper's CR as lgc_ring_bucket counts
  /// them: every payload this rank produced, once (the dense sum's float32
  /// body with a header, the top-k-only COO, the own top-k or innovation COO,
  /// the common worker's index set and code, the trainer's weights).
  const lgc_traffic& last_traffic() const noexcept { return traffic_; }
  /// The worker whose code feeds every decoder in training step `step` (as lgc_ps_server).
  std::size_t training_common(std::uint64_t step) const noexcept {
    return std::size_t(gradcomp::detail::counter_rng(opt_.seed ^ 0x4C47435053ull).stream(step).below(0, std::uint64_t(ranks_)));
  }

  void begin(const step_context&) override {
    phase_ = opt_.schedule.phase(step_);
    first_compressed_ = phase_ == lgc_phase::compressed && step_ == opt_.schedule.first_compressed();
    specs_.clear();
    if (first_compressed_) specs_.push_back({round_op::all_gather, buffer_element::float32, 0, after_reduce_check::none});
    const std::size_t dense = phase_ == lgc_phase::full ? layout_.total : layout_.dense_values;
    if (dense) specs_.push_back({round_op::sum, buffer_element::float32, dense, after_reduce_check::finite});
    if (phase_ != lgc_phase::full) specs_.push_back({round_op::all_gather, buffer_element::float32, 0, after_reduce_check::none});
    undo_u_.clear();
    undo_v_.clear();
    pending_net_.reset();
    dense_sum_ = {};
    gathered_ = {};
    std::fill(bytes_.begin(), bytes_.end(), 0);
    traffic_ = {};
    traffic_.original_bytes = 4 * layout_.total;
  }

  void prepare(const step_context&, std::span<const std::span<const float>> in) override {
    undo_u_ = acc_.u;
    undo_v_ = acc_.v;
    dense_in_.clear();
    for (auto j : group_.dense) dense_in_.insert(dense_in_.end(), in[j].begin(), in[j].end());
    dense_.clear();
    sparse_ = {};
    last_ = {};
    sparse_.length = layout_.space;
    own_.clear();
    mid_.clear();
    std::vector<std::uint32_t> idx;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      const std::span<const float> g = !group_.dense.empty() && l == 0 ? std::span<const float>(dense_in_) : in[position(l)];
      if (phase_ == lgc_phase::full || layout_.roles[l] == lgc_layer_role::dense) {
        acc_.dense(l, g, dense_);
        continue;
      }
      acc_.accumulate(l, g);
      topk_exact(Policy{}, std::span<const float>(acc_.v[l]), layout_.k[l], idx, ws_);  // this worker's own top-k
      if (layout_.roles[l] == lgc_layer_role::topk) {
        last_.length = layout_.sizes[l];
        last_.indices = idx;
        acc_.take(l, idx, last_.values);
      } else {
        for (std::uint32_t i : idx) sparse_.indices.push_back(static_cast<std::uint32_t>(layout_.space_offset[l] + i));
        acc_.take(l, idx, mid_);
        own_.push_back(idx);
      }
    }
    sparse_.values = mid_;
    traffic_.payload_bytes += gradcomp::detail::lgc_dense_bytes(dense_.size());
    if (phase_ == lgc_phase::compressed) {  // Alg. 1: the innovation of each autoencoder layer
      sparse_coo_payload inn;
      inn.length = layout_.space;
      gradcomp::detail::lgc_innovation(Policy{}, layout_, opt_.innovation_percent, sparse_.indices, mid_, inn.indices,
                                       inn.values, ws_);
      innovation_ = std::move(inn);
    }
  }

  std::size_t rounds() const override { return specs_.size(); }
  round_spec round(std::size_t r) const override { return specs_.at(r); }

  void contribute(std::size_t, std::span<float> buffer) override {
    std::copy(dense_.begin(), dense_.end(), buffer.begin());
    if (phase_ == lgc_phase::full)
      for (std::size_t j = 0; j < lengths_.size(); ++j) bytes_[j] += 4 * lengths_[j];
    else
      for (auto j : group_.dense) bytes_[j] += 4 * lengths_[j];
  }

  std::vector<std::byte> contribute(std::size_t r) override {
    if (first_compressed_ && r == 0) {
      auto weights = trainer_ ? lgc_network(trainer_->network()).save() : std::vector<std::byte>{};
      traffic_.payload_bytes += weights.size();
      return weights;
    }
    std::vector<std::vector<std::byte>> parts(4);
    if (layout_.topk_values) parts[0] = wire::serialize(last_);
    parts[1] = wire::serialize(phase_ == lgc_phase::compressed ? innovation_ : sparse_);
    if (phase_ == lgc_phase::compressed && rank_ == opt_.common_worker) {
      lgc_index_payload index_set;  // the common worker's own top-k, and its code (eq. 3)
      for (std::size_t l = 0, j = 0; l < layout_.sizes.size(); ++l)
        if (layout_.roles[l] == lgc_layer_role::autoencoder) {
          index_set.layer_lengths.push_back(layout_.sizes[l]);
          index_set.indices.push_back(own_[j++]);
        }
      index_set.pack(opt_.deflate_level);
      parts[2] = wire::serialize(index_set);
      autoencoder_codec<Policy> codec(pending_net_ ? pending_net_ : net_, layout_.mu);
      lgc_code_payload code;
      codec.encode(mid_, code);
      parts[3] = wire::serialize(code);
    }
    for (const auto& part : parts) traffic_.payload_bytes += part.size();
    if (group_.last >= 0) bytes_[std::size_t(group_.last)] += parts[0].size();
    const std::size_t first = group_.dense.empty() ? 0 : 1;
    if (first < layout_.sizes.size()) bytes_[position(first)] += parts[1].size() + parts[2].size() + parts[3].size();
    return gradcomp::exchange::detail::pack_blobs(parts);
  }

  void absorb(std::size_t, std::span<const float> reduced) override { dense_sum_ = reduced; }
  void absorb(std::size_t r, std::span<const std::vector<std::byte>> gathered) override {
    if (first_compressed_ && r == 0) {
      auto fresh = std::make_shared<lgc_network>(trainer_ ? trainer_->network() : *net_);
      if (!trainer_) fresh->load(gathered[std::size_t(opt_.trainer_rank)]);
      pending_net_ = std::move(fresh);
      return;
    }
    gathered_ = gathered;
  }

  /// The server's aggregation (lgc_ps_server::step) on every rank: the SUM of the workers' contributions.
  void finish(std::span<const std::span<float>> out) override {
    aggregate_.assign(layout_.total, 0.0f);
    std::copy(dense_sum_.begin(), dense_sum_.end(), aggregate_.begin());  // LGC's dense layer comes first
    if (phase_ != lgc_phase::full) {
      std::vector<sparse_coo_payload> sparse(static_cast<std::size_t>(ranks_));
      std::vector<std::vector<std::span<const std::byte>>> parts;
      for (int k = 0; k < ranks_; ++k) {
        parts.push_back(gradcomp::exchange::detail::unpack_blobs(gathered_[std::size_t(k)], 4, "lgc_ps_bucket payload"));
        if (layout_.topk_values) {
          const auto p = wire::parse<sparse_coo_payload>(parts.back()[0]);
          const std::size_t l = layout_.sizes.size() - 1, off = layout_.total - layout_.sizes[l];
          if (p.length != layout_.sizes[l] || p.indices.size() > layout_.k[l])
            throw size_mismatch_error("lgc_ps_bucket: top-k layer", layout_.k[l], p.indices.size());
          for (std::size_t j = 0; j < p.indices.size(); ++j) aggregate_[off + p.indices[j]] += p.values[j];
        }
        sparse[std::size_t(k)] = wire::parse<sparse_coo_payload>(parts.back()[1]);
        if (sparse[std::size_t(k)].length != layout_.space)
          throw size_mismatch_error("lgc_ps_bucket: sparse payload", layout_.space, std::size_t(sparse[std::size_t(k)].length));
      }
      if (phase_ == lgc_phase::topk_training) {
        for (const auto& p : sparse)
          for (std::size_t j = 0; j < p.indices.size(); ++j) aggregate_[space_to_total(p.indices[j])] += p.values[j];
        if (trainer_) train(sparse);
      } else {
        reconstruct(parts[std::size_t(opt_.common_worker)], sparse);
      }
    }
    std::size_t at = 0;
    for (auto j : group_.dense) {
      std::copy_n(aggregate_.begin() + std::ptrdiff_t(at), lengths_[j], out[j].begin());
      at += lengths_[j];
    }
    for (std::size_t l = group_.dense.empty() ? 0 : 1; l < layout_.sizes.size(); ++l) {
      std::copy_n(aggregate_.begin() + std::ptrdiff_t(at), layout_.sizes[l], out[position(l)].begin());
      at += layout_.sizes[l];
    }
    if (first_compressed_) {
      net_ = std::move(pending_net_);
      trainer_.reset();
    }
    pending_net_.reset();
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
  }

  std::uint64_t digest() const override { return (step_ + 3) * 0xD6E8FEB86659FD93ull; }

  /// Step and training counters, the accumulator, the network in use and the
  /// trainer's (sgd only, as lgc_ring_bucket).
  std::vector<std::byte> save_state() const override {
    if (trainer_ && opt_.optimizer != lgc_optimizer::sgd)
      throw state_error("lgc_ps_bucket::save_state: the Adam trainer's moments cannot be saved (use lgc_optimizer::sgd)");
    std::vector<std::vector<std::byte>> parts;
    parts.push_back(wire::serialize_state(wire::codec_id::autoencoder, layout_.total, [&](wire::writer& w) {
      w.put<std::uint64_t>(step_);
      w.put<std::uint64_t>(training_steps_);
      w.put<float>(last_loss_);
      gradcomp::exchange::detail::put_lgc_accumulator(w, acc_);
    }));
    parts.push_back(lgc_network(*net_).save());
    parts.push_back(trainer_ ? lgc_network(trainer_->network()).save() : std::vector<std::byte>{});
    return gradcomp::exchange::detail::pack_blobs(parts);
  }

  void restore_state(std::span<const std::byte> bytes) override {
    const auto parts = gradcomp::exchange::detail::unpack_blobs(bytes, 3, "lgc_ps_bucket state");
    wire::header h;
    wire::reader r = wire::parse_state(parts[0], wire::codec_id::autoencoder, &h);
    if (h.element_count != layout_.total) throw layout_error("lgc_ps_bucket state: another layout");
    const auto step = r.get<std::uint64_t>(), trained = r.get<std::uint64_t>();
    const float loss = r.get<float>();
    auto [u, v] = gradcomp::exchange::detail::get_lgc_accumulator(r, acc_, "lgc_ps_bucket state");
    r.expect_end();
    auto net = std::make_shared<lgc_network>(*net_);
    net->load(parts[1]);
    const bool trains = rank_ == opt_.trainer_rank && step <= opt_.schedule.first_compressed();
    auto trainer = gradcomp::exchange::detail::restore_lgc_trainer(*net_, parts[2], trains, opt_, "lgc_ps_bucket state");
    acc_.u = std::move(u);
    acc_.v = std::move(v);
    net_ = std::move(net);
    trainer_ = std::move(trainer);
    step_ = step;
    training_steps_ = trained;
    last_loss_ = loss;
  }

  std::vector<std::size_t> layer_bytes() const override { return bytes_; }
  std::string phase() const override {
    return phase_ == lgc_phase::full ? "lgc_ps:full" : phase_ == lgc_phase::topk_training ? "lgc_ps:topk-training"
                                                                                         : "lgc_ps:compressed";
  }

 private:
  std::size_t position(std::size_t l) const {
    const std::size_t first = group_.dense.empty() ? 0 : 1;
    if (l - first < group_.coded.size()) return group_.coded[l - first];
    return static_cast<std::size_t>(group_.last);
  }
  std::size_t space_to_total(std::uint32_t pos) const {
    std::size_t off = 0;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::autoencoder && pos >= layout_.space_offset[l] &&
          pos < layout_.space_offset[l] + layout_.sizes[l])
        return off + (pos - layout_.space_offset[l]);
      off += layout_.sizes[l];
    }
    throw size_mismatch_error("lgc_ps_bucket: position outside the autoencoder layers", layout_.space, pos);
  }

  void train(const std::vector<sparse_coo_payload>& sparse) {  // lgc_ps_server's training step (eq. 7)
    for (const auto& p : sparse)
      if (p.indices.size() != layout_.mu) throw size_mismatch_error("lgc_ps_bucket: top-k count", layout_.mu, p.indices.size());
    const std::size_t r = training_common(step_);
    const auto& slots = sparse[r].indices;
    std::vector<float> scales;
    gradcomp::detail::lgc_window_scales<float>(sparse[r].values, opt_.window, scales);
    std::vector<std::vector<float>> x(sparse.size()), h(sparse.size());
    std::vector<std::uint32_t> ipos;
    std::vector<float> ival;
    for (std::size_t k = 0; k < sparse.size(); ++k) {
      gradcomp::detail::lgc_map_to_slots(slots, sparse[k].indices, sparse[k].values, x[k], nullptr, nullptr);
      gradcomp::detail::lgc_innovation(Policy{}, layout_, opt_.innovation_percent, sparse[k].indices, sparse[k].values,
                                       ipos, ival, ws_);
      gradcomp::detail::lgc_map_to_slots(slots, ipos, ival, h[k], nullptr, nullptr);
    }
    std::vector<std::span<const float>> xs(x.begin(), x.end()), hs(h.begin(), h.end());
    try {
      last_loss_ = trainer_->step_ps(xs, hs, r, scales, opt_.lambda1, opt_.lambda2);
      ++training_steps_;
    } catch (const non_finite_error&) {
      ++rejected_;  // rolled back by the trainer: the weights stay finite
    }
  }

  // eqs. 12-13: every worker's vector D_c^k(code, innovation_k) on the common index set, summed.
  void reconstruct(const std::vector<std::span<const std::byte>>& common, const std::vector<sparse_coo_payload>& inn) {
    const auto index_set = wire::parse<lgc_index_payload>(common[2]);
    const auto code = wire::parse<lgc_code_payload>(common[3]);
    std::vector<std::uint32_t> slots;
    for (std::size_t l = 0, j = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] != lgc_layer_role::autoencoder) continue;
      if (j >= index_set.indices.size() || index_set.layer_lengths[j] != layout_.sizes[l] ||
          index_set.indices[j].size() != layout_.k[l])
        throw size_mismatch_error("lgc_ps_bucket: common index set, layer " + std::to_string(l), layout_.k[l],
                                  j < index_set.indices.size() ? index_set.indices[j].size() : 0);
      for (std::uint32_t i : index_set.indices[j]) slots.push_back(static_cast<std::uint32_t>(layout_.space_offset[l] + i));
      ++j;
    }
    autoencoder_codec<Policy> codec(pending_net_ ? pending_net_ : net_, layout_.mu);
    std::vector<float> h, rec(layout_.mu), sum(layout_.mu, 0.0f);
    std::vector<std::uint32_t> out_pos;
    std::vector<float> out_val;
    for (int k = 0; k < ranks_; ++k) {
      out_pos.clear();
      out_val.clear();
      gradcomp::detail::lgc_map_to_slots(slots, inn[std::size_t(k)].indices, inn[std::size_t(k)].values, h, &out_pos, &out_val);
      codec.decode(code, std::size_t(k), h, rec, decode_ws_);
      add_into(Policy{}, std::span<float>(sum), std::span<const float>(rec));
      for (std::size_t e = 0; e < out_pos.size(); ++e) aggregate_[space_to_total(out_pos[e])] += out_val[e];
    }
    for (std::size_t s = 0; s < slots.size(); ++s) aggregate_[space_to_total(slots[s])] += sum[s];
  }

  lgc_bucket_grouping group_;
  lgc_options opt_;
  lgc_layout layout_;
  int rank_, ranks_;
  std::vector<std::size_t> lengths_;
  std::shared_ptr<const lgc_network> net_, pending_net_;
  typename autoencoder_codec<Policy>::workspace decode_ws_;
  std::optional<lgc_trainer> trainer_;
  gradcomp::detail::lgc_accumulator<Policy> acc_;
  std::vector<std::vector<float>> undo_u_, undo_v_;
  execution::topk_workspace ws_;
  std::uint64_t step_ = 0, training_steps_ = 0, rejected_ = 0;
  float last_loss_ = 0.0f;
  lgc_traffic traffic_;
  lgc_phase phase_ = lgc_phase::full;
  bool first_compressed_ = false;
  std::vector<round_spec> specs_;
  std::vector<float> dense_in_, dense_, mid_, aggregate_;
  std::vector<std::vector<std::uint32_t>> own_;
  sparse_coo_payload sparse_, last_, innovation_;
  std::span<const float> dense_sum_;
  std::span<const std::vector<std::byte>> gathered_;
  std::vector<std::size_t> bytes_;
};

/// The factory of plan_options::lgc_factory: makes the LGC bucket of a plan
/// (lgc_ring_bucket for codec_kind::lgc_ring, lgc_ps_bucket for codec_kind::lgc_ps).
template <ExecutionPolicy Policy = execution::seq>
custom_bucket_factory lgc_bucket_factory() {
  return [](const plan& p, const bucket_desc& b, int rank, int ranks) -> std::unique_ptr<bucket_codec> {
    if (b.kind == codec_kind::lgc_ring) return std::make_unique<lgc_ring_bucket<Policy>>(p, b, rank, ranks);
    if (b.kind == codec_kind::lgc_ps) return std::make_unique<lgc_ps_bucket<Policy>>(p, b, rank, ranks);
    throw invalid_argument_error(std::string("exchange: no LGC bucket for codec kind ") + to_string(b.kind));
  };
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
