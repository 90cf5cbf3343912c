#pragma once
/// \file parameter_server.hpp
/// Parameter-server drivers over any gradcomp::Transport: rank 0 is the
/// server, ranks 1..N are the workers (worker k is rank k+1).
///
///  - Asynchronous (seed 001, DGS, Algorithms 1-3): every worker pushes at its
///    own pace; the server serves pushes in arrival order (or, in the
///    deterministic mode, in a fixed schedule), applies theta <- theta - g
///    (eq. 1) and answers that worker alone with the model difference
///    G = theta - w_k (eq. 3), optionally sparsified again (secondary
///    compression, eq. 6a), or with the dense model (ps_downlink::dense, which
///    with a compressed uplink is MXNet's dist_async with two-bit compression).
///    The uplink is any Codec; the four rows of seed 001 Table 5 are
///    asgd_rule, gd_async_rule, dgc_async_rule and dgs_rule.
///  - Synchronous: every round each worker pushes one payload per layer of any
///    Codec; the server decodes, sums (or averages) in rank order and sends
///    the aggregate back to everyone, dense or re-encoded with a second codec
///    (MXNet dist_sync compresses only worker-to-server).
///
/// The transport-free state machines live in dgs_server.hpp (dgs_server_state,
/// sync_aggregate, ps_uplink); this header adds the messages, the driver
/// loops, failure handling, and async_ps_simulation, a single-threaded
/// deterministic run of the same code without a transport.
///
///     // server (rank 0)                       // worker k (rank k + 1)
///     async_ps_server<sa_momentum<>> server(   async_ps_worker<sa_momentum<>> w(layers, dgs_rule{.ratio_percent = 1});
///         layers, theta0, N, dgs_rule{});      w.join(transport, model);           // dense resync
///     server.serve(transport);                 for (...) { grad = ...(model);
///                                                          w.step(transport, grad, lr, model); }
///                                              w.leave(transport);
///
/// Messages (docs/drivers.md). Every message is one transport message, a
/// *frame*: a control message (wire codec_id::control, body below) followed by
/// `layers` wire messages, one per layer, each a complete wire message with
/// its own header and CRC. Worker-to-server frames use tag `tag_up`,
/// server-to-worker frames `tag_down`.
///
///     control body (32 bytes, little-endian)
///       u8  protocol   0x50 ('P')
///       u8  kind       ps_kind: join, push, leave, update, resync, reject, aggregate
///       u8  detail     reject: ps_reject_reason; aggregate: 1 if this worker's push was rejected; else 0
///       u8  reserved   0
///       u32 layers     layer messages that follow (0 for join, leave, reject)
///       u32 count      aggregate: contributing workers; else 0
///       u32 reserved   0
///       u64 sequence   the worker's request number; a reply echoes it
///       u64 timestamp  async: server time t of the model sent; sync: the round
///     header element_count: the model's element count when layers follow, else 0
///
/// Asynchronous downlink layers are `sparse_coo_payload`s whose values are the
/// server's model values at the sent indices (dgs_server.hpp explains why
/// values and not differences: it makes eq. 5 exact), or `dense_payload`s of the
/// whole layer when that is smaller; a resync is dense. Parsing never trusts
/// the bytes: frames are split with bounds checks, each layer is parsed with
/// wire::parse (CRC, layout, element count = the layer's size).
///
/// Failures. A malformed, mis-shaped or non-finite push is rejected with a
/// typed error (wire::wire_error, size_mismatch_error, non_finite_error) and a
/// `reject` reply, and the server's state is unchanged. A worker whose reply
/// cannot be delivered (it died) is marked gone and the server carries on with
/// the others; a worker that comes back (join, or a push while marked gone)
/// receives a dense resync. A worker that times out waiting for its reply, or
/// receives a malformed one, rejoins (a dense resync) up to `max_rejoins` times.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/dense.hpp>
#include <gradcomp/dgs_server.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/samomentum.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

// ---------------------------------------------------------------------------
// Worker update rules: the four rows of seed 001 Table 5

namespace ps_detail {
/// Layer j's sampling seed under a rule's `seed`: distinct layers draw
/// distinct samples.
inline std::uint64_t layer_seed(std::uint64_t seed, std::size_t layer) noexcept {
  return seed ^ (0x9E3779B97F4A7C15ull * (layer + 1));
}
}  // namespace ps_detail

/// ASGD (Table 5 row 1): the dense gradient eta * grad, no momentum, no
/// sparsification. A factory for ps_uplink: rule(j, n) builds layer j's codec.
template <ExecutionPolicy Policy = execution::seq>
struct asgd_rule {
  using codec_type = dense_codec<Policy>;
  codec_type operator()(std::size_t, std::size_t) const { return {}; }
};

/// GD-async (Table 5, "GD-async / DGS without SAMomentum"): top-R% per layer
/// of the residual r <- r + eta * grad, the rest kept (Alg. 1 lines 6-12).
template <ExecutionPolicy Policy = execution::seq>
struct gd_async_rule {
  using codec_type = sparsifier_with_memory<Policy>;
  double ratio_percent = 1.0;
  threshold_mode mode = threshold_mode::exact;
  std::uint64_t seed = 0;
  codec_type operator()(std::size_t layer, std::size_t n) const {
    sparsifier_options o;
    o.ratio_percent = ratio_percent;
    o.mode = mode;
    o.seed = ps_detail::layer_seed(seed, layer);
    o.scale = 1.0f;  // ps_uplink feeds eta * grad
    return codec_type(n, o);
  }
};

/// DGC-async (Table 5): vanilla momentum with DGC's momentum correction and
/// momentum-factor masking (u <- m u + eta grad, v <- v + u, send top-R% of v,
/// clear u and v where sent).
template <ExecutionPolicy Policy = execution::seq>
struct dgc_async_rule {
  using codec_type = sparsifier_with_memory<Policy>;
  double ratio_percent = 1.0;
  float momentum = 0.7f;
  threshold_mode mode = threshold_mode::exact;
  std::uint64_t seed = 0;
  codec_type operator()(std::size_t layer, std::size_t n) const {
    sparsifier_options o;
    o.ratio_percent = ratio_percent;
    o.mode = mode;
    o.seed = ps_detail::layer_seed(seed, layer);
    o.scale = 1.0f;
    o.dgc_momentum = true;
    o.momentum = momentum;
    return codec_type(n, o);
  }
};

/// DGS (Table 5): SAMomentum (Alg. 3, eqs. 14-15), no residual accumulation.
template <ExecutionPolicy Policy = execution::seq>
struct dgs_rule {
  using codec_type = sa_momentum<Policy>;
  double ratio_percent = 1.0;
  float momentum = 0.7f;
  threshold_mode mode = threshold_mode::exact;
  std::uint64_t seed = 0;
  codec_type operator()(std::size_t layer, std::size_t n) const {
    sa_momentum_options o;
    o.ratio_percent = ratio_percent;
    o.momentum = momentum;
    o.learning_rate = 1.0f;
    o.mode = mode;
    o.seed = ps_detail::layer_seed(seed, layer);
    return codec_type(n, o);
  }
};

// ---------------------------------------------------------------------------
// Control messages and frames

/// Default tags of the parameter-server messages (below MPI's guaranteed
/// MPI_TAG_UB of 32767, apart from the ring's 32000-32001).
inline constexpr int ps_default_tag_up = 31000;
inline constexpr int ps_default_tag_down = 31001;

/// What a control message says.
enum class ps_kind : std::uint8_t {
  join = 1,       ///< worker -> server: (re)join; answered by a dense resync
  push = 2,       ///< worker -> server: one payload per layer follows (async: eta-scaled update; sync: gradient)
  leave = 3,      ///< worker -> server: the worker stops; no answer
  update = 4,     ///< server -> worker (async): the model difference, one payload per layer
  resync = 5,     ///< server -> worker (async): the whole model, dense
  reject = 6,     ///< server -> worker: the request was rejected (detail: ps_reject_reason)
  aggregate = 7,  ///< server -> worker (sync): the round's aggregate, one payload per layer
};

/// Why the server rejected a request.
enum class ps_reject_reason : std::uint8_t {
  malformed = 1,   ///< bytes that do not parse (wire::wire_error)
  bad_shape = 2,   ///< a layer of the wrong size (size_mismatch_error)
  non_finite = 3,  ///< NaN or infinity in the decoded update (non_finite_error)
  protocol = 4,    ///< a message kind the server does not accept
};

/// The control message that starts every parameter-server frame (wire codec_id::control).
struct ps_control {
  static constexpr wire::codec_id wire_codec = wire::codec_id::control;
  static constexpr std::uint8_t protocol_id = 0x50;  ///< 'P': parameter-server control messages
  static constexpr std::size_t body_bytes = 32;

  ps_kind kind = ps_kind::join;
  std::uint8_t detail = 0;     ///< reject: ps_reject_reason; aggregate: 1 if this worker's push was rejected
  std::uint32_t layers = 0;    ///< layer messages that follow
  std::uint32_t count = 0;     ///< aggregate: contributing workers
  std::uint64_t sequence = 0;  ///< the worker's request number (echoed by the reply)
  std::uint64_t timestamp = 0; ///< async: server time t; sync: round
  std::uint64_t elements = 0;  ///< model elements covered by the layers (0 without layers)

  std::uint64_t element_count() const noexcept { return elements; }
  std::size_t body_size() const noexcept { return body_bytes; }
  void write_body(wire::writer& w) const {
    w.put<std::uint8_t>(protocol_id);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(kind));
    w.put<std::uint8_t>(detail);
    w.put<std::uint8_t>(0);
    w.put<std::uint32_t>(layers);
    w.put<std::uint32_t>(count);
    w.put<std::uint32_t>(0);
    w.put<std::uint64_t>(sequence);
    w.put<std::uint64_t>(timestamp);
  }
  static ps_control read_body(wire::reader& r, const wire::header& h) {
    using wire::reader;
    ps_control c;
    reader::check(r.get<std::uint8_t>() == protocol_id, "ps control: not a parameter-server message");
    const auto kind = r.get<std::uint8_t>();
    reader::check(kind >= 1 && kind <= 7, "ps control: unknown message kind");
    c.kind = static_cast<ps_kind>(kind);
    c.detail = r.get<std::uint8_t>();
    reader::check(r.get<std::uint8_t>() == 0, "ps control: reserved byte is not zero");
    c.layers = r.get<std::uint32_t>();
    c.count = r.get<std::uint32_t>();
    reader::check(r.get<std::uint32_t>() == 0, "ps control: reserved word is not zero");
    c.sequence = r.get<std::uint64_t>();
    c.timestamp = r.get<std::uint64_t>();
    c.elements = h.element_count;
    const bool carries = c.kind == ps_kind::push || c.kind == ps_kind::update || c.kind == ps_kind::resync ||
                         c.kind == ps_kind::aggregate;
    if (carries)
      reader::check(c.layers >= 1 && c.elements >= c.layers, "ps control: a payload frame needs non-empty layers");
    else
      reader::check(c.layers == 0 && c.elements == 0, "ps control: this kind carries no layers");
    if (c.kind == ps_kind::reject)
      reader::check(c.detail >= 1 && c.detail <= 4, "ps control: unknown reject reason");
    else if (c.kind == ps_kind::aggregate)
      reader::check(c.detail <= 1, "ps control: aggregate detail must be 0 or 1");
    else
      reader::check(c.detail == 0, "ps control: detail must be 0 for this kind");
    if (c.kind != ps_kind::aggregate) reader::check(c.count == 0, "ps control: count must be 0 for this kind");
    return c;
  }
};

/// Size of the wire message at the front of `bytes` (header plus declared
/// body), checked against the bytes present; the message itself is validated
/// by wire::parse afterwards.
inline std::size_t ps_message_extent(std::span<const std::byte> bytes) {
  if (bytes.size() < wire::header_size)
    wire::reader::fail(wire::wire_errc::truncated, "ps frame: " + std::to_string(bytes.size()) +
                                                       " bytes cannot hold a message header");
  std::uint64_t body = 0;
  std::memcpy(&body, bytes.data() + 20, sizeof body);
  body = wire::detail::to_little(body);
  if (body > bytes.size() - wire::header_size)
    wire::reader::fail(wire::wire_errc::truncated, "ps frame: a message declares " + std::to_string(body) +
                                                       " body bytes, " +
                                                       std::to_string(bytes.size() - wire::header_size) + " remain");
  return wire::header_size + static_cast<std::size_t>(body);
}

/// A frame split into its control message and its layer messages (views into the bytes).
struct ps_frame_view {
  ps_control control;
  std::vector<std::span<const std::byte>> layers;
};

/// Splits and validates a frame's structure: the control message parses, it
/// announces at most `max_layers` layers, the layer messages follow back to
/// back and nothing is left over. Throws wire::wire_error.
inline ps_frame_view ps_split_frame(std::span<const std::byte> bytes, std::size_t max_layers) {
  ps_frame_view f;
  const std::size_t first = ps_message_extent(bytes);
  f.control = wire::parse<ps_control>(bytes.first(first));
  if (f.control.layers > max_layers)
    wire::reader::fail(wire::wire_errc::malformed_body, "ps frame: " + std::to_string(f.control.layers) +
                                                            " layers announced, the model has " +
                                                            std::to_string(max_layers));
  std::size_t pos = first;
  f.layers.reserve(f.control.layers);
  for (std::uint32_t j = 0; j < f.control.layers; ++j) {
    const std::size_t n = ps_message_extent(bytes.subspan(pos));
    f.layers.push_back(bytes.subspan(pos, n));
    pos += n;
  }
  if (pos != bytes.size())
    wire::reader::fail(wire::wire_errc::oversized,
                       "ps frame: " + std::to_string(bytes.size() - pos) + " bytes after the last layer message");
  return f;
}

/// Codec id of a (complete, size-checked) wire message, without validating it.
inline wire::codec_id ps_peek_codec(std::span<const std::byte> message) {
  std::uint16_t id = 0;
  std::memcpy(&id, message.data() + 6, sizeof id);
  return static_cast<wire::codec_id>(wire::detail::to_little(id));
}

/// Parses one layer message as a P of exactly `n` elements (wire_error otherwise).
template <wire::WirePayload P>
P ps_parse_layer(std::span<const std::byte> message, std::size_t n) {
  wire::parse_limits limits;
  limits.max_element_count = n;
  P p = wire::parse<P>(message, limits);
  if (p.element_count() != n)
    wire::reader::fail(wire::wire_errc::malformed_body, "ps frame: a layer of " + std::to_string(p.element_count()) +
                                                            " elements where the model has " + std::to_string(n));
  return p;
}

/// Builds a frame: a control message, then layer messages appended one by one.
class ps_frame_builder {
 public:
  void start(const ps_control& c) {
    frame_.clear();
    append(c);
  }
  template <wire::WirePayload P>
  void append(const P& p) {
    wire::serialize_into(p, tmp_);
    frame_.insert(frame_.end(), tmp_.begin(), tmp_.end());
  }
  /// Appends bytes that are already complete layer messages.
  void append_bytes(std::span<const std::byte> bytes) { frame_.insert(frame_.end(), bytes.begin(), bytes.end()); }
  std::vector<std::byte> take() { return std::exchange(frame_, {}); }

 private:
  std::vector<std::byte> frame_;
  std::vector<std::byte> tmp_;
};

namespace ps_detail {

/// A decode-only stand-in for the sparse codecs: sparse_coo_payload describes
/// itself, so the server needs no codec state (a sparsifier would hold a
/// model-sized residual per layer for nothing).
struct coo_decoder {
  using payload_type = sparse_coo_payload;
  void decode(const payload_type& p, std::span<float> out) const {
    detail::sparse_scatter<false>(p, out, "parameter server: sparse layer");
  }
  void decode_add(const payload_type& p, std::span<float> out) const {
    detail::sparse_scatter<true>(p, out, "parameter server: sparse layer");
  }
};

/// What a server decodes C's payloads with: a stateless stand-in for the
/// self-describing payloads (dense, sparse COO), else C itself.
template <class C, class Policy>
using decoder_t =
    std::conditional_t<std::is_same_v<typename C::payload_type, sparse_coo_payload>, coo_decoder,
                       std::conditional_t<std::is_same_v<typename C::payload_type, dense_payload>, dense_codec<Policy>,
                                          C>>;

template <class C, class Policy>
inline constexpr bool needs_codec_instances = std::is_same_v<decoder_t<C, Policy>, C>;

/// One decoder per layer (built by `make` only when C's payload does not describe itself).
template <class C, class Policy, class MakeCodec>
std::vector<decoder_t<C, Policy>> make_decoders(const layer_partition& layers, MakeCodec& make) {
  std::vector<decoder_t<C, Policy>> d;
  d.reserve(layers.layers());
  for (std::size_t j = 0; j < layers.layers(); ++j) {
    if constexpr (needs_codec_instances<C, Policy>)
      d.push_back(make(j, layers.size(j)));
    else
      d.emplace_back();
  }
  return d;
}

inline ps_control make_control(ps_kind kind, std::uint64_t sequence, std::uint64_t timestamp = 0) {
  ps_control c;
  c.kind = kind;
  c.sequence = sequence;
  c.timestamp = timestamp;
  return c;
}

/// Serialises a model update (async downlink): each sparse layer as a
/// sparse_coo_payload of the server's values, or dense (`dense_layer(j)`) when
/// that is no larger; dense layers as dense_payload.
template <class DenseLayer>
std::vector<std::byte> serialize_update(ps_frame_builder& b, const layer_partition& layers, model_update& u,
                                        std::uint64_t sequence, DenseLayer&& dense_layer) {
  ps_control c = make_control(u.resync ? ps_kind::resync : ps_kind::update, sequence, u.timestamp);
  c.layers = static_cast<std::uint32_t>(layers.layers());
  c.elements = layers.total();
  b.start(c);
  for (std::size_t j = 0; j < layers.layers(); ++j) {
    auto& l = u.layers[j];
    const std::size_t n = layers.size(j);
    if (!l.dense) {
      sparse_coo_payload p;
      p.length = n;
      p.indices = std::move(l.indices);
      p.values = std::move(l.values);
      if (wire::serialized_size(p) < wire::header_size + n * sizeof(float)) {
        b.append(p);
        continue;
      }
      auto src = dense_layer(j);  // the worker's whole layer after this update
      b.append(dense_payload{std::vector<float>(src.begin(), src.end())});
      continue;
    }
    b.append(dense_payload{std::move(l.values)});
  }
  return b.take();
}

inline std::vector<std::byte> serialize_reject(std::uint64_t sequence, ps_reject_reason why) {
  ps_control c = make_control(ps_kind::reject, sequence);
  c.detail = static_cast<std::uint8_t>(why);
  return wire::serialize(c);
}

template <Transport T>
void send(T& t, int dest, int tag, std::vector<std::byte>&& bytes) {
  auto h = t.isend(dest, tag, std::move(bytes));
  h.wait();
}

}  // namespace ps_detail

// ---------------------------------------------------------------------------
// Asynchronous server

/// Status of a worker as the server sees it.
enum class ps_worker_status : std::uint8_t {
  active = 1,  ///< started from theta_0 or joined; its copy w_k is exact
  left = 2,    ///< said leave
  gone = 3,    ///< a reply to it could not be delivered, or it fell silent; a dense resync awaits it
};

/// Options of the asynchronous server.
struct async_ps_options {
  ps_downlink downlink = ps_downlink::model_difference;  ///< what a reply carries (dgs_server.hpp)
  double secondary_ratio = 0.0;  ///< secondary compression R in percent, 0 = off (eq. 6a)
  int tag_up = ps_default_tag_up;
  int tag_down = ps_default_tag_down;
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

/// Counters of a parameter server.
struct ps_server_stats {
  std::uint64_t pushes = 0;    ///< pushes applied
  std::uint64_t rejected = 0;  ///< frames rejected (state unchanged)
  std::uint64_t joins = 0;
  std::uint64_t leaves = 0;
  std::uint64_t resyncs = 0;   ///< dense resyncs sent (joins and pushes from workers marked gone)
  std::uint64_t send_failures = 0;
  std::vector<std::uint64_t> bytes_up;    ///< per worker: frame bytes received
  std::vector<std::uint64_t> bytes_down;  ///< per worker: frame bytes sent
  std::vector<std::uint64_t> pushes_per_worker;
  std::string last_error;
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
    if (options_.tag_up < 0 || options_.tag_down < 0 || options_.tag_up == options_.tag_down)
      throw invalid_argument_error("async_ps_server: tags must be non-negative and distinct");
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
  ps_handled handle(int k, std::span<const std::byte> frame) {
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

// ---------------------------------------------------------------------------
// Asynchronous worker

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

/// Options of an asynchronous worker's transport calls.
struct async_ps_worker_options {
  int server_rank = 0;
  int tag_up = ps_default_tag_up;
  int tag_down = ps_default_tag_down;
  /// Rejoins (dense resyncs) a request may trigger after a reply timed out or
  /// was malformed, before the error is thrown.
  int max_rejoins = 1;
};

/// Counters of a worker.
struct ps_worker_stats {
  std::uint64_t pushes = 0, rejected = 0, resyncs = 0, stale = 0, rejoins = 0;
  std::uint64_t bytes_up = 0, bytes_down = 0;
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
  }

  const layer_partition& layers() const noexcept { return uplink_.layers(); }
  ps_uplink<C, Policy>& uplink() noexcept { return uplink_; }
  const ps_worker_stats& stats() const noexcept { return stats_; }
  /// The number of the latest request.
  std::uint64_t sequence() const noexcept { return sequence_; }

  /// A push frame of lr * gradient through the uplink (the codecs' state
  /// advances). Throws before any state changes for a bad gradient or lr.
  std::vector<std::byte> make_push(std::span<const float> gradient, float lr) {
    uplink_.encode(gradient, lr, payloads_);
    ps_control c = ps_detail::make_control(ps_kind::push, ++sequence_);
    c.layers = static_cast<std::uint32_t>(layers().layers());
    c.elements = layers().total();
    builder_.start(c);
    for (const auto& p : payloads_) builder_.append(p);
    ++stats_.pushes;
    auto f = builder_.take();
    stats_.bytes_up += f.size();
    return f;
  }
  std::vector<std::byte> make_join() { return control_frame(ps_kind::join); }
  std::vector<std::byte> make_leave() { return control_frame(ps_kind::leave); }

  /// Applies a server frame answering the latest request to `model`: update
  /// (assign the sent values), resync (the whole model) or reject (nothing).
  /// A reply to an older request is ignored (stale). Throws wire::wire_error
  /// for a malformed frame, with the model unchanged.
  ps_reply apply_reply(std::span<const std::byte> frame, std::span<float> model) {
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
  ps_reply step(T& t, std::span<const float> gradient, float lr, std::span<float> model) {
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

// ---------------------------------------------------------------------------
// Deterministic single-threaded mode

/// The asynchronous parameter server and N workers in one thread, exchanging
/// the same frames a transport would carry, in the order the caller chooses:
/// step(k, ...) is worker k pushing and pulling (seed 001 Alg. 1/3 at worker
/// k, Alg. 2 at the server). Bit for bit the run of async_ps_server::serve
/// with the same schedule. Workers start from theta_0.
template <Codec C, ExecutionPolicy Policy = execution::seq>
class async_ps_simulation {
 public:
  template <class MakeCodec>
    requires std::invocable<MakeCodec&, std::size_t, std::size_t>
  async_ps_simulation(layer_partition layers, std::span<const float> theta0, int workers, MakeCodec&& make,
                      async_ps_options options = {})
      : server_(layers, theta0, workers, make, std::move(options)) {
    workers_.reserve(static_cast<std::size_t>(workers));
    models_.reserve(static_cast<std::size_t>(workers));
    for (int k = 0; k < workers; ++k) {
      workers_.emplace_back(layers, make);
      models_.emplace_back(theta0.begin(), theta0.end());
    }
  }

  int workers() const noexcept { return server_.workers(); }
  async_ps_server<C, Policy>& server() noexcept { return server_; }
  const async_ps_server<C, Policy>& server() const noexcept { return server_; }
  async_ps_worker<C, Policy>& worker(int k) { return workers_.at(static_cast<std::size_t>(k)); }
  /// Worker k's model theta_k.
  std::span<float> model(int k) { return models_.at(static_cast<std::size_t>(k)); }
  std::span<const float> model(int k) const { return models_.at(static_cast<std::size_t>(k)); }

  /// Worker k pushes lr * gradient (computed by the caller at model(k)) and
  /// applies the server's reply.
  ps_reply step(int k, std::span<const float> gradient, float lr) {
    auto& w = worker(k);
    auto up = w.make_push(gradient, lr);
    ps_handled h = server_.handle(k, std::span<const std::byte>(up));
    return w.apply_reply(std::span<const std::byte>(h.reply), model(k));
  }

  /// Worker k (re)joins: its model becomes the server's.
  ps_reply join(int k) {
    auto& w = worker(k);
    auto up = w.make_join();
    ps_handled h = server_.handle(k, std::span<const std::byte>(up));
    return w.apply_reply(std::span<const std::byte>(h.reply), model(k));
  }

 private:
  async_ps_server<C, Policy> server_;
  std::vector<async_ps_worker<C, Policy>> workers_;
  std::vector<std::vector<float>> models_;
};

// ---------------------------------------------------------------------------
// Synchronous server and worker

/// Options of the synchronous parameter server.
struct sync_ps_options {
  bool average = true;  ///< send the mean of the contributions (else their sum)
  int tag_up = ps_default_tag_up;
  int tag_down = ps_default_tag_down;
};

/// Result of one synchronous exchange, as the worker sees it.
struct ps_sync_result {
  std::uint32_t contributors = 0;  ///< workers whose push is in the aggregate
  bool rejected = false;           ///< this worker's push was rejected (not in the aggregate)
  std::uint64_t round = 0;
};

/// A default factory for a downlink codec that is default-constructible.
template <class D>
struct default_codec_factory {
  D operator()(std::size_t, std::size_t) const { return D{}; }
};

/// The synchronous parameter server: every round, one push (payloads of the
/// uplink codec C) from each active worker, taken in rank order; the decoded
/// sum or mean (sync_aggregate) is sent back to all of them, dense when DownC
/// is dense_codec, else re-encoded once per layer with the server's DownC
/// instance (stateful down codecs keep their state on the server).
template <Codec C, Codec DownC = dense_codec<>, ExecutionPolicy Policy = execution::seq>
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
    if (options_.tag_up < 0 || options_.tag_down < 0 || options_.tag_up == options_.tag_down)
      throw invalid_argument_error("sync_ps_server: tags must be non-negative and distinct");
    if constexpr (!std::is_same_v<DownC, dense_codec<Policy>> && !std::is_same_v<DownC, dense_codec<>>) {
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
  std::vector<std::vector<std::byte>> round(std::span<const std::vector<std::byte>> frames) {
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
        const ps_frame_view f = ps_split_frame(*in[k], layers_.layers());
        sequence[k] = f.control.sequence;
        if (f.control.kind == ps_kind::leave) {
          ++stats_.leaves;
          status_[k] = ps_worker_status::left;
          continue;
        }
        if (f.control.kind != ps_kind::push)
          wire::reader::fail(wire::wire_errc::malformed_body, "ps sync: expected a push or a leave");
        if (f.control.layers != layers_.layers() || f.control.elements != layers_.total())
          throw size_mismatch_error("ps sync push: model elements", layers_.total(),
                                    static_cast<std::size_t>(f.control.elements));
        std::vector<payload_type> ps;
        ps.reserve(layers_.layers());
        scratch_.resize(layers_.total());
        for (std::size_t j = 0; j < layers_.layers(); ++j) {
          ps.push_back(ps_parse_layer<payload_type>(f.layers[j], layers_.size(j)));
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
      if constexpr (std::is_same_v<DownC, dense_codec<Policy>> || std::is_same_v<DownC, dense_codec<>>) {
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

/// A worker of the synchronous server: exchange() pushes a gradient (one
/// payload per layer of C) and overwrites it with the round's aggregate.
template <Codec C, Codec DownC = dense_codec<>, ExecutionPolicy Policy = execution::seq>
class sync_ps_worker {
 public:
  template <class MakeUp, class MakeDown = default_codec_factory<DownC>>
    requires std::invocable<MakeUp&, std::size_t, std::size_t> && std::invocable<MakeDown&, std::size_t, std::size_t>
  sync_ps_worker(layer_partition layers, MakeUp&& make_up, MakeDown&& make_down = {},
                 async_ps_worker_options options = {})
      : uplink_(layers, make_up), down_(ps_detail::make_decoders<DownC, Policy>(uplink_.layers(), make_down)),
        options_(options) {}

  const layer_partition& layers() const noexcept { return uplink_.layers(); }
  ps_uplink<C, Policy>& uplink() noexcept { return uplink_; }
  const ps_worker_stats& stats() const noexcept { return stats_; }

  /// The push frame of `gradient` (the codecs' state advances).
  std::vector<std::byte> make_push(std::span<const float> gradient) {
    uplink_.encode(gradient, 1.0f, payloads_);
    ps_control c = ps_detail::make_control(ps_kind::push, ++sequence_);
    c.layers = static_cast<std::uint32_t>(layers().layers());
    c.elements = layers().total();
    builder_.start(c);
    for (const auto& p : payloads_) builder_.append(p);
    ++stats_.pushes;
    auto f = builder_.take();
    stats_.bytes_up += f.size();
    return f;
  }

  /// Decodes an aggregate frame into `out`. Throws wire::wire_error for a
  /// malformed frame, one answering another request or holding NaN/Inf, and
  /// the decoders' own errors; in every case `out` is unchanged.
  ps_sync_result apply_aggregate(std::span<const std::byte> frame, std::span<float> out) {
    const auto& L = layers();
    L.check("sync_ps_worker::apply_aggregate: out", out.size());
    stats_.bytes_down += frame.size();
    const ps_frame_view f = ps_split_frame(frame, L.layers());
    if (f.control.kind != ps_kind::aggregate)
      wire::reader::fail(wire::wire_errc::malformed_body, "ps sync: expected an aggregate");
    if (f.control.sequence != sequence_)
      wire::reader::fail(wire::wire_errc::malformed_body, "ps sync: the aggregate answers another push");
    if (f.control.layers != L.layers() || f.control.elements != L.total())
      wire::reader::fail(wire::wire_errc::malformed_body, "ps sync: the aggregate does not match the model's layers");
    using P = typename DownC::payload_type;
    std::vector<P> ps;
    ps.reserve(L.layers());
    for (std::size_t j = 0; j < L.layers(); ++j) ps.push_back(ps_parse_layer<P>(f.layers[j], L.size(j)));
    // Decode aside and check, so a bad aggregate leaves `out` untouched.
    decoded_.resize(L.total());
    for (std::size_t j = 0; j < L.layers(); ++j) down_[j].decode(ps[j], L.layer(std::span<float>(decoded_), j));
    if (find_non_finite(Policy{}, std::span<const float>(decoded_)) != decoded_.size())
      wire::reader::fail(wire::wire_errc::malformed_body, "ps sync: non-finite value in the aggregate");
    std::copy(decoded_.begin(), decoded_.end(), out.begin());
    ps_sync_result r;
    r.contributors = f.control.count;
    r.rejected = f.control.detail == 1;
    r.round = f.control.timestamp;
    if (r.rejected) ++stats_.rejected;
    return r;
  }

  /// One synchronous step: push `gradient`, wait for the aggregate, write it
  /// into `gradient`.
  template <Transport T>
  ps_sync_result exchange(T& t, std::span<float> gradient) {
    layers().check("sync_ps_worker::exchange: gradient", gradient.size());
    ps_detail::send(t, options_.server_rank, options_.tag_up, make_push(gradient));
    auto h = t.irecv(options_.server_rank, options_.tag_down);
    message m = h.wait();
    return apply_aggregate(std::span<const std::byte>(m.bytes), gradient);
  }

  template <Transport T>
  void leave(T& t) {
    auto f = wire::serialize(ps_detail::make_control(ps_kind::leave, ++sequence_));
    stats_.bytes_up += f.size();
    ps_detail::send(t, options_.server_rank, options_.tag_up, std::move(f));
  }

 private:
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
