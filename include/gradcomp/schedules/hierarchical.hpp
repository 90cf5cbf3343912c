#pragma once
/// \file schedules/hierarchical.hpp
/// The hierarchical (two-level) ring for ranks grouped under switches or on
/// nodes: groups of g consecutive ranks; a ring reduce-scatter inside each
/// group, a ring all-reduce of each group's owned segment across the ranks
/// of the same index in every group, then a ring all-gather inside each
/// group. Each rank's slow (inter-group) link carries about 2 (G-1)/G of
/// 1/g of the vector instead of 2 (N-1)/N of it, in 2(G-1) latency steps
/// instead of 2(N-1). All three phases are the pipelined ring's chunked
/// phases. Part of <gradcomp/schedules.hpp>.

#include <cstddef>
#include <span>
#include <string>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring/schedule.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/schedules/link.hpp>
#include <gradcomp/schedules/options.hpp>
#include <gradcomp/schedules/pipelined_ring.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// True when group size g gives two real levels over n ranks (1 < g < n, g divides n).
inline bool hierarchical_two_levels(int n, int g) noexcept { return g > 1 && g < n && n % g == 0; }

/// The hierarchical ring with an explicit addition (see hierarchical_allreduce).
template <class T, class Add>
ring_stats hierarchical_impl(T& t, std::span<float> data, const schedule_options& o, Add& add) {
  constexpr const char* who = "hierarchical_allreduce";
  const int n = static_cast<int>(t.size()), rank = static_cast<int>(t.rank()), g = o.group_size;
  if (g < 0 || (g > 1 && n % g != 0))
    throw invalid_argument_error(std::string(who) + ": group_size " + std::to_string(g) + " does not divide the " +
                                 std::to_string(n) + " ranks");
  if (!hierarchical_two_levels(n, g)) return pipelined_ring_impl(t, data, o, add);
  const auto started = ring_clock::now();
  ring_stats st;
  schedule_check_tags(o, who);
  const int groups = n / g, group = rank / g, local = rank % g;
  const int tag = o.tag_base, tag2 = o.tag_base + 1;
  const std::size_t chunk = o.chunk_elements;
  float_link<T> link(t, st, who, link_element(add));

  // Level 1: reduce-scatter inside the group (ring over ranks group*g .. group*g + g-1).
  const ring_schedule intra(local, g, data.size());
  const int intra_next = group * g + intra.next(), intra_prev = group * g + intra.prev();
  chunked_reduce_scatter(link, data, intra, intra_next, intra_prev, tag, chunk, add);
  link.finish();

  // Level 2: all-reduce of the owned segment across the groups (ring over
  // the ranks of index `local` in every group).
  const std::span<float> block = intra.segment<float>(data, intra.owned_segment());
  const ring_schedule inter(group, groups, block.size());
  const int inter_next = inter.next() * g + local, inter_prev = inter.prev() * g + local;
  chunked_reduce_scatter(link, block, inter, inter_next, inter_prev, tag, chunk, add);
  link.finish();
  if (o.average) schedule_average(inter.segment<float>(block, inter.owned_segment()), n);
  chunked_all_gather(link, block, inter, inter_next, inter_prev, tag2, chunk);
  link.finish();

  // Level 1 again: all-gather inside the group.
  chunked_all_gather(link, data, intra, intra_next, intra_prev, tag2, chunk);
  link.finish();
  st.seconds = ring_seconds_since(started);
  return st;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// The hierarchical two-level ring all-reduce of `data` (sum, or mean with
/// options.average), in place: groups of options.group_size consecutive
/// ranks (it must divide N; 0, 1 or N run the one-level pipelined ring).
/// Every element is summed by one rank (its inter-group segment's owner)
/// and copied to the others: bit-identical on every rank. Tags
/// options.tag_base (reduce-scatters) and + 1 (all-gathers); intra- and
/// inter-group pairs are different ranks, so they never mix. Errors as
/// ring_allreduce's; invalid_argument_error for a group size not dividing N.
template <ExecutionPolicy Policy, Transport T>
ring_stats hierarchical_allreduce(Policy, T& t, std::span<float> data, const schedule_options& options = {}) {
  float_adder<Policy> add;
  return detail::hierarchical_impl(t, data, options, add);
}

/// hierarchical_allreduce with the generic (execution::seq) kernels.
template <Transport T>
ring_stats hierarchical_allreduce(T& t, std::span<float> data, const schedule_options& options = {}) {
  return hierarchical_allreduce(execution::seq{}, t, data, options);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
