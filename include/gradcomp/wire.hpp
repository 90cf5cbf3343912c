#pragma once
/// \file wire.hpp
/// The versioned, little-endian, bounds-checked binary format of everything
/// gradcomp puts on a network: codec payloads and saved codec states.
/// docs/wire-format.md is the normative description.
///
/// A message is a fixed 32-byte header followed by a codec-specific body:
///
///     offset size field
///          0    4 magic          "GCW1" (0x47 0x43 0x57 0x31)
///          4    2 version        format version, currently 1
///          6    2 codec          wire::codec_id
///          8    1 element_type   wire::element_type of the decoded data
///          9    1 flags          bit 0: body is a saved codec state, not a payload
///         10    2 reserved       must be 0
///         12    8 element_count  length of the decoded gradient
///         20    8 body_length    bytes after the header
///         28    4 checksum       CRC-32C of header bytes [0,28) then the body
///
/// Parsing never trusts the bytes: every read is bounds-checked, and each
/// failure is a wire_error with a distinct wire_errc.
///
/// A payload type P takes part by providing (see the WirePayload concept):
///     static constexpr wire::codec_id wire_codec;
///     std::uint64_t element_count() const;      // decoded length
///     std::size_t   body_size() const;          // exact body bytes
///     void          write_body(wire::writer&) const;
///     static P      read_body(wire::reader&, const wire::header&);

#include <algorithm>
#include <array>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/errors.hpp>

#include <gradcomp/wire/crc32c.hpp>

namespace gradcomp::wire {

static_assert(std::endian::native == std::endian::little || std::endian::native == std::endian::big,
              "mixed-endian platforms are not supported");

/// Identifies the codec (and so the body layout) of a message.
enum class codec_id : std::uint16_t {
  dense = 1,        ///< uncompressed float32 (dense.hpp)
  two_bit = 2,      ///< two_bit_quantizer (two_bit.hpp)
  qsgd = 3,         ///< qsgd (qsgd.hpp)
  sparse_coo = 4,   ///< sparsifier_with_memory, sa_momentum (sparsify.hpp)
  gradiveq = 5,     ///< linear_compressor (gradiveq.hpp)
  autoencoder = 6,  ///< autoencoder_codec (autoencoder.hpp)
  fp16 = 8,         ///< fp16_codec (half.hpp)
  bf16 = 9,         ///< bf16_codec (half.hpp)
  homomorphic = 10, ///< homomorphic_quantizer (homomorphic.hpp)
  powersgd = 12,    ///< powersgd_compressor's saved state (powersgd.hpp; its P and Q are plain float sums)
  codec_group = 13, ///< codec_group's payload: its members' payloads of one run (schedules/codec_group.hpp)
  control = 100,    ///< driver control messages (parameter servers, schedules)
  user_first = 1000 ///< first id free for users' own codecs
};

/// Element type of the decoded data.
enum class element_type : std::uint8_t { float32 = 1 };

/// Header flag bits.
enum header_flags : std::uint8_t {
  flag_none = 0,
  flag_codec_state = 1,  ///< the body is a StatefulCodec's saved state
  flag_known_mask = 1,
};

inline constexpr std::array<std::uint8_t, 4> magic = {0x47, 0x43, 0x57, 0x31};  // "GCW1"
inline constexpr std::uint16_t current_version = 1;
inline constexpr std::size_t header_size = 32;

/// Why a buffer was rejected. Each value is a distinct failure.
enum class wire_errc {
  truncated = 1,         ///< fewer bytes than the header or the declared body need
  oversized,             ///< more bytes than declared, or a declared size above the parse limits
  bad_magic,             ///< not a gradcomp message
  unsupported_version,   ///< a version this build cannot read
  wrong_codec,           ///< a valid message for another codec
  wrong_element_type,    ///< element type this codec does not decode
  checksum_mismatch,     ///< corrupted in transit
  malformed_header,      ///< reserved bits or fields set, unknown flags
  malformed_body,        ///< the body contradicts itself or the header
  wrong_kind,            ///< a state where a payload was expected, or the reverse
};

inline const char* to_string(wire_errc e) noexcept {
  switch (e) {
    case wire_errc::truncated: return "truncated";
    case wire_errc::oversized: return "oversized";
    case wire_errc::bad_magic: return "bad magic";
    case wire_errc::unsupported_version: return "unsupported version";
    case wire_errc::wrong_codec: return "wrong codec";
    case wire_errc::wrong_element_type: return "wrong element type";
    case wire_errc::checksum_mismatch: return "checksum mismatch";
    case wire_errc::malformed_header: return "malformed header";
    case wire_errc::malformed_body: return "malformed body";
    case wire_errc::wrong_kind: return "wrong kind (payload/state)";
  }
  return "unknown wire error";
}

/// std::error_category for wire_errc, so errors compose with std::error_code.
inline const std::error_category& wire_category() noexcept {
  struct category final : std::error_category {
    const char* name() const noexcept override { return "gradcomp.wire"; }
    std::string message(int v) const override { return to_string(static_cast<wire_errc>(v)); }
  };
  static const category instance;
  return instance;
}

inline std::error_code make_error_code(wire_errc e) noexcept { return {static_cast<int>(e), wire_category()}; }

/// Thrown for every rejected buffer; code() says why.
class wire_error : public gradcomp::error {
 public:
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  wire_error(wire_errc code, const std::string& detail)
      : gradcomp::error(std::string("gradcomp wire: ") + to_string(code) + ": " + detail), code_(code) {}
  wire_errc code() const noexcept { return code_; }
  std::error_code error_code() const noexcept { return make_error_code(code_); }

 private:
  wire_errc code_;
};

/// Upper bounds a parser accepts before allocating anything.
struct parse_limits {
  std::uint64_t max_element_count = std::uint64_t{1} << 34;  ///< 16 Gi elements
  std::uint64_t max_body_length = std::uint64_t{1} << 36;    ///< 64 GiB
};

// ---------------------------------------------------------------------------
// Little-endian scalar codecs.

GRADCOMP_ABI_NAMESPACE_BEGIN
namespace detail {
template <class T>
T byteswap(T v) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  auto bytes = std::bit_cast<std::array<std::byte, sizeof(T)>>(v);
  for (std::size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(bytes[i], bytes[sizeof(T) - 1 - i]);
  return std::bit_cast<T>(bytes);
}
template <class T>
T to_little(T v) noexcept {
  if constexpr (std::endian::native == std::endian::little || sizeof(T) == 1) return v;
  else return byteswap(v);
}
}  // namespace detail
GRADCOMP_ABI_NAMESPACE_END

template <class T>
concept WireScalar = std::is_arithmetic_v<T> && !std::same_as<T, bool> && !std::same_as<T, long double>;

/// Appends little-endian values to a byte vector. (Its member functions,
/// like reader's, are templates with a last `AbiMarker` parameter so each
/// instruction-set configuration has its own copy: abi.hpp.)
class writer {
 public:
  explicit writer(std::vector<std::byte>& out) noexcept : out_(&out) {}

  template <WireScalar T, class AbiMarker = execution::abi_marker>
  void put(T v) {
    v = detail::to_little(v);
    const auto at = out_->size();
    out_->resize(at + sizeof(T));
    std::memcpy(out_->data() + at, &v, sizeof(T));
  }
  /// An array of scalars, no length prefix (the body layout says how many).
  template <WireScalar T, class AbiMarker = execution::abi_marker>
  void put_array(std::span<const T> values) {
    const auto at = out_->size();
    out_->resize(at + values.size_bytes());
    if constexpr (std::endian::native == std::endian::little || sizeof(T) == 1) {
      if (!values.empty()) std::memcpy(out_->data() + at, values.data(), values.size_bytes());
    } else {
      for (std::size_t i = 0; i < values.size(); ++i) {
        T v = detail::to_little(values[i]);
        std::memcpy(out_->data() + at + i * sizeof(T), &v, sizeof(T));
      }
    }
  }
  template <class AbiMarker = execution::abi_marker>
  void put_bytes(std::span<const std::byte> bytes) {
    out_->insert(out_->end(), bytes.begin(), bytes.end());
  }
  /// LEB128 unsigned varint (1-10 bytes).
  template <class AbiMarker = execution::abi_marker>
  void put_varint(std::uint64_t v) {
    while (v >= 0x80) {
      put<std::uint8_t>(static_cast<std::uint8_t>(v | 0x80));
      v >>= 7;
    }
    put<std::uint8_t>(static_cast<std::uint8_t>(v));
  }
  std::size_t size() const noexcept { return out_->size(); }
  std::vector<std::byte>& buffer() noexcept { return *out_; }

 private:
  std::vector<std::byte>* out_;
};

/// Bytes a varint of v takes.
constexpr std::size_t varint_size(std::uint64_t v) noexcept {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

/// Reads little-endian values from untrusted bytes; every read is bounds-checked
/// and throws wire_error(truncated) or (malformed_body) instead of overrunning.
class reader {
 public:
  explicit reader(std::span<const std::byte> bytes) noexcept : bytes_(bytes) {}

  template <WireScalar T, class AbiMarker = execution::abi_marker>
  T get() {
    require(sizeof(T), "scalar");
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return detail::to_little(v);
  }
  /// Fills `out` with out.size() scalars.
  template <WireScalar T, class AbiMarker = execution::abi_marker>
  void get_array(std::span<T> out) {
    if (out.size() > remaining() / sizeof(T)) fail(wire_errc::truncated, "array of " + std::to_string(out.size()));
    if (!out.empty()) std::memcpy(out.data(), bytes_.data() + pos_, out.size_bytes());
    if constexpr (std::endian::native == std::endian::big && sizeof(T) > 1)
      for (auto& v : out) v = detail::to_little(v);
    pos_ += out.size_bytes();
  }
  /// Reads `count` scalars into a new vector, after checking they are there
  /// (so a lying count cannot make us allocate more than the buffer holds).
  template <WireScalar T, class AbiMarker = execution::abi_marker>
  std::vector<T> get_vector(std::uint64_t count) {
    if (count > remaining() / sizeof(T)) fail(wire_errc::truncated, "vector of " + std::to_string(count));
    std::vector<T> v(static_cast<std::size_t>(count));
    get_array<T>(v);
    return v;
  }
  /// A view of the next n bytes.
  template <class AbiMarker = execution::abi_marker>
  std::span<const std::byte> get_bytes(std::uint64_t n) {
    if (n > remaining()) fail(wire_errc::truncated, "byte run of " + std::to_string(n));
    auto s = bytes_.subspan(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  template <class AbiMarker = execution::abi_marker>
  std::uint64_t get_varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const auto b = get<std::uint8_t>();
      if (shift == 63 && (b & 0x7E)) fail(wire_errc::malformed_body, "varint overflows 64 bits");
      v |= std::uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail(wire_errc::malformed_body, "varint longer than 10 bytes");
  }
  std::size_t remaining() const noexcept { return bytes_.size() - pos_; }
  std::size_t position() const noexcept { return pos_; }
  /// The body must be consumed exactly.
  template <class AbiMarker = execution::abi_marker>
  void expect_end() const {
    if (remaining() != 0) fail(wire_errc::malformed_body, std::to_string(remaining()) + " unread bytes at end of body");
  }
  template <class AbiMarker = execution::abi_marker>
  [[noreturn]] static void fail(wire_errc code, const std::string& what) { throw wire_error(code, what); }
  /// Throws malformed_body with `what` unless `ok`.
  template <class AbiMarker = execution::abi_marker>
  static void check(bool ok, const char* what) {
    if (!ok) fail(wire_errc::malformed_body, what);
  }

 private:
  template <class AbiMarker = execution::abi_marker>
  void require(std::size_t n, const char* what) const {
    if (n > remaining()) fail(wire_errc::truncated, std::string(what) + " needs " + std::to_string(n) + " bytes, " +
                                                        std::to_string(remaining()) + " left");
  }
  std::span<const std::byte> bytes_;
  std::size_t pos_ = 0;
};

// ---------------------------------------------------------------------------
// Header.

/// The decoded fixed header of a message.
struct header {
  std::uint16_t version = current_version;
  codec_id codec = codec_id::dense;
  element_type elements = element_type::float32;
  std::uint8_t flags = flag_none;
  std::uint64_t element_count = 0;
  std::uint64_t body_length = 0;
  std::uint32_t checksum = 0;

  bool is_state() const noexcept { return (flags & flag_codec_state) != 0; }
};

/// The part of a message a payload type must describe.
template <class P>
concept WirePayload = requires(const P& p, writer& w, reader& r, const header& h) {
  { P::wire_codec } -> std::convertible_to<codec_id>;
  { p.element_count() } -> std::convertible_to<std::uint64_t>;
  { p.body_size() } -> std::convertible_to<std::size_t>;
  { p.write_body(w) } -> std::same_as<void>;
  { P::read_body(r, h) } -> std::same_as<P>;
};

// The functions below have a copy per instruction-set configuration (abi.hpp).
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace detail {
inline void write_header_prefix(std::byte* out, const header& h) noexcept {
  // Everything but the checksum, little-endian.
  std::memcpy(out, magic.data(), 4);
  auto put = [&](std::size_t at, auto v) {
    v = to_little(v);
    std::memcpy(out + at, &v, sizeof(v));
  };
  put(4, h.version);
  put(6, static_cast<std::uint16_t>(h.codec));
  put(8, static_cast<std::uint8_t>(h.elements));
  put(9, h.flags);
  put(10, std::uint16_t{0});
  put(12, h.element_count);
  put(20, h.body_length);
}
}  // namespace detail

/// Reads and validates the header of `bytes` (magic, version, flags, lengths,
/// checksum) without looking at the body's layout.
inline header parse_header(std::span<const std::byte> bytes, const parse_limits& limits = {}) {
  if (bytes.size() < header_size)
    reader::fail(wire_errc::truncated, "message of " + std::to_string(bytes.size()) + " bytes is shorter than the " +
                                           std::to_string(header_size) + "-byte header");
  if (std::memcmp(bytes.data(), magic.data(), magic.size()) != 0) reader::fail(wire_errc::bad_magic, "expected \"GCW1\"");
  reader r(bytes.first(header_size));
  r.get_bytes(4);
  header h;
  h.version = r.get<std::uint16_t>();
  if (h.version != current_version)
    reader::fail(wire_errc::unsupported_version,
                 "version " + std::to_string(h.version) + ", this build reads " + std::to_string(current_version));
  h.codec = static_cast<codec_id>(r.get<std::uint16_t>());
  h.elements = static_cast<element_type>(r.get<std::uint8_t>());
  h.flags = r.get<std::uint8_t>();
  if (h.flags & ~flag_known_mask) reader::fail(wire_errc::malformed_header, "unknown flag bits");
  if (r.get<std::uint16_t>() != 0) reader::fail(wire_errc::malformed_header, "reserved field is not zero");
  h.element_count = r.get<std::uint64_t>();
  h.body_length = r.get<std::uint64_t>();
  h.checksum = r.get<std::uint32_t>();
  if (h.element_count > limits.max_element_count)
    reader::fail(wire_errc::oversized, "element count " + std::to_string(h.element_count) + " above the limit");
  if (h.body_length > limits.max_body_length)
    reader::fail(wire_errc::oversized, "body length " + std::to_string(h.body_length) + " above the limit");
  const std::uint64_t available = bytes.size() - header_size;
  if (h.body_length > available)
    reader::fail(wire_errc::truncated, "body declares " + std::to_string(h.body_length) + " bytes, " +
                                           std::to_string(available) + " present");
  if (h.body_length < available)
    reader::fail(wire_errc::oversized,
                 std::to_string(available - h.body_length) + " bytes beyond the declared body");
  const std::uint32_t crc = crc32c(crc32c(0, bytes.first(28)), bytes.subspan(header_size));
#if !defined(FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
  if (crc != h.checksum) reader::fail(wire_errc::checksum_mismatch, "CRC-32C does not match");
#else
  (void)crc;  // fuzz builds skip the checksum so mutations reach the body parsers
#endif
  return h;
}

/// Exact bytes `serialize(p)` produces: header plus body.
template <WirePayload P>
std::size_t serialized_size(const P& p) {
  return header_size + p.body_size();
}

namespace detail {
/// Writes one message (header, then the body write_body appends) at the end
/// of `out`, from byte `start` on (`out` is cut to `start` first).
template <class WriteBody>
void serialize_message_at(std::vector<std::byte>& out, std::size_t start, codec_id codec, std::uint8_t flags,
                          std::uint64_t element_count, std::size_t body_size, WriteBody&& write_body) {
  out.resize(start);
  if (out.capacity() < start + header_size + body_size)
    out.reserve(std::max(start + header_size + body_size, 2 * out.capacity()));
  out.resize(start + header_size);
  writer w(out);
  write_body(w);
  if (out.size() != start + header_size + body_size)
    throw state_error("gradcomp wire: body_size() disagrees with write_body() (" + std::to_string(body_size) +
                      " declared, " + std::to_string(out.size() - start - header_size) + " written)");
  header h;
  h.codec = codec;
  h.flags = flags;
  h.element_count = element_count;
  h.body_length = body_size;
  write_header_prefix(out.data() + start, h);
  auto span = std::span<const std::byte>(out).subspan(start);
  std::uint32_t crc = to_little(crc32c(crc32c(0, span.first(28)), span.subspan(header_size)));
  std::memcpy(out.data() + start + 28, &crc, 4);
}

template <class WriteBody>
void serialize_message(std::vector<std::byte>& out, codec_id codec, std::uint8_t flags, std::uint64_t element_count,
                       std::size_t body_size, WriteBody&& write_body) {
  serialize_message_at(out, 0, codec, flags, element_count, body_size, std::forward<WriteBody>(write_body));
}
}  // namespace detail

/// Serialises a payload into `out` (replacing its contents, reusing its capacity).
template <WirePayload P>
void serialize_into(const P& p, std::vector<std::byte>& out) {
  detail::serialize_message(out, P::wire_codec, flag_none, p.element_count(), p.body_size(),
                            [&](writer& w) { p.write_body(w); });
}

/// Appends a payload's message (exactly serialized_size(p) bytes) to `out`:
/// several messages in one buffer without a copy of each (the compressed
/// schedules pack a message of blocks this way).
template <WirePayload P>
void serialize_append(const P& p, std::vector<std::byte>& out) {
  detail::serialize_message_at(out, out.size(), P::wire_codec, flag_none, p.element_count(), p.body_size(),
                               [&](writer& w) { p.write_body(w); });
}

/// Serialises a payload into a new byte vector.
template <WirePayload P>
std::vector<std::byte> serialize(const P& p) {
  std::vector<std::byte> out;
  serialize_into(p, out);
  return out;
}

namespace detail {
/// The header of a payload message of type P, checked (codec, kind, element type).
template <WirePayload P>
header parse_payload_header(std::span<const std::byte> bytes, const parse_limits& limits) {
  const header h = parse_header(bytes, limits);
  if (h.codec != P::wire_codec)
    reader::fail(wire_errc::wrong_codec, "message is for codec " + std::to_string(static_cast<int>(h.codec)) +
                                             ", expected " + std::to_string(static_cast<int>(P::wire_codec)));
  if (h.is_state()) reader::fail(wire_errc::wrong_kind, "message holds a codec state, not a payload");
  if (h.elements != element_type::float32)
    reader::fail(wire_errc::wrong_element_type, "element type " + std::to_string(static_cast<int>(h.elements)));
  return h;
}
/// The body was read whole and says as many elements as the header.
template <WirePayload P>
void check_payload_end(const reader& r, const P& p, const header& h) {
  r.expect_end();
  if (static_cast<std::uint64_t>(p.element_count()) != h.element_count)
    reader::fail(wire_errc::malformed_body, "body decodes " + std::to_string(p.element_count()) +
                                                " elements, header says " + std::to_string(h.element_count));
}
}  // namespace detail

/// Parses untrusted bytes as a payload of type P. Throws wire_error on any defect.
template <WirePayload P>
P parse(std::span<const std::byte> bytes, const parse_limits& limits = {}) {
  const header h = detail::parse_payload_header<P>(bytes, limits);
  reader r(bytes.subspan(header_size));
  P p = P::read_body(r, h);
  detail::check_payload_end(r, p, h);
  return p;
}

/// parse() into an existing payload: one whose type has
/// `static void read_body_into(reader&, const header&, P&)` (GradiVeQ's)
/// keeps out's buffers, so parsing payloads of one size again and again
/// neither allocates nor zeroes; any other is assigned parse's result.
/// Throws as parse(); out is then unspecified (but valid).
template <WirePayload P>
void parse_into(std::span<const std::byte> bytes, P& out, const parse_limits& limits = {}) {
  const header h = detail::parse_payload_header<P>(bytes, limits);
  reader r(bytes.subspan(header_size));
  if constexpr (requires { P::read_body_into(r, h, out); })
    P::read_body_into(r, h, out);
  else
    out = P::read_body(r, h);
  detail::check_payload_end(r, out, h);
}

// ---------------------------------------------------------------------------
// Saved codec states use the same container with flag_codec_state set.

/// Writes a codec's state: `write` appends the body through a writer.
template <class WriteBody>
std::vector<std::byte> serialize_state(codec_id codec, std::uint64_t element_count, WriteBody&& write) {
  std::vector<std::byte> body;
  writer w(body);
  write(w);
  std::vector<std::byte> out;
  detail::serialize_message(out, codec, flag_codec_state, element_count, body.size(),
                            [&](writer& ww) { ww.put_bytes(body); });
  return out;
}

/// Validates a saved state for `codec` and returns a reader over its body.
/// The caller reads the body and calls expect_end().
inline reader parse_state(std::span<const std::byte> bytes, codec_id codec, header* out_header = nullptr,
                          const parse_limits& limits = {}) {
  const header h = parse_header(bytes, limits);
  if (h.codec != codec) reader::fail(wire_errc::wrong_codec, "state belongs to another codec");
  if (!h.is_state()) reader::fail(wire_errc::wrong_kind, "message holds a payload, not a codec state");
  if (out_header) *out_header = h;
  return reader(bytes.subspan(header_size));
}

GRADCOMP_ABI_NAMESPACE_END

}  // namespace gradcomp::wire

template <>
struct std::is_error_code_enum<gradcomp::wire::wire_errc> : std::true_type {};
