#pragma once
/// \file payloads/summable.hpp
/// Summable buffers: what a sum or max round of the whole-model exchange
/// reduces (docs/exchange.md), and what gradcomp's ring drivers reduce for
/// it (ring/summable.hpp). Shared by codecs, drivers and the exchange.
///
/// In memory a summable buffer is a std::span<float> of 4-byte cells:
///  - float32: float values;
///  - float16 / bfloat16: float values exactly representable in that type;
///  - int32_words: uint32 bit patterns (std::bit_cast<float>(word)), packed
///    lanes with headroom, so that adding whole words adds the lanes.
/// On the wire: wire_bytes(e) bytes per cell, native byte order (the ranks
/// are homogeneous, as for the plain ring): float32, IEEE binary16 bits,
/// bfloat16 bits, uint32 words.
///
/// Sums: float32 adds in float32; float16 and bfloat16 add in float32 and
/// round once to the type (round to nearest even), so a sum over N ranks is
/// rounded once per hop, never twice per addition (float32's 24 bits are at
/// least 2p + 2 for p = 11 and 8: the float32 sum of two 16-bit values,
/// rounded to 16 bits, is the correctly rounded sum). A 16-bit sum beyond
/// the type's largest finite value saturates to it (+-65504 for float16):
/// gradcomp's reductions never produce an Inf; the exchange treats a
/// saturated element as an overflow (after_reduce_check::finite).
/// int32_words add as uint32 modulo 2^32. (A NaN cell stays NaN; the payload
/// of NaN + NaN is the hardware's choice of operand.)

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/system/half.hpp>

namespace gradcomp {

/// Element type of a summable buffer (exchange::buffer_element is this type).
enum class summable_element : std::uint8_t {
  float32 = 0,      ///< IEEE binary32
  float16 = 1,      ///< IEEE binary16, summed in float32 and rounded once per addition
  bfloat16 = 2,     ///< bfloat16, summed in float32 and rounded once per addition
  int32_words = 3,  ///< 32-bit words of packed lanes with headroom: adding words adds the lanes
};

namespace summable {

/// Bytes of one cell on the wire: 4, 2, 2, 4.
constexpr std::size_t wire_bytes(summable_element e) noexcept {
  return e == summable_element::float16 || e == summable_element::bfloat16 ? 2 : 4;
}

/// A readable name of an element type.
constexpr const char* to_string(summable_element e) noexcept {
  switch (e) {
    case summable_element::float32: return "float32";
    case summable_element::float16: return "float16";
    case summable_element::bfloat16: return "bfloat16";
    case summable_element::int32_words: return "int32_words";
  }
  return "unknown";
}

/// True for the float element types (float32, float16, bfloat16).
constexpr bool is_float(summable_element e) noexcept { return e != summable_element::int32_words; }

/// Largest finite value of a float element type (float16: 65504).
constexpr float max_finite(summable_element e) noexcept {
  return e == summable_element::float16    ? execution::half_max
         : e == summable_element::bfloat16 ? execution::bfloat16_max
                                           : 0x1.FFFFFEp127f;
}

GRADCOMP_ABI_NAMESPACE_BEGIN

namespace detail {
inline void check_element(summable_element e, const char* who) {
  if (static_cast<std::uint8_t>(e) > 3)
    throw invalid_argument_error(std::string(who) + ": unknown summable element " +
                                 std::to_string(static_cast<unsigned>(e)));
}
inline void check_bytes(summable_element e, std::size_t cells, std::size_t bytes, const char* who) {
  check_element(e, who);
  if (bytes != cells * wire_bytes(e))
    throw size_mismatch_error(std::string(who) + ": bytes for " + std::to_string(cells) + " " + to_string(e) + " cells",
                              cells * wire_bytes(e), bytes);
}
/// Cells as 16-bit patterns in a scratch buffer (the received bytes may be unaligned).
inline std::span<const std::uint16_t> as_u16(std::span<const std::byte> in, std::vector<std::uint16_t>& scratch) {
  if (reinterpret_cast<std::uintptr_t>(in.data()) % alignof(std::uint16_t) == 0)
    return {reinterpret_cast<const std::uint16_t*>(in.data()), in.size() / 2};
  scratch.resize(in.size() / 2);
  if (!in.empty()) std::memcpy(scratch.data(), in.data(), in.size());
  return scratch;
}
}  // namespace detail

/// Writes the cells in their wire form: out.size() == cells.size() *
/// wire_bytes(e) (size_mismatch_error otherwise). 16-bit types: round to
/// nearest even, saturated (cells of that type convert exactly).
inline void pack(summable_element e, std::span<const float> cells, std::span<std::byte> out) {
  detail::check_bytes(e, cells.size(), out.size(), "summable::pack");
  if (cells.empty()) return;
  if (wire_bytes(e) == 4) {
    std::memcpy(out.data(), cells.data(), out.size());
    return;
  }
  std::vector<std::uint16_t> scratch;
  const bool aligned = reinterpret_cast<std::uintptr_t>(out.data()) % alignof(std::uint16_t) == 0;
  if (!aligned) scratch.resize(cells.size());
  const std::span<std::uint16_t> dst =
      aligned ? std::span<std::uint16_t>(reinterpret_cast<std::uint16_t*>(out.data()), cells.size())
              : std::span<std::uint16_t>(scratch);
  if (e == summable_element::float16)
    execution::floats_to_half(cells, dst);
  else
    execution::floats_to_bfloat16(cells, dst);
  if (!aligned) std::memcpy(out.data(), scratch.data(), out.size());
}

/// Reads cells from their wire form: in.size() == cells.size() * wire_bytes(e).
inline void unpack(summable_element e, std::span<const std::byte> in, std::span<float> cells) {
  detail::check_bytes(e, cells.size(), in.size(), "summable::unpack");
  if (cells.empty()) return;
  if (wire_bytes(e) == 4) {
    std::memcpy(cells.data(), in.data(), in.size());
    return;
  }
  std::vector<std::uint16_t> scratch;
  const auto src = detail::as_u16(in, scratch);
  if (e == summable_element::float16)
    execution::half_to_floats(src, cells);
  else
    execution::bfloat16_to_floats(src, cells);
}

/// acc += in, element-wise, rounded once to e: float32 adds; float16 and
/// bfloat16 round the float32 sum to nearest even, saturated; int32_words
/// add as uint32 modulo 2^32. Equal lengths (size_mismatch_error).
inline void add_into(summable_element e, std::span<float> acc, std::span<const float> in) {
  detail::check_element(e, "summable::add_into");
  if (acc.size() != in.size()) throw size_mismatch_error("summable::add_into", acc.size(), in.size());
  switch (e) {
    case summable_element::float32:
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += in[i];
      break;
    case summable_element::float16: execution::add_round_half(acc, in); break;
    case summable_element::bfloat16: execution::add_round_bfloat16(acc, in); break;
    case summable_element::int32_words:
      for (std::size_t i = 0; i < acc.size(); ++i)
        acc[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(acc[i]) + std::bit_cast<std::uint32_t>(in[i]));
      break;
  }
}

/// acc += unpack(in), rounded once to e (add_into with packed cells);
/// in.size() == acc.size() * wire_bytes(e).
inline void add_packed_into(summable_element e, std::span<float> acc, std::span<const std::byte> in) {
  detail::check_bytes(e, acc.size(), in.size(), "summable::add_packed_into");
  if (acc.empty()) return;
  switch (e) {
    case summable_element::float16:
    case summable_element::bfloat16: {
      std::vector<std::uint16_t> scratch;
      const auto src = detail::as_u16(in, scratch);
      if (e == summable_element::float16)
        execution::add_half_bits_round(acc, src);
      else
        execution::add_bfloat16_bits_round(acc, src);
      break;
    }
    case summable_element::float32:
    case summable_element::int32_words: {
      std::uint32_t w[256];
      for (std::size_t at = 0; at < acc.size(); at += 256) {
        const std::size_t k = std::min<std::size_t>(256, acc.size() - at);
        std::memcpy(w, in.data() + 4 * at, 4 * k);
        if (e == summable_element::float32)
          for (std::size_t i = 0; i < k; ++i) acc[at + i] += std::bit_cast<float>(w[i]);
        else
          for (std::size_t i = 0; i < k; ++i)
            acc[at + i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(acc[at + i]) + w[i]);
      }
      break;
    }
  }
}

/// acc = max(acc, in), element-wise, for the float types (a NaN in either
/// operand gives NaN). int32_words: invalid_argument_error (a max of packed
/// lanes means nothing).
inline void max_into(summable_element e, std::span<float> acc, std::span<const float> in) {
  detail::check_element(e, "summable::max_into");
  if (e == summable_element::int32_words)
    throw invalid_argument_error("summable::max_into: int32_words buffers have no element-wise max");
  if (acc.size() != in.size()) throw size_mismatch_error("summable::max_into", acc.size(), in.size());
  for (std::size_t i = 0; i < acc.size(); ++i) {
    const float a = acc[i], b = in[i];
    acc[i] = (a != a || b != b) ? (a != a ? a : b) : std::max(a, b);
  }
}

/// Rounds float cells to the element type in place (float16, bfloat16: to
/// nearest even, saturated; float32 and int32_words unchanged): what a codec
/// writes into a 16-bit buffer.
inline void round_cells(summable_element e, std::span<float> cells) {
  detail::check_element(e, "summable::round_cells");
  if (e == summable_element::float16)
    execution::round_half(cells);
  else if (e == summable_element::bfloat16)
    execution::round_bfloat16(cells);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace summable
}  // namespace gradcomp
