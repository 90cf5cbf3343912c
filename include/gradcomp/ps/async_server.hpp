#pragma once
/// \file ps/async_server.hpp
/// The asynchronous parameter server (seed 001, DGS, Algorithm 2) over any
/// Transport: async_ps_server, its options and what handle() reports.

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

/// Options of the asynchronous server.
struct async_ps_options {
  ps_downlink downlink = ps_downlink::model_difference;  ///< what a reply carries (dgs_server.hpp)
  double secondary_ratio = 0.0;  ///< secondary compression R in percent, 0 = off (eq. 6a)
  int tag_up = ps_default_tag_up;      ///< worker-to-server tag (checked against the registry, tags.hpp)
  int tag_down = ps_default_tag_down;  ///< server-to-worker tag
  /// Deterministic mode: the worker (0-based) whose push the server takes
  /// next, in order (receives from that rank only; joins on the way are served
  /// and do not use up an entry; entries of workers that left or are gone are
  /// skipped). After the schedule, pushes are served in arrival order.
  /// Empty: free-running, arrival order from the start.
  std::vector<int> schedule;
  /// serve() gives up on silent workers (marks them gone and returns) after
  /// this long without any message. Default: wait as long as a worker may still talk.
  std::chrono::nanoseconds idle_timeout = std::chrono::nanoseconds::max();
};

/// What happened to one frame the server handled.
enum class ps_event : std::uint8_t { pushed, joined, left, rejected, resynced };

/// Result of async_ps_server::handle.
struct ps_handled {
  ps_event event = ps_event::rejected;
  std::optional<ps_kind> kind;   ///< the frame's kind, when its control message parsed
  std::vector<std::byte> reply;  ///< empty: no reply (leave)
  std::string error;             ///< why, for a rejected frame
};

/// The asynchronous parameter server (seed 001 Algorithm 2) for workers whose
/// uplink codec is C. Holds a dgs_server_state; handle() processes one frame,
/// serve() runs the loop over a transport (rank 0 = this server).
template <Codec C, ExecutionPolicy Policy = execution::seq>
class async_ps_server {
 public:
  using codec_type = C;
  using payload_type = typename C::payload_type;

  /// `make(j, n)` builds layer j's codec (the workers' rule); it is used only
  /// when C's payload needs a codec to decode (not for dense or sparse COO).
  template <class MakeCodec>
    requires std::invocable<MakeCodec&, std::size_t, std::size_t>
  async_ps_server(layer_partition layers, std::span<const float> theta0, int workers, MakeCodec&& make,
                  async_ps_options options = {})
      : state_(std::move(layers), theta0, workers,
               dgs_server_options{.downlink = options.downlink, .secondary_ratio = options.secondary_ratio}),
        options_(std::move(options)),
        decoders_(ps_detail::make_decoders<C, Policy>(state_.layers(), make)),
        status_(static_cast<std::size_t>(workers), ps_worker_status::active) {
    for (int k : options_.schedule)
      if (k < 0 || k >= workers)
        throw invalid_argument_error("async_ps_server: schedule names worker " + std::to_string(k) + " of " +
                                     std::to_string(workers));
    ps_check_tags(options_.tag_up, options_.tag_down, "async_ps_server");
    if (options_.idle_timeout <= std::chrono::nanoseconds::zero())
      throw invalid_argument_error("async_ps_server: idle_timeout must be positive");
    stats_.bytes_up.assign(static_cast<std::size_t>(workers), 0);
    stats_.bytes_down.assign(static_cast<std::size_t>(workers), 0);
    stats_.pushes_per_worker.assign(static_cast<std::size_t>(workers), 0);
  }

  const layer_partition& layers() const noexcept { return state_.layers(); }
  int workers() const noexcept { return state_.workers(); }
  dgs_server_state<Policy>& state() noexcept { return state_; }
  const dgs_server_state<Policy>& state() const noexcept { return state_; }
  /// theta_t.
  std::span<const float> model() const noexcept { return state_.model(); }
  ps_worker_status status(int k) const { return status_.at(static_cast<std::size_t>(k)); }
  const ps_server_stats& stats() const noexcept { return stats_; }
  const async_ps_options& options() const noexcept { return options_; }
  /// The server's memory (Sec. 5.6.2): model, N copies w_k, work buffers.
  ps_memory_report memory() const noexcept {
    auto r = state_.memory();
    r.scratch_bytes += decoded_.capacity() * sizeof(float);
    for (const auto& l : sparse_)
      r.scratch_bytes += l.indices.capacity() * sizeof(std::uint32_t) + l.values.capacity() * sizeof(float);
    return r;
  }

  /// Validates a push frame of worker k and applies it (eq. 1, Alg. 2 line 3).
  /// Throws wire::wire_error (bytes), size_mismatch_error (a layer of the
  /// wrong size), non_finite_error (NaN/Inf in the decoded update); in every
  /// case the state is unchanged. Returns the frame's control message.
  ps_control apply_push(int k, std::span<const std::byte> frame) {
    check_worker(k);
    const ps_frame_view f = ps_split_frame(frame, layers().layers());
    if (f.control.kind != ps_kind::push)
      wire::reader::fail(wire::wire_errc::malformed_body, "ps: expected a push frame");
    apply_layers(f);
    return f.control;
  }

  /// Handles one frame from worker k and returns the reply to send it:
  /// push -> update (or a dense resync if k was gone or had left), join ->
  /// dense resync, leave -> nothing, anything malformed -> reject (state unchanged).
  [[nodiscard]] ps_handled handle(int k, std::span<const std::byte> frame) {
    check_worker(k);
    const auto ku = static_cast<std::size_t>(k);
    stats_.bytes_up[ku] += frame.size();
    ps_handled h;
    std::uint64_t sequence = 0;
    try {
      const ps_frame_view f = ps_split_frame(frame, layers().layers());
      sequence = f.control.sequence;
      h.kind = f.control.kind;
      switch (f.control.kind) {
        case ps_kind::push: {
          apply_layers(f);
          ++stats_.pushes;
          ++stats_.pushes_per_worker[ku];
          if (status_[ku] == ps_worker_status::active) {
            model_update u = state_.update_for(k);
            h.reply = serialize(k, u, sequence);
            h.event = ps_event::pushed;
          } else {
            h.reply = resync_reply(k, sequence);
            h.event = ps_event::resynced;
          }
          break;
        }
        case ps_kind::join:
          ++stats_.joins;
          h.reply = resync_reply(k, sequence);
          h.event = ps_event::joined;
          break;
        case ps_kind::leave:
          ++stats_.leaves;
          status_[ku] = ps_worker_status::left;
          h.event = ps_event::left;
          break;
        default:
          return reject(k, sequence, h.kind, ps_reject_reason::protocol, "ps: a worker sent a server-to-worker message");
      }
    } catch (const wire::wire_error& e) {
      return reject(k, sequence, h.kind, ps_reject_reason::malformed, e.what());
    } catch (const size_mismatch_error& e) {
      return reject(k, sequence, h.kind, ps_reject_reason::bad_shape, e.what());
    } catch (const non_finite_error& e) {
      return reject(k, sequence, h.kind, ps_reject_reason::non_finite, e.what());
    } catch (const invalid_argument_error& e) {  // a decoder's own checks
      return reject(k, sequence, h.kind, ps_reject_reason::malformed, e.what());
    }
    stats_.bytes_down[ku] += h.reply.size();
    return h;
  }

  /// Marks worker k gone (its next message gets a dense resync).
  void mark_gone(int k) {
    check_worker(k);
    auto& s = status_[static_cast<std::size_t>(k)];
    if (s == ps_worker_status::active) s = ps_worker_status::gone;
  }

  /// True while some worker is active (neither left nor gone).
  bool any_active() const noexcept {
    return std::any_of(status_.begin(), status_.end(), [](auto s) { return s == ps_worker_status::active; });
  }

  /// Serves workers over `t` (this is rank 0, worker k is rank k+1) until
  /// every worker has left or is gone: in the schedule's order first (if
  /// any), then in arrival order. A reply that cannot be delivered marks its
  /// worker gone; a receive timeout probes the silent workers and marks the
  /// closed ones gone; after `idle_timeout` without messages the remaining
  /// workers are marked gone. Returns the counters.
  template <Transport T>
  const ps_server_stats& serve(T& t) {
    if (static_cast<int>(t.size()) != workers() + 1)
      throw invalid_argument_error("async_ps_server::serve: the transport has " + std::to_string(t.size()) +
                                   " ranks, expected 1 server + " + std::to_string(workers()) + " workers");
    if (static_cast<int>(t.rank()) != 0)
      throw invalid_argument_error("async_ps_server::serve: the server must be rank 0");
    std::size_t next = 0;
    auto last_message = std::chrono::steady_clock::now();
    while (any_active()) {
      // The next scheduled worker still active, or anyone.
      while (next < options_.schedule.size() &&
             status_[static_cast<std::size_t>(options_.schedule[next])] != ps_worker_status::active)
        ++next;
      const bool scheduled = next < options_.schedule.size();
      const int source = scheduled ? options_.schedule[next] + 1 : any_source;
      auto h = t.irecv(source, options_.tag_up);
      std::optional<message> m;
      while (!m) {
        try {
          m = h.wait();
        } catch (const timeout_error&) {
          if (!scheduled) probe(t);
          if (!any_active()) return stats_;
          if (std::chrono::steady_clock::now() - last_message >= options_.idle_timeout) {
            for (int k = 0; k < workers(); ++k) mark_gone(k);
            stats_.last_error = "ps: workers silent for longer than idle_timeout";
            return stats_;
          }
        } catch (const transport_error& e) {
          stats_.last_error = e.what();
          if (scheduled) {
            mark_gone(source - 1);  // that worker cannot send any more
          } else {
            for (int k = 0; k < workers(); ++k) mark_gone(k);  // nobody can
          }
          break;
        }
      }
      if (!m) continue;
      last_message = std::chrono::steady_clock::now();
      if (dispatch(t, std::move(*m)) && scheduled) ++next;
    }
    return stats_;
  }

 private:
  void check_worker(int k) const {
    if (k < 0 || k >= workers())
      throw invalid_argument_error("async_ps_server: worker " + std::to_string(k) + " is outside [0, " +
                                   std::to_string(workers()) + ")");
  }

  // Parse and decode every layer first, then apply: a bad layer changes nothing.
  void apply_layers(const ps_frame_view& f) {
    const auto& L = layers();
    if (f.control.layers != L.layers())
      throw size_mismatch_error("ps push: layers", L.layers(), f.control.layers);
    if (f.control.elements != L.total())
      throw size_mismatch_error("ps push: model elements", L.total(), static_cast<std::size_t>(f.control.elements));
    if constexpr (std::is_same_v<payload_type, sparse_coo_payload>) {
      // Sparse pushes are applied where they are non-zero: O(sent), not O(model).
      sparse_.resize(L.layers());
      for (std::size_t j = 0; j < L.layers(); ++j) {
        sparse_coo_payload p = ps_parse_layer<sparse_coo_payload>(f.layers[j], L.size(j));
        sparse_[j].dense = false;
        sparse_[j].indices = std::move(p.indices);
        sparse_[j].values = std::move(p.values);
      }
      state_.apply_sparse(std::span<const layer_update>(sparse_));  // checks everything before changing anything
    } else {
      decoded_.resize(L.total());
      for (std::size_t j = 0; j < L.layers(); ++j) {
        const payload_type p = ps_parse_layer<payload_type>(f.layers[j], L.size(j));
        decoders_[j].decode(p, L.layer(std::span<float>(decoded_), j));
      }
      state_.apply(std::span<const float>(decoded_));  // checks NaN/Inf before changing anything
    }
  }

  std::vector<std::byte> serialize(int k, model_update& u, std::uint64_t sequence) {
    return ps_detail::serialize_update(builder_, layers(), u, sequence, [&](std::size_t j) {
      return layers().layer(state_.replica(k), j);
    });
  }

  std::vector<std::byte> resync_reply(int k, std::uint64_t sequence) {
    model_update u = state_.resync(k);
    status_[static_cast<std::size_t>(k)] = ps_worker_status::active;
    ++stats_.resyncs;
    return serialize(k, u, sequence);
  }

  ps_handled reject(int k, std::uint64_t sequence, std::optional<ps_kind> kind, ps_reject_reason why,
                    std::string what) {
    ++stats_.rejected;
    stats_.last_error = what;
    ps_handled h;
    h.event = ps_event::rejected;
    h.kind = kind;
    h.error = std::move(what);
    h.reply = ps_detail::serialize_reject(sequence, why);
    stats_.bytes_down[static_cast<std::size_t>(k)] += h.reply.size();
    return h;
  }

  // Handles a received message and sends the reply. True when it used up the
  // sender's schedule entry: anything but a join (a push, a rejected frame, a leave).
  template <Transport T>
  bool dispatch(T& t, message m) {
    const int k = m.source - 1;
    if (k < 0 || k >= workers()) return false;  // not a worker: ignore
    ps_handled h = handle(k, std::span<const std::byte>(m.bytes));
    if (!h.reply.empty()) {
      try {
        ps_detail::send(t, m.source, options_.tag_down, std::move(h.reply));
      } catch (const transport_error& e) {
        ++stats_.send_failures;
        stats_.last_error = e.what();
        mark_gone(k);
      }
    }
    return h.event != ps_event::joined && !(h.event == ps_event::rejected && h.kind == ps_kind::join);
  }

  // After a receive timeout: a receive posted for a silent worker completes at
  // once if that rank is closed (its wait() throws) -> gone. A message that
  // turns up is served.
  template <Transport T>
  void probe(T& t) {
    for (int k = 0; k < workers(); ++k) {
      if (status_[static_cast<std::size_t>(k)] != ps_worker_status::active) continue;
      auto h = t.irecv(k + 1, options_.tag_up);
      bool ready = false;
      try {
        ready = h.test();
      } catch (const transport_error&) {
        mark_gone(k);
        continue;
      }
      if (!ready) continue;
      try {
        message m = h.wait();
        dispatch(t, std::move(m));
      } catch (const transport_error& e) {
        stats_.last_error = e.what();
        mark_gone(k);
      }
    }
  }

  dgs_server_state<Policy> state_;
  async_ps_options options_;
  std::vector<ps_detail::decoder_t<C, Policy>> decoders_;
  std::vector<ps_worker_status> status_;
  std::vector<float> decoded_;
  std::vector<layer_update> sparse_;
  ps_frame_builder builder_;
  ps_server_stats stats_;
};

}  // namespace gradcomp
