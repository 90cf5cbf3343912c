#pragma once
/// \file ps/sync_server.hpp
/// The synchronous parameter server (MXNet dist_sync, seed 003; seed 001
/// eq. 7's sum over workers): sync_ps_server, its options and the round
/// result its workers see.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/dgs_server.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/payloads/dense.hpp>
#include <gradcomp/payloads/sparse_coo.hpp>
#include <gradcomp/ps/common.hpp>
#include <gradcomp/ps/frames.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

/// Options of the synchronous parameter server.
struct sync_ps_options {
  bool average = true;  ///< send the mean of the contributions (else their sum)
  int tag_up = ps_default_tag_up;      ///< worker-to-server tag (checked against the registry, tags.hpp)
  int tag_down = ps_default_tag_down;  ///< server-to-worker tag
};

/// Result of one synchronous exchange, as the worker sees it.
struct ps_sync_result {
  std::uint32_t contributors = 0;  ///< workers whose push is in the aggregate
  bool rejected = false;           ///< this worker's push was rejected (not in the aggregate)
  std::uint64_t round = 0;
};

/// The synchronous parameter server: every round, one push (payloads of the
/// uplink codec C) from each active worker, taken in rank order; the decoded
/// sum or mean (sync_aggregate) is sent back to all of them, dense when DownC's
/// payload is dense_payload (ps_dense_downlink, the default, or dense_codec),
/// else re-encoded once per layer with the server's DownC instance (stateful
/// down codecs keep their state on the server). A push of another layer
/// layout is left out like a malformed one (stats().last_error: layout_error).
template <Codec C, Codec DownC = ps_dense_downlink<>, ExecutionPolicy Policy = execution::seq>
class sync_ps_server {
 public:
  template <class MakeUp, class MakeDown = default_codec_factory<DownC>>
    requires std::invocable<MakeUp&, std::size_t, std::size_t> && std::invocable<MakeDown&, std::size_t, std::size_t>
  sync_ps_server(layer_partition layers, int workers, MakeUp&& make_up, MakeDown&& make_down = {},
                 sync_ps_options options = {})
      : layers_(std::move(layers)),
        workers_(workers),
        options_(options),
        decoders_(ps_detail::make_decoders<C, Policy>(layers_, make_up)),
        status_(static_cast<std::size_t>(workers < 0 ? 0 : workers), ps_worker_status::active) {
    if (layers_.layers() == 0) throw invalid_argument_error("sync_ps_server: the layer partition is empty");
    if (workers < 1) throw invalid_argument_error("sync_ps_server: at least one worker is needed");
    ps_check_tags(options_.tag_up, options_.tag_down, "sync_ps_server");
    if constexpr (!ps_detail::is_dense_downlink<DownC>) {
      down_.reserve(layers_.layers());
      for (std::size_t j = 0; j < layers_.layers(); ++j) down_.push_back(make_down(j, layers_.size(j)));
    }
    aggregate_.resize(layers_.total());
    stats_.bytes_up.assign(static_cast<std::size_t>(workers), 0);
    stats_.bytes_down.assign(static_cast<std::size_t>(workers), 0);
    stats_.pushes_per_worker.assign(static_cast<std::size_t>(workers), 0);
  }

  const layer_partition& layers() const noexcept { return layers_; }
  int workers() const noexcept { return workers_; }
  ps_worker_status status(int k) const { return status_.at(static_cast<std::size_t>(k)); }
  const ps_server_stats& stats() const noexcept { return stats_; }
  /// The last round's aggregate (before any re-encoding).
  std::span<const float> aggregate() const noexcept { return aggregate_; }
  /// Layer j's downlink codec (its state, e.g. a residual, lives on the server).
  /// Throws state_error for the dense downlink, which has none.
  const DownC& down_codec(std::size_t j) const {
    if (down_.empty()) throw state_error("sync_ps_server::down_codec: the dense downlink has no codec state");
    return down_.at(j);
  }
  /// Rounds answered so far.
  std::uint64_t rounds() const noexcept { return round_; }

  /// One round without a transport: frames[k] is worker k's frame (empty: it
  /// sent nothing this round). Returns the reply for each worker (empty: none,
  /// because it sent nothing or left). Malformed pushes are left out of the
  /// aggregate and their senders told so.
  [[nodiscard]] std::vector<std::vector<std::byte>> round(std::span<const std::vector<std::byte>> frames) {
    if (frames.size() != static_cast<std::size_t>(workers_))
      throw size_mismatch_error("sync_ps_server::round: frames", static_cast<std::size_t>(workers_), frames.size());
    std::vector<std::optional<std::span<const std::byte>>> in(frames.size());
    for (std::size_t k = 0; k < frames.size(); ++k)
      if (!frames[k].empty()) in[k] = std::span<const std::byte>(frames[k]);
    return round_impl(in);
  }

  /// Serves rounds over `t` (rank 0; worker k is rank k+1) until every worker
  /// has left or is gone. A worker whose receive fails (closed, timed out) is
  /// gone and no longer waited for; one whose reply cannot be delivered too.
  template <Transport T>
  const ps_server_stats& serve(T& t) {
    if (static_cast<int>(t.size()) != workers_ + 1)
      throw invalid_argument_error("sync_ps_server::serve: the transport has " + std::to_string(t.size()) +
                                   " ranks, expected 1 server + " + std::to_string(workers_) + " workers");
    if (static_cast<int>(t.rank()) != 0) throw invalid_argument_error("sync_ps_server::serve: the server must be rank 0");
    std::vector<message> got(static_cast<std::size_t>(workers_));
    while (std::any_of(status_.begin(), status_.end(), [](auto s) { return s == ps_worker_status::active; })) {
      std::vector<std::optional<std::span<const std::byte>>> in(static_cast<std::size_t>(workers_));
      for (int k = 0; k < workers_; ++k) {
        const auto ku = static_cast<std::size_t>(k);
        if (status_[ku] != ps_worker_status::active) continue;
        try {
          auto h = t.irecv(k + 1, options_.tag_up);
          got[ku] = h.wait();
          in[ku] = std::span<const std::byte>(got[ku].bytes);
        } catch (const transport_error& e) {  // also timeout_error
          stats_.last_error = e.what();
          status_[ku] = ps_worker_status::gone;
        }
      }
      auto replies = round_impl(in);
      for (int k = 0; k < workers_; ++k) {
        const auto ku = static_cast<std::size_t>(k);
        if (replies[ku].empty()) continue;
        try {
          ps_detail::send(t, k + 1, options_.tag_down, std::move(replies[ku]));
        } catch (const transport_error& e) {
          ++stats_.send_failures;
          stats_.last_error = e.what();
          status_[ku] = ps_worker_status::gone;
        }
      }
    }
    return stats_;
  }

 private:
  using payload_type = typename C::payload_type;

  std::vector<std::vector<std::byte>> round_impl(std::span<const std::optional<std::span<const std::byte>>> in) {
    const std::size_t N = static_cast<std::size_t>(workers_);
    std::vector<std::vector<payload_type>> pushed(N);
    std::vector<std::uint64_t> sequence(N, 0);
    std::vector<int> outcome(N, 0);  // 0 nothing, 1 contributed, 2 rejected (still answered)
    for (std::size_t k = 0; k < N; ++k) {
      if (!in[k]) continue;
      stats_.bytes_up[k] += in[k]->size();
      try {
        // The frame bounds the layer count (a header per layer): another count is a layout error.
        const ps_frame_view f = ps_split_frame(*in[k], std::max(layers_.layers(), in[k]->size() / wire::header_size));
        sequence[k] = f.control.sequence;
        if (f.control.kind == ps_kind::leave) {
          ++stats_.leaves;
          status_[k] = ps_worker_status::left;
          continue;
        }
        if (f.control.kind != ps_kind::push)
          wire::reader::fail(wire::wire_errc::malformed_body, "ps sync: expected a push or a leave");
        if (f.control.layers != layers_.layers() || f.control.elements != layers_.total())
          throw layout_error("ps sync push: " + std::to_string(f.control.layers) + " layers of " +
                             std::to_string(f.control.elements) + " elements, the model has " +
                             std::to_string(layers_.layers()) + " of " + std::to_string(layers_.total()));
        std::vector<payload_type> ps;
        ps.reserve(layers_.layers());
        scratch_.resize(layers_.total());
        for (std::size_t j = 0; j < layers_.layers(); ++j) {
          ps.push_back(ps_parse_model_layer<payload_type>(f.layers[j], layers_.size(j), j));
          auto dst = layers_.layer(std::span<float>(scratch_), j);
          decoders_[j].decode(ps.back(), dst);
          if (auto bad = find_non_finite(Policy{}, std::span<const float>(dst)); bad != dst.size())
            throw non_finite_error("ps sync push: layer " + std::to_string(j), bad);
        }
        pushed[k] = std::move(ps);
        outcome[k] = 1;
        ++stats_.pushes;
        ++stats_.pushes_per_worker[k];
      } catch (const gradcomp::error& e) {  // wire_error, size_mismatch_error, non_finite_error
        ++stats_.rejected;
        stats_.last_error = e.what();
        outcome[k] = 2;
      }
    }
    std::uint32_t contributors = 0;
    for (auto o : outcome) contributors += o == 1;
    // Nobody to answer (only leaves): no round, and no down codec step whose
    // output would be lost.
    if (std::all_of(outcome.begin(), outcome.end(), [](int o) { return o == 0; })) return std::vector<std::vector<std::byte>>(N);
    // Aggregate each layer in rank order.
    std::vector<const payload_type*> ptrs;
    for (std::size_t j = 0; j < layers_.layers(); ++j) {
      ptrs.clear();
      for (std::size_t k = 0; k < N; ++k)
        if (outcome[k] == 1) ptrs.push_back(&pushed[k][j]);
      sync_aggregate<Policy>(decoders_[j], std::span<const payload_type* const>(ptrs),
                             layers_.layer(std::span<float>(aggregate_), j), options_.average, scratch2_);
    }
    // The layers once, then one control message per recipient.
    layer_bytes_.clear();
    for (std::size_t j = 0; j < layers_.layers(); ++j) {
      auto src = layers_.layer(std::span<const float>(aggregate_), j);
      if constexpr (ps_detail::is_dense_downlink<DownC>) {
        wire::serialize_into(dense_payload{std::vector<float>(src.begin(), src.end())}, tmp_);
      } else {
        typename DownC::payload_type p;
        down_[j].encode(src, p);
        wire::serialize_into(p, tmp_);
      }
      layer_bytes_.insert(layer_bytes_.end(), tmp_.begin(), tmp_.end());
    }
    std::vector<std::vector<std::byte>> replies(N);
    for (std::size_t k = 0; k < N; ++k) {
      if (outcome[k] == 0) continue;
      ps_control c = ps_detail::make_control(ps_kind::aggregate, sequence[k], round_);
      c.detail = outcome[k] == 2 ? 1 : 0;
      c.count = contributors;
      c.layers = static_cast<std::uint32_t>(layers_.layers());
      c.elements = layers_.total();
      builder_.start(c);
      builder_.append_bytes(layer_bytes_);
      replies[k] = builder_.take();
      stats_.bytes_down[k] += replies[k].size();
    }
    ++round_;
    return replies;
  }

  layer_partition layers_;
  int workers_;
  sync_ps_options options_;
  std::vector<ps_detail::decoder_t<C, Policy>> decoders_;
  std::vector<DownC> down_;
  std::vector<ps_worker_status> status_;
  std::vector<float> aggregate_, scratch_, scratch2_;
  std::vector<std::byte> layer_bytes_, tmp_;
  ps_frame_builder builder_;
  std::uint64_t round_ = 0;
  ps_server_stats stats_;
};

}  // namespace gradcomp
