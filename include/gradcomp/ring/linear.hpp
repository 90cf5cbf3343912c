#pragma once
/// \file ring/linear.hpp
/// Algorithm 1 of seed 002: the pipelined ring all-reduce in the compressed
/// domain of a LinearCodec (ring_allreduce_linear), and its customization
/// point ring_segmentation (where the segments begin, how one is encoded).
/// Part of <gradcomp/ring_allreduce.hpp>.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring/channel.hpp>
#include <gradcomp/ring/chunks.hpp>
#include <gradcomp/ring/schedule.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/ring/summable.hpp>

namespace gradcomp {

/// A codec that cuts its vector into ring segments on its own granularity
/// and encodes one segment at its offset (GradiVeQ's linear_compressor:
/// segments of whole slices, eq. 3 on the slices of the segment only).
template <class C>
concept SegmentedCodec = Codec<C> && requires(const C& cc, C& c, std::size_t parts, std::size_t offset,
                                              std::span<const float> segment, typename C::payload_type& p) {
  { cc.segment_bounds(parts) } -> std::convertible_to<std::vector<std::size_t>>;
  c.encode_segment(offset, segment, p);
};

/// A linear codec that can add a segment of raw floats into a received
/// payload and re-encode once (fp16_codec, bf16_codec):
/// `add_raw_and_reencode(p, raw)` makes p the encoding of decode(p) + raw,
/// rounded once. ring_allreduce_linear then skips encoding this rank's
/// segments ahead and accumulating two payloads: each reduce-scatter hop is
/// one add-and-re-encode, so a 16-bit sum is rounded once per hop.
template <class C>
concept ReencodingLinearCodec = LinearCodec<C> && requires(C& c, typename C::payload_type& p, std::span<const float> raw) {
  c.add_raw_and_reencode(p, raw);
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
  /// True when the codec knows the body bytes of a segment's payload without
  /// encoding it (`codec.segment_body_size(offset, length)`: GradiVeQ).
  /// The compressed Rabenseifner then sends its first step in pieces over a
  /// zero-copy transport too (exact receives posted before the data is due,
  /// no length messages).
  static constexpr bool knows_body_size = requires(const C& c, std::size_t offset, std::size_t length) {
    { c.segment_body_size(offset, length) } -> std::convertible_to<std::size_t>;
  };
  /// The body bytes of the payload encode() gives for [offset, offset + length).
  static std::size_t body_size(const C& codec, std::size_t offset, std::size_t length)
    requires knows_body_size
  {
    return static_cast<std::size_t>(codec.segment_body_size(offset, length));
  }
  /// Where a segment may be cut into chunks (ring_options::chunk_elements):
  /// chunks start on multiples of the result from the segment's start, and
  /// encoding a chunk at its offset must give the chunk's part of the
  /// segment's sums, element by element. 1 for a codec without segments
  /// (fp16, bf16, dense: encode works element by element); a SegmentedCodec
  /// with slices (GradiVeQ: slice_size(), K) or blocks (the homomorphic
  /// quantizer: options().block_size) cuts on them; any other
  /// SegmentedCodec: 0, segments travel whole. Specialise for a codec whose
  /// encode is not local to its granules.
  static std::size_t granularity(const C& codec) {
    if constexpr (!SegmentedCodec<C>) {
      (void)codec;
      return 1;
    } else if constexpr (requires {
                           { codec.slice_size() } -> std::convertible_to<std::size_t>;
                         }) {
      return static_cast<std::size_t>(codec.slice_size());
    } else if constexpr (requires {
                           { codec.options().block_size } -> std::convertible_to<std::size_t>;
                         }) {
      return static_cast<std::size_t>(codec.options().block_size);
    } else {
      (void)codec;
      return 0;
    }
  }
  /// ring_options::chunk_elements = 0 (automatic) for a largest segment of
  /// `largest` elements: ring_auto_chunk_elements(largest) for every codec
  /// (GradiVeQ included: its seq kernels run on the calling thread in one
  /// fixed order per slice, so chunks cost no more CPU than whole segments
  /// and give the same bits). Until issue 21 GradiVeQ kept whole segments:
  /// its Eigen GEMMs started an OpenMP team per call in builds that link
  /// OpenMP, and 16x more calls took 8x the CPU with four ranks on two cores.
  static std::size_t auto_chunk_elements(const C& codec, std::size_t largest) {
    (void)codec;
    return ring_auto_chunk_elements(largest);
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

/// True when ring_segmentation<C> knows the body bytes of a segment's payload
/// before encoding it; false for a user specialisation without the member.
template <class C>
concept KnowsBodySize = requires { requires ring_segmentation<C>::knows_body_size; };

/// The default "own encode" observer of ring_allreduce_linear: does nothing.
struct ring_no_observer {
  template <class... A>
  void operator()(A&&...) const noexcept {}
};

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

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
/// A codec with `check_summands(n, who)` checks itself (codec_group: each
/// member that has an N).
template <class C>
void ring_check_summands(const C& codec, int n, const char* who) {
  if constexpr (requires(const C& c) { c.check_summands(std::size_t{}, who); }) {
    codec.check_summands(static_cast<std::size_t>(n), who);
  } else if constexpr (requires(const C& c) {
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
/// The agreed scales of an AgreedScaleCodec (the homomorphic quantizer),
/// before a compressed all-reduce encodes anything: local scales, a max ring
/// over them on the call's tags (it completes before the caller posts its own
/// receives, so the messages cannot mix), set_agreed_scales. Every schedule
/// of such a codec runs it; nothing for other codecs.
template <class Policy, class T, class C>
void ring_agree_scales(T& t, C& codec, std::span<const float> data, const ring_options& options, ring_stats& st) {
  if constexpr (AgreedScaleCodec<std::remove_const_t<C>>) {
    std::vector<float> scales(codec.scale_count(data.size()));
    ring_timed(st.encode_seconds, [&] { codec.local_scales(data, std::span<float>(scales)); });
    const ring_stats m = ring_allreduce_max(Policy{}, t, std::span<float>(scales), summable_element::float32, options);
    st.bytes_sent += m.bytes_sent;
    st.messages_sent += m.messages_sent;
    st.bytes_received += m.bytes_received;
    st.wait_seconds += m.wait_seconds;
    codec.set_agreed_scales(std::span<const float>(scales), data.size());
  } else {
    (void)t;
    (void)codec;
    (void)data;
    (void)options;
    (void)st;
  }
}

/// FNV-1a over 64-bit values, a byte at a time: the digest of message sizes
/// two ranks swap before receiving into buffers sized by their own idea of
/// each other's payloads (ring_allreduce_linear's exact receives,
/// linear_blocks::sizes_digest of the compressed schedules).
struct size_digest {
  std::uint64_t value = 14695981039346656037ull;
  void mix(std::uint64_t x) noexcept {
    for (int i = 0; i < 8; ++i) value = (value ^ ((x >> (8 * i)) & 0xFFu)) * 1099511628211ull;
  }
};

/// A receive of exactly `buffer.size()` bytes posted straight into a buffer
/// of its own (irecv_into): Algorithm 1's messages over a zero-copy
/// transport when the codec knows its payload sizes (KnowsBodySize). Every
/// receive is then posted before its data is due, so a message moves as
/// soon as it is sent; a receive of unknown size probes first, and an MPI
/// without a matched probe (SimGrid's SMPI) receives such messages one at a
/// time, each behind its own latency.
template <class T>
struct ring_exact_recv {
  using handle = decltype(std::declval<T&>().irecv_into(0, 0, std::span<std::byte>{}));
  std::vector<std::byte> buffer;  ///< where the bytes land (its heap storage stays put when the struct moves)
  std::optional<handle> h;
  int source = 0, tag = 0;

  /// Waits and returns the message (the buffer moves into it); transport_error on another length.
  message wait(ring_stats& st, const char* who, int self) {
    std::size_t got = 0;
    ring_timed(st.wait_seconds, [&] { got = h->wait(); });
    st.bytes_received += got;
    if (got != buffer.size())
      throw transport_error(std::string(who) + ": rank " + std::to_string(self) + " expected " +
                            std::to_string(buffer.size()) + " bytes from rank " + std::to_string(source) + ", got " +
                            std::to_string(got));
    return message{source, tag, std::move(buffer)};
  }
};

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
  ring_agree_scales<Policy>(t, codec, std::span<const float>(data), options, st);
  const std::vector<std::size_t> bounds = ring_checked_bounds(seg::bounds(std::as_const(codec), data.size(), n),
                                                              data.size(), n, who);
  // Chunks of the segments (ring_options::chunk_elements): one per segment
  // unless a segment is larger than the chunk size.
  std::size_t chunk_elements = options.chunk_elements;
  if (chunk_elements == 0) {
    std::size_t largest = 0;
    for (std::size_t u = 0; u + 1 < bounds.size(); ++u) largest = std::max(largest, bounds[u + 1] - bounds[u]);
    chunk_elements = seg::auto_chunk_elements(std::as_const(codec), largest);
  }
  const ring_chunk_plan plan(bounds, n == 1 ? 0 : seg::granularity(std::as_const(codec)), chunk_elements);
  auto chunk = [&](int j, std::size_t c) { return data.subspan(plan.begin(j, c), plan.size(j, c)); };
  // Body size of this rank's payload of each chunk (the limit of a received one).
  std::vector<std::vector<std::size_t>> body(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) body[static_cast<std::size_t>(j)].assign(plan.count(j), 0);
  payload own;
  // Eq. 3 on chunk c of this rank's segment j; every chunk is encoded exactly once.
  auto encode_own = [&](int j, std::size_t c) {
    ring_timed(st.encode_seconds, [&] { seg::encode(codec, plan.begin(j, c), std::span<const float>(chunk(j, c)), own); });
    ++st.encodes;
    body[static_cast<std::size_t>(j)][c] = own.body_size();
    st.own_encoded_bytes += codec.encoded_bytes(own);
    on_encode(j, std::span<const float>(chunk(j, c)), std::as_const(own));
  };
  // Eq. 5 into chunk c of segment j (then the mean, when asked: the same operation on the same bits everywhere).
  auto decode_chunk = [&](const payload& p, int j, std::size_t c) {
    ring_timed(st.decode_seconds, [&] {
      codec.decode(p, chunk(j, c));
      if (options.average) ring_average(chunk(j, c), n);
    });
    ++st.decodes;
  };
  if (n == 1) {
    encode_own(0, 0);
    decode_chunk(own, 0, 0);
    st.seconds = ring_seconds_since(started);
    return st;
  }

  const int tag_rs = options.tag_base, tag_ag = options.tag_base + 1;
  ring_channel<T> ch(t, ring.next(), ring.prev(), st);
  // Over a zero-copy transport, for a codec that knows its payload sizes,
  // every receive is posted with its exact size (ring_exact_recv). Those
  // sizes are this rank's idea of the predecessor's payloads, and some MPI
  // libraries write past a receive that is too small instead of failing, so
  // each rank first sends its successor a digest of every chunk's size and
  // checks its predecessor's: a rank with another length or codec
  // configuration (another GradiVeQ basis) is an error before any payload
  // is received.
  constexpr bool exact = ZeroCopyTransport<T> && KnowsBodySize<std::remove_const_t<C>>;
  auto exact_bytes = [&](int k, std::size_t c) -> std::size_t {
    if constexpr (exact) {
      return wire::header_size + seg::body_size(std::as_const(codec), plan.begin(k, c), plan.size(k, c));
    } else {
      (void)k;
      (void)c;
      return 0;
    }
  };
  if constexpr (exact) {
    size_digest d;  // N, the length and every chunk's bytes
    d.mix(std::uint64_t(n));
    d.mix(std::uint64_t(data.size()));
    for (int k = 0; k < n; ++k)
      for (std::size_t c = 0; c < plan.count(k); ++c) d.mix(std::uint64_t(exact_bytes(k, c)));
    const std::uint64_t mine = d.value;
    std::uint64_t theirs = 0;
    auto in = t.irecv_into(ring.prev(), tag_rs, std::as_writable_bytes(std::span<std::uint64_t>(&theirs, 1)));
    auto out = t.isend_view(ring.next(), tag_rs, std::as_bytes(std::span<const std::uint64_t>(&mine, 1)));
    st.bytes_sent += sizeof mine;
    ++st.messages_sent;
    std::size_t got = 0;
    ring_timed(st.wait_seconds, [&] { got = in.wait(); });
    ring_timed(st.wait_seconds, [&] { out.wait(); });
    st.bytes_received += got;
    if (got != sizeof theirs || theirs != mine)
      throw transport_error(std::string(who) + ": rank " + std::to_string(self) + " and its predecessor, rank " +
                            std::to_string(ring.prev()) +
                            ", disagree on the sizes of their chunks' payloads (another vector length or codec "
                            "configuration, e.g. another GradiVeQ basis)");
  }
  // Every receive posted up front, in the order the predecessor sends.
  auto post = [&](int tag, auto segment) {
    if constexpr (exact) {
      std::vector<ring_exact_recv<T>> h;
      h.reserve(plan.messages(steps, segment));
      for (int s = 0; s < steps; ++s) {
        const int k = segment(s);
        for (std::size_t c = 0; c < plan.count(k); ++c) {
          h.push_back(ring_exact_recv<T>{std::vector<std::byte>(exact_bytes(k, c)), std::nullopt, ring.prev(), tag});
          h.back().h.emplace(t.irecv_into(ring.prev(), tag, std::span<std::byte>(h.back().buffer)));
        }
      }
      return h;
    } else {
      return ch.post(tag, static_cast<int>(plan.messages(steps, segment)));
    }
  };
  auto rs_recv = post(tag_rs, [&](int s) { return ring.reduce_scatter_recv(s); });
  auto ag_recv = post(tag_ag, [&](int s) { return ring.all_gather_recv(s); });
  std::size_t rs_next = 0;
  auto receive = [&](auto& handle, int k, std::size_t c, const char* phase, int s) {
    message m;
    if constexpr (exact)
      m = handle.wait(st, who, self);
    else
      m = ch.wait(handle);
    const std::string where =
        plan.count(k) == 1 ? ring_where(who, self, k, m.source, phase, s)
                           : ring_where(who, self, k, m.source, phase, s) + ", chunk " + std::to_string(c) + " of " +
                                 std::to_string(plan.count(k));
    payload p;
    ring_timed(st.combine_seconds, [&] {
      // A linear codec's sum has the shape of one payload (eq. 4): the body
      // can be no larger than this rank's own payload of the chunk.
      p = ring_parse<payload>(m, plan.size(k, c), body[static_cast<std::size_t>(k)][c], where);
      seg::check(p, plan.begin(k, c), where);
    });
    return std::pair<message, payload>(std::move(m), std::move(p));
  };

  // Line 3: compress segment r and send it, a chunk at a time (the first
  // chunk travels while the next is compressed).
  const int first = ring.reduce_scatter_send(0);
  for (std::size_t c = 0; c < plan.count(first); ++c) {
    encode_own(first, c);
    ch.send(tag_rs, ch.serialize(own));
  }
  std::vector<payload> owned(plan.count(ring.owned_segment()));
  if constexpr (ReencodingLinearCodec<std::remove_const_t<C>>) {
    // Lines 4-8 with one rounding per hop: the received partial sum and this
    // rank's raw chunk are added and re-encoded once (the sum has the shape
    // of one payload: its body is limited like the first encode's), and the
    // chunk is forwarded while the next one arrives.
    for (int j = 0; j < n; ++j)
      for (std::size_t c = 0; c < plan.count(j); ++c) {
        auto& b = body[static_cast<std::size_t>(j)][c];
        b = b ? b : ring_payload_body_limit(plan.size(j, c));
      }
    for (int s = 0; s < steps; ++s) {
      const int k = ring.reduce_scatter_recv(s);
      for (std::size_t c = 0; c < plan.count(k); ++c) {
        auto got = receive(rs_recv[rs_next++], k, c, "reduce-scatter", s);
        payload& in = got.second;
        ring_timed(st.encode_seconds, [&] { codec.add_raw_and_reencode(in, std::span<const float>(chunk(k, c))); });
        ++st.encodes;
        st.own_encoded_bytes += codec.encoded_bytes(in);
        if (s + 1 < steps) {
          ch.send(tag_rs, ch.serialize(in, std::move(got.first.bytes)));
        } else {  // complete: its all-gather starts now
          ch.send(tag_ag, ch.serialize(in, std::move(got.first.bytes)));
          owned[c] = std::move(in);
        }
      }
    }
    ring_chunked_all_gather_phase(ch, ring, plan, tag_ag, ag_recv, owned, receive, decode_chunk);
    st.seconds = ring_seconds_since(started);
    return st;
  }
  // Lines 4-8: the chunk of step s is compressed before its predecessor's
  // sum is waited for, so compression overlaps the transfer (Fig. 2b); the
  // two are summed in the compressed domain (eq. 4) and forwarded while the
  // next chunk arrives.
  for (int s = 0; s < steps; ++s) {
    const int k = ring.reduce_scatter_recv(s);
    for (std::size_t c = 0; c < plan.count(k); ++c) {
      encode_own(k, c);
      auto got = receive(rs_recv[rs_next++], k, c, "reduce-scatter", s);
      payload& in = got.second;
      ring_timed(st.combine_seconds, [&] { codec.accumulate(in, own); });
      if (s + 1 < steps) {
        ch.send(tag_rs, ch.serialize(in, std::move(got.first.bytes)));  // the sum has the received size
      } else {  // line 9: a chunk of the complete compressed segment r+1, whose all-gather starts now
        ch.send(tag_ag, ch.serialize(in, std::move(got.first.bytes)));
        owned[c] = std::move(in);
      }
    }
  }
  // Lines 10-13.
  ring_chunked_all_gather_phase(ch, ring, plan, tag_ag, ag_recv, owned, receive, decode_chunk);
  st.seconds = ring_seconds_since(started);
  return st;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
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
/// `on_encode(segment j, std::span<const float> local part, const payload&)`
/// is called after each of this rank's own encodes (N with whole segments,
/// one per chunk with chunks; e.g. GradiVeQ's eq. 7 local_loss, whose sum
/// over the calls is the same). Messages are wire payloads; a received one
/// is parsed with limits derived from its chunk (element count exactly the
/// chunk's, body at most this rank's own payload of that chunk, which for a
/// linear codec has the aggregate's shape): bad bytes throw wire::wire_error,
/// a wrong length or offset size_mismatch_error, a codec mismatch the codec's
/// error (GradiVeQ: fingerprint_mismatch_error), transport failures
/// transport_error / timeout_error; the message names the segment and chunk.
///
/// Chunks (options.chunk_elements, ring/chunks.hpp): each segment travels as
/// chunks on the codec's granularity, and a hop accumulates (or re-encodes)
/// and forwards chunk c while chunk c+1 arrives; the first hop sends each
/// chunk as soon as it is encoded, and each completed chunk of the owned
/// segment starts its all-gather at once. The sums are element by element,
/// so the result does not depend on the chunks (fp16, bf16, dense_codec,
/// the homomorphic quantizer, GradiVeQ on the host: the same bits). Each rank sends 2(N-1) segments, one message per chunk.
/// N = 1: data = decode(encode(data)). `codec` may be const when its encode
/// (or encode_segment) is const, as GradiVeQ's is.
///
/// An AgreedScaleCodec (the homomorphic quantizer) first agrees on its
/// scales: local_scales of `data`, ring_allreduce_max over them (same tags,
/// its bytes and messages added to the stats), set_agreed_scales; then
/// Algorithm 1 as above (its accumulate is an integer addition).
///
/// A ReencodingLinearCodec (fp16, bf16) runs lines 4-8 as one
/// add_raw_and_reencode per hop instead (the received partial sum plus this
/// rank's raw segment, rounded once): each rank encodes only its first
/// segment, and `on_encode` is called for that segment's encodes only.
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

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
