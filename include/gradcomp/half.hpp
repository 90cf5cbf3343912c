#pragma once
/// \file half.hpp
/// fp16_codec and bf16_codec: the 16-bit baselines every compressor should
/// be compared with (arXiv 2407.01378), as LinearCodecs: a gradient is sent
/// as IEEE binary16 (fp16) or bfloat16 values, payloads add element-wise.
/// docs/codecs.md ("fp16 and bf16") states the policies:
///
///  - Rounding: to nearest, ties to even (bit-exact portable conversion;
///    F16C instructions when the unit is compiled for them, same bits:
///    system/half.hpp).
///  - Sums: in float32, rounded once. In gradcomp's ring (Algorithm 1's path,
///    ring/linear.hpp) a hop adds the partial sum it received to its own raw
///    float32 segment and rounds once (add_raw_and_reencode), so a segment's
///    sum over N ranks is rounded N times in all (once per hop), not 2N - 1.
///    Through a framework's all-reduce of the 16-bit buffer (the exchange's
///    bucket layer), the framework's own 16-bit sum applies.
///  - Range (fp16): values beyond +-65504 saturate to +-65504 at encode, and
///    every rounding of a sum saturates the same way, so no Inf is ever
///    produced in the middle of a collective; saturated() counts the clamped
///    values of this codec's last encode (and the hops after it). The
///    exchange treats a saturated reduced element as an overflow and skips
///    the step on every rank (like a loss-scaler overflow). Magnitudes below
///    2^-14 become fp16 subnormals (absolute error at most 2^-25), and at or
///    below 2^-25 they become (signed) zero: scale the loss when gradients are
///    that small.
///  - Range (bf16): bfloat16 has float32's exponent range, so no finite
///    gradient overflows (only the last half-ulp below FLT_MAX would round to
///    Inf; it saturates like fp16) and nothing underflows before float32
///    does: bf16 has no range problem, only 8 bits of precision.
///  - Non-finite input: rejected at encode (non_finite_error naming the first
///    bad index). A payload holding an Inf or NaN pattern is rejected at parse.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/payloads/summable.hpp>
#include <gradcomp/system/half.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

/// Wire codec ids of the 16-bit payloads.
inline constexpr wire::codec_id fp16_wire_codec = wire::codec_id::fp16;
inline constexpr wire::codec_id bf16_wire_codec = wire::codec_id::bf16;

/// Payload of fp16_codec (E = float16) and bf16_codec (E = bfloat16): the
/// 16-bit patterns of the values. Body: u16 values[n], little-endian; no Inf
/// or NaN pattern (exponent all ones) is accepted at parse.
template <summable_element E>
struct half_payload {
  static_assert(E == summable_element::float16 || E == summable_element::bfloat16);
  static constexpr wire::codec_id wire_codec = E == summable_element::float16 ? fp16_wire_codec : bf16_wire_codec;
  std::vector<std::uint16_t> values;

  std::uint64_t element_count() const noexcept { return values.size(); }
  std::size_t body_size() const noexcept { return values.size() * sizeof(std::uint16_t); }
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void write_body(wire::writer& w) const {
    w.put_array<std::uint16_t>(values);
  }
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static half_payload read_body(wire::reader& r, const wire::header& h) {
    if (h.body_length != h.element_count * sizeof(std::uint16_t))
      wire::reader::fail(wire::wire_errc::malformed_body, "16-bit body length is not 2 x element count");
    half_payload p{r.get_vector<std::uint16_t>(h.element_count)};
    const std::uint16_t exponent = E == summable_element::float16 ? 0x7C00 : 0x7F80;
    bool finite = true;
    for (const std::uint16_t v : p.values) finite &= (v & exponent) != exponent;
    if (!finite) wire::reader::fail(wire::wire_errc::malformed_body, "16-bit body: non-finite value");
    return p;
  }
};

/// Payload of fp16_codec.
using fp16_payload = half_payload<summable_element::float16>;
/// Payload of bf16_codec.
using bf16_payload = half_payload<summable_element::bfloat16>;

/// The 16-bit codec of element type E (float16 or bfloat16): see the file
/// comment for its rounding, sums and range policy. Linear: accumulate adds
/// two payloads in float32 and rounds once. Stateless apart from the
/// saturation count.
template <summable_element E, ExecutionPolicy Policy = execution::seq>
class half_codec {
 public:
  using payload_type = half_payload<E>;
  using codec_concept = linear_codec_tag;

  /// The element type of the payloads (float16 or bfloat16).
  static constexpr summable_element element = E;
  /// Largest finite value (fp16 65504, bf16 0x1.FEp127): the saturation bound.
  static constexpr float max_value = summable::max_finite(E);

  /// out = the gradient rounded to nearest even, saturated at +-max_value.
  /// Throws non_finite_error (first bad index) for NaN / Inf (out is unspecified then).
  void encode(std::span<const float> gradient, payload_type& out) {
    out.values.resize(gradient.size());
    saturated_ = 0;
    // One pass over the gradient: check, count and convert a cache-sized chunk at a time.
    for (std::size_t at = 0; at < gradient.size(); at += chunk) {
      const auto part = gradient.subspan(at, std::min(chunk, gradient.size() - at));
      if (const auto bad = find_non_finite(Policy{}, part); bad != part.size()) throw non_finite_error(name("encode"), at + bad);
      saturated_ += count_beyond(part);
      to_bits(part, std::span<std::uint16_t>(out.values).subspan(at, part.size()));
    }
  }
  /// out = the payload's values (exact).
  void decode(const payload_type& p, std::span<float> out) const {
    if (out.size() != p.values.size()) throw size_mismatch_error(name("decode"), p.values.size(), out.size());
    from_bits(p.values, out);
  }
  /// out += the payload's values (in float32).
  void decode_add(const payload_type& p, std::span<float> out) const {
    if (out.size() != p.values.size()) throw size_mismatch_error(name("decode_add"), p.values.size(), out.size());
    chunked(out.size(), [&](std::size_t at, std::span<float> tmp) {
      from_bits(std::span<const std::uint16_t>(p.values).subspan(at, tmp.size()), tmp);
      add_into(Policy{}, out.subspan(at, tmp.size()), std::span<const float>(tmp));
    });
  }
  /// into = round(into + from): the float32 sum rounded once (saturated).
  void accumulate(payload_type& into, const payload_type& from) const {
    if (into.values.size() != from.values.size())
      throw size_mismatch_error(name("accumulate"), into.values.size(), from.values.size());
    float other[chunk];
    chunked(into.values.size(), [&](std::size_t at, std::span<float> tmp) {
      const std::span<float> o(other, tmp.size());
      from_bits(std::span<const std::uint16_t>(into.values).subspan(at, tmp.size()), tmp);
      from_bits(std::span<const std::uint16_t>(from.values).subspan(at, tmp.size()), o);
      for (std::size_t i = 0; i < tmp.size(); ++i) tmp[i] += o[i];
      to_bits(tmp, std::span<std::uint16_t>(into.values).subspan(at, tmp.size()));
    });
  }
  /// p = round(decode(p) + raw): a ring hop's sum of the received partial sum
  /// and this rank's raw float32 segment, rounded once (saturated; the clamped
  /// values add to saturated()). Throws non_finite_error for a NaN / Inf in
  /// raw (p is unspecified then).
  void add_raw_and_reencode(payload_type& p, std::span<const float> raw) {
    if (p.values.size() != raw.size()) throw size_mismatch_error(name("add_raw_and_reencode"), p.values.size(), raw.size());
    chunked(raw.size(), [&](std::size_t at, std::span<float> tmp) {
      if (const auto bad = find_non_finite(Policy{}, raw.subspan(at, tmp.size())); bad != tmp.size())
        throw non_finite_error(name("add_raw_and_reencode"), at + bad);
      const std::span<std::uint16_t> bits = std::span<std::uint16_t>(p.values).subspan(at, tmp.size());
      from_bits(bits, tmp);
      const float* r = raw.data() + at;
      for (std::size_t i = 0; i < tmp.size(); ++i) tmp[i] += r[i];  // the sum in float32
      saturated_ += count_beyond(tmp);
      to_bits(tmp, bits);  // the one rounding of this hop
    });
  }
  /// Exact serialized bytes: 32 header + 2 per element.
  [[nodiscard]] std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }
  /// Body bytes of the payload of `length` elements, known before encoding
  /// (ring_segmentation::knows_body_size: the compressed Rabenseifner then
  /// posts exact receives). `offset` does not matter: the codec has no segments.
  [[nodiscard]] std::size_t segment_body_size(std::size_t /*offset*/, std::size_t length) const noexcept {
    return length * sizeof(std::uint16_t);
  }
  /// Values clamped to +-max_value by the last encode and the add_raw_and_reencode calls after it.
  [[nodiscard]] std::size_t saturated() const noexcept { return saturated_; }

 private:
  static std::string name(const char* what) {
    return std::string(E == summable_element::float16 ? "fp16_codec::" : "bf16_codec::") + what;
  }
  static constexpr std::size_t chunk = 1024;
  /// f(offset, scratch of min(chunk, n - offset) floats) over [0, n).
  template <class F>
  static void chunked(std::size_t n, F&& f) {
    alignas(64) float tmp[chunk];
    for (std::size_t at = 0; at < n; at += chunk) f(at, std::span<float>(tmp, std::min(chunk, n - at)));
  }
  static std::size_t count_beyond(std::span<const float> x) noexcept {
    std::uint32_t n = 0;  // a chunk at a time: no overflow
    for (const float v : x) n += std::fabs(v) > max_value ? 1u : 0u;
    return n;
  }
  static void to_bits(std::span<const float> in, std::span<std::uint16_t> out) noexcept {
    if constexpr (E == summable_element::float16)
      execution::floats_to_half(in, out);
    else
      execution::floats_to_bfloat16(in, out);
  }
  static void from_bits(std::span<const std::uint16_t> in, std::span<float> out) noexcept {
    if constexpr (E == summable_element::float16)
      execution::half_to_floats(in, out);
    else
      execution::bfloat16_to_floats(in, out);
  }

  std::size_t saturated_ = 0;
};

/// IEEE binary16 codec (see the file comment).
template <ExecutionPolicy Policy = execution::seq>
using fp16_codec = half_codec<summable_element::float16, Policy>;
/// bfloat16 codec (see the file comment).
template <ExecutionPolicy Policy = execution::seq>
using bf16_codec = half_codec<summable_element::bfloat16, Policy>;

// The concepts the 16-bit codecs claim: linear, decode into a running sum.
static_assert(LinearCodec<fp16_codec<>> && DecodeAddCodec<fp16_codec<>> && LinearCodec<bf16_codec<>>);
static_assert(LinearCodec<fp16_codec<execution::simd>>);

}  // namespace gradcomp
