#pragma once
/// \file ring/allgather.hpp
/// The all-gather of whole-vector payloads with local decode-and-sum, for any
/// Codec (ring_allgather_decode), and ring_allreduce with a codec: Algorithm 1
/// for a LinearCodec, this all-gather for any other.
/// Part of <gradcomp/ring_allreduce.hpp>.

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring/channel.hpp>
#include <gradcomp/ring/linear.hpp>
#include <gradcomp/ring/schedule.hpp>
#include <gradcomp/ring/stats.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

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

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
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

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
