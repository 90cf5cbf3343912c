#pragma once
/// \file ring/summable.hpp
/// The ring all-reduce of a summable buffer of any element type
/// (payloads/summable.hpp): float16 and bfloat16 cells travel as 2 bytes and
/// are summed in float32, rounded once per hop; int32_words travel as words
/// and add modulo 2^32 (packed lanes with headroom); float32 is the plain
/// ring's sum. Part of <gradcomp/ring_allreduce.hpp>.

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/wait_sends.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/payloads/summable.hpp>
#include <gradcomp/ring/schedule.hpp>
#include <gradcomp/ring/stats.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Throws transport_error unless a received packed segment has the expected length.
inline void ring_check_packed(std::size_t got, std::size_t cells, summable_element e, int self, int source,
                              int segment, const char* phase, int step) {
  const std::size_t expected = cells * summable::wire_bytes(e);
  if (got != expected)
    throw transport_error("ring_allreduce_summable: rank " + std::to_string(self) + " expected " +
                          std::to_string(expected) + " bytes for segment " + std::to_string(segment) + " from rank " +
                          std::to_string(source) + " (" + phase + " step " + std::to_string(step) + "), got " +
                          std::to_string(got) + " (do all ranks pass the same length and element type?)");
}

/// The ring of ring_allreduce_summable (max: ring_allreduce_max).
template <class T>
ring_stats ring_summable_impl(T& t, std::span<float> cells, summable_element e, bool max, const ring_options& options);

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Sums the summable buffer `cells` (element type `e`) in place across the
/// ranks of `t` with a ring (ring_schedule's segments and steps). Per
/// reduce-scatter hop a rank receives the partial sum of a segment as packed
/// cells, adds it into its own cells with summable::add_packed_into (16-bit
/// types: one rounding of the float32 sum per hop), packs the result and
/// sends it on; the owner of a complete segment packs it once and it goes
/// round the all-gather, unpacked by every rank. Every rank ends with the
/// same bits (segment j is summed in the fixed ring order, then copied).
///
/// Each rank sends 2(N-1) messages of one segment each, wire_bytes(e) bytes
/// per cell. `options.average` is refused for this form
/// (invalid_argument_error): divide after the sum. A received segment of the
/// wrong length throws transport_error; transport errors propagate.
/// Tags as ring_allreduce (tag_base, tag_base + 1). Returns the bytes and
/// messages sent and received, and the time blocked on the transport.
template <ExecutionPolicy Policy, Transport T>
ring_stats ring_allreduce_summable(Policy, T& t, std::span<float> cells, summable_element e,
                                   const ring_options& options = {}) {
  return detail::ring_summable_impl(t, cells, e, false, options);
}

/// ring_allreduce_summable with the generic (execution::seq) policy.
template <Transport T>
ring_stats ring_allreduce_summable(T& t, std::span<float> cells, summable_element e, const ring_options& options = {}) {
  return ring_allreduce_summable(execution::seq{}, t, cells, e, options);
}

/// The element-wise max of the summable buffer `cells` (a float element
/// type) across the ranks, in place, on the same ring as
/// ring_allreduce_summable (a hop keeps the max of the received partial max
/// and its own cells; no rounding: the max of representable values is one).
/// int32_words: invalid_argument_error. Agreed scales (AgreedScaleCodec)
/// run on it; bit-identical on every rank.
template <ExecutionPolicy Policy, Transport T>
ring_stats ring_allreduce_max(Policy, T& t, std::span<float> cells, summable_element e, const ring_options& options = {}) {
  if (e == summable_element::int32_words)
    throw invalid_argument_error("ring_allreduce_max: int32_words buffers have no element-wise max");
  return detail::ring_summable_impl(t, cells, e, true, options);
}

/// ring_allreduce_max with the generic (execution::seq) policy.
template <Transport T>
ring_stats ring_allreduce_max(T& t, std::span<float> cells, summable_element e, const ring_options& options = {}) {
  return ring_allreduce_max(execution::seq{}, t, cells, e, options);
}

GRADCOMP_ABI_NAMESPACE_END
namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN
template <class T>
ring_stats ring_summable_impl(T& t, std::span<float> cells, summable_element e, bool max, const ring_options& options) {
  const char* who = max ? "ring_allreduce_max" : "ring_allreduce_summable";
  const auto started = detail::ring_clock::now();
  ring_stats st;
  detail::ring_check_tags(options, who);
  if (options.average)
    throw invalid_argument_error(std::string(who) + ": options.average is not supported; divide after the sum");
  const ring_schedule ring(static_cast<int>(t.rank()), static_cast<int>(t.size()), cells.size());
  const int self = ring.rank(), next = ring.next(), prev = ring.prev(), steps = ring.steps();
  if (ring.size() == 1) {
    st.seconds = detail::ring_seconds_since(started);
    return st;
  }
  const std::size_t wb = summable::wire_bytes(e);
  const int tag_rs = options.tag_base, tag_ag = options.tag_base + 1;
  using recv_handle = decltype(t.irecv(prev, tag_rs));
  using send_handle = decltype(t.isend(next, tag_rs, std::vector<std::byte>{}));
  std::vector<recv_handle> rs_recv, ag_recv;
  for (int s = 0; s < steps; ++s) rs_recv.push_back(t.irecv(prev, tag_rs));
  for (int s = 0; s < steps; ++s) ag_recv.push_back(t.irecv(prev, tag_ag));
  std::vector<send_handle> sends;
  sends.reserve(static_cast<std::size_t>(2 * steps));
  auto send = [&](int tag, std::vector<std::byte>&& b) {
    st.bytes_sent += b.size();
    ++st.messages_sent;
    sends.push_back(t.isend(next, tag, std::move(b)));
  };
  auto wait = [&](recv_handle& h) {
    message m;
    detail::ring_timed(st.wait_seconds, [&] { m = h.wait(); });
    st.bytes_received += m.bytes.size();
    return m;
  };
  auto packed = [&](std::span<const float> seg, std::vector<std::byte>&& reuse) {
    std::vector<std::byte> b = std::move(reuse);
    b.resize(seg.size() * wb);
    summable::pack(e, seg, b);
    return b;
  };

  // Reduce-scatter: own segment r - s goes out at step 0; each hop adds the
  // received partial sum into the own cells (one rounding) and forwards it.
  send(tag_rs, packed(ring.segment<float>(cells, ring.reduce_scatter_send(0)), {}));
  std::vector<std::byte> spare;
  std::vector<float> scratch;
  for (int s = 0; s < steps; ++s) {
    const int k = ring.reduce_scatter_recv(s);
    message m = wait(rs_recv[static_cast<std::size_t>(s)]);
    const std::span<float> own = ring.segment<float>(cells, k);
    detail::ring_check_packed(m.bytes.size(), own.size(), e, self, m.source, k, "reduce-scatter", s);
    detail::ring_timed(st.combine_seconds, [&] {
      if (max) {
        scratch.resize(own.size());
        summable::unpack(e, m.bytes, scratch);
        summable::max_into(e, own, scratch);
      } else {
        summable::add_packed_into(e, own, m.bytes);
      }
    });
    if (s + 1 < steps)
      send(tag_rs, packed(own, std::move(m.bytes)));
    else
      spare = std::move(m.bytes);
  }
  // All-gather: the complete owned segment goes round, forwarded as received.
  send(tag_ag, packed(ring.segment<float>(cells, ring.owned_segment()), std::move(spare)));
  for (int s = 0; s < steps; ++s) {
    const int k = ring.all_gather_recv(s);
    message m = wait(ag_recv[static_cast<std::size_t>(s)]);
    const std::span<float> seg = ring.segment<float>(cells, k);
    detail::ring_check_packed(m.bytes.size(), seg.size(), e, self, m.source, k, "all-gather", s);
    detail::ring_timed(st.decode_seconds, [&] { summable::unpack(e, m.bytes, seg); });
    if (s + 1 < steps) send(tag_ag, std::move(m.bytes));
  }
  detail::ring_timed(st.wait_seconds, [&] {
    detail::wait_sends<T>(std::span(sends));
  });
  st.seconds = detail::ring_seconds_since(started);
  return st;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail
}  // namespace gradcomp
