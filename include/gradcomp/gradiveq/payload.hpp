#pragma once
/// \file gradiveq/payload.hpp
/// GradiVeQ (seed 002): the payload of linear_compressor (eqs. 3-4: the
/// compressed coefficients of a run of slices), the error a payload of
/// another basis raises, and the eq. 7 local-loss value.
/// Part of <gradcomp/gradiveq.hpp>.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/system/generic/elementwise.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

/// A payload made with another basis (or another N, K or layer): the nodes'
/// compressors disagree, so summing or decoding would silently be wrong.
class fingerprint_mismatch_error : public state_error {
 public:
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  fingerprint_mismatch_error(const std::string& where, std::uint32_t expected, std::uint32_t actual)
      : state_error(where + ": basis fingerprint mismatch (expected " + hex(expected) + ", got " + hex(actual) +
                    "): the nodes' GradiVeQ compressors differ"),
        expected_(expected),
        actual_(actual) {}
  std::uint32_t expected() const noexcept { return expected_; }
  std::uint32_t actual() const noexcept { return actual_; }

 private:
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static std::string hex(std::uint32_t v) {
    static const char* digits = "0123456789abcdef";
    std::string s = "0x00000000";
    for (int i = 0; i < 8; ++i) s[9 - i] = digits[(v >> (4 * i)) & 0xF];
    return s;
  }
  std::uint32_t expected_;
  std::uint32_t actual_;
};

/// Payload of linear_compressor: the compressed coefficients of a run of whole
/// slices of a layer (the whole layer, or one ring segment), and the
/// uncompressed tail when the run ends at a layer end that K does not divide.
///
/// Body (little-endian, docs/codecs.md):
///     u32 fingerprint   basis fingerprint of the codec that made it
///     u32 count         payloads summed into this one (1 after encode)
///     u64 slice_size    K
///     u64 offset        first element of the run in the layer (a multiple of K)
///     u64 coefficients  number of coefficient floats (d per slice)
///     f32 coefficient[coefficients]   slice after slice
///     f32 tail[element_count % K]     uncompressed tail
/// element_count (header) is the run's length in elements.
struct gradiveq_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::gradiveq;
  static constexpr std::size_t fixed_body_size = 4 + 4 + 8 + 8 + 8;

  std::uint32_t fingerprint = 0;
  std::uint32_t count = 0;
  std::uint64_t slice_size = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::vector<float> coefficients;
  std::vector<float> tail;

  std::uint64_t element_count() const noexcept { return length; }
  std::size_t body_size() const noexcept { return fixed_body_size + 4 * (coefficients.size() + tail.size()); }
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void write_body(wire::writer& w) const {
    w.put<std::uint32_t>(fingerprint);
    w.put<std::uint32_t>(count);
    w.put<std::uint64_t>(slice_size);
    w.put<std::uint64_t>(offset);
    w.put<std::uint64_t>(coefficients.size());
    w.put_array<float>(coefficients);
    w.put_array<float>(tail);
  }
  /// Validates everything the payload can say about itself (non-finite values
  /// included: wire_errc::malformed_body); the codec checks the rest (fingerprint, d per slice, position in its layer) on use.
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static gradiveq_payload read_body(wire::reader& r, const wire::header& h) {
    gradiveq_payload p;
    read_body_into(r, h, p);
    return p;
  }
  /// read_body into `p`, keeping its buffers (wire::parse_into).
  template <class AbiMarker = execution::abi_marker>
  static void read_body_into(wire::reader& r, const wire::header& h, gradiveq_payload& p) {
    using wire::reader;
    p.length = h.element_count;
    p.fingerprint = r.get<std::uint32_t>();
    p.count = r.get<std::uint32_t>();
    p.slice_size = r.get<std::uint64_t>();
    p.offset = r.get<std::uint64_t>();
    const std::uint64_t ncoef = r.get<std::uint64_t>();
    reader::check(p.count >= 1, "gradiveq payload: count is 0");
    reader::check(p.slice_size >= 1, "gradiveq payload: slice size is 0");
    reader::check(p.offset % p.slice_size == 0, "gradiveq payload: offset is not on a slice boundary");
    reader::check(p.offset <= std::numeric_limits<std::uint64_t>::max() - p.length,
                  "gradiveq payload: offset + length overflows");
    const std::uint64_t slices = p.length / p.slice_size;
    const std::uint64_t tail = p.length % p.slice_size;
    // d <= K for every slice, so at most slices*K (<= length) coefficients.
    reader::check(ncoef <= slices * p.slice_size, "gradiveq payload: more coefficients than the slices allow");
    reader::check(slices > 0 || ncoef == 0, "gradiveq payload: coefficients without slices");
    const std::uint64_t floats = ncoef + tail;  // both <= length <= parse limit: no overflow
    if (r.remaining() / 4 < floats || r.remaining() % 4 != 0 || r.remaining() / 4 != floats) {
      if (r.remaining() / 4 < floats)
        reader::fail(wire::wire_errc::truncated, "gradiveq payload: body shorter than its counts");
      reader::fail(wire::wire_errc::malformed_body, "gradiveq payload: body longer than its counts");
    }
    // Sizes checked against the bytes above: resizing cannot over-allocate.
    p.coefficients.resize(static_cast<std::size_t>(ncoef));
    p.tail.resize(static_cast<std::size_t>(tail));
    r.get_array<float>(std::span<float>(p.coefficients));
    r.get_array<float>(std::span<float>(p.tail));
    // One validation policy for every payload: non-finite values (a buggy or
    // hostile sender with a valid checksum) are rejected at parse, with the
    // codecs' own branch-free scan (vectorised, unlike an exit per value).
    const auto finite = [](std::span<const float> x) { return execution::find_non_finite(execution::seq{}, x) == x.size(); };
    if (!finite(p.coefficients)) reader::fail(wire::wire_errc::malformed_body, "gradiveq payload: non-finite coefficient");
    if (!finite(p.tail)) reader::fail(wire::wire_errc::malformed_body, "gradiveq payload: non-finite tail value");
  }
};

/// Eq. 7: a node's local compression loss ||g_n - (U_d g'_n + mu/N)||^2 over a
/// run of slices, with the gradient's own energy for a scale-free reading.
struct local_loss_value {
  double loss = 0.0;    ///< eq. 7 (absolute)
  double energy = 0.0;  ///< ||g_n||^2 over the same elements
  /// loss / energy (0 for a zero gradient): comparable with lambda.
  double relative() const noexcept { return energy > 0.0 ? loss / energy : 0.0; }
};

}  // namespace gradcomp
