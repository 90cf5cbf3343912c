#pragma once
/// \file lgc/payloads.hpp
/// What LGC puts on the wire (seed 004, Sections IV-V): the code of a vector
/// (`lgc_code_payload`) and the top-k index set (`lgc_index_payload`,
/// DEFLATE-compressed). Both reject non-finite floats at parse.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/lgc/architecture.hpp>
#include <gradcomp/lgc/deflate.hpp>
#include <gradcomp/lgc/windows.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

/// The code of a vector of `value_count` values cut into windows (Section
/// IV, eqs. 8 and 17): for each window, code_per_window floats (the encoder's
/// code_channels x positions output, column-major), and optionally one scale
/// per window. Body layout (after the wire header; element_count = value_count):
///     u8      kind = 2
///     varint  window
///     varint  code_per_window
///     varint  scale count (0, or the number of windows ceil(value_count / window))
///     f32     scales[scale count]   finite, > 0
///     f32     codes[windows * code_per_window]   finite
struct lgc_code_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::autoencoder;

  std::uint64_t value_count = 0;
  std::uint32_t window = 0;
  std::uint32_t code_per_window = 0;
  std::vector<float> scales;
  std::vector<float> codes;

  std::size_t windows() const noexcept { return window ? detail::lgc_window_count(value_count, window) : 0; }
  std::uint64_t element_count() const noexcept { return value_count; }
  std::size_t body_size() const noexcept {
    return 1 + wire::varint_size(window) + wire::varint_size(code_per_window) + wire::varint_size(scales.size()) +
           4 * (scales.size() + codes.size());
  }
  /// Throws invalid_argument_error unless the fields agree.
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void validate() const {
    if (value_count == 0 || window == 0 || code_per_window == 0)
      throw invalid_argument_error("lgc_code_payload: empty value count, window or code");
    if (codes.size() != windows() * code_per_window)
      throw invalid_argument_error("lgc_code_payload: " + std::to_string(codes.size()) + " code floats for " +
                                   std::to_string(windows()) + " windows of " + std::to_string(code_per_window));
    if (!scales.empty() && scales.size() != windows())
      throw invalid_argument_error("lgc_code_payload: one scale per window required");
  }
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void write_body(wire::writer& w) const {
    validate();
    w.put<std::uint8_t>(detail::lgc_kind_code);
    w.put_varint(window);
    w.put_varint(code_per_window);
    w.put_varint(scales.size());
    w.put_array<float>(scales);
    w.put_array<float>(codes);
  }
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static lgc_code_payload read_body(wire::reader& r, const wire::header& h) {
    using wire::reader;
    using wire::wire_errc;
    if (r.get<std::uint8_t>() != detail::lgc_kind_code)
      reader::fail(wire_errc::malformed_body, "lgc: not a code payload (another LGC message kind)");
    lgc_code_payload p;
    p.value_count = h.element_count;
    const auto window = r.get_varint(), cpw = r.get_varint(), nscales = r.get_varint();
    if (p.value_count == 0) reader::fail(wire_errc::malformed_body, "lgc code: zero values");
    if (window == 0 || window > std::numeric_limits<std::uint32_t>::max())
      reader::fail(wire_errc::malformed_body, "lgc code: window out of range");
    if (cpw == 0 || cpw > std::numeric_limits<std::uint32_t>::max())
      reader::fail(wire_errc::malformed_body, "lgc code: code length out of range");
    p.window = static_cast<std::uint32_t>(window);
    p.code_per_window = static_cast<std::uint32_t>(cpw);
    const std::uint64_t windows = (p.value_count - 1) / window + 1;
    if (nscales != 0 && nscales != windows)
      reader::fail(wire_errc::malformed_body, "lgc code: scale count is neither 0 nor the window count");
    p.scales = r.get_vector<float>(nscales);
    for (float s : p.scales)
      if (!(s > 0.0f) || !std::isfinite(s)) reader::fail(wire_errc::malformed_body, "lgc code: scale not finite and > 0");
    if (cpw > r.remaining() / 4 / windows)
      reader::fail(wire_errc::truncated, "lgc code: " + std::to_string(windows) + " windows of " + std::to_string(cpw) +
                                             " floats do not fit the body");
    p.codes = r.get_vector<float>(windows * cpw);
    for (float c : p.codes)
      if (!std::isfinite(c)) reader::fail(wire_errc::malformed_body, "lgc code: non-finite code value");
    return p;
  }
};

/// The leader's top-k index set (ring form, Section V-A; also the common
/// worker's in the parameter-server form): per layer, strictly increasing
/// indices; plus the per-window scales of the leader's values (empty when
/// not used). Indices travel as DEFLATE (zlib, raw) of their LEB128 delta
/// varints (first index, then differences), layer after layer, as the paper
/// entropy-codes them [54]. Body layout (element_count = sum of layer lengths):
///     u8      kind = 1
///     varint  layers
///     per layer: varint length (<= 2^32-1), varint count (<= length)
///     varint  scale count; f32 scales[scale count]   finite, > 0
///     varint  raw length (bytes of the varint stream; count <= raw <= 5 count)
///     varint  packed length; packed bytes (raw DEFLATE)
/// Call pack() after filling layer_lengths/indices (it computes `packed`).
struct lgc_index_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::autoencoder;

  std::vector<std::uint64_t> layer_lengths;
  std::vector<std::vector<std::uint32_t>> indices;
  std::vector<float> scales;
  std::vector<std::byte> packed;  ///< filled by pack() or read_body
  std::uint64_t raw_length = 0;   ///< filled by pack() or read_body
  bool is_packed = false;

  /// Total number of indices.
  [[nodiscard]] std::size_t count() const noexcept {
    std::size_t n = 0;
    for (const auto& v : indices) n += v.size();
    return n;
  }
  std::uint64_t element_count() const noexcept {
    return std::accumulate(layer_lengths.begin(), layer_lengths.end(), std::uint64_t{0});
  }

  /// Throws invalid_argument_error unless the index lists are well formed.
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void validate() const {
    if (indices.size() != layer_lengths.size())
      throw invalid_argument_error("lgc_index_payload: one index list per layer required");
    for (std::size_t l = 0; l < indices.size(); ++l) {
      if (layer_lengths[l] > sparse_max_elements)
        throw invalid_argument_error("lgc_index_payload: layer longer than 2^32-1");
      const auto& v = indices[l];
      for (std::size_t j = 0; j < v.size(); ++j)
        if (v[j] >= layer_lengths[l] || (j > 0 && v[j] <= v[j - 1]))
          throw invalid_argument_error("lgc_index_payload: layer " + std::to_string(l) +
                                       " indices not strictly increasing below the length");
    }
    for (float s : scales)
      if (!(s > 0.0f) || !std::isfinite(s)) throw invalid_argument_error("lgc_index_payload: scale not finite and > 0");
  }

  /// Computes the DEFLATE stream from `indices` (zlib level 0-9, -1 default).
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void pack(int level = 6) {
    validate();
    std::vector<std::byte> raw;
    raw.reserve(count() * 2);
    wire::writer w(raw);
    for (const auto& v : indices) {
      std::uint32_t prev = 0;
      for (std::size_t j = 0; j < v.size(); ++j) {
        w.put_varint(j == 0 ? v[0] : v[j] - prev);
        prev = v[j];
      }
    }
    raw_length = raw.size();
    packed = detail::lgc_deflate(raw, level);
    is_packed = true;
  }

  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  std::size_t body_size() const {
    if (!is_packed) throw state_error("lgc_index_payload: pack() was not called");
    std::size_t n = 1 + wire::varint_size(layer_lengths.size());
    for (std::size_t l = 0; l < layer_lengths.size(); ++l)
      n += wire::varint_size(layer_lengths[l]) + wire::varint_size(indices[l].size());
    return n + wire::varint_size(scales.size()) + 4 * scales.size() + wire::varint_size(raw_length) +
           wire::varint_size(packed.size()) + packed.size();
  }
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void write_body(wire::writer& w) const {
    if (!is_packed) throw state_error("lgc_index_payload: pack() was not called");
    w.put<std::uint8_t>(detail::lgc_kind_index);
    w.put_varint(layer_lengths.size());
    for (std::size_t l = 0; l < layer_lengths.size(); ++l) {
      w.put_varint(layer_lengths[l]);
      w.put_varint(indices[l].size());
    }
    w.put_varint(scales.size());
    w.put_array<float>(scales);
    w.put_varint(raw_length);
    w.put_varint(packed.size());
    w.put_bytes(packed);
  }
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static lgc_index_payload read_body(wire::reader& r, const wire::header& h) {
    using wire::reader;
    using wire::wire_errc;
    if (r.get<std::uint8_t>() != detail::lgc_kind_index)
      reader::fail(wire_errc::malformed_body, "lgc: not an index set (another LGC message kind)");
    lgc_index_payload p;
    const std::uint64_t layers = r.get_varint();
    if (layers > r.remaining() / 2) reader::fail(wire_errc::truncated, "lgc index set: layer count exceeds the body");
    std::vector<std::uint64_t> counts(static_cast<std::size_t>(layers));
    p.layer_lengths.resize(static_cast<std::size_t>(layers));
    std::uint64_t total_length = 0, total_count = 0;
    for (std::size_t l = 0; l < layers; ++l) {
      p.layer_lengths[l] = r.get_varint();
      counts[l] = r.get_varint();
      if (p.layer_lengths[l] > sparse_max_elements)
        reader::fail(wire_errc::malformed_body, "lgc index set: layer longer than 2^32-1");
      if (counts[l] > p.layer_lengths[l]) reader::fail(wire_errc::malformed_body, "lgc index set: more indices than elements");
      total_length += p.layer_lengths[l];  // <= 2^32 * 2^32 / 2: cannot wrap (layers <= body bytes)
      total_count += counts[l];
    }
    if (total_length != h.element_count)
      reader::fail(wire_errc::malformed_body, "lgc index set: layer lengths do not add up to the element count");
    const std::uint64_t nscales = r.get_varint();
    p.scales = r.get_vector<float>(nscales);
    for (float s : p.scales)
      if (!(s > 0.0f) || !std::isfinite(s)) reader::fail(wire_errc::malformed_body, "lgc index set: scale not finite and > 0");
    p.raw_length = r.get_varint();
    const std::uint64_t packed_length = r.get_varint();
    if (packed_length > r.remaining()) reader::fail(wire_errc::truncated, "lgc index set: packed stream exceeds the body");
    // Each delta is a 1-5 byte varint; DEFLATE expands at most 1032:1. So the
    // allocation below is bounded by what the message itself justifies.
    if (p.raw_length < total_count || p.raw_length > 5 * total_count)
      reader::fail(wire_errc::malformed_body, "lgc index set: raw length inconsistent with the index count");
    if (p.raw_length > detail::lgc_max_inflate_ratio * packed_length + 64)
      reader::fail(wire_errc::malformed_body, "lgc index set: raw length beyond what DEFLATE can encode");
    const auto packed = r.get_bytes(packed_length);
    p.packed.assign(packed.begin(), packed.end());
    const std::vector<std::byte> raw = detail::lgc_inflate(packed, static_cast<std::size_t>(p.raw_length));
    wire::reader vr(raw);
    p.indices.resize(p.layer_lengths.size());
    for (std::size_t l = 0; l < p.layer_lengths.size(); ++l) {
      auto& v = p.indices[l];
      v.resize(static_cast<std::size_t>(counts[l]));
      std::uint64_t prev = 0;
      for (std::size_t j = 0; j < v.size(); ++j) {
        std::uint64_t d = 0;
        try {
          d = vr.get_varint();
        } catch (const wire::wire_error&) {
          reader::fail(wire_errc::malformed_body, "lgc index set: truncated or invalid index stream");
        }
        if (j > 0 && d == 0) reader::fail(wire_errc::malformed_body, "lgc index set: indices not strictly increasing");
        const std::uint64_t base = j == 0 ? 0 : prev;
        if (d >= p.layer_lengths[l] - base) reader::fail(wire_errc::malformed_body, "lgc index set: index out of range");
        prev = base + d;
        v[j] = static_cast<std::uint32_t>(prev);
      }
    }
    if (vr.remaining() != 0) reader::fail(wire_errc::malformed_body, "lgc index set: unused bytes in the index stream");
    p.is_packed = true;
    return p;
  }
};

/// Calls `f.template operator()<P>()` for each LGC payload type (code, index
/// set). gradcomp.hpp's for_each_payload_type lists the payloads that need no
/// zlib; the fuzzer and the wire tests add these where zlib is linked.
template <class F>
void for_each_lgc_payload_type(F&& f) {
  f.template operator()<lgc_code_payload>();
  f.template operator()<lgc_index_payload>();
}

}  // namespace gradcomp
