#pragma once
/// \file protocols/lgc_ring.hpp
/// The LGC ring-all-reduce form `lgc_ring_node<Policy>` (seed 004, Section
/// IV-B, Algorithm 2): a third-layer piece, it names the LGC codec and the
/// ring all-reduce driver. Link zlib (CMake: gradcomp::lgc).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/autoencoder.hpp>
#include <gradcomp/detail/random.hpp>
#include <gradcomp/payloads/dense.hpp>
#include <gradcomp/protocols/lgc_common.hpp>
#include <gradcomp/ring_allreduce.hpp>

namespace gradcomp {

/// One node of the LGC ring-all-reduce form (Section IV-B, Algorithm 2, Fig. 9).
///
/// Every call of `step(transport, layers)` is one training iteration on every
/// rank: `layers` holds this node's gradient, one span per layer, and is
/// overwritten with the aggregated update (the average over the nodes;
/// with momentum > 0 the momentum-corrected update, to be applied with plain
/// SGD, as in DGC).
///  - full phase (eq. 14): the dense gradients (or velocities) are averaged
///    with ring_allreduce.
///  - top-k phases (eqs. 15-16): the leader of the iteration, drawn by the
///    counter-based generator from (seed, step), selects the alpha% largest
///    |v| of each sparsified layer and sends the index set (DEFLATE) to every
///    other node; every node gathers its own v at those indices and clears
///    them. The dense layer, the top-k-only layer and the autoencoder part are
///    averaged in one ring_allreduce: the autoencoder part is the top-k values
///    in the training phase (while non-trainers also send their values to the
///    trainer, which takes one training step, eq. 11), and in the compressed
///    phase the codes E(g_k / s) (eq. 17), whose average (eq. 18) every node
///    decodes once (eq. 19) and multiplies by the leader's per-window scales s.
///  - At the first compressed step the trainer sends the trained weights to
///    every other node (counted once in payload_bytes, K-1 times in wire_bytes).
/// All ranks must call step() with the same step count and layer sizes; an
/// error on one rank (bad gradient, transport failure) leaves the others to
/// fail on their transport's timeout.
template <ExecutionPolicy Policy = execution::seq>
class lgc_ring_node {
 public:
  /// Node `rank` of `size` for a model with the given layer sizes.
  lgc_ring_node(int rank, int size, std::vector<std::size_t> layer_sizes, lgc_options options = {})
      : rank_(rank), size_(size), options_(std::move(options)), layout_(std::move(layer_sizes), options_),
        net_(std::make_shared<lgc_network>(lgc_form::ring, 1, options_.window, options_.architecture, options_.seed)) {
    if (size < 1 || rank < 0 || rank >= size) throw invalid_argument_error("lgc_ring_node: rank outside [0, size)");
    if (options_.trainer_rank < 0 || options_.trainer_rank >= size)
      throw invalid_argument_error("lgc_ring_node: trainer rank outside [0, size)");
    acc_.reset(layout_, options_.momentum);
    if (rank_ == options_.trainer_rank)
      trainer_.emplace(*net_, options_.optimizer, options_.learning_rate);
  }

  const lgc_layout& layout() const noexcept { return layout_; }
  const lgc_options& options() const noexcept { return options_; }
  /// Iterations done so far; the next step() is iteration steps().
  std::uint64_t steps() const noexcept { return step_; }
  /// Phase of the next step().
  lgc_phase phase() const noexcept { return options_.schedule.phase(step_); }
  /// The leader of iteration `step` (a pure function of the seed and the step).
  [[nodiscard]] int leader(std::uint64_t step) const noexcept {
    return static_cast<int>(detail::counter_rng(options_.seed ^ 0x4C47435249ull).stream(step).below(0, std::uint64_t(size_)));
  }
  /// The weights in use (decoding); the trained ones from the first compressed step on.
  const lgc_network& network() const noexcept { return *net_; }
  /// The trainer (only on the trainer rank, until the weights are distributed).
  const lgc_trainer* trainer() const noexcept { return trainer_ ? &*trainer_ : nullptr; }
  std::uint64_t training_steps() const noexcept { return training_steps_; }
  std::uint64_t rejected_training_steps() const noexcept { return rejected_steps_; }
  float last_training_loss() const noexcept { return last_loss_; }
  /// Bytes of the last iteration and of all iterations so far.
  const lgc_traffic& last_traffic() const noexcept { return last_; }
  const lgc_traffic& total_traffic() const noexcept { return total_; }
  /// This node's own top-k vector g~_k of the last top-k iteration (the
  /// autoencoder's input before scaling) and the index set it was taken at.
  const std::vector<float>& last_values() const noexcept { return mid_; }
  const lgc_index_payload& last_index_set() const noexcept { return index_set_; }

  /// One iteration; see the class comment. Throws size_mismatch_error /
  /// non_finite_error before any state changes on a bad gradient.
  template <Transport T>
  void step(T& transport, std::span<const std::span<float>> layers) {
    detail::lgc_check_gradients<Policy>(layout_, layers, "lgc_ring_node::step");
    if (static_cast<int>(transport.size()) != size_ || static_cast<int>(transport.rank()) != rank_)
      throw invalid_argument_error("lgc_ring_node::step: transport rank/size differ from the node's");
    lgc_traffic traffic;
    traffic.original_bytes = 4 * layout_.total;
    detail::lgc_counting_transport<T> t(transport, traffic.wire_bytes);
    const lgc_phase ph = options_.schedule.phase(step_);
    const int tag = options_.tag_base;
    ring_options ro;
    ro.average = true;
    ro.tag_base = tag + 4;
    ro.tag_owner = tags::lgc;  // the ring runs inside LGC's own tag range

    if (ph == lgc_phase::full) {
      buffer_.clear();
      for (std::size_t l = 0; l < layers.size(); ++l) acc_.dense(l, layers[l], buffer_);
      traffic.payload_bytes += detail::lgc_dense_bytes(buffer_.size());
      if (size_ > 1) ring_allreduce(Policy{}, t, std::span<float>(buffer_), ro);
      std::size_t at = 0;
      for (auto& layer : layers) {
        std::copy(buffer_.begin() + std::ptrdiff_t(at), buffer_.begin() + std::ptrdiff_t(at + layer.size()), layer.begin());
        at += layer.size();
      }
      finish(traffic);
      return;
    }

    if (ph == lgc_phase::compressed && step_ == options_.schedule.first_compressed()) distribute_weights(t, traffic);

    // Accumulate, agree on the index set, gather this node's values.
    buffer_.clear();
    for (std::size_t l = 0; l < layers.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense)
        acc_.dense(l, layers[l], buffer_);
      else
        acc_.accumulate(l, layers[l]);
    }
    const int lead = leader(step_);
    if (lead == rank_) {
      index_set_ = select_indices();
      auto bytes = wire::serialize(index_set_);
      traffic.payload_bytes += bytes.size();
      for (int r = 0; r < size_; ++r)
        if (r != rank_) t.isend(r, tag, std::vector<std::byte>(bytes)).wait();
    } else {
      index_set_ = detail::lgc_receive<lgc_index_payload>(t, lead, tag);
      check_index_set(index_set_);
    }
    mid_.clear();
    std::vector<float> last_vals;
    for (std::size_t l = 0, j = 0; l < layers.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense) continue;
      acc_.take(l, index_set_.indices[j++], layout_.roles[l] == lgc_layer_role::topk ? last_vals : mid_);
    }
    const std::size_t dense_n = buffer_.size();
    buffer_.insert(buffer_.end(), last_vals.begin(), last_vals.end());
    traffic.payload_bytes += detail::lgc_dense_bytes(dense_n) + detail::lgc_dense_bytes(last_vals.size());
    const std::span<const float> scales(index_set_.scales);

    if (ph == lgc_phase::topk_training) {
      buffer_.insert(buffer_.end(), mid_.begin(), mid_.end());
      traffic.payload_bytes += detail::lgc_dense_bytes(mid_.size());
      // The trainer needs every node's vector (eq. 11).
      std::vector<std::vector<float>> gathered;
      if (rank_ == options_.trainer_rank) {
        gathered.resize(std::size_t(size_));
        gathered[std::size_t(rank_)] = mid_;
        for (int r = 0; r < size_; ++r) {
          if (r == rank_) continue;
          auto p = detail::lgc_receive<dense_payload>(t, r, tag + 2);
          if (p.values.size() != layout_.mu)
            throw size_mismatch_error("lgc_ring_node: training vector from rank " + std::to_string(r), layout_.mu,
                                      p.values.size());
          gathered[std::size_t(r)] = std::move(p.values);
        }
      } else {
        detail::lgc_send(t, options_.trainer_rank, tag + 2, dense_payload{mid_});
      }
      if (size_ > 1) ring_allreduce(Policy{}, t, std::span<float>(buffer_), ro);
      write_sparse_output(layers, std::span<const float>(buffer_).subspan(dense_n + last_vals.size()));
      if (trainer_) {
        std::vector<std::span<const float>> views(gathered.begin(), gathered.end());
        train(views, scales);
      }
    } else {
      if (!codec_) codec_.emplace(net_, layout_.mu);
      auto& codec = *codec_;
      lgc_code_payload code;
      codec.encode(mid_, scales, code, false);
      traffic.payload_bytes += wire::serialized_size(code);
      if (options_.feedback_reconstruction_error) feed_back_error(codec, code, scales);
      buffer_.insert(buffer_.end(), code.codes.begin(), code.codes.end());
      if (size_ > 1) ring_allreduce(Policy{}, t, std::span<float>(buffer_), ro);
      decoded_.resize(layout_.mu);
      codec.decode(std::span<const float>(buffer_).subspan(dense_n + last_vals.size()), scales, decoded_, decode_ws_);
      write_sparse_output(layers, decoded_);
    }
    // Dense and top-k-only layers.
    std::size_t at = 0, lv = dense_n, j = 0;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense) {
        std::copy(buffer_.begin() + std::ptrdiff_t(at), buffer_.begin() + std::ptrdiff_t(at + layers[l].size()), layers[l].begin());
        at += layers[l].size();
        continue;
      }
      const auto& idx = index_set_.indices[j++];
      if (layout_.roles[l] == lgc_layer_role::topk) {
        std::fill(layers[l].begin(), layers[l].end(), 0.0f);
        for (std::uint32_t i : idx) layers[l][i] = buffer_[lv++];
      }
    }
    finish(traffic);
  }

  /// The unsent accumulation of layer l (empty for a dense layer): what
  /// this node still owes the other nodes.
  std::span<const float> residual(std::size_t l) const {
    if (l >= acc_.v.size()) throw invalid_argument_error("lgc_ring_node: residual: no layer " + std::to_string(l));
    return acc_.v[l];
  }

 private:
  void finish(const lgc_traffic& t) {
    last_ = t;
    total_ += t;
    ++step_;
  }

  /// Error feedback of the compressed phase: v += mid - decode(own code) at
  /// the entries this node just sent through the autoencoder.
  template <class Codec>
  void feed_back_error(const Codec& codec, const lgc_code_payload& own, std::span<const float> scales) {
    own_decoded_.resize(layout_.mu);
    codec.decode(std::span<const float>(own.codes), scales, own_decoded_, decode_ws_);
    std::size_t at = 0;
    for_each_autoencoder_layer([&](std::size_t l, const std::vector<std::uint32_t>& idx) {
      auto& vl = acc_.v[l];
      for (std::uint32_t i : idx) {
        vl[i] += mid_[at] - own_decoded_[at];
        ++at;
      }
    });
  }

  /// Calls fn(l, indices) for each autoencoder layer of this iteration's
  /// index set, in the order its values take in mid_ and in the codes.
  template <class Fn>
  void for_each_autoencoder_layer(Fn&& fn) const {
    for (std::size_t l = 0, j = 0; l < layout_.roles.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense) continue;
      const auto& idx = index_set_.indices[j++];
      if (layout_.roles[l] == lgc_layer_role::autoencoder) fn(l, idx);
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
    detail::lgc_window_scales<float>(mid_vals, options_.window, p.scales);
    p.pack(options_.deflate_level);
    return p;
  }

  void check_index_set(const lgc_index_payload& p) const {
    std::size_t j = 0;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense) continue;
      if (j >= p.layer_lengths.size() || p.layer_lengths[j] != layout_.sizes[l] || p.indices[j].size() != layout_.k[l])
        throw size_mismatch_error("lgc_ring_node: index set of layer " + std::to_string(l), layout_.k[l],
                                  j < p.indices.size() ? p.indices[j].size() : 0);
      ++j;
    }
    if (j != p.layer_lengths.size()) throw size_mismatch_error("lgc_ring_node: index set layers", j, p.layer_lengths.size());
    if (p.scales.size() != layout_.windows(options_.window))
      throw size_mismatch_error("lgc_ring_node: index set scales", layout_.windows(options_.window), p.scales.size());
  }

  /// Scatters the autoencoder values (mu, in index-set order) into their layers.
  void write_sparse_output(std::span<const std::span<float>> layers, std::span<const float> values) {
    std::size_t v = 0;
    for_each_autoencoder_layer([&](std::size_t l, const std::vector<std::uint32_t>& idx) {
      std::fill(layers[l].begin(), layers[l].end(), 0.0f);
      for (std::uint32_t i : idx) layers[l][i] = values[v++];
    });
  }

  void train(std::span<const std::span<const float>> vectors, std::span<const float> scales) {
    try {
      last_loss_ = trainer_->step_ring(vectors, scales);
      ++training_steps_;
    } catch (const non_finite_error&) {
      ++rejected_steps_;  // rolled back: the weights stay finite
    }
  }

  template <class T>
  void distribute_weights(T& t, lgc_traffic& traffic) {
    const int tag = options_.tag_base + 3;
    if (rank_ == options_.trainer_rank) {
      auto bytes = trainer_->network().save();
      traffic.payload_bytes += bytes.size();
      for (int r = 0; r < size_; ++r)
        if (r != rank_) t.isend(r, tag, std::vector<std::byte>(bytes)).wait();
      auto trained = std::make_shared<lgc_network>(trainer_->network());
      net_ = std::move(trained);
      trainer_.reset();
      codec_.reset();
    } else {
      message m = t.irecv(options_.trainer_rank, tag).wait();
      auto fresh = std::make_shared<lgc_network>(*net_);
      fresh->load(m.bytes);
      net_ = std::move(fresh);
      codec_.reset();
    }
  }

  int rank_, size_;
  lgc_options options_;
  lgc_layout layout_;
  std::shared_ptr<lgc_network> net_;
  std::optional<autoencoder_codec<Policy>> codec_;  // over net_ (reset when the weights change)
  typename autoencoder_codec<Policy>::workspace decode_ws_;  // the codec's decode scratch, kept across steps
  std::optional<lgc_trainer> trainer_;
  detail::lgc_accumulator<Policy> acc_;
  execution::topk_workspace ws_;
  std::uint64_t step_ = 0, training_steps_ = 0, rejected_steps_ = 0;
  float last_loss_ = 0.0f;
  lgc_traffic last_, total_;
  std::vector<float> buffer_, mid_, decoded_, own_decoded_;
  lgc_index_payload index_set_;
};

}  // namespace gradcomp
