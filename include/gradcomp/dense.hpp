#pragma once
/// \file dense.hpp
/// dense_codec: the identity codec (uncompressed float32). It is the baseline
/// every ratio is measured against, and the simplest LinearCodec.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/payloads/dense.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

/// The identity codec. Linear: payloads add element-wise.
/// Non-finite policy: rejected at encode with non_finite_error.
template <ExecutionPolicy Policy = execution::seq>
class dense_codec {
 public:
  using payload_type = dense_payload;
  using codec_concept = linear_codec_tag;

  /// out = the gradient (throws non_finite_error for NaN/Inf, naming the first bad index).
  void encode(std::span<const float> gradient, payload_type& out) const {
    if (auto bad = find_non_finite(Policy{}, gradient); bad != gradient.size())
      throw non_finite_error("dense_codec::encode", bad);
    out.values.assign(gradient.begin(), gradient.end());
  }
  /// out = the payload's values (size_mismatch_error if the lengths differ).
  void decode(const payload_type& p, std::span<float> out) const {
    if (out.size() != p.values.size()) throw size_mismatch_error("dense_codec::decode", p.values.size(), out.size());
    std::copy(p.values.begin(), p.values.end(), out.begin());
  }
  /// out += the payload's values.
  void decode_add(const payload_type& p, std::span<float> out) const {
    if (out.size() != p.values.size())
      throw size_mismatch_error("dense_codec::decode_add", p.values.size(), out.size());
    add_into(Policy{}, out, std::span<const float>(p.values));
  }
  /// into += from, element-wise: the compressed-domain sum of a LinearCodec.
  void accumulate(payload_type& into, const payload_type& from) const {
    if (into.values.size() != from.values.size())
      throw size_mismatch_error("dense_codec::accumulate", into.values.size(), from.values.size());
    add_into(Policy{}, std::span<float>(into.values), std::span<const float>(from.values));
  }
  /// Exact serialized bytes: 32 header + 4 per element.
  [[nodiscard]] std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }
  /// Body bytes of the payload of `length` elements, known before encoding
  /// (ring_segmentation::knows_body_size: the compressed schedules then post
  /// exact receives, e.g. for dense buckets in a codec_group beside GradiVeQ
  /// ones). `offset` does not matter: the codec has no segments.
  [[nodiscard]] std::size_t segment_body_size(std::size_t /*offset*/, std::size_t length) const noexcept {
    return length * sizeof(float);
  }
};

// The concepts dense_codec claims: linear (payloads add), decodes into a
// running sum; stateless.
static_assert(Codec<dense_codec<>> && LinearCodec<dense_codec<>> && DecodeAddCodec<dense_codec<>>);
static_assert(LinearCodec<dense_codec<execution::simd>>);

}  // namespace gradcomp
