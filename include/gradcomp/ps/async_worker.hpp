#pragma once
/// \file ps/async_worker.hpp
/// A worker of the asynchronous parameter server (seed 001, DGS,
/// Algorithms 1 and 3 at worker k): async_ps_worker and what its requests report.

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

/// How a worker's request ended.
enum class ps_pull_status : std::uint8_t {
  updated = 1,   ///< the model took the server's update (eq. 5 / Alg. 1 line 16)
  resynced = 2,  ///< the model was replaced by the server's (join, rejoin)
  rejected = 3,  ///< the server rejected the push; the model is unchanged (the push's content is lost)
  stale = 4,     ///< (apply_reply only) a reply to an older request, ignored
};

/// What apply_reply / step / join report.
struct ps_reply {
  ps_pull_status status = ps_pull_status::stale;
  std::uint64_t sequence = 0;   ///< the request it answers
  std::uint64_t timestamp = 0;  ///< server time t of the model now held
  std::size_t entries = 0;      ///< model entries written
  ps_reject_reason reason{};    ///< for rejected
};

/// A worker of the asynchronous server (seed 001 Algorithm 1 / 3 at worker k):
/// its uplink (one codec per layer, the update rule) and the protocol. The
/// model is the caller's (framework memory); the worker writes the server's
/// updates into it. make_push / apply_reply are the transport-free halves;
/// join / step / leave run them over a transport.
template <Codec C, ExecutionPolicy Policy = execution::seq>
class async_ps_worker {
 public:
  using codec_type = C;

  template <class MakeCodec>
    requires std::invocable<MakeCodec&, std::size_t, std::size_t>
  async_ps_worker(layer_partition layers, MakeCodec&& make, async_ps_worker_options options = {})
      : uplink_(std::move(layers), make), options_(options) {
    if (options_.max_rejoins < 0) throw invalid_argument_error("async_ps_worker: max_rejoins must be >= 0");
    ps_check_tags(options_.tag_up, options_.tag_down, "async_ps_worker");
  }

  const layer_partition& layers() const noexcept { return uplink_.layers(); }
  ps_uplink<C, Policy>& uplink() noexcept { return uplink_; }
  const ps_worker_stats& stats() const noexcept { return stats_; }
  /// The number of the latest request.
  std::uint64_t sequence() const noexcept { return sequence_; }

  /// A push frame of lr * gradient through the uplink (the codecs' state
  /// advances). Throws before any state changes for a bad gradient or lr.
  [[nodiscard]] std::vector<std::byte> make_push(std::span<const float> gradient, float lr) {
    uplink_.encode(gradient, lr, payloads_);
    auto f = ps_detail::push_frame(builder_, layers(), ++sequence_, payloads_);
    ++stats_.pushes;
    stats_.bytes_up += f.size();
    return f;
  }
  [[nodiscard]] std::vector<std::byte> make_join() { return control_frame(ps_kind::join); }
  [[nodiscard]] std::vector<std::byte> make_leave() { return control_frame(ps_kind::leave); }

  /// Applies a server frame answering the latest request to `model`: update
  /// (assign the sent values), resync (the whole model) or reject (nothing).
  /// A reply to an older request is ignored (stale). Throws wire::wire_error
  /// for a malformed frame, with the model unchanged.
  [[nodiscard]] ps_reply apply_reply(std::span<const std::byte> frame, std::span<float> model) {
    layers().check("async_ps_worker::apply_reply: model", model.size());
    stats_.bytes_down += frame.size();
    const ps_frame_view f = ps_split_frame(frame, layers().layers());
    ps_reply r;
    r.sequence = f.control.sequence;
    r.timestamp = f.control.timestamp;
    if (f.control.kind != ps_kind::update && f.control.kind != ps_kind::resync && f.control.kind != ps_kind::reject)
      wire::reader::fail(wire::wire_errc::malformed_body, "ps: a worker received a worker-to-server message");
    // A reject of an unparseable request carries sequence 0: it answers the latest.
    if (f.control.sequence != sequence_ && !(f.control.kind == ps_kind::reject && f.control.sequence == 0)) {
      ++stats_.stale;
      r.status = ps_pull_status::stale;
      return r;
    }
    if (f.control.kind == ps_kind::reject) {
      ++stats_.rejected;
      r.status = ps_pull_status::rejected;
      r.reason = static_cast<ps_reject_reason>(f.control.detail);
      return r;
    }
    const auto& L = layers();
    if (f.control.layers != L.layers() || f.control.elements != L.total())
      wire::reader::fail(wire::wire_errc::malformed_body, "ps: the update does not match the model's layers");
    model_update u;
    u.timestamp = f.control.timestamp;
    u.resync = f.control.kind == ps_kind::resync;
    u.layers.resize(L.layers());
    for (std::size_t j = 0; j < L.layers(); ++j) {
      const auto codec = ps_peek_codec(f.layers[j]);
      if (codec == wire::codec_id::dense) {
        u.layers[j].dense = true;
        u.layers[j].values = ps_parse_layer<dense_payload>(f.layers[j], L.size(j)).values;
      } else if (codec == wire::codec_id::sparse_coo && !u.resync) {
        auto p = ps_parse_layer<sparse_coo_payload>(f.layers[j], L.size(j));
        u.layers[j].indices = std::move(p.indices);
        u.layers[j].values = std::move(p.values);
      } else {
        wire::reader::fail(wire::wire_errc::wrong_codec, "ps: unexpected codec in a model update");
      }
      for (float v : u.layers[j].values)
        if (!std::isfinite(v)) wire::reader::fail(wire::wire_errc::malformed_body, "ps: non-finite model value");
    }
    apply_model_update<Policy>(L, u, model);
    r.entries = u.entries();
    if (u.resync) {
      ++stats_.resyncs;
      r.status = ps_pull_status::resynced;
    } else {
      r.status = ps_pull_status::updated;
    }
    return r;
  }

  /// Joins (or rejoins): sends join and writes the server's model into `model`.
  template <Transport T>
  ps_reply join(T& t, std::span<float> model) {
    layers().check("async_ps_worker::join: model", model.size());
    ps_detail::send(t, options_.server_rank, options_.tag_up, make_join());
    return await(t, model, options_.max_rejoins);
  }

  /// One iteration of Algorithm 1 / 3 (lines 4-16): pushes lr * gradient
  /// (computed by the caller at `model`) and applies the server's reply to
  /// `model`. Returns updated, rejected, or resynced (after a rejoin).
  template <Transport T>
  [[nodiscard]] ps_reply step(T& t, std::span<const float> gradient, float lr, std::span<float> model) {
    layers().check("async_ps_worker::step: model", model.size());
    ps_detail::send(t, options_.server_rank, options_.tag_up, make_push(gradient, lr));
    return await(t, model, options_.max_rejoins);
  }

  /// Tells the server this worker stops.
  template <Transport T>
  void leave(T& t) {
    ps_detail::send(t, options_.server_rank, options_.tag_up, make_leave());
  }

 private:
  std::vector<std::byte> control_frame(ps_kind kind) {
    auto f = wire::serialize(ps_detail::make_control(kind, ++sequence_));
    stats_.bytes_up += f.size();
    return f;
  }

  // Waits for the reply to the latest request; on a timeout or a malformed
  // reply, rejoins (up to `rejoins` times) and waits for the resync.
  template <Transport T>
  ps_reply await(T& t, std::span<float> model, int rejoins) {
    for (;;) {
      bool retry = false;
      try {
        auto h = t.irecv(options_.server_rank, options_.tag_down);
        message m = h.wait();
        ps_reply r = apply_reply(std::span<const std::byte>(m.bytes), model);
        if (r.status != ps_pull_status::stale) return r;
      } catch (const timeout_error&) {
        if (rejoins <= 0) throw;
        retry = true;
      } catch (const wire::wire_error&) {
        if (rejoins <= 0) throw;
        retry = true;
      }
      if (retry) {
        --rejoins;
        ++stats_.rejoins;
        ps_detail::send(t, options_.server_rank, options_.tag_up, make_join());
      }
    }
  }

  ps_uplink<C, Policy> uplink_;
  async_ps_worker_options options_;
  std::vector<typename C::payload_type> payloads_;
  ps_frame_builder builder_;
  std::uint64_t sequence_ = 0;
  ps_worker_stats stats_;
};

}  // namespace gradcomp
