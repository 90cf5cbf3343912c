#pragma once
/// \file ring/chunks.hpp
/// Chunks inside a ring hop (ring_options::chunk_elements): the plan that
/// cuts each ring segment into chunks on a codec's granularity, and the
/// chunked all-gather phase of the compressed linear ring (seed 002,
/// Algorithm 1 lines 10-13, a chunk at a time). Used by ring_allreduce_linear
/// (ring/linear.hpp); written here, not in schedules/, so that any schedule
/// can cut its hops the same way. Part of <gradcomp/ring_allreduce.hpp>.

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include <gradcomp/ring/channel.hpp>
#include <gradcomp/ring/schedule.hpp>

namespace gradcomp {
namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The chunks of every segment of a ring: chunk c of segment u is
/// [begin(u, c), end(u, c)), absolute element offsets. Every segment has at
/// least one chunk (an empty segment: one empty chunk, one message, as
/// without chunks).
class ring_chunk_plan {
 public:
  /// `bounds`: the N + 1 segment bounds; `granularity`: chunks start on
  /// multiples of it from the segment's start (0: segments travel whole);
  /// `chunk_elements`: ring_options::chunk_elements.
  ring_chunk_plan(const std::vector<std::size_t>& bounds, std::size_t granularity, std::size_t chunk_elements) {
    std::size_t largest = 0;
    for (std::size_t u = 0; u + 1 < bounds.size(); ++u) largest = std::max(largest, bounds[u + 1] - bounds[u]);
    std::size_t step = chunk_elements == 0 ? ring_auto_chunk_elements(largest) : chunk_elements;
    if (granularity == 0 || step >= largest) {
      step = 0;  // whole segments
    } else {
      step = (step / granularity + (step % granularity != 0 ? 1 : 0)) * granularity;  // round up
    }
    cuts_.resize(bounds.size() > 0 ? bounds.size() - 1 : 0);
    for (std::size_t u = 0; u < cuts_.size(); ++u) {
      auto& c = cuts_[u];
      const std::size_t b = bounds[u], e = bounds[u + 1];
      c.push_back(b);
      if (step > 0)
        for (std::size_t at = b + step; at < e; at += step) {
          // A last piece shorter than one granule (GradiVeQ: the tail only)
          // joins the chunk before it.
          if (e - at < granularity) break;
          c.push_back(at);
        }
      c.push_back(e);
    }
  }
  /// Chunks of segment u.
  std::size_t count(int u) const noexcept { return cuts_[static_cast<std::size_t>(u)].size() - 1; }
  std::size_t begin(int u, std::size_t c) const noexcept { return cuts_[static_cast<std::size_t>(u)][c]; }
  std::size_t end(int u, std::size_t c) const noexcept { return cuts_[static_cast<std::size_t>(u)][c + 1]; }
  std::size_t size(int u, std::size_t c) const noexcept { return end(u, c) - begin(u, c); }
  /// Chunks of the segments `segment(0) .. segment(steps - 1)` (the messages of one phase).
  template <class Segment>
  std::size_t messages(int steps, Segment&& segment) const {
    std::size_t n = 0;
    for (int s = 0; s < steps; ++s) n += count(segment(s));
    return n;
  }

 private:
  std::vector<std::vector<std::size_t>> cuts_;
};

/// The all-gather phase of the compressed linear ring, a chunk at a time:
/// `owned[c]`, this rank's complete compressed chunks of its segment, are
/// decoded (the reduce-scatter sent each on `tag` as soon as it was
/// complete, so the all-gather's first sends overlap the reduce-scatter's
/// last receives); each received chunk is forwarded as received (the same
/// bytes) before it is decoded, so chunk c+1 travels while chunk c is
/// decoded. `receive(handle, segment, chunk, phase, step)` waits and parses
/// (a (message, payload) pair), `decode_chunk(payload, segment, chunk)`
/// decodes; `recv` holds the phase's receives in order. Ends with every
/// send completed.
template <class T, class Payload, class Handles, class Receive, class DecodeChunk>
void ring_chunked_all_gather_phase(ring_channel<T>& ch, const ring_schedule& ring, const ring_chunk_plan& plan,
                                   int tag, Handles& recv, std::vector<Payload>& owned, Receive& receive,
                                   DecodeChunk& decode_chunk) {
  const int steps = ring.steps(), mine = ring.owned_segment();
  for (std::size_t c = 0; c < owned.size(); ++c) decode_chunk(owned[c], mine, c);
  std::size_t next = 0;
  for (int s = 0; s < steps; ++s) {
    const int k = ring.all_gather_recv(s);
    for (std::size_t c = 0; c < plan.count(k); ++c) {
      auto got = receive(recv[next++], k, c, "all-gather", s);
      if (s + 1 < steps) ch.send(tag, std::move(got.first.bytes));
      decode_chunk(got.second, k, c);
    }
  }
  ch.finish();
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail
}  // namespace gradcomp
