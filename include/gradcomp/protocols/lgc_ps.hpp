#pragma once
/// \file protocols/lgc_ps.hpp
/// The LGC parameter-server form `lgc_ps_worker<Policy>` /
/// `lgc_ps_server<Policy>` (seed 004, Section IV-A, Algorithm 1): a
/// third-layer piece. Link zlib (CMake: gradcomp::lgc).

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
#include <gradcomp/sparsify.hpp>

namespace gradcomp {

/// Tags (offsets from options.tag_base) of the parameter-server messages.
namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN
inline constexpr int lgc_ps_up_dense = 10, lgc_ps_up_last = 11, lgc_ps_up_sparse = 12, lgc_ps_up_index = 13,
                     lgc_ps_up_code = 14, lgc_ps_down = 15, lgc_ps_weights = 16;
GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

/// One worker of the LGC parameter-server form (Section IV-A, Algorithm 1,
/// Fig. 8). Workers are ranks 0..K-1, the server rank K.
///
/// Each step(transport, layers) sends this worker's contribution and
/// overwrites `layers` with the server's aggregate (sent back dense; the
/// downlink is not compressed, as in the paper):
///  - full phase: all layers dense (eq. 14);
///  - training phase: the dense layer, and the own top-k of every sparsified
///    layer as sparse COO payloads (eq. 15);
///  - compressed phase: the dense layer, the top-k-only layer as COO, and the
///    innovation (the innovation_percent largest of each layer's top-k values,
///    Alg. 1) as COO; the common worker also sends its index set (DEFLATE) and
///    the code E_c(g~_r / s) with its scales (eq. 3). Every worker clears its
///    own top-k from its accumulation (Alg. 1).
/// The common worker receives the trained encoder once, at the first
/// compressed step.
template <ExecutionPolicy Policy = execution::seq>
class lgc_ps_worker {
 public:
  lgc_ps_worker(int worker, int workers, std::vector<std::size_t> layer_sizes, lgc_options options = {})
      : worker_(worker), workers_(workers), options_(std::move(options)), layout_(std::move(layer_sizes), options_) {
    if (workers < 1 || worker < 0 || worker >= workers) throw invalid_argument_error("lgc_ps_worker: worker outside [0, K)");
    if (options_.common_worker < 0 || options_.common_worker >= workers)
      throw invalid_argument_error("lgc_ps_worker: common worker outside [0, K)");
    acc_.reset(layout_, options_.momentum);
    if (is_common())
      net_ = std::make_shared<lgc_network>(lgc_form::parameter_server, std::size_t(workers), options_.window,
                                           options_.architecture, options_.seed);
  }

  bool is_common() const noexcept { return worker_ == options_.common_worker; }
  const lgc_layout& layout() const noexcept { return layout_; }
  std::uint64_t steps() const noexcept { return step_; }
  lgc_phase phase() const noexcept { return options_.schedule.phase(step_); }
  const lgc_traffic& last_traffic() const noexcept { return last_; }
  const lgc_traffic& total_traffic() const noexcept { return total_; }
  /// This worker's own top-k value vector of the last top-k iteration.
  const std::vector<float>& last_values() const noexcept { return mid_; }

  template <Transport T>
  void step(T& transport, std::span<const std::span<float>> layers) {
    detail::lgc_check_gradients<Policy>(layout_, layers, "lgc_ps_worker::step");
    if (static_cast<int>(transport.size()) != workers_ + 1 || static_cast<int>(transport.rank()) != worker_)
      throw invalid_argument_error("lgc_ps_worker::step: the transport must have K + 1 ranks, this worker at its index");
    lgc_traffic traffic;
    traffic.original_bytes = 4 * layout_.total;
    detail::lgc_counting_transport<T> t(transport, traffic.wire_bytes);
    const int server = workers_, tag = options_.tag_base;
    const lgc_phase ph = options_.schedule.phase(step_);

    if (ph == lgc_phase::compressed && step_ == options_.schedule.first_compressed() && is_common()) {
      message m = t.irecv(server, tag + detail::lgc_ps_weights).wait();
      auto fresh = std::make_shared<lgc_network>(*net_);
      fresh->load(m.bytes, true);
      net_ = std::move(fresh);
    }

    std::vector<float> dense;
    if (ph == lgc_phase::full) {
      for (std::size_t l = 0; l < layers.size(); ++l) acc_.dense(l, layers[l], dense);
      traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_dense, dense_payload{dense});
    } else {
      sparse_coo_payload sparse, last;
      sparse.length = layout_.space;
      std::vector<std::vector<std::uint32_t>> own;
      mid_.clear();
      std::vector<std::uint32_t> idx;
      for (std::size_t l = 0; l < layers.size(); ++l) {
        if (layout_.roles[l] == lgc_layer_role::dense) {
          acc_.dense(l, layers[l], dense);
          continue;
        }
        acc_.accumulate(l, layers[l]);
        topk_exact(Policy{}, std::span<const float>(acc_.v[l]), layout_.k[l], idx, ws_);
        if (layout_.roles[l] == lgc_layer_role::topk) {
          last.length = layout_.sizes[l];
          last.indices = idx;
          acc_.take(l, idx, last.values);
        } else {
          for (std::uint32_t i : idx) sparse.indices.push_back(static_cast<std::uint32_t>(layout_.space_offset[l] + i));
          acc_.take(l, idx, mid_);
          own.push_back(idx);
        }
      }
      sparse.values = mid_;
      if (!dense.empty())
        traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_dense, dense_payload{dense});
      if (layout_.topk_values > 0) traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_last, last);
      if (ph == lgc_phase::topk_training) {
        traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_sparse, sparse);
      } else {
        sparse_coo_payload innovation;
        innovation.length = layout_.space;
        detail::lgc_innovation(Policy{}, layout_, options_.innovation_percent, sparse.indices, mid_, innovation.indices,
                               innovation.values, ws_);
        traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_sparse, innovation);
        if (is_common()) {
          lgc_index_payload index_set;
          std::size_t j = 0;
          for (std::size_t l = 0; l < layout_.sizes.size(); ++l)
            if (layout_.roles[l] == lgc_layer_role::autoencoder) {
              index_set.layer_lengths.push_back(layout_.sizes[l]);
              index_set.indices.push_back(own[j++]);
            }
          index_set.pack(options_.deflate_level);
          traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_index, index_set);
          autoencoder_codec<Policy> codec(net_, layout_.mu);
          lgc_code_payload code;
          codec.encode(mid_, code);  // scales: the per-window RMS of g~_r, carried in the payload
          traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_code, code);
        }
      }
    }
    // The aggregate comes back dense.
    auto agg = detail::lgc_receive<dense_payload>(t, server, tag + detail::lgc_ps_down);
    if (agg.values.size() != layout_.total)
      throw size_mismatch_error("lgc_ps_worker: aggregate from the server", layout_.total, agg.values.size());
    std::size_t at = 0;
    for (auto& layer : layers) {
      std::copy(agg.values.begin() + std::ptrdiff_t(at), agg.values.begin() + std::ptrdiff_t(at + layer.size()), layer.begin());
      at += layer.size();
    }
    last_ = traffic;
    total_ += traffic;
    ++step_;
  }

 private:
  int worker_, workers_;
  lgc_options options_;
  lgc_layout layout_;
  std::shared_ptr<lgc_network> net_;
  detail::lgc_accumulator<Policy> acc_;
  execution::topk_workspace ws_;
  std::uint64_t step_ = 0;
  lgc_traffic last_, total_;
  std::vector<float> mid_;
};

/// The server of the LGC parameter-server form (rank K of K + 1). It owns the
/// encoder and the K decoders D_c^k, trains them during the training phase
/// (eq. 7, the code of a worker drawn per iteration from (seed, step) fed to
/// every decoder, Fig. 6), sends the encoder to the common worker once, and
/// in the compressed phase reconstructs every worker's vector as
/// D_c^k(code, innovation_k) (eq. 12) on the common worker's index set and
/// averages (eq. 13). Innovation entries outside the common index set are
/// added exactly (value / K). Its step() must be called once per iteration,
/// alongside the workers'.
template <ExecutionPolicy Policy = execution::seq>
class lgc_ps_server {
 public:
  lgc_ps_server(int workers, std::vector<std::size_t> layer_sizes, lgc_options options = {})
      : workers_(workers), options_(std::move(options)), layout_(std::move(layer_sizes), options_) {
    if (workers < 1) throw invalid_argument_error("lgc_ps_server: at least one worker");
    if (options_.common_worker < 0 || options_.common_worker >= workers)
      throw invalid_argument_error("lgc_ps_server: common worker outside [0, K)");
    net_ = std::make_shared<lgc_network>(lgc_form::parameter_server, std::size_t(workers), options_.window,
                                         options_.architecture, options_.seed);
    trainer_.emplace(*net_, options_.optimizer, options_.learning_rate);
  }

  const lgc_layout& layout() const noexcept { return layout_; }
  std::uint64_t steps() const noexcept { return step_; }
  lgc_phase phase() const noexcept { return options_.schedule.phase(step_); }
  const lgc_network& network() const noexcept { return *net_; }
  std::uint64_t training_steps() const noexcept { return training_steps_; }
  std::uint64_t rejected_training_steps() const noexcept { return rejected_steps_; }
  float last_training_loss() const noexcept { return last_loss_; }
  /// Bytes the server sent: the weights once (payload_bytes), the dense downlink (wire_bytes).
  const lgc_traffic& total_traffic() const noexcept { return total_; }
  /// The worker whose code feeds every decoder in training iteration `step`.
  [[nodiscard]] std::size_t training_common(std::uint64_t step) const noexcept {
    return std::size_t(detail::counter_rng(options_.seed ^ 0x4C47435053ull).stream(step).below(0, std::uint64_t(workers_)));
  }
  /// The aggregate of the last iteration (all layers concatenated).
  const std::vector<float>& last_aggregate() const noexcept { return aggregate_; }

  template <Transport T>
  void step(T& transport) {
    if (static_cast<int>(transport.size()) != workers_ + 1 || static_cast<int>(transport.rank()) != workers_)
      throw invalid_argument_error("lgc_ps_server::step: the server is rank K of K + 1");
    lgc_traffic traffic;
    detail::lgc_counting_transport<T> t(transport, traffic.wire_bytes);
    const int tag = options_.tag_base;
    const lgc_phase ph = options_.schedule.phase(step_);
    const float inv = 1.0f / float(workers_);
    aggregate_.assign(layout_.total, 0.0f);

    if (ph == lgc_phase::compressed && step_ == options_.schedule.first_compressed()) {
      net_ = std::make_shared<lgc_network>(trainer_->network());
      trainer_.reset();
      auto bytes = net_->save(true);
      traffic.payload_bytes += bytes.size();
      t.isend(options_.common_worker, tag + detail::lgc_ps_weights, std::move(bytes)).wait();
    }

    if (ph == lgc_phase::full) {
      for (int k = 0; k < workers_; ++k) {
        auto p = detail::lgc_receive<dense_payload>(t, k, tag + detail::lgc_ps_up_dense);
        if (p.values.size() != layout_.total) throw size_mismatch_error("lgc_ps_server: dense push", layout_.total, p.values.size());
        add_into(Policy{}, std::span<float>(aggregate_), std::span<const float>(p.values));
      }
    } else {
      std::vector<sparse_coo_payload> sparse(static_cast<std::size_t>(workers_));
      for (int k = 0; k < workers_; ++k) {
        if (layout_.dense_values > 0) {
          auto p = detail::lgc_receive<dense_payload>(t, k, tag + detail::lgc_ps_up_dense);
          if (p.values.size() != layout_.dense_values)
            throw size_mismatch_error("lgc_ps_server: dense layers", layout_.dense_values, p.values.size());
          add_dense(p.values);
        }
        if (layout_.topk_values > 0) {
          auto p = detail::lgc_receive<sparse_coo_payload>(t, k, tag + detail::lgc_ps_up_last);
          const std::size_t l = layout_.sizes.size() - 1;
          if (p.length != layout_.sizes[l] || p.indices.size() > layout_.k[l])
            throw size_mismatch_error("lgc_ps_server: top-k layer", layout_.k[l], p.indices.size());
          const std::size_t off = layout_.total - layout_.sizes[l];
          for (std::size_t j = 0; j < p.indices.size(); ++j) aggregate_[off + p.indices[j]] += p.values[j];
        }
        sparse[std::size_t(k)] = detail::lgc_receive<sparse_coo_payload>(t, k, tag + detail::lgc_ps_up_sparse);
        if (sparse[std::size_t(k)].length != layout_.space)
          throw size_mismatch_error("lgc_ps_server: sparse push", layout_.space, std::size_t(sparse[std::size_t(k)].length));
      }
      if (ph == lgc_phase::topk_training) {
        if (!training_ready(sparse)) throw size_mismatch_error("lgc_ps_server: top-k count", layout_.mu, 0);
        for (const auto& p : sparse)
          for (std::size_t j = 0; j < p.indices.size(); ++j) add_space(p.indices[j], p.values[j]);
        train(sparse);
      } else {
        reconstruct(t, sparse);
      }
    }
    for (float& v : aggregate_) v *= inv;
    const dense_payload down{aggregate_};
    for (int k = 0; k < workers_; ++k) detail::lgc_send(t, k, tag + detail::lgc_ps_down, down);
    total_ += traffic;
    ++step_;
  }

 private:
  /// Position in the aggregate of a position of the autoencoder layers' concatenated space.
  std::size_t space_to_total(std::uint32_t pos) const {
    // Layers are few; a linear scan keeps this simple.
    std::size_t off = 0;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::autoencoder && pos >= layout_.space_offset[l] &&
          pos < layout_.space_offset[l] + layout_.sizes[l])
        return off + (pos - layout_.space_offset[l]);
      off += layout_.sizes[l];
    }
    throw size_mismatch_error("lgc_ps_server: position outside the autoencoder layers", layout_.space, pos);
  }
  void add_space(std::uint32_t pos, float v) { aggregate_[space_to_total(pos)] += v; }
  void add_dense(const std::vector<float>& values) {
    std::size_t off = 0, at = 0;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense)
        for (std::size_t i = 0; i < layout_.sizes[l]; ++i) aggregate_[off + i] += values[at++];
      off += layout_.sizes[l];
    }
  }
  bool training_ready(const std::vector<sparse_coo_payload>& sparse) const {
    for (const auto& p : sparse)
      if (p.indices.size() != layout_.mu) return false;
    return true;
  }

  void train(const std::vector<sparse_coo_payload>& sparse) {
    const std::size_t r = training_common(step_);
    const auto& slots = sparse[r].indices;
    std::vector<float> scales;
    detail::lgc_window_scales<float>(sparse[r].values, options_.window, scales);
    std::vector<std::vector<float>> x(sparse.size()), h(sparse.size());
    std::vector<std::uint32_t> ipos;
    std::vector<float> ival;
    for (std::size_t k = 0; k < sparse.size(); ++k) {
      detail::lgc_map_to_slots(slots, sparse[k].indices, sparse[k].values, x[k], nullptr, nullptr);
      detail::lgc_innovation(Policy{}, layout_, options_.innovation_percent, sparse[k].indices, sparse[k].values, ipos,
                             ival, ws_);
      detail::lgc_map_to_slots(slots, ipos, ival, h[k], nullptr, nullptr);
    }
    std::vector<std::span<const float>> xs(x.begin(), x.end()), hs(h.begin(), h.end());
    try {
      last_loss_ = trainer_->step_ps(xs, hs, r, scales, options_.lambda1, options_.lambda2);
      ++training_steps_;
    } catch (const non_finite_error&) {
      ++rejected_steps_;
    }
  }

  template <class T>
  void reconstruct(T& t, const std::vector<sparse_coo_payload>& innovations) {
    const int tag = options_.tag_base;
    const int c = options_.common_worker;
    auto index_set = detail::lgc_receive<lgc_index_payload>(t, c, tag + detail::lgc_ps_up_index);
    auto code = detail::lgc_receive<lgc_code_payload>(t, c, tag + detail::lgc_ps_up_code);
    // The common worker's index set, as positions of the concatenated space.
    std::vector<std::uint32_t> slots;
    std::size_t j = 0;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] != lgc_layer_role::autoencoder) continue;
      if (j >= index_set.indices.size() || index_set.layer_lengths[j] != layout_.sizes[l] ||
          index_set.indices[j].size() != layout_.k[l])
        throw size_mismatch_error("lgc_ps_server: common index set, layer " + std::to_string(l), layout_.k[l],
                                  j < index_set.indices.size() ? index_set.indices[j].size() : 0);
      for (std::uint32_t i : index_set.indices[j]) slots.push_back(static_cast<std::uint32_t>(layout_.space_offset[l] + i));
      ++j;
    }
    if (j != index_set.indices.size()) throw size_mismatch_error("lgc_ps_server: common index set layers", j, index_set.indices.size());
    autoencoder_codec<Policy> codec(net_, layout_.mu);  // checks the code's window and length in decode
    std::vector<float> h, rec(layout_.mu), sum(layout_.mu, 0.0f);
    std::vector<std::uint32_t> out_pos;
    std::vector<float> out_val;
    for (int k = 0; k < workers_; ++k) {
      const auto& inn = innovations[std::size_t(k)];
      out_pos.clear();
      out_val.clear();
      detail::lgc_map_to_slots(slots, inn.indices, inn.values, h, &out_pos, &out_val);
      codec.decode(code, std::size_t(k), h, rec, decode_ws_);
      add_into(Policy{}, std::span<float>(sum), std::span<const float>(rec));
      for (std::size_t e = 0; e < out_pos.size(); ++e) add_space(out_pos[e], out_val[e]);
    }
    for (std::size_t s = 0; s < slots.size(); ++s) add_space(slots[s], sum[s]);
  }

  int workers_;
  lgc_options options_;
  lgc_layout layout_;
  std::shared_ptr<lgc_network> net_;
  std::optional<lgc_trainer> trainer_;
  execution::topk_workspace ws_;
  typename autoencoder_codec<Policy>::workspace decode_ws_;  // the codec's decode scratch, kept across steps
  std::uint64_t step_ = 0, training_steps_ = 0, rejected_steps_ = 0;
  float last_loss_ = 0.0f;
  lgc_traffic total_;
  std::vector<float> aggregate_;
};

}  // namespace gradcomp
