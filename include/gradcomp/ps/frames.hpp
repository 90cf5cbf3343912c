#pragma once
/// \file ps/frames.hpp
/// The parameter servers' messages (docs/drivers.md): the control message
/// ps_control, frames (a control message followed by one wire message per
/// layer), their bounds-checked splitting and building, and the default tags.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/tags.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

// ---------------------------------------------------------------------------
// Control messages and frames

/// Default tag of worker-to-server frames: the first of the parameter
/// servers' range in the tag registry (tags.hpp, [31000, 31016)).
inline constexpr int ps_default_tag_up = tags::parameter_server.first;
/// Default tag of server-to-worker frames (31001).
inline constexpr int ps_default_tag_down = tags::parameter_server.first + 1;
static_assert(ps_default_tag_up == 31000 && ps_default_tag_down == 31001, "the parameter servers' tags are fixed");

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Checks a server's or worker's tags: non-negative, distinct, and each inside
/// [0, 32767] and out of every other piece's range of the tag registry
/// (tags::check_tag_base). Throws invalid_argument_error naming `who`.
inline void ps_check_tags(int tag_up, int tag_down, const char* who) {
  if (tag_up < 0 || tag_down < 0 || tag_up == tag_down)
    throw invalid_argument_error(std::string(who) + ": tags must be non-negative and distinct");
  tags::check_tag_base(tags::parameter_server, tag_up, 1, who);
  tags::check_tag_base(tags::parameter_server, tag_down, 1, who);
}

GRADCOMP_ABI_NAMESPACE_END
/// What a control message says.
enum class ps_kind : std::uint8_t {
  join = 1,       ///< worker -> server: (re)join; answered by a dense resync
  push = 2,       ///< worker -> server: one payload per layer follows (async: eta-scaled update; sync: gradient)
  leave = 3,      ///< worker -> server: the worker stops; no answer
  update = 4,     ///< server -> worker (async): the model difference, one payload per layer
  resync = 5,     ///< server -> worker (async): the whole model, dense
  reject = 6,     ///< server -> worker: the request was rejected (detail: ps_reject_reason)
  aggregate = 7,  ///< server -> worker (sync): the round's aggregate, one payload per layer
};

/// Why the server rejected a request.
enum class ps_reject_reason : std::uint8_t {
  malformed = 1,   ///< bytes that do not parse (wire::wire_error)
  bad_shape = 2,   ///< a layer of the wrong size (size_mismatch_error)
  non_finite = 3,  ///< NaN or infinity in the decoded update (non_finite_error)
  protocol = 4,    ///< a message kind the server does not accept
};

/// The control message that starts every parameter-server frame (wire codec_id::control).
struct ps_control {
  static constexpr wire::codec_id wire_codec = wire::codec_id::control;
  static constexpr std::uint8_t protocol_id = 0x50;  ///< 'P': parameter-server control messages
  static constexpr std::size_t body_bytes = 32;

  ps_kind kind = ps_kind::join;
  std::uint8_t detail = 0;     ///< reject: ps_reject_reason; aggregate: 1 if this worker's push was rejected
  std::uint32_t layers = 0;    ///< layer messages that follow
  std::uint32_t count = 0;     ///< aggregate: contributing workers
  std::uint64_t sequence = 0;  ///< the worker's request number (echoed by the reply)
  std::uint64_t timestamp = 0; ///< async: server time t; sync: round
  std::uint64_t elements = 0;  ///< model elements covered by the layers (0 without layers)

  std::uint64_t element_count() const noexcept { return elements; }
  std::size_t body_size() const noexcept { return body_bytes; }
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void write_body(wire::writer& w) const {
    w.put<std::uint8_t>(protocol_id);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(kind));
    w.put<std::uint8_t>(detail);
    w.put<std::uint8_t>(0);
    w.put<std::uint32_t>(layers);
    w.put<std::uint32_t>(count);
    w.put<std::uint32_t>(0);
    w.put<std::uint64_t>(sequence);
    w.put<std::uint64_t>(timestamp);
  }
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static ps_control read_body(wire::reader& r, const wire::header& h) {
    using wire::reader;
    ps_control c;
    reader::check(r.get<std::uint8_t>() == protocol_id, "ps control: not a parameter-server message");
    const auto kind = r.get<std::uint8_t>();
    reader::check(kind >= 1 && kind <= 7, "ps control: unknown message kind");
    c.kind = static_cast<ps_kind>(kind);
    c.detail = r.get<std::uint8_t>();
    reader::check(r.get<std::uint8_t>() == 0, "ps control: reserved byte is not zero");
    c.layers = r.get<std::uint32_t>();
    c.count = r.get<std::uint32_t>();
    reader::check(r.get<std::uint32_t>() == 0, "ps control: reserved word is not zero");
    c.sequence = r.get<std::uint64_t>();
    c.timestamp = r.get<std::uint64_t>();
    c.elements = h.element_count;
    const bool carries = c.kind == ps_kind::push || c.kind == ps_kind::update || c.kind == ps_kind::resync ||
                         c.kind == ps_kind::aggregate;
    if (carries)
      reader::check(c.layers >= 1 && c.elements >= c.layers, "ps control: a payload frame needs non-empty layers");
    else
      reader::check(c.layers == 0 && c.elements == 0, "ps control: this kind carries no layers");
    if (c.kind == ps_kind::reject)
      reader::check(c.detail >= 1 && c.detail <= 4, "ps control: unknown reject reason");
    else if (c.kind == ps_kind::aggregate)
      reader::check(c.detail <= 1, "ps control: aggregate detail must be 0 or 1");
    else
      reader::check(c.detail == 0, "ps control: detail must be 0 for this kind");
    if (c.kind != ps_kind::aggregate) reader::check(c.count == 0, "ps control: count must be 0 for this kind");
    return c;
  }
};

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Size of the wire message at the front of `bytes` (header plus declared
/// body), checked against the bytes present; the message itself is validated
/// by wire::parse afterwards.
inline std::size_t ps_message_extent(std::span<const std::byte> bytes) {
  if (bytes.size() < wire::header_size)
    wire::reader::fail(wire::wire_errc::truncated, "ps frame: " + std::to_string(bytes.size()) +
                                                       " bytes cannot hold a message header");
  std::uint64_t body = 0;
  std::memcpy(&body, bytes.data() + 20, sizeof body);
  body = wire::detail::to_little(body);
  if (body > bytes.size() - wire::header_size)
    wire::reader::fail(wire::wire_errc::truncated, "ps frame: a message declares " + std::to_string(body) +
                                                       " body bytes, " +
                                                       std::to_string(bytes.size() - wire::header_size) + " remain");
  return wire::header_size + static_cast<std::size_t>(body);
}

/// A frame split into its control message and its layer messages (views into the bytes).
struct ps_frame_view {
  ps_control control;
  std::vector<std::span<const std::byte>> layers;
};

/// Splits and validates a frame's structure: the control message parses, it
/// announces at most `max_layers` layers, the layer messages follow back to
/// back and nothing is left over. Throws wire::wire_error.
inline ps_frame_view ps_split_frame(std::span<const std::byte> bytes, std::size_t max_layers) {
  ps_frame_view f;
  const std::size_t first = ps_message_extent(bytes);
  f.control = wire::parse<ps_control>(bytes.first(first));
  if (f.control.layers > max_layers)
    wire::reader::fail(wire::wire_errc::malformed_body, "ps frame: " + std::to_string(f.control.layers) +
                                                            " layers announced, the model has " +
                                                            std::to_string(max_layers));
  std::size_t pos = first;
  f.layers.reserve(f.control.layers);
  for (std::uint32_t j = 0; j < f.control.layers; ++j) {
    const std::size_t n = ps_message_extent(bytes.subspan(pos));
    f.layers.push_back(bytes.subspan(pos, n));
    pos += n;
  }
  if (pos != bytes.size())
    wire::reader::fail(wire::wire_errc::oversized,
                       "ps frame: " + std::to_string(bytes.size() - pos) + " bytes after the last layer message");
  return f;
}

/// Codec id of a (complete, size-checked) wire message, without validating it.
inline wire::codec_id ps_peek_codec(std::span<const std::byte> message) {
  std::uint16_t id = 0;
  std::memcpy(&id, message.data() + 6, sizeof id);
  return static_cast<wire::codec_id>(wire::detail::to_little(id));
}

/// Parses one layer message as a P of exactly `n` elements (wire_error otherwise).
template <wire::WirePayload P>
P ps_parse_layer(std::span<const std::byte> message, std::size_t n) {
  wire::parse_limits limits;
  limits.max_element_count = n;
  P p = wire::parse<P>(message, limits);
  if (p.element_count() != n)
    wire::reader::fail(wire::wire_errc::malformed_body, "ps frame: a layer of " + std::to_string(p.element_count()) +
                                                            " elements where the model has " + std::to_string(n));
  return p;
}

/// Parses layer j of a frame as a P of exactly `n` elements, as
/// ps_parse_layer does, except that a well-formed message (valid header and
/// checksum) of another element count is a layout_error: the sender's model
/// has other layers, which no retry or resend can mend.
template <wire::WirePayload P>
P ps_parse_model_layer(std::span<const std::byte> message, std::size_t n, std::size_t j) {
  try {
    return ps_parse_layer<P>(message, n);
  } catch (const wire::wire_error&) {
    std::uint64_t count = n;
    try {
      count = wire::parse_header(message).element_count;
    } catch (const wire::wire_error&) {
    }
    if (count != n)
      throw layout_error("ps frame: layer " + std::to_string(j) + " has " + std::to_string(count) +
                         " elements where the model has " + std::to_string(n));
    throw;
  }
}

/// Builds a frame: a control message, then layer messages appended one by one.
class ps_frame_builder {
 public:
  void start(const ps_control& c) {
    frame_.clear();
    append(c);
  }
  template <wire::WirePayload P>
  void append(const P& p) {
    wire::serialize_into(p, tmp_);
    frame_.insert(frame_.end(), tmp_.begin(), tmp_.end());
  }
  /// Appends bytes that are already complete layer messages.
  void append_bytes(std::span<const std::byte> bytes) { frame_.insert(frame_.end(), bytes.begin(), bytes.end()); }
  std::vector<std::byte> take() { return std::exchange(frame_, {}); }

 private:
  std::vector<std::byte> frame_;
  std::vector<std::byte> tmp_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
