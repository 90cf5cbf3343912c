#pragma once
// Helpers for the tests of wire-format rejections.

#include <gradcomp/wire.hpp>

#include <doctest/doctest.h>

#include <cstddef>
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

/// Checks that wire::parse<Payload> rejects `good` with any one of its bytes
/// XORed with `mask` (header, body and checksum alike).
template <class Payload>
void check_flipped_bytes_rejected(const std::vector<std::byte>& good, std::byte mask) {
  for (std::size_t at = 0; at < good.size(); ++at) {
    auto bad = good;
    bad[at] ^= mask;
    CHECK_THROWS_AS(wire::parse<Payload>(bad), wire::wire_error);
  }
}

/// Checks that wire::parse<Payload> rejects every proper prefix of `good` as truncated.
template <class Payload>
void check_truncations_rejected(std::span<const std::byte> good) {
  for (std::size_t len = 0; len < good.size(); ++len)
    CHECK(parse_error_of<Payload>(good.first(len)) == wire::wire_errc::truncated);
}

/// A message of codec `Codec` with an arbitrary body behind a valid header and
/// checksum: the hand-crafted bodies of the rejection tests.
template <wire::codec_id Codec>
struct raw_message_of {
  static constexpr wire::codec_id wire_codec = Codec;
  std::uint64_t n = 0;
  std::vector<std::byte> body;
  std::uint64_t element_count() const { return n; }
  std::size_t body_size() const { return body.size(); }
  void write_body(wire::writer& w) const { w.put_bytes(body); }
  static raw_message_of read_body(wire::reader& r, const wire::header& h) {
    const auto b = r.get_bytes(h.body_length);
    return {h.element_count, std::vector<std::byte>(b.begin(), b.end())};
  }
};

}  // namespace gradcomp::test_support
