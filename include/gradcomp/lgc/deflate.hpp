#pragma once
/// \file lgc/deflate.hpp
/// Raw DEFLATE (zlib) of the LGC index sets, and the bounded inflate the
/// parser uses. Link zlib (CMake: gradcomp::lgc).

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// raw DEFLATE (zlib, windowBits -15) of `raw`.
[[nodiscard]] inline std::vector<std::byte> lgc_deflate(std::span<const std::byte> raw, int level) {
  z_stream s{};
  if (deflateInit2(&s, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw invalid_argument_error("lgc: zlib rejected DEFLATE level " + std::to_string(level));
  std::vector<std::byte> out(deflateBound(&s, static_cast<uLong>(raw.size())));
  s.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(raw.data()));
  s.avail_in = static_cast<uInt>(raw.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&s, Z_FINISH);
  const std::size_t produced = out.size() - s.avail_out;
  deflateEnd(&s);
  if (rc != Z_STREAM_END) throw state_error("lgc: zlib deflate did not finish");
  out.resize(produced);
  return out;
}

/// Inflates raw DEFLATE into exactly `raw_length` bytes; anything else
/// (a corrupt stream, more or less output, unused input) is malformed_body.
[[nodiscard]] inline std::vector<std::byte> lgc_inflate(std::span<const std::byte> packed, std::size_t raw_length) {
  // One spare byte: a stream that would inflate to more than raw_length fills it.
  std::vector<std::byte> out(raw_length + 1);
  z_stream s{};
  if (inflateInit2(&s, -15) != Z_OK) throw state_error("lgc: zlib inflateInit failed");
  s.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(packed.data()));
  s.avail_in = static_cast<uInt>(packed.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  const int rc = inflate(&s, Z_FINISH);
  const bool ok = rc == Z_STREAM_END && s.total_out == raw_length && s.avail_in == 0;
  inflateEnd(&s);
  if (!ok)
    wire::reader::fail(wire::wire_errc::malformed_body,
                       "lgc index set: DEFLATE stream does not inflate to exactly the declared length");
  out.resize(raw_length);
  return out;
}

/// DEFLATE cannot expand data by more than this factor (1032:1) plus a constant.
inline constexpr std::uint64_t lgc_max_inflate_ratio = 1032;

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

}  // namespace gradcomp
