#pragma once
/// \file payloads/dense.hpp
/// dense_payload: uncompressed float32 values. Shared by dense_codec and the
/// drivers (the parameter servers' dense downlink), so it lives below both.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <gradcomp/wire.hpp>

namespace gradcomp {

/// Payload of dense_codec: the floats themselves.
struct dense_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::dense;
  std::vector<float> values;

  std::uint64_t element_count() const noexcept { return values.size(); }
  std::size_t body_size() const noexcept { return values.size() * sizeof(float); }
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void write_body(wire::writer& w) const { w.put_array<float>(values); }
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static dense_payload read_body(wire::reader& r, const wire::header& h) {
    if (h.body_length != h.element_count * sizeof(float))
      wire::reader::fail(wire::wire_errc::malformed_body, "dense body length is not 4 x element count");
    dense_payload p{r.get_vector<float>(h.element_count)};
    // One validation policy for every payload: non-finite values are rejected
    // at parse (a buggy or hostile sender with a valid checksum).
    for (float v : p.values)
      if (!std::isfinite(v)) wire::reader::fail(wire::wire_errc::malformed_body, "dense body: non-finite value");
    return p;
  }
};

}  // namespace gradcomp
