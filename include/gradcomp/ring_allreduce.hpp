#pragma once
/// \file ring_allreduce.hpp
/// Ring all-reduce over any gradcomp::Transport: reduce-scatter, then
/// all-gather, over N segments (GradiVeQ, seed 002, Algorithm 1 with the
/// compression and decompression steps skipped: "the original RAR is a
/// special case of Algorithm 1").
///
///     gradcomp::ring_allreduce(transport, std::span<float>(grad));             // sum
///     gradcomp::ring_allreduce(transport, grad, {.average = true});            // mean
///     gradcomp::ring_allreduce(gradcomp::execution::simd{}, transport, grad);  // kernel backend
///
/// Every rank calls it with the same length. Afterwards every rank holds the
/// element-wise sum (or mean) of all ranks' inputs, bit-identical on every
/// rank: segment j is summed once, in the fixed order
/// ((x_j + x_{j+1}) + x_{j+2}) + ... + x_{j-1} (ranks mod N) along the ring, and
/// the finished values are then copied to everyone.
///
/// Tags: one call uses tags `tag_base` (reduce-scatter) and `tag_base + 1`
/// (all-gather), messages to rank+1 and from rank-1 only. Collectives that
/// may overlap on one transport must use disjoint tag pairs; consecutive calls
/// with the same tags are fine (messages between a pair of ranks with one tag
/// stay in order). The default base, 32000, stays below MPI's guaranteed
/// MPI_TAG_UB (32767).
///
/// Bytes on the wire: each rank sends 2(N-1) segments, about 2(N-1)/N of the
/// vector, as raw floats in native byte order (ranks are assumed homogeneous;
/// codec payloads use wire.hpp instead).
///
/// Copies: over a plain Transport (inproc), which moves whole byte vectors,
/// received buffers are summed into and forwarded as they are, so a rank
/// copies only its first segment of each phase and the all-gather's segments
/// into `data`. Over a ZeroCopyTransport (MPI) it sends from `data` and
/// receives into `data` or two scratch segments: no copies at all.
///
/// Errors: a received segment whose byte length is not the expected one (the
/// ranks disagree on the length) throws transport_error naming both; transport
/// errors (a dead peer, a timeout) propagate. After an error `data` is
/// unspecified.
///
/// Compressed forms (second half of this file; docs/drivers.md):
///
///     ring_allreduce_linear(t, codec, grad)        // LinearCodec: Algorithm 1 of seed 002
///     ring_allreduce_reencode(t, codecs, grad)     // any Codec: decode-add-re-encode at every hop
///     ring_allgather_decode(t, codec, grad)        // any Codec: all-gather payloads, decode and sum
///     ring_allreduce(t, codec, grad)               // linear form for a LinearCodec, else the all-gather
///
/// Each returns a ring_stats (bytes and messages sent, encode/decode/wait
/// times). Every rank ends with bit-identical values: every rank decodes the
/// same aggregated payloads (the same bytes) in the same order.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

/// First of the two tags a ring all-reduce uses by default.
inline constexpr int ring_default_tag_base = 32000;

/// Options of ring_allreduce.
struct ring_options {
  /// Divide the sum by N (the owner of each segment divides before the
  /// all-gather, so the mean is bit-identical on every rank too).
  bool average = false;
  /// The call uses tags tag_base and tag_base + 1.
  int tag_base = ring_default_tag_base;
};

/// The bookkeeping of a ring over N ranks and a vector of `length` elements:
/// the segment bounds and which segment rank r sends and receives at each step.
/// Shared by the plain ring and the compressed forms (Algorithm 1 of seed 002).
///
/// Segment j is [begin(j), begin(j) + size(j)); the first length % N
/// segments hold one element more than the others, so sizes differ by at most
/// one (and are 0 when length < N for the last ones).
///
/// Reduce-scatter, steps s = 0 .. N-2 (Algorithm 1, lines 3-8): rank r sends
/// segment (r - s) mod N to rank r+1 and receives segment (r - s - 1) mod N
/// from rank r-1, which it combines with its own and sends at step s+1. After
/// the last step rank r holds the complete segment owned_segment() = (r + 1) mod N.
///
/// All-gather, steps s = 0 .. N-2 (lines 10-13): rank r sends segment
/// (r + 1 - s) mod N and receives segment (r - s) mod N, which it forwards at
/// step s+1.
class ring_schedule {
 public:
  ring_schedule(int rank, int size, std::size_t length) : rank_(rank), size_(size), length_(length) {
    if (size < 1) throw invalid_argument_error("ring_schedule: size must be >= 1, got " + std::to_string(size));
    if (rank < 0 || rank >= size)
      throw invalid_argument_error("ring_schedule: rank " + std::to_string(rank) + " outside [0, " +
                                   std::to_string(size) + ")");
    base_ = length / static_cast<std::size_t>(size);
    extra_ = length % static_cast<std::size_t>(size);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  std::size_t length() const noexcept { return length_; }
  /// Successor (receives from this rank) and predecessor (sends to it).
  int next() const noexcept { return (rank_ + 1) % size_; }
  int prev() const noexcept { return (rank_ + size_ - 1) % size_; }
  /// Steps per phase: N - 1.
  int steps() const noexcept { return size_ - 1; }

  /// Segment bounds, j in [0, N).
  std::size_t begin(int j) const noexcept {
    const auto u = static_cast<std::size_t>(j);
    return u * base_ + std::min(u, extra_);
  }
  std::size_t size(int j) const noexcept { return base_ + (static_cast<std::size_t>(j) < extra_ ? 1 : 0); }
  std::size_t end(int j) const noexcept { return begin(j) + size(j); }
  template <class T>
  std::span<T> segment(std::span<T> data, int j) const noexcept {
    return data.subspan(begin(j), size(j));
  }

  /// Reduce-scatter: segment sent / received by this rank at step s.
  int reduce_scatter_send(int s) const noexcept { return mod(rank_ - s); }
  int reduce_scatter_recv(int s) const noexcept { return mod(rank_ - s - 1); }
  /// The segment this rank holds complete after the reduce-scatter.
  int owned_segment() const noexcept { return mod(rank_ + 1); }
  /// All-gather: segment sent / received by this rank at step s.
  int all_gather_send(int s) const noexcept { return mod(rank_ + 1 - s); }
  int all_gather_recv(int s) const noexcept { return mod(rank_ - s); }

 private:
  int mod(int x) const noexcept { return ((x % size_) + size_) % size_; }
  int rank_;
  int size_;
  std::size_t length_;
  std::size_t base_ = 0;
  std::size_t extra_ = 0;
};

namespace detail {

/// Bytes of a float span, copied into a new buffer (no zero-fill first).
inline std::vector<std::byte> ring_bytes_of(std::span<const float> x) {
  const auto* p = reinterpret_cast<const std::byte*>(x.data());
  return std::vector<std::byte>(p, p + x.size_bytes());
}

/// Throws transport_error unless a received segment has the expected length.
inline void ring_check_length(std::size_t got_bytes, std::size_t expected_floats, int self, int source, int segment,
                              const char* phase, int step) {
  const std::size_t expected = expected_floats * sizeof(float);
  if (got_bytes != expected)
    throw transport_error("ring_allreduce: rank " + std::to_string(self) + " expected " + std::to_string(expected) +
                          " bytes for segment " + std::to_string(segment) + " from rank " + std::to_string(source) +
                          " (" + phase + " step " + std::to_string(step) + "), got " + std::to_string(got_bytes) +
                          " (do all ranks pass the same length?)");
}

/// True when a byte buffer can be viewed as floats in place. Vector storage
/// comes from operator new, so this holds in practice; callers copy otherwise.
inline bool ring_float_aligned(const std::vector<std::byte>& b) noexcept {
  return reinterpret_cast<std::uintptr_t>(b.data()) % alignof(float) == 0;
}

inline std::span<float> ring_as_floats(std::vector<std::byte>& b) noexcept {
  return {reinterpret_cast<float*>(b.data()), b.size() / sizeof(float)};
}

inline void ring_copy_out(const std::vector<std::byte>& from, std::span<float> to) noexcept {
  if (!to.empty()) std::memcpy(to.data(), from.data(), to.size_bytes());
}

}  // namespace detail

namespace detail {

/// Throws invalid_argument_error unless tags tag_base and tag_base + 1 are valid.
inline void ring_check_tags(const ring_options& options, const char* who) {
  if (options.tag_base < 0 || options.tag_base > std::numeric_limits<int>::max() - 1)
    throw invalid_argument_error(std::string(who) + ": tag_base " + std::to_string(options.tag_base) +
                                 " leaves no room for tags tag_base and tag_base + 1");
}

/// Divides the owned segment by N (options.average) before it is distributed.
inline void ring_average(std::span<float> owned, int n) noexcept {
  const float divisor = static_cast<float>(n);
  for (float& v : owned) v /= divisor;
}

/// The ring over a plain Transport, which moves whole byte vectors (inproc):
/// received buffers are summed into and forwarded, so the only copies are the
/// first send of each phase and the all-gather's copy into `data`.
template <class Policy, class T>
void ring_allreduce_moving(T& t, std::span<float> data, const ring_schedule& ring, const ring_options& options) {
  const int self = ring.rank(), next = ring.next(), prev = ring.prev(), steps = ring.steps();
  const int tag_rs = options.tag_base, tag_ag = options.tag_base + 1;
  using recv_handle = decltype(t.irecv(prev, tag_rs));
  using send_handle = decltype(t.isend(next, tag_rs, std::vector<std::byte>{}));

  // Post every receive up front: they match the predecessor's messages in
  // order, so each arriving segment lands straight in its handle.
  std::vector<recv_handle> rs_recv, ag_recv;
  rs_recv.reserve(static_cast<std::size_t>(steps));
  ag_recv.reserve(static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) rs_recv.push_back(t.irecv(prev, tag_rs));
  for (int s = 0; s < steps; ++s) ag_recv.push_back(t.irecv(prev, tag_ag));
  std::vector<send_handle> sends;
  sends.reserve(static_cast<std::size_t>(2 * steps));

  // Reduce-scatter. Step 0 sends a copy of the own segment; later steps add
  // the own segment into the received buffer and forward that buffer (moved:
  // no copy). The last step adds into `data` instead, completing the owned segment.
  sends.push_back(t.isend(next, tag_rs, ring_bytes_of(ring.segment<float>(data, ring.reduce_scatter_send(0)))));
  std::vector<std::byte> spare;  // the last received buffer, reused for the all-gather's first send
  std::vector<float> unaligned;  // only used if a buffer is not float-aligned
  for (int s = 0; s < steps; ++s) {
    const int k = ring.reduce_scatter_recv(s);
    message m = rs_recv[static_cast<std::size_t>(s)].wait();
    ring_check_length(m.bytes.size(), ring.size(k), self, m.source, k, "reduce-scatter", s);
    const std::span<float> own = ring.segment<float>(data, k);
    const bool last = s + 1 == steps;
    if (ring_float_aligned(m.bytes)) {
      const std::span<float> received = ring_as_floats(m.bytes);
      if (last)
        add_into(Policy{}, own, std::span<const float>(received));
      else
        add_into(Policy{}, received, std::span<const float>(own));  // IEEE addition commutes: same bits
    } else {
      unaligned.resize(own.size());
      ring_copy_out(m.bytes, unaligned);
      if (last) {
        add_into(Policy{}, own, std::span<const float>(unaligned));
      } else {
        add_into(Policy{}, std::span<float>(unaligned), std::span<const float>(own));
        if (!unaligned.empty()) std::memcpy(m.bytes.data(), unaligned.data(), m.bytes.size());
      }
    }
    if (last)
      spare = std::move(m.bytes);
    else
      sends.push_back(t.isend(next, tag_rs, std::move(m.bytes)));
  }

  const std::span<float> mine = ring.segment<float>(data, ring.owned_segment());
  if (options.average) ring_average(mine, ring.size());

  // All-gather. The first send reuses the last reduce-scatter buffer (same
  // segment, same size); each received segment is copied into `data` and
  // the same buffer forwarded.
  if (!mine.empty()) std::memcpy(spare.data(), mine.data(), mine.size_bytes());
  sends.push_back(t.isend(next, tag_ag, std::move(spare)));
  for (int s = 0; s < steps; ++s) {
    const int k = ring.all_gather_recv(s);
    message m = ag_recv[static_cast<std::size_t>(s)].wait();
    ring_check_length(m.bytes.size(), ring.size(k), self, m.source, k, "all-gather", s);
    ring_copy_out(m.bytes, ring.segment<float>(data, k));
    if (s + 1 < steps) sends.push_back(t.isend(next, tag_ag, std::move(m.bytes)));
  }
  for (auto& h : sends) h.wait();
}

/// The ring over a ZeroCopyTransport (MPI): sends straight from `data`,
/// reduce-scatter receives into two alternating scratch segments (the next
/// receive is posted before the current one is added), all-gather receives
/// straight into `data`. No copies, two segment-sized allocations.
template <class Policy, class T>
void ring_allreduce_zero_copy(T& t, std::span<float> data, const ring_schedule& ring, const ring_options& options) {
  const int self = ring.rank(), next = ring.next(), prev = ring.prev(), steps = ring.steps();
  const int tag_rs = options.tag_base, tag_ag = options.tag_base + 1;
  auto bytes = [](std::span<float> x) { return std::as_writable_bytes(x); };
  auto cbytes = [](std::span<float> x) { return std::as_bytes(x); };
  using recv_handle = decltype(t.irecv_into(prev, tag_rs, std::span<std::byte>{}));
  using send_handle = decltype(t.isend_view(next, tag_rs, std::span<const std::byte>{}));

  // Declared before the handles: a pending handle may still use them when destroyed.
  std::vector<float> scratch[2];
  scratch[0].resize(ring.size(0));  // segment 0 is a largest one
  scratch[1].resize(steps > 1 ? ring.size(0) : 0);
  std::vector<send_handle> sends;
  sends.reserve(static_cast<std::size_t>(steps));
  std::vector<recv_handle> recvs;
  recvs.reserve(static_cast<std::size_t>(steps));

  // Reduce-scatter: data[k] += received, then data[k] is sent on. Every
  // segment but the owned one is overwritten by the all-gather afterwards.
  recvs.push_back(t.irecv_into(prev, tag_rs, bytes(scratch[0])));
  sends.push_back(t.isend_view(next, tag_rs, cbytes(ring.segment<float>(data, ring.reduce_scatter_send(0)))));
  for (int s = 0; s < steps; ++s) {
    if (s + 1 < steps) recvs.push_back(t.irecv_into(prev, tag_rs, bytes(scratch[(s + 1) % 2])));
    const int k = ring.reduce_scatter_recv(s);
    const std::size_t got = recvs[static_cast<std::size_t>(s)].wait();
    ring_check_length(got, ring.size(k), self, prev, k, "reduce-scatter", s);
    const std::span<float> own = ring.segment<float>(data, k);
    add_into(Policy{}, own, std::span<const float>(scratch[s % 2].data(), own.size()));
    if (s + 1 < steps) sends.push_back(t.isend_view(next, tag_rs, cbytes(own)));
  }
  // The all-gather receives into segments sent above: those sends must be done.
  for (auto& h : sends) h.wait();
  sends.clear();
  recvs.clear();

  const std::span<float> mine = ring.segment<float>(data, ring.owned_segment());
  if (options.average) ring_average(mine, ring.size());

  // All-gather: receive each segment into place, forward it from there.
  for (int s = 0; s < steps; ++s)
    recvs.push_back(t.irecv_into(prev, tag_ag, bytes(ring.segment<float>(data, ring.all_gather_recv(s)))));
  sends.push_back(t.isend_view(next, tag_ag, cbytes(mine)));
  for (int s = 0; s < steps; ++s) {
    const int k = ring.all_gather_recv(s);
    const std::size_t got = recvs[static_cast<std::size_t>(s)].wait();
    ring_check_length(got, ring.size(k), self, prev, k, "all-gather", s);
    if (s + 1 < steps) sends.push_back(t.isend_view(next, tag_ag, cbytes(ring.segment<float>(data, k))));
  }
  for (auto& h : sends) h.wait();
}

}  // namespace detail

/// Sums (or averages, options.average) `data` in place across all ranks of `t`
/// with a ring all-reduce; additions use add_into(Policy{}, ...) from the
/// policy's kernels. A ZeroCopyTransport (MPI) sends from and receives into
/// `data` directly; other transports move byte vectors (see the detail
/// functions). See the file comment for the algorithm, tags and errors.
template <ExecutionPolicy Policy, Transport T>
void ring_allreduce(Policy, T& t, std::span<float> data, const ring_options& options = {}) {
  detail::ring_check_tags(options, "ring_allreduce");
  const ring_schedule ring(static_cast<int>(t.rank()), static_cast<int>(t.size()), data.size());
  if (ring.size() == 1) return;  // the sum (and the mean) of one vector is itself
  if constexpr (ZeroCopyTransport<T>)
    detail::ring_allreduce_zero_copy<Policy>(t, data, ring, options);
  else
    detail::ring_allreduce_moving<Policy>(t, data, ring, options);
}

/// ring_allreduce with the generic (execution::seq) kernels.
template <Transport T>
void ring_allreduce(T& t, std::span<float> data, const ring_options& options = {}) {
  ring_allreduce(execution::seq{}, t, data, options);
}

// ===========================================================================
// Compressed forms: Algorithm 1 of seed 002 for a LinearCodec, and the two
// fair baselines for any other codec (decode-add-re-encode at every hop, and
// all-gather of payloads with local decode-and-sum). docs/drivers.md.

/// What one rank did in one call of a compressed ring form. Bytes count the
/// serialized messages (wire headers included) this rank handed to isend,
/// i.e. what its outgoing link carries.
struct ring_stats {
  std::size_t bytes_sent = 0;         ///< bytes this rank sent
  std::size_t messages_sent = 0;      ///< messages this rank sent (2(N-1) in the ring forms, N-1 in the all-gather)
  std::size_t bytes_received = 0;     ///< bytes this rank received
  std::size_t own_encoded_bytes = 0;  ///< encoded_bytes() of the encodes of this rank's own input: its compressed vector
  std::size_t encodes = 0;            ///< codec encode calls
  std::size_t decodes = 0;            ///< codec decode / decode_add calls
  double encode_seconds = 0.0;        ///< time in encode
  double decode_seconds = 0.0;        ///< time in decode / decode_add (and options.average's division)
  double combine_seconds = 0.0;       ///< time in accumulate / additions, serialize and parse
  double wait_seconds = 0.0;          ///< time blocked on receives, and on the last sends at the end
  double seconds = 0.0;               ///< the whole call
};

/// A codec that cuts its vector into ring segments on its own granularity
/// and encodes one segment at its offset (GradiVeQ's linear_compressor:
/// segments of whole slices, eq. 3 on the slices of the segment only).
template <class C>
concept SegmentedCodec = Codec<C> && requires(const C& cc, C& c, std::size_t parts, std::size_t offset,
                                              std::span<const float> segment, typename C::payload_type& p) {
  { cc.segment_bounds(parts) } -> std::convertible_to<std::vector<std::size_t>>;
  c.encode_segment(offset, segment, p);
};

/// The customization point of ring_allreduce_linear: where the N segments of
/// a codec's vector begin, how one segment is encoded, and how a received
/// payload is checked against the segment it arrives for.
///
/// Default: a SegmentedCodec is asked (segment_bounds(N), encode_segment);
/// any other codec gets ring_schedule's equal float segments and encode() of
/// the segment. A payload type with an `offset` member (gradiveq_payload)
/// must carry the offset of the segment it arrives for. Specialise this
/// template for a codec that needs other boundaries.
template <class C>
struct ring_segmentation {
  /// parts + 1 non-decreasing offsets from 0 to `length`.
  static std::vector<std::size_t> bounds(const C& codec, std::size_t length, int parts) {
    if constexpr (SegmentedCodec<C>) {
      return codec.segment_bounds(static_cast<std::size_t>(parts));
    } else {
      const ring_schedule ring(0, parts, length);
      std::vector<std::size_t> b(static_cast<std::size_t>(parts) + 1);
      for (int j = 0; j < parts; ++j) b[static_cast<std::size_t>(j)] = ring.begin(j);
      b.back() = length;
      return b;
    }
  }
  /// Encodes the segment starting at element `offset` (`codec` is a C or a const C).
  template <class Self>
  static void encode(Self& codec, std::size_t offset, std::span<const float> segment, typename C::payload_type& out) {
    if constexpr (SegmentedCodec<C>) {
      codec.encode_segment(offset, segment, out);
    } else {
      (void)offset;
      codec.encode(segment, out);
    }
  }
  /// Throws size_mismatch_error when a received payload says it belongs to another segment.
  static void check(const typename C::payload_type& p, std::size_t offset, const std::string& where) {
    if constexpr (requires(const typename C::payload_type& q) {
                    { q.offset } -> std::convertible_to<std::uint64_t>;
                  }) {
      if (static_cast<std::uint64_t>(p.offset) != static_cast<std::uint64_t>(offset))
        throw size_mismatch_error(where + ": payload for another segment (offset)", offset,
                                  static_cast<std::size_t>(p.offset));
    } else {
      (void)p;
      (void)offset;
      (void)where;
    }
  }
};

/// The default "own encode" observer of ring_allreduce_linear: does nothing.
struct ring_no_observer {
  template <class... A>
  void operator()(A&&...) const noexcept {}
};

/// Upper bound on the body of one non-linear payload of `elements` floats
/// that the re-encode and all-gather forms accept before parsing (16 bytes
/// per element plus 4 KiB: above every codec of the library, dense included;
/// parsing is bounded by the received bytes anyway).
inline constexpr std::size_t ring_payload_body_limit(std::size_t elements) noexcept {
  return elements > (std::numeric_limits<std::size_t>::max() - 4096) / 16 ? std::numeric_limits<std::size_t>::max()
                                                                          : 16 * elements + 4096;
}

/// One codec per ring segment of a vector of `length` floats over `size`
/// ranks, for ring_allreduce_reencode: element j is make(j, length of segment j).
template <class Make>
auto make_ring_codecs(int size, std::size_t length, Make&& make) {
  const ring_schedule ring(0, size, length);
  using codec_type = std::remove_cvref_t<decltype(make(0, std::size_t{}))>;
  std::vector<codec_type> out;
  out.reserve(static_cast<std::size_t>(size));
  for (int j = 0; j < size; ++j) out.push_back(make(j, ring.size(j)));
  return out;
}

namespace detail {

using ring_clock = std::chrono::steady_clock;

/// Runs f, adding the seconds it takes to `acc`.
template <class F>
void ring_timed(double& acc, F&& f) {
  const auto t0 = ring_clock::now();
  std::forward<F>(f)();
  acc += std::chrono::duration<double>(ring_clock::now() - t0).count();
}

inline double ring_seconds_since(ring_clock::time_point t0) {
  return std::chrono::duration<double>(ring_clock::now() - t0).count();
}

/// Validates a codec's segment bounds against the vector and the ring.
inline std::vector<std::size_t> ring_checked_bounds(std::vector<std::size_t> b, std::size_t length, int parts,
                                                    const char* who) {
  if (b.size() != static_cast<std::size_t>(parts) + 1)
    throw invalid_argument_error(std::string(who) + ": the codec gave " + std::to_string(b.size()) +
                                 " segment bounds for " + std::to_string(parts) + " segments");
  if (b.back() != length)
    throw size_mismatch_error(std::string(who) + ": the codec's vector length vs the data", b.back(), length);
  if (b.front() != 0 || !std::is_sorted(b.begin(), b.end()))
    throw invalid_argument_error(std::string(who) + ": the codec's segment bounds must rise from 0 to the length");
  return b;
}

/// Throws invalid_argument_error when a codec that knows how many payloads
/// its aggregate sums (GradiVeQ's N of eq. 3) was configured for another N.
template <class C>
void ring_check_summands(const C& codec, int n, const char* who) {
  if constexpr (requires(const C& c) {
                  { c.summands() } -> std::convertible_to<std::size_t>;
                }) {
    if (static_cast<std::size_t>(codec.summands()) != static_cast<std::size_t>(n))
      throw invalid_argument_error(std::string(who) + ": the codec is configured for " +
                                   std::to_string(codec.summands()) + " summands but the ring has " +
                                   std::to_string(n) + " ranks (set_summands(N))");
  } else {
    (void)codec;
    (void)n;
    (void)who;
  }
}

inline std::string ring_where(const char* who, int self, int segment, int source, const char* phase, int step) {
  return std::string(who) + ": rank " + std::to_string(self) + ", segment " + std::to_string(segment) +
         " from rank " + std::to_string(source) + " (" + phase + " step " + std::to_string(step) + ")";
}

/// Parses a received payload of `elements` floats with wire limits derived
/// from it (element count, body at most `max_body`); the element count must
/// be exact (size_mismatch_error), bad bytes are a wire_error naming the segment.
template <class P>
P ring_parse(const message& m, std::size_t elements, std::size_t max_body, const std::string& where) {
  wire::parse_limits limits;
  limits.max_element_count = elements;
  limits.max_body_length = max_body;
  P p = [&] {
    try {
      return wire::parse<P>(m.bytes, limits);
    } catch (const wire::wire_error& e) {
      throw wire::wire_error(e.code(), where + ": " + e.what());
    }
  }();
  if (static_cast<std::uint64_t>(p.element_count()) != static_cast<std::uint64_t>(elements))
    throw size_mismatch_error(where + ": payload length", elements, static_cast<std::size_t>(p.element_count()));
  return p;
}

/// Sends, receives and counts for one compressed ring call over a transport
/// that moves byte vectors (every Transport has isend/irecv).
template <class T>
class ring_channel {
 public:
  using recv_handle = decltype(std::declval<T&>().irecv(0, 0));
  using send_handle = decltype(std::declval<T&>().isend(0, 0, std::vector<std::byte>{}));

  ring_channel(T& t, int next, int prev, ring_stats& stats) : t_(t), next_(next), prev_(prev), stats_(stats) {}

  /// Posts `count` receives from the predecessor with `tag` (they match its messages in order).
  std::vector<recv_handle> post(int tag, int count) {
    std::vector<recv_handle> h;
    h.reserve(static_cast<std::size_t>(count));
    for (int s = 0; s < count; ++s) h.push_back(t_.irecv(prev_, tag));
    return h;
  }
  void send(int tag, std::vector<std::byte>&& bytes) {
    stats_.bytes_sent += bytes.size();
    ++stats_.messages_sent;
    sends_.push_back(t_.isend(next_, tag, std::move(bytes)));
  }
  message wait(recv_handle& h) {
    message m;
    ring_timed(stats_.wait_seconds, [&] { m = h.wait(); });
    stats_.bytes_received += m.bytes.size();
    return m;
  }
  void finish() {
    ring_timed(stats_.wait_seconds, [&] {
      for (auto& h : sends_) h.wait();
    });
    sends_.clear();
  }
  /// Serialises a payload (combine time) into `reuse`, whose capacity is
  /// kept (a received buffer of the same size: no allocation).
  template <class P>
  std::vector<std::byte> serialize(const P& p, std::vector<std::byte>&& reuse = {}) {
    std::vector<std::byte> b = std::move(reuse);
    ring_timed(stats_.combine_seconds, [&] { wire::serialize_into(p, b); });
    return b;
  }

 private:
  T& t_;
  int next_, prev_;
  ring_stats& stats_;
  std::vector<send_handle> sends_;
};

/// The all-gather phase of the reducing rings (Algorithm 1 lines 10-13 of
/// seed 002): `owned`, this rank's complete compressed segment, goes round the
/// ring; each received segment is forwarded as received (the same bytes) and
/// decoded while the next one is on the wire. `receive(handle, segment,
/// phase, step)` waits and parses (a (message, payload) pair),
/// `decode_segment(payload, segment)` decodes; ends with every send completed.
template <class T, class Payload, class Handles, class Receive, class DecodeSegment>
void ring_all_gather_phase(ring_channel<T>& ch, const ring_schedule& ring, int tag, Handles& recv,
                           const Payload& owned, Receive& receive, DecodeSegment& decode_segment) {
  const int steps = ring.steps();
  ch.send(tag, ch.serialize(owned));
  decode_segment(owned, ring.owned_segment());
  for (int s = 0; s < steps; ++s) {
    const int k = ring.all_gather_recv(s);
    auto got = receive(recv[static_cast<std::size_t>(s)], k, "all-gather", s);
    if (s + 1 < steps) ch.send(tag, std::move(got.first.bytes));
    decode_segment(got.second, k);
  }
  ch.finish();
}

/// Algorithm 1 of seed 002 (see ring_allreduce_linear).
template <class Policy, class T, class C, class OnEncode>
ring_stats ring_linear_impl(T& t, C& codec, std::span<float> data, const ring_options& options, OnEncode& on_encode) {
  using payload = typename std::remove_const_t<C>::payload_type;
  using seg = ring_segmentation<std::remove_const_t<C>>;
  constexpr const char* who = "ring_allreduce_linear";
  const auto started = ring_clock::now();
  ring_stats st;
  ring_check_tags(options, who);
  const ring_schedule ring(static_cast<int>(t.rank()), static_cast<int>(t.size()), data.size());
  const int n = ring.size(), self = ring.rank(), steps = ring.steps();
  ring_check_summands(codec, n, who);
  const std::vector<std::size_t> bounds = ring_checked_bounds(seg::bounds(std::as_const(codec), data.size(), n),
                                                              data.size(), n, who);
  auto segment = [&](int j) {
    const auto u = static_cast<std::size_t>(j);
    return data.subspan(bounds[u], bounds[u + 1] - bounds[u]);
  };
  std::vector<std::size_t> body(static_cast<std::size_t>(n), 0);  // body size of this rank's payload of each segment
  payload own;
  // Eq. 3 on this rank's segment j; every segment is encoded exactly once.
  auto encode_own = [&](int j) {
    const auto u = static_cast<std::size_t>(j);
    ring_timed(st.encode_seconds, [&] { seg::encode(codec, bounds[u], std::span<const float>(segment(j)), own); });
    ++st.encodes;
    body[u] = own.body_size();
    st.own_encoded_bytes += codec.encoded_bytes(own);
    on_encode(j, std::span<const float>(segment(j)), std::as_const(own));
  };
  // Eq. 5 into segment j (then the mean, when asked: the same operation on the same bits everywhere).
  auto decode_segment = [&](const payload& p, int j) {
    ring_timed(st.decode_seconds, [&] {
      codec.decode(p, segment(j));
      if (options.average) ring_average(segment(j), n);
    });
    ++st.decodes;
  };
  if (n == 1) {
    encode_own(0);
    decode_segment(own, 0);
    st.seconds = ring_seconds_since(started);
    return st;
  }

  const int tag_rs = options.tag_base, tag_ag = options.tag_base + 1;
  ring_channel<T> ch(t, ring.next(), ring.prev(), st);
  auto rs_recv = ch.post(tag_rs, steps);
  auto ag_recv = ch.post(tag_ag, steps);
  auto receive = [&](auto& handle, int k, const char* phase, int s) {
    message m = ch.wait(handle);
    const auto u = static_cast<std::size_t>(k);
    const std::string where = ring_where(who, self, k, m.source, phase, s);
    payload p;
    ring_timed(st.combine_seconds, [&] {
      // A linear codec's sum has the shape of one payload (eq. 4): the body
      // can be no larger than this rank's own payload of the segment.
      p = ring_parse<payload>(m, bounds[u + 1] - bounds[u], body[u], where);
      seg::check(p, bounds[u], where);
    });
    return std::pair<message, payload>(std::move(m), std::move(p));
  };

  // Line 3: compress segment r and send it.
  encode_own(ring.reduce_scatter_send(0));
  ch.send(tag_rs, ch.serialize(own));
  // Lines 4-8: the segment of step s is compressed before its predecessor's
  // sum is waited for, so compression overlaps the transfer (Fig. 2b); the
  // two are summed in the compressed domain (eq. 4) and forwarded.
  encode_own(ring.reduce_scatter_recv(0));
  payload owned;
  for (int s = 0; s < steps; ++s) {
    const int k = ring.reduce_scatter_recv(s);
    auto got = receive(rs_recv[static_cast<std::size_t>(s)], k, "reduce-scatter", s);
    payload& in = got.second;
    ring_timed(st.combine_seconds, [&] { codec.accumulate(in, own); });
    if (s + 1 < steps) {
      ch.send(tag_rs, ch.serialize(in, std::move(got.first.bytes)));  // the sum has the received size
      encode_own(ring.reduce_scatter_recv(s + 1));  // while the sum just sent and the next one travel
    } else {
      owned = std::move(in);  // line 9: the complete compressed segment r+1
    }
  }
  // Lines 10-13.
  ring_all_gather_phase(ch, ring, tag_ag, ag_recv, owned, receive, decode_segment);
  st.seconds = ring_seconds_since(started);
  return st;
}

/// Decode-add-re-encode at every hop (see ring_allreduce_reencode).
template <class Policy, class T, class C>
ring_stats ring_reencode_impl(T& t, std::span<C> codecs, std::span<float> data, const ring_options& options) {
  using payload = typename C::payload_type;
  constexpr const char* who = "ring_allreduce_reencode";
  const auto started = ring_clock::now();
  ring_stats st;
  ring_check_tags(options, who);
  const ring_schedule ring(static_cast<int>(t.rank()), static_cast<int>(t.size()), data.size());
  const int n = ring.size(), self = ring.rank(), steps = ring.steps();
  if (codecs.size() != 1 && codecs.size() != static_cast<std::size_t>(n))
    throw invalid_argument_error(std::string(who) + ": needs one codec per segment (" + std::to_string(n) +
                                 ") or a single codec for all, got " + std::to_string(codecs.size()));
  auto codec_for = [&](int j) -> C& { return codecs[codecs.size() == 1 ? 0 : static_cast<std::size_t>(j)]; };
  auto segment = [&](int j) { return ring.segment<float>(data, j); };
  auto encode = [&](int j, std::span<const float> x, payload& p) {
    ring_timed(st.encode_seconds, [&] { codec_for(j).encode(x, p); });
    ++st.encodes;
  };
  auto decode_segment = [&](const payload& p, int j) {
    ring_timed(st.decode_seconds, [&] {
      codec_for(j).decode(p, segment(j));
      if (options.average) ring_average(segment(j), n);
    });
    ++st.decodes;
  };
  payload p;
  if (n == 1) {
    encode(0, data, p);
    st.own_encoded_bytes = codec_for(0).encoded_bytes(p);
    decode_segment(p, 0);
    st.seconds = ring_seconds_since(started);
    return st;
  }

  const int tag_rs = options.tag_base, tag_ag = options.tag_base + 1;
  ring_channel<T> ch(t, ring.next(), ring.prev(), st);
  auto rs_recv = ch.post(tag_rs, steps);
  auto ag_recv = ch.post(tag_ag, steps);
  auto receive = [&](auto& handle, int k, const char* phase, int s) {
    message m = ch.wait(handle);
    const std::size_t len = ring.size(k);
    payload in;
    ring_timed(st.combine_seconds, [&] {
      in = ring_parse<payload>(m, len, ring_payload_body_limit(len), ring_where(who, self, k, m.source, phase, s));
    });
    return std::pair<message, payload>(std::move(m), std::move(in));
  };

  // Step 0 encodes this rank's own segment: the only encode of its raw data.
  const int first = ring.reduce_scatter_send(0);
  encode(first, segment(first), p);
  st.own_encoded_bytes = codec_for(first).encoded_bytes(p);
  ch.send(tag_rs, ch.serialize(p));
  // Each hop: decode the partial sum, add the own segment, re-encode, forward
  // (decode, add and encode cannot start before the segment has arrived:
  // Fig. 2a). The last hop encodes the complete segment once more: that
  // payload is what every rank decodes.
  std::vector<float> partial;
  payload owned;
  for (int s = 0; s < steps; ++s) {
    const int k = ring.reduce_scatter_recv(s);
    auto got = receive(rs_recv[static_cast<std::size_t>(s)], k, "reduce-scatter", s);
    payload& in = got.second;
    partial.resize(ring.size(k));
    ring_timed(st.decode_seconds, [&] { codec_for(k).decode(in, std::span<float>(partial)); });
    ++st.decodes;
    ring_timed(st.combine_seconds,
               [&] { add_into(Policy{}, std::span<float>(partial), std::span<const float>(segment(k))); });
    if (s + 1 < steps) {
      encode(k, partial, p);
      ch.send(tag_rs, ch.serialize(p, std::move(got.first.bytes)));
    } else {
      encode(k, partial, owned);
    }
  }
  ring_all_gather_phase(ch, ring, tag_ag, ag_recv, owned, receive, decode_segment);
  st.seconds = ring_seconds_since(started);
  return st;
}

/// All-gather of whole-vector payloads with decode-and-sum (see ring_allgather_decode).
template <class Policy, class T, class C>
ring_stats ring_allgather_impl(T& t, C& codec, std::span<float> data, const ring_options& options) {
  using payload = typename C::payload_type;
  constexpr const char* who = "ring_allgather_decode";
  const auto started = ring_clock::now();
  ring_stats st;
  ring_check_tags(options, who);
  const ring_schedule ring(static_cast<int>(t.rank()), static_cast<int>(t.size()), data.size());
  const int n = ring.size(), self = ring.rank(), steps = ring.steps();

  payload own;
  ring_timed(st.encode_seconds, [&] { codec.encode(std::span<const float>(data), own); });
  ++st.encodes;
  st.own_encoded_bytes = codec.encoded_bytes(own);

  // Decode-and-sum in rank order 0, 1, ..., N-1 on every rank (float
  // addition is not associative: one order keeps the ranks bit-identical),
  // as far as the payloads have arrived; `data` is free once encoded.
  std::vector<std::optional<payload>> have(static_cast<std::size_t>(n));
  std::vector<float> scratch;
  int next_decode = 0;
  auto drain = [&] {
    while (next_decode < n && have[static_cast<std::size_t>(next_decode)]) {
      const payload& p = *have[static_cast<std::size_t>(next_decode)];
      ring_timed(st.decode_seconds, [&] {
        if (next_decode == 0) {
          codec.decode(p, data);
        } else if constexpr (DecodeAddCodec<C>) {
          codec.decode_add(p, data);
        } else {
          scratch.resize(data.size());
          codec.decode(p, std::span<float>(scratch));
          add_into(Policy{}, data, std::span<const float>(scratch));
        }
      });
      ++st.decodes;
      have[static_cast<std::size_t>(next_decode)].reset();
      ++next_decode;
    }
  };

  if (n > 1) {
    const int tag = options.tag_base + 1;
    ring_channel<T> ch(t, ring.next(), ring.prev(), st);
    auto recv = ch.post(tag, steps);
    ch.send(tag, ch.serialize(own));
    have[static_cast<std::size_t>(self)] = std::move(own);
    drain();
    // Step s brings rank (r - s - 1)'s payload, forwarded at step s + 1.
    for (int s = 0; s < steps; ++s) {
      const int origin = (self - s - 1 + n) % n;
      message m = ch.wait(recv[static_cast<std::size_t>(s)]);
      payload in;
      ring_timed(st.combine_seconds, [&] {
        in = ring_parse<payload>(m, data.size(), ring_payload_body_limit(data.size()),
                                 ring_where(who, self, origin, m.source, "all-gather", s));
      });
      if (s + 1 < steps) ch.send(tag, std::move(m.bytes));
      have[static_cast<std::size_t>(origin)] = std::move(in);
      drain();
    }
    ch.finish();
  } else {
    have[0] = std::move(own);
    drain();
  }
  if (options.average) ring_timed(st.decode_seconds, [&] { ring_average(data, n); });
  st.seconds = ring_seconds_since(started);
  return st;
}

}  // namespace detail

/// Algorithm 1 of seed 002: the pipelined ring all-reduce in the compressed
/// domain of a LinearCodec, in place on `data` (every rank passes the same
/// length and an identically configured codec: same basis).
///
/// The vector is cut into N segments by ring_segmentation<C> (GradiVeQ: on
/// slice boundaries, segment_bounds(N)). Reduce-scatter (lines 3-8): rank r
/// compresses segment r (eq. 3) and sends it; at step s it compresses its
/// segment r-s-1 *before* waiting for its predecessor's compressed partial
/// sum of that segment, adds the two with codec.accumulate (eq. 4) and sends
/// the sum on. All-gather (lines 10-13): the N complete compressed segments
/// go round the ring as serialized (forwarded byte for byte); every rank
/// decompresses each (eq. 5) while the next one is on the wire. With
/// options.average the decoded values are divided by N.
///
/// Result: data = decode(sum over ranks of encode(segment)), segment by
/// segment; bit-identical on every rank (all decode the same bytes).
/// For GradiVeQ the codec's summands() must equal N (invalid_argument_error).
/// `on_encode(segment j, std::span<const float> local segment, const payload&)`
/// is called after each of this rank's N own encodes (e.g. GradiVeQ's eq. 7
/// local_loss). Messages are wire payloads; a received one is parsed with
/// limits derived from its segment (element count exactly the segment's,
/// body at most this rank's own payload of that segment, which for a linear
/// codec has the aggregate's shape): bad bytes throw wire::wire_error, a wrong
/// length or offset size_mismatch_error, a codec mismatch the codec's error
/// (GradiVeQ: fingerprint_mismatch_error), transport failures transport_error /
/// timeout_error. Each rank sends 2(N-1) messages, one compressed segment each.
/// N = 1: data = decode(encode(data)). `codec` may be const when its encode
/// (or encode_segment) is const, as GradiVeQ's is.
template <ExecutionPolicy Policy, Transport T, class C, class OnEncode = ring_no_observer>
  requires LinearCodec<std::remove_const_t<C>>
ring_stats ring_allreduce_linear(Policy, T& t, C& codec, std::span<float> data, const ring_options& options = {},
                                 OnEncode&& on_encode = {}) {
  return detail::ring_linear_impl<Policy>(t, codec, data, options, on_encode);
}

/// ring_allreduce_linear with the generic (execution::seq) kernels.
template <Transport T, class C, class OnEncode = ring_no_observer>
  requires LinearCodec<std::remove_const_t<C>>
ring_stats ring_allreduce_linear(T& t, C& codec, std::span<float> data, const ring_options& options = {},
                                 OnEncode&& on_encode = {}) {
  return detail::ring_linear_impl<execution::seq>(t, codec, data, options, on_encode);
}

/// The decode-add-re-encode ring (the baseline seed 002 compares QSGD with,
/// Fig. 2a): equal float segments (ring_schedule); at each reduce-scatter hop
/// a rank decodes the incoming partial sum, adds its own raw segment,
/// re-encodes and forwards; the rank completing a segment encodes the
/// complete sum once more, and that payload goes round the all-gather and is
/// decoded by every rank (so the result is bit-identical everywhere).
///
/// `codecs`: a contiguous range of either N codecs, codec j encoding and
/// decoding segment j (make_ring_codecs builds them, sized per segment), or a
/// single codec for every segment (size-agnostic codecs such as qsgd).
/// Per call a rank encodes every segment exactly once: its own segment r
/// (its raw data), the partial sums of segments r-1 .. r-N+2, and the complete
/// segment r+1. A stateful codec j therefore always sees the same quantity
/// at the same point of the ring, and its residual (two-bit, sparsifier) is
/// the error feedback of that compression point: what it drops is re-sent by
/// the same rank at the same hop next call, so over the calls every dropped
/// value reaches the aggregate (error compensation at every compression
/// point; a stateless re-encode would lose the partial sums' rounding for
/// good). Only codec r's residual holds this rank's own gradient alone.
/// QSGD-style codecs advance their step once per encode; give every codec
/// its own seed. Errors as in ring_allreduce_linear; payload bodies are
/// limited to ring_payload_body_limit(segment length).
template <ExecutionPolicy Policy, Transport T, class Codecs>
  requires std::ranges::contiguous_range<Codecs> && Codec<std::ranges::range_value_t<Codecs>>
ring_stats ring_allreduce_reencode(Policy, T& t, Codecs& codecs, std::span<float> data,
                                   const ring_options& options = {}) {
  using C = std::ranges::range_value_t<Codecs>;
  return detail::ring_reencode_impl<Policy>(t, std::span<C>(std::ranges::data(codecs), std::ranges::size(codecs)),
                                            data, options);
}

/// ring_allreduce_reencode with the generic (execution::seq) kernels.
template <Transport T, class Codecs>
  requires std::ranges::contiguous_range<Codecs> && Codec<std::ranges::range_value_t<Codecs>>
ring_stats ring_allreduce_reencode(T& t, Codecs& codecs, std::span<float> data, const ring_options& options = {}) {
  return ring_allreduce_reencode(execution::seq{}, t, codecs, data, options);
}

/// All-gather of payloads with local decode-and-sum: every rank encodes its
/// whole vector once with `codec` (its residual, if any, is its own
/// gradient's), the N payloads go round the ring in N-1 steps (each forwarded
/// byte for byte), and every rank decodes all N and sums them in rank order
/// 0..N-1 (decode_add when the codec has it), starting as soon as the next
/// payload in that order has arrived. data = sum over ranks of decode(payload)
/// (divided by N with options.average), bit-identical on every rank. Each rank
/// sends N-1 messages of one whole-vector payload each; it holds up to N
/// parsed payloads at once. Uses tag options.tag_base + 1. Errors as in
/// ring_allreduce_reencode (body limit ring_payload_body_limit(length)).
template <ExecutionPolicy Policy, Transport T, Codec C>
ring_stats ring_allgather_decode(Policy, T& t, C& codec, std::span<float> data, const ring_options& options = {}) {
  return detail::ring_allgather_impl<Policy>(t, codec, data, options);
}

/// ring_allgather_decode with the generic (execution::seq) kernels.
template <Transport T, Codec C>
ring_stats ring_allgather_decode(T& t, C& codec, std::span<float> data, const ring_options& options = {}) {
  return detail::ring_allgather_impl<execution::seq>(t, codec, data, options);
}

/// Compressed all-reduce with one codec: Algorithm 1 (ring_allreduce_linear)
/// for a LinearCodec, the all-gather with decode-and-sum
/// (ring_allgather_decode) for any other codec.
template <ExecutionPolicy Policy, Transport T, Codec C>
ring_stats ring_allreduce(Policy policy, T& t, C& codec, std::span<float> data, const ring_options& options = {}) {
  if constexpr (LinearCodec<C>)
    return ring_allreduce_linear(policy, t, codec, data, options);
  else
    return ring_allgather_decode(policy, t, codec, data, options);
}

/// ring_allreduce with a codec and the generic (execution::seq) kernels.
template <Transport T, Codec C>
ring_stats ring_allreduce(T& t, C& codec, std::span<float> data, const ring_options& options = {}) {
  return ring_allreduce(execution::seq{}, t, codec, data, options);
}

}  // namespace gradcomp
