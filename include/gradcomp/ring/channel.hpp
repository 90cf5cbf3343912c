#pragma once
/// \file ring/channel.hpp
/// What the compressed ring forms share: the channel that sends, receives and
/// counts serialized payloads, their parse with limits, and the all-gather
/// phase of the reducing rings (seed 002, Algorithm 1 lines 10-13).
/// Part of <gradcomp/ring_allreduce.hpp>.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/wait_sends.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/ring/schedule.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Upper bound on the body of one non-linear payload of `elements` floats
/// that the re-encode and all-gather forms accept before parsing (16 bytes
/// per element plus 4 KiB: above every codec of the library, dense included;
/// parsing is bounded by the received bytes anyway).
inline constexpr std::size_t ring_payload_body_limit(std::size_t elements) noexcept {
  return elements > (std::numeric_limits<std::size_t>::max() - 4096) / 16 ? std::numeric_limits<std::size_t>::max()
                                                                          : 16 * elements + 4096;
}

GRADCOMP_ABI_NAMESPACE_END
namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

inline std::string ring_where(const char* who, int self, int segment, int source, const char* phase, int step) {
  return std::string(who) + ": rank " + std::to_string(self) + ", segment " + std::to_string(segment) +
         " from rank " + std::to_string(source) + " (" + phase + " step " + std::to_string(step) + ")";
}

/// Parses a received payload of `elements` floats with wire limits derived
/// from it (element count, body at most `max_body`); the element count must
/// be exact (size_mismatch_error), bad bytes are a wire_error naming the segment.
template <class P>
P ring_parse(const message& m, std::size_t elements, std::size_t max_body, const std::string& where) {
  wire::parse_limits limits;
  limits.max_element_count = elements;
  limits.max_body_length = max_body;
  P p = [&] {
    try {
      return wire::parse<P>(m.bytes, limits);
    } catch (const wire::wire_error& e) {
      throw wire::wire_error(e.code(), where + ": " + e.what());
    }
  }();
  if (static_cast<std::uint64_t>(p.element_count()) != static_cast<std::uint64_t>(elements))
    throw size_mismatch_error(where + ": payload length", elements, static_cast<std::size_t>(p.element_count()));
  return p;
}

/// Sends, receives and counts for one compressed ring call over a transport
/// that moves byte vectors (every Transport has isend/irecv).
template <class T>
class ring_channel {
 public:
  using recv_handle = decltype(std::declval<T&>().irecv(0, 0));
  using send_handle = decltype(std::declval<T&>().isend(0, 0, std::vector<std::byte>{}));

  ring_channel(T& t, int next, int prev, ring_stats& stats) : t_(t), next_(next), prev_(prev), stats_(stats) {}

  /// Posts `count` receives from the predecessor with `tag` (they match its messages in order).
  std::vector<recv_handle> post(int tag, int count) {
    std::vector<recv_handle> h;
    h.reserve(static_cast<std::size_t>(count));
    for (int s = 0; s < count; ++s) h.push_back(t_.irecv(prev_, tag));
    return h;
  }
  void send(int tag, std::vector<std::byte>&& bytes) {
    stats_.bytes_sent += bytes.size();
    ++stats_.messages_sent;
    sends_.push_back(t_.isend(next_, tag, std::move(bytes)));
  }
  message wait(recv_handle& h) {
    message m;
    ring_timed(stats_.wait_seconds, [&] { m = h.wait(); });
    stats_.bytes_received += m.bytes.size();
    return m;
  }
  void finish() {
    ring_timed(stats_.wait_seconds, [&] {
      detail::wait_sends<T>(std::span(sends_));
    });
    sends_.clear();
  }
  /// Serialises a payload (combine time) into `reuse`, whose capacity is
  /// kept (a received buffer of the same size: no allocation).
  template <class P>
  std::vector<std::byte> serialize(const P& p, std::vector<std::byte>&& reuse = {}) {
    std::vector<std::byte> b = std::move(reuse);
    ring_timed(stats_.combine_seconds, [&] { wire::serialize_into(p, b); });
    return b;
  }

 private:
  T& t_;
  int next_, prev_;
  ring_stats& stats_;
  std::vector<send_handle> sends_;
};

/// The all-gather phase of the reducing rings (Algorithm 1 lines 10-13 of
/// seed 002): `owned`, this rank's complete compressed segment, goes round the
/// ring; each received segment is forwarded as received (the same bytes) and
/// decoded while the next one is on the wire. `receive(handle, segment,
/// phase, step)` waits and parses (a (message, payload) pair),
/// `decode_segment(payload, segment)` decodes; ends with every send completed.
template <class T, class Payload, class Handles, class Receive, class DecodeSegment>
void ring_all_gather_phase(ring_channel<T>& ch, const ring_schedule& ring, int tag, Handles& recv,
                           const Payload& owned, Receive& receive, DecodeSegment& decode_segment) {
  const int steps = ring.steps();
  ch.send(tag, ch.serialize(owned));
  decode_segment(owned, ring.owned_segment());
  for (int s = 0; s < steps; ++s) {
    const int k = ring.all_gather_recv(s);
    auto got = receive(recv[static_cast<std::size_t>(s)], k, "all-gather", s);
    if (s + 1 < steps) ch.send(tag, std::move(got.first.bytes));
    decode_segment(got.second, k);
  }
  ch.finish();
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

}  // namespace gradcomp
