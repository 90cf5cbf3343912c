#pragma once
/// \file ring/reencode.hpp
/// The decode-add-re-encode ring for any Codec (the baseline seed 002 compares
/// QSGD with, Fig. 2a), and make_ring_codecs, one codec per segment.
/// Part of <gradcomp/ring_allreduce.hpp>.

#include <cstddef>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring/channel.hpp>
#include <gradcomp/ring/schedule.hpp>
#include <gradcomp/ring/stats.hpp>

namespace gradcomp {

GRADCOMP_ABI_NAMESPACE_BEGIN
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

GRADCOMP_ABI_NAMESPACE_END
namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

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

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
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

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
