#pragma once
/// \file schedules/pipelined_ring.hpp
/// The pipelined ring (issue 21 item 4): the ring all-reduce of seed 002's
/// Algorithm 1, each hop's segment cut into chunks of
/// schedule_options::chunk_elements floats. A chunk is added and forwarded
/// as soon as it has arrived, so the receive of chunk c+1, the addition of
/// chunk c and the send of chunk c-1 overlap. Same additions in the same
/// order as ring_allreduce: the result is bit for bit the plain ring's.
/// Also the ring's two phases over any subset of ranks (the hierarchical
/// schedule's building blocks). Part of <gradcomp/schedules.hpp>.

#include <cstddef>
#include <span>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring/schedule.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/schedules/link.hpp>
#include <gradcomp/schedules/options.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The ring's reduce-scatter over `ring` (its ranks are positions in a ring
/// whose successor is global rank `next` and predecessor `prev`), chunked.
/// Afterwards segment ring.owned_segment() of `data` holds the complete sum,
/// computed by this rank alone in the ring's order.
template <class T, class Add>
void chunked_reduce_scatter(float_link<T>& link, std::span<float> data, const ring_schedule& ring, int next, int prev,
                            int tag, std::size_t chunk, Add& add) {
  const int steps = ring.steps();
  if (steps < 1) return;
  using slot = typename float_link<T>::slot;
  // Receives of step s land in scratch[s % 2] (zero-copy float cells only;
  // moving transports and packed links keep the received buffers): step s + 1
  // is posted before step s is added.
  const bool in_scratch = float_link<T>::zero_copy && !link.packed();
  std::vector<float> scratch[2];
  if (in_scratch) {
    scratch[0].resize(ring.size(0));
    scratch[1].resize(ring.size(0));
  }
  auto post_step = [&](int s) {
    const std::size_t len = ring.size(ring.reduce_scatter_recv(s));
    std::span<float> into = in_scratch ? std::span<float>(scratch[s % 2]).first(len)
                                                     : std::span<float>(ring.segment<float>(data, ring.reduce_scatter_recv(s)));
    std::vector<slot> v;
    const std::size_t nc = link_chunks(len, chunk);
    v.reserve(nc);
    for (std::size_t c = 0; c < nc; ++c) v.push_back(link.post(prev, tag, link_chunk(into, chunk, c)));
    return v;
  };
  std::vector<slot> cur = post_step(0);
  const std::span<float> first = ring.segment<float>(data, ring.reduce_scatter_send(0));
  for (std::size_t c = 0; c < link_chunks(first.size(), chunk); ++c)
    link.send(next, tag, std::span<const float>(link_chunk(first, chunk, c)));
  for (int s = 0; s < steps; ++s) {
    std::vector<slot> nxt;
    if (s + 1 < steps) nxt = post_step(s + 1);
    const std::span<float> own = ring.segment<float>(data, ring.reduce_scatter_recv(s));
    for (std::size_t c = 0; c < cur.size(); ++c) {
      if (s + 1 == steps)
        link.wait_add(cur[c], link_chunk(own, chunk, c), add);
      else
        link.wait_add_forward(cur[c], link_chunk(own, chunk, c), next, tag, add);
    }
    cur = std::move(nxt);
  }
}

/// The ring's all-gather over `ring` (see chunked_reduce_scatter): segment
/// ring.owned_segment() goes round; every other segment of `data` is
/// received in place and forwarded, chunk by chunk. Zero-copy transports:
/// the reduce-scatter's sends must be finished (link.finish()) first.
template <class T>
void chunked_all_gather(float_link<T>& link, std::span<float> data, const ring_schedule& ring, int next, int prev,
                        int tag, std::size_t chunk) {
  const int steps = ring.steps();
  if (steps < 1) return;
  using slot = typename float_link<T>::slot;
  std::vector<std::vector<slot>> slots(static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    const std::span<float> into = ring.segment<float>(data, ring.all_gather_recv(s));
    for (std::size_t c = 0; c < link_chunks(into.size(), chunk); ++c)
      slots[static_cast<std::size_t>(s)].push_back(link.post(prev, tag, link_chunk(into, chunk, c)));
  }
  const std::span<float> mine = ring.segment<float>(data, ring.owned_segment());
  for (std::size_t c = 0; c < link_chunks(mine.size(), chunk); ++c)
    link.send(next, tag, std::span<const float>(link_chunk(mine, chunk, c)));
  for (int s = 0; s < steps; ++s)
    for (auto& sl : slots[static_cast<std::size_t>(s)]) {
      if (s + 1 < steps)
        link.wait_into_forward(sl, next, tag);
      else
        link.wait_into(sl);
    }
}

/// Divides `x` by n (options.average), on the owner only: bit-identical everywhere.
inline void schedule_average(std::span<float> x, int n) noexcept {
  const float d = static_cast<float>(n);
  for (float& v : x) v /= d;
}

/// The pipelined ring with an explicit addition (see pipelined_ring_allreduce).
template <class T, class Add>
ring_stats pipelined_ring_impl(T& t, std::span<float> data, const schedule_options& o, Add& add) {
  const auto started = ring_clock::now();
  ring_stats st;
  schedule_check_tags(o, "pipelined_ring_allreduce");
  const ring_schedule ring(static_cast<int>(t.rank()), static_cast<int>(t.size()), data.size());
  if (ring.size() > 1) {
    float_link<T> link(t, st, "pipelined_ring_allreduce", link_element(add));
    chunked_reduce_scatter(link, data, ring, ring.next(), ring.prev(), o.tag_base, o.chunk_elements, add);
    link.finish();
    if (o.average) schedule_average(ring.segment<float>(data, ring.owned_segment()), ring.size());
    chunked_all_gather(link, data, ring, ring.next(), ring.prev(), o.tag_base + 1, o.chunk_elements);
    link.finish();
  }
  st.seconds = ring_seconds_since(started);
  return st;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// The pipelined ring all-reduce of `data` (sum, or mean with
/// options.average), in place, bit for bit ring_allreduce's result on every
/// rank; each hop's segment travels as chunks of options.chunk_elements
/// floats whose receive, addition and send overlap. Tags options.tag_base
/// (reduce-scatter) and + 1 (all-gather). Returns bytes / messages sent and
/// the time waiting and adding. Errors as ring_allreduce's.
template <ExecutionPolicy Policy, Transport T>
ring_stats pipelined_ring_allreduce(Policy, T& t, std::span<float> data, const schedule_options& options = {}) {
  float_adder<Policy> add;
  return detail::pipelined_ring_impl(t, data, options, add);
}

/// pipelined_ring_allreduce with the generic (execution::seq) kernels.
template <Transport T>
ring_stats pipelined_ring_allreduce(T& t, std::span<float> data, const schedule_options& options = {}) {
  return pipelined_ring_allreduce(execution::seq{}, t, data, options);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
