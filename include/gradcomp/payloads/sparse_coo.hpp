#pragma once
/// \file payloads/sparse_coo.hpp
/// sparse_coo_payload: the COO payload of the top-R% codecs
/// (sparsifier_with_memory, sa_momentum), its wire encoding (delta+varint or
/// bitmap indices) and its scatter kernel. Shared by those codecs and the
/// parameter servers (which decode and re-send COO layers), so it lives below
/// both (seed 001, DGS: the sparse G and g of Algorithms 1-3).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

/// Index encodings of sparse_coo_payload (the body's first byte).
enum class index_encoding : std::uint8_t {
  delta_varint = 0,  ///< first index, then differences to the previous index, each a LEB128 varint
  bitmap = 1,        ///< ceil(n/8) bytes, bit i (LSB first within a byte) set when index i is present
};

/// The largest layer the sparse codecs address (indices are 32-bit).
inline constexpr std::uint64_t sparse_max_elements = std::numeric_limits<std::uint32_t>::max();

/// COO payload of the sparse codecs: `length` (decoded size), strictly
/// increasing `indices` < length and their `values`. The index block is
/// written as delta+varint or as a bitmap, whichever is smaller (ties:
/// delta+varint), unless `forced_encoding` says which. Body layout:
///     u8      index encoding (0 delta+varint, 1 bitmap)
///     varint  nnz, the number of entries (<= length)
///     ...     index block: nnz varints, or ceil(length/8) bitmap bytes
///     f32[nnz] values, little-endian
/// Parsing rejects: unknown encoding, nnz > length, length > 2^32-1, a zero
/// difference (indices not strictly increasing), an index >= length, bitmap
/// bits beyond length, a bitmap whose popcount is not nnz, a truncated varint
/// or block, and non-finite values.
struct sparse_coo_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::sparse_coo;

  std::uint64_t length = 0;                       ///< decoded element count
  std::vector<std::uint32_t> indices;             ///< strictly increasing, < length
  std::vector<float> values;                      ///< one per index
  std::optional<index_encoding> forced_encoding;  ///< write this encoding instead of the smaller one

  std::uint64_t element_count() const noexcept { return length; }
  /// Number of entries sent.
  std::size_t nnz() const noexcept { return indices.size(); }

  /// Bytes of the index block as delta+varint.
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  std::size_t delta_varint_index_bytes() const noexcept {
    std::size_t bytes = 0;
    std::uint32_t prev = 0;
    for (std::size_t j = 0; j < indices.size(); ++j) {
      bytes += wire::varint_size(j == 0 ? indices[0] : indices[j] - prev);
      prev = indices[j];
    }
    return bytes;
  }
  /// Bytes of the index block as a bitmap.
  std::size_t bitmap_index_bytes() const noexcept { return static_cast<std::size_t>((length + 7) / 8); }
  /// The encoding write_body uses.
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  index_encoding encoding() const noexcept {
    if (forced_encoding) return *forced_encoding;
    return bitmap_index_bytes() < delta_varint_index_bytes() ? index_encoding::bitmap : index_encoding::delta_varint;
  }

  /// Throws invalid_argument_error unless the payload is well formed
  /// (sizes agree, indices strictly increasing and < length <= 2^32-1).
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void validate() const {
    if (indices.size() != values.size())
      throw invalid_argument_error("sparse_coo_payload: " + std::to_string(indices.size()) + " indices but " +
                                   std::to_string(values.size()) + " values");
    if (length > sparse_max_elements) throw invalid_argument_error("sparse_coo_payload: length above 2^32-1");
    for (std::size_t j = 0; j < indices.size(); ++j) {
      if (indices[j] >= length)
        throw invalid_argument_error("sparse_coo_payload: index " + std::to_string(indices[j]) + " >= length " +
                                     std::to_string(length));
      if (j > 0 && indices[j] <= indices[j - 1])
        throw invalid_argument_error("sparse_coo_payload: indices not strictly increasing at entry " +
                                     std::to_string(j));
    }
  }

  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  std::size_t body_size() const noexcept {
    const std::size_t index_bytes =
        encoding() == index_encoding::bitmap ? bitmap_index_bytes() : delta_varint_index_bytes();
    return 1 + wire::varint_size(indices.size()) + index_bytes + values.size() * sizeof(float);
  }

  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void write_body(wire::writer& w) const {
    validate();
    const index_encoding enc = encoding();
    w.put<std::uint8_t>(static_cast<std::uint8_t>(enc));
    w.put_varint(indices.size());
    if (enc == index_encoding::bitmap) {
      std::vector<std::byte> bits(bitmap_index_bytes(), std::byte{0});
      for (std::uint32_t i : indices) bits[i >> 3] |= std::byte(1u << (i & 7u));
      w.put_bytes(bits);
    } else {
      std::uint32_t prev = 0;
      for (std::size_t j = 0; j < indices.size(); ++j) {
        w.put_varint(j == 0 ? indices[0] : indices[j] - prev);
        prev = indices[j];
      }
    }
    w.put_array<float>(values);
  }

  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static sparse_coo_payload read_body(wire::reader& r, const wire::header& h) {
    using wire::reader;
    using wire::wire_errc;
    sparse_coo_payload p;
    p.length = h.element_count;
    if (p.length > sparse_max_elements) reader::fail(wire_errc::malformed_body, "sparse_coo: length above 2^32-1");
    const auto enc = r.get<std::uint8_t>();
    if (enc > 1) reader::fail(wire_errc::malformed_body, "sparse_coo: unknown index encoding " + std::to_string(enc));
    const std::uint64_t nnz = r.get_varint();
    if (nnz > p.length)
      reader::fail(wire_errc::malformed_body, "sparse_coo: " + std::to_string(nnz) + " entries for " +
                                                  std::to_string(p.length) + " elements");
    if (enc == static_cast<std::uint8_t>(index_encoding::delta_varint)) {
      // Every entry needs at least one index byte and four value bytes:
      // check before allocating, so a lying count cannot allocate.
      if (nnz > r.remaining() / 5)
        reader::fail(wire_errc::truncated, "sparse_coo: " + std::to_string(nnz) + " entries do not fit the body");
      p.indices.resize(static_cast<std::size_t>(nnz));
      std::uint64_t prev = 0;
      for (std::size_t j = 0; j < p.indices.size(); ++j) {
        const std::uint64_t d = r.get_varint();
        if (j > 0 && d == 0) reader::fail(wire_errc::malformed_body, "sparse_coo: indices not strictly increasing");
        const std::uint64_t base = j == 0 ? 0 : prev;
        if (d >= p.length - base) reader::fail(wire_errc::malformed_body, "sparse_coo: index out of range");
        prev = base + d;
        p.indices[j] = static_cast<std::uint32_t>(prev);
      }
    } else {
      const std::uint64_t bitmap_bytes = (p.length + 7) / 8;
      const auto bits = r.get_bytes(bitmap_bytes);
      if (nnz > r.remaining() / 4)
        reader::fail(wire_errc::truncated, "sparse_coo: " + std::to_string(nnz) + " values do not fit the body");
      if (p.length % 8 != 0 && (std::to_integer<unsigned>(bits.back()) >> (p.length % 8)) != 0)
        reader::fail(wire_errc::malformed_body, "sparse_coo: bitmap bit beyond the element count");
      p.indices.resize(static_cast<std::size_t>(nnz));
      std::size_t m = 0;
      for (std::size_t byte = 0; byte < bits.size(); ++byte) {
        unsigned b = std::to_integer<unsigned>(bits[byte]);
        if (b == 0) continue;
        if (static_cast<std::size_t>(std::popcount(b)) > p.indices.size() - m)
          reader::fail(wire_errc::malformed_body, "sparse_coo: bitmap holds more entries than its count");
        for (; b != 0; b &= b - 1) p.indices[m++] = static_cast<std::uint32_t>(byte * 8 + std::countr_zero(b));
      }
      if (m != p.indices.size())
        reader::fail(wire_errc::malformed_body, "sparse_coo: bitmap holds fewer entries than its count");
    }
    p.values = r.get_vector<float>(nnz);
    for (float v : p.values)
      if (!std::isfinite(v)) reader::fail(wire_errc::malformed_body, "sparse_coo: non-finite value");
    return p;
  }
};

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// out = decode(p) (Add: out += decode(p)), after checking sizes and the payload.
template <bool Add>
void sparse_scatter(const sparse_coo_payload& p, std::span<float> out, const char* who) {
  if (out.size() != p.length) throw size_mismatch_error(who, static_cast<std::size_t>(p.length), out.size());
  p.validate();
  if constexpr (!Add) std::fill(out.begin(), out.end(), 0.0f);
  float* o = out.data();
  for (std::size_t j = 0; j < p.indices.size(); ++j) {
    if constexpr (Add)
      o[p.indices[j]] += p.values[j];
    else
      o[p.indices[j]] = p.values[j];
  }
}

inline void check_sparse_length(std::size_t n, const char* who) {
  if (n > sparse_max_elements)
    throw invalid_argument_error(std::string(who) + ": layers are limited to 2^32-1 elements (32-bit indices)");
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

}  // namespace gradcomp
