#pragma once
/// \file ps/sync_worker.hpp
/// A worker of the synchronous parameter server: sync_ps_worker, and the
/// typed error its exchange raises when the server left its push out.

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
#include <gradcomp/ps/sync_server.hpp>

namespace gradcomp {

/// Thrown by sync_ps_worker::exchange when the server left this worker's push
/// out of the round (it could not parse or decode it: a codec mismatch,
/// corrupted bytes, NaN/Inf). The gradient is left unchanged; result() is the
/// round as the server reported it, and the worker's aggregate() holds the
/// others' aggregate should the caller want it knowingly.
class ps_push_rejected_error : public error {
 public:
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  explicit ps_push_rejected_error(const ps_sync_result& r)
      : error("sync_ps_worker::exchange: the server rejected this worker's push in round " + std::to_string(r.round) +
              " (" + std::to_string(r.contributors) + " other workers contributed); the gradient is unchanged"),
        result_(r) {}
  /// The round as the server reported it (rejected is true).
  const ps_sync_result& result() const noexcept { return result_; }

 private:
  ps_sync_result result_;
};

/// A worker of the synchronous server: exchange() pushes a gradient (one
/// payload per layer of C) and overwrites it with the round's aggregate, or
/// throws ps_push_rejected_error (gradient unchanged) when the server left
/// the push out.
template <Codec C, Codec DownC = ps_dense_downlink<>, ExecutionPolicy Policy = execution::seq>
class sync_ps_worker {
 public:
  template <class MakeUp, class MakeDown = default_codec_factory<DownC>>
    requires std::invocable<MakeUp&, std::size_t, std::size_t> && std::invocable<MakeDown&, std::size_t, std::size_t>
  sync_ps_worker(layer_partition layers, MakeUp&& make_up, MakeDown&& make_down = {},
                 async_ps_worker_options options = {})
      : uplink_(layers, make_up), down_(ps_detail::make_decoders<DownC, Policy>(uplink_.layers(), make_down)),
        options_(options) {
    ps_check_tags(options_.tag_up, options_.tag_down, "sync_ps_worker");
  }

  const layer_partition& layers() const noexcept { return uplink_.layers(); }
  ps_uplink<C, Policy>& uplink() noexcept { return uplink_; }
  const ps_worker_stats& stats() const noexcept { return stats_; }
  /// The aggregate of the last aggregate frame read without error, decoded
  /// (also when this worker's push was rejected: the others' sum or mean).
  std::span<const float> aggregate() const noexcept { return decoded_; }

  /// The push frame of `gradient` (the codecs' state advances).
  [[nodiscard]] std::vector<std::byte> make_push(std::span<const float> gradient) {
    uplink_.encode(gradient, 1.0f, payloads_);
    auto f = ps_detail::push_frame(builder_, layers(), ++sequence_, payloads_);
    ++stats_.pushes;
    stats_.bytes_up += f.size();
    return f;
  }

  /// Decodes an aggregate frame into `out`, the transport-free half of
  /// exchange(). The aggregate is written even when this worker's push was
  /// rejected: the result says so (`rejected`), so it must not be ignored.
  /// Throws layout_error for an aggregate of another layer layout than the
  /// model's, wire::wire_error for a malformed frame, one answering another
  /// request or holding NaN/Inf, and the decoders' own errors; in every case
  /// `out` is unchanged.
  [[nodiscard]] ps_sync_result apply_aggregate(std::span<const std::byte> frame, std::span<float> out) {
    layers().check("sync_ps_worker::apply_aggregate: out", out.size());
    const ps_sync_result r = read_aggregate(frame);
    std::copy(decoded_.begin(), decoded_.end(), out.begin());
    return r;
  }

  /// One synchronous step: push `gradient`, wait for the aggregate, write it
  /// into `gradient`. Throws ps_push_rejected_error, with `gradient`
  /// unchanged, when the server left this push out of the round (a codec
  /// mismatch, corrupted bytes); layout_error when the server's layers are
  /// not the model's; and apply_aggregate's errors.
  template <Transport T>
  [[nodiscard]] ps_sync_result exchange(T& t, std::span<float> gradient) {
    layers().check("sync_ps_worker::exchange: gradient", gradient.size());
    ps_detail::send(t, options_.server_rank, options_.tag_up, make_push(gradient));
    auto h = t.irecv(options_.server_rank, options_.tag_down);
    message m = h.wait();
    const ps_sync_result r = read_aggregate(std::span<const std::byte>(m.bytes));
    if (r.rejected) throw ps_push_rejected_error(r);
    std::copy(decoded_.begin(), decoded_.end(), gradient.begin());
    return r;
  }

  template <Transport T>
  void leave(T& t) {
    auto f = wire::serialize(ps_detail::make_control(ps_kind::leave, ++sequence_));
    stats_.bytes_up += f.size();
    ps_detail::send(t, options_.server_rank, options_.tag_up, std::move(f));
  }

 private:
  // Reads an aggregate frame answering the latest push into decoded_.
  ps_sync_result read_aggregate(std::span<const std::byte> frame) {
    const auto& L = layers();
    stats_.bytes_down += frame.size();
    // Every layer message takes at least a header, so the frame itself bounds
    // the layer count: a count other than the model's is a layout error.
    const ps_frame_view f = ps_split_frame(frame, std::max(L.layers(), frame.size() / wire::header_size));
    if (f.control.kind != ps_kind::aggregate)
      wire::reader::fail(wire::wire_errc::malformed_body, "ps sync: expected an aggregate");
    if (f.control.sequence != sequence_)
      wire::reader::fail(wire::wire_errc::malformed_body, "ps sync: the aggregate answers another push");
    if (f.control.layers != L.layers() || f.control.elements != L.total())
      throw layout_error("sync_ps_worker: the aggregate has " + std::to_string(f.control.layers) + " layers of " +
                         std::to_string(f.control.elements) + " elements, the model " + std::to_string(L.layers()) +
                         " layers of " + std::to_string(L.total()));
    using P = typename DownC::payload_type;
    std::vector<P> ps;
    ps.reserve(L.layers());
    for (std::size_t j = 0; j < L.layers(); ++j) ps.push_back(ps_parse_model_layer<P>(f.layers[j], L.size(j), j));
    // Decode aside and check, so a bad aggregate leaves the caller's memory untouched.
    decoded_.resize(L.total());
    for (std::size_t j = 0; j < L.layers(); ++j) down_[j].decode(ps[j], L.layer(std::span<float>(decoded_), j));
    if (find_non_finite(Policy{}, std::span<const float>(decoded_)) != decoded_.size())
      wire::reader::fail(wire::wire_errc::malformed_body, "ps sync: non-finite value in the aggregate");
    ps_sync_result r;
    r.contributors = f.control.count;
    r.rejected = f.control.detail == 1;
    r.round = f.control.timestamp;
    if (r.rejected) ++stats_.rejected;
    return r;
  }

  ps_uplink<C, Policy> uplink_;
  std::vector<ps_detail::decoder_t<DownC, Policy>> down_;
  async_ps_worker_options options_;
  std::vector<typename C::payload_type> payloads_;
  std::vector<float> decoded_;
  ps_frame_builder builder_;
  std::uint64_t sequence_ = 0;
  ps_worker_stats stats_;
};

}  // namespace gradcomp
