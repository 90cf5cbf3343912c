#pragma once
/// \file schedules/direct.hpp
/// The direct (pairwise-exchange) all-reduce of float vectors: the vector is
/// cut into N segments as the ring cuts it; every rank sends segment j
/// straight to its owner, rank j, all N-1 messages at once (the reduce-scatter
/// of MPICH's long-message pairwise exchange, or an all-to-all), the owner
/// adds the N-1 received segments into its own in a fixed order, then sends
/// the finished segment straight to every other rank (an all-gather).
/// Two latency steps and 2(N-1)/N of the vector per rank, like the ring's
/// bytes with Rabenseifner's latency beaten: the schedule for a
/// non-blocking switch (a flat cluster), where N-1 concurrent flows into one
/// port share its rate. On an oversubscribed network, or where many
/// simultaneous senders into one port cause incast losses (not modelled by a
/// flow-level simulator), the ring or Rabenseifner is safer.
/// Part of <gradcomp/schedules.hpp>.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring/schedule.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/schedules/link.hpp>
#include <gradcomp/schedules/options.hpp>
#include <gradcomp/schedules/pipelined_ring.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The most floats one reduce-scatter message of the direct schedule carries
/// (2^26 floats = 256 MiB, under MPI's int count of bytes); a larger segment
/// goes as several messages.
inline constexpr std::size_t direct_message_floats = std::size_t{1} << 26;

/// The direct all-reduce with an explicit addition (see direct_allreduce);
/// `copy_message_floats`: the most floats of one reduce-scatter message (the
/// tests make it small to cut copies into several messages).
template <class T, class Add>
ring_stats direct_impl(T& t, std::span<float> data, const schedule_options& o, Add& add,
                       std::size_t copy_message_floats = direct_message_floats) {
  constexpr const char* who = "direct_allreduce";
  const auto started = ring_clock::now();
  ring_stats st;
  schedule_check_tags(o, who);
  const int n = static_cast<int>(t.size()), r = static_cast<int>(t.rank());
  if (n == 1) return st;
  const int tag = o.tag_base, tag2 = o.tag_base + 1;
  const ring_schedule split(r, n, data.size());
  auto seg = [&](int j) { return split.segment<float>(data, j); };
  const std::span<float> mine = seg(r);
  float_link<T> link(t, st, who, link_element(add));
  using slot = typename float_link<T>::slot;
  // All-gather: a segment goes as at most options.max_chunks messages (chunks of at least
  // chunk_elements floats), so that chunk c travels while chunk c + 1 is summed.
  const auto chunk_of = [&](std::size_t elements) { return link_chunk_size(elements, o.chunk_elements, o.max_chunks); };
  const std::size_t mc = chunk_of(mine.size());
  // Reduce-scatter: one message per peer. Chunks would hide nothing there (every copy
  // lands before any is added) and cost a message each (under SMPI at 64 ranks, 16 MB,
  // 25 Gbit/s: 18.3 ms with 2 chunks per peer in both phases, 16.6 with the copies whole;
  // docs/performance.md); cut only where a segment would exceed copy_message_floats.
  const auto copy_chunk_of = [&](std::size_t elements) {
    return link_chunk_size(elements, std::max<std::size_t>(1, copy_message_floats), o.max_chunks);
  };
  const std::size_t rc = copy_chunk_of(mine.size());

  // Reduce-scatter: receive every peer's copy of my segment (peer r+1, r+2, ... in that order).
  scratch_floats space(o.workspace);
  const std::span<float> scratch = space.first(mine.size() * static_cast<std::size_t>(n - 1));
  std::vector<std::vector<slot>> in;
  in.reserve(static_cast<std::size_t>(n - 1));
  // Each phase's posts start together (MPI: one MPI_Startall of kept persistent requests
  // instead of a call per message; under SMPI at 64 ranks the calls cost more than the additions).
  auto copies = link.batch();
  for (int k = 1; k < n; ++k)
    in.push_back(link_post_chunks(link, (r + k) % n, tag, scratch.subspan(mine.size() * std::size_t(k - 1), mine.size()), rc));
  // ...and send segment j to rank j (rank r-1, r-2, ...: every rank's first sends go to different ranks).
  for (int k = 1; k < n; ++k) {
    const int peer = (r - k + n) % n;
    link_send_chunks(link, peer, tag, std::span<const float>(seg(peer)), copy_chunk_of(seg(peer).size()));
  }
  copies.close();
  // Every copy of my segment lands before any is added: they share my port
  // fairly and arrive together. The sends of the segments given away then
  // finish (those ranges are overwritten by the all-gather) and the
  // all-gather's receives are posted before the additions start, so that...
  link.arrive_all(in);  // MPI: one MPI_Waitall for the N-1 copies, not a call per message
  link.finish();
  std::vector<std::vector<slot>> out;
  out.reserve(static_cast<std::size_t>(n - 1));
  auto gathers = link.batch();
  for (int k = 1; k < n; ++k) {
    const int peer = (r - k + n) % n;
    out.push_back(link_post_chunks(link, peer, tag2, seg(peer), chunk_of(seg(peer).size())));
  }
  gathers.close();
  // ...chunk c's all-gather travels while chunk c + 1 is summed: only the
  // first chunk's additions are on the critical path. The sum is own +
  // (r+1) + (r+2) + ... in that fixed order, element by element.
  for (std::size_t c = 0; c < link_chunks(mine.size(), mc); ++c) {
    const std::span<float> part = link_chunk(mine, mc, c);
    const std::size_t begin = c * mc, end = begin + part.size();  // within `mine` (mc 0: one chunk, begin 0)
    for (auto& slots : in)  // the pieces of the copies' messages (rc floats each) that cover [begin, end)
      for (std::size_t m = begin / rc; m * rc < end; ++m) {
        const std::size_t lo = std::max(begin, m * rc), hi = std::min(end, (m + 1) * rc);
        link.add_arrived(slots[m], part.subspan(lo - begin, hi - lo), add, lo - m * rc);
      }
    if (o.average) schedule_average(part, n);
    auto sends = link.batch();
    for (int k = 1; k < n; ++k) link.send((r + k) % n, tag2, std::span<const float>(part));
    sends.close();
  }
  link.wait_all_into(out);
  link.finish();
  st.seconds = ring_seconds_since(started);
  return st;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// The direct all-reduce of `data` (sum, or mean with options.average), in
/// place, for any N (see the file comment). Each segment is summed on its
/// owner alone, in the order own, rank+1, rank+2, ..., and its bits copied
/// to every rank: bit-identical on every rank. Per rank 2(N-1)/N of the
/// vector sent in 2 latency steps: the reduce-scatter's N-1 copies at once,
/// one message per peer (chunks would hide nothing: every copy lands before
/// any is added), then the all-gather's, each segment cut into chunks of
/// options.chunk_elements floats, grown so that a segment goes as at most
/// options.max_chunks messages; and (N-1)/N of the vector of
/// scratch (options.workspace when given: keep one across calls). The
/// additions of chunk c + 1 overlap the all-gather of chunk c. Tags
/// options.tag_base (reduce-scatter) and + 1 (all-gather).
/// Errors: a message of the wrong length is a transport_error naming both
/// ranks; transport errors propagate.
template <ExecutionPolicy Policy, Transport T>
ring_stats direct_allreduce(Policy, T& t, std::span<float> data, const schedule_options& options = {}) {
  float_adder<Policy> add;
  return detail::direct_impl(t, data, options, add);
}

/// direct_allreduce with the generic (execution::seq) kernels.
template <Transport T>
ring_stats direct_allreduce(T& t, std::span<float> data, const schedule_options& options = {}) {
  return direct_allreduce(execution::seq{}, t, data, options);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
