#pragma once
// Helpers for the tests of wire-format rejections.

#include <gradcomp/wire.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace gradcomp::test_support {

/// The wire_errc with which wire::parse<Payload> rejects `bytes`; fails the test if it accepts them.
template <class Payload>
wire::wire_errc parse_error_of(std::span<const std::byte> bytes, const wire::parse_limits& limits = {}) {
  try {
    (void)wire::parse<Payload>(bytes, limits);
  } catch (const wire::wire_error& e) {
    return e.code();
  }
  FAIL("parse accepted bytes it should reject");
  return wire::wire_errc::truncated;
}

/// Recomputes the checksum after a deliberate edit, so the test reaches the
/// check behind it instead of stopping at checksum_mismatch. Writes the CRC
/// in host order (little-endian in CI; test_wire's endian test covers that).
inline void reseal(std::vector<std::byte>& bytes) {
  auto span = std::span<const std::byte>(bytes);
  const std::uint32_t crc = wire::crc32c(wire::crc32c(0, span.first(28)), span.subspan(wire::header_size));
  std::memcpy(bytes.data() + 28, &crc, 4);
}

}  // namespace gradcomp::test_support
