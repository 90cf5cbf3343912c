#pragma once
/// \file schedules/hierarchical_linear.hpp
/// The hierarchical (two-level) ring in the compressed domain of a
/// LinearCodec (GradiVeQ eq. 4 holds for any order of summation): groups of
/// g consecutive ranks, G = N / g groups. The vector is cut into N blocks by
/// Algorithm 1's customization point (ring_segmentation<C>: GradiVeQ's slice
/// boundaries); super-block i is blocks [i G, (i + 1) G). Every rank encodes
/// each block once (eq. 3); a ring reduce-scatter of the super-blocks inside
/// the group sums them in the compressed domain (eq. 4); the ranks of the
/// same index in every group then ring-all-reduce the blocks of the
/// super-block they own (reduce-scatter, then the complete blocks' bytes);
/// a ring all-gather inside the group distributes the complete super-blocks
/// byte for byte, and every rank decodes every block (eq. 5). The slow
/// (inter-group) links carry about 2 (G-1)/G of 1/g of the compressed vector
/// in 2 (G-1) latency steps. Part of <gradcomp/schedules.hpp>.

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring/linear.hpp>
#include <gradcomp/ring/schedule.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/schedules/hierarchical.hpp>
#include <gradcomp/schedules/options.hpp>
#include <gradcomp/schedules/linear_blocks.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The compressed hierarchical ring (see hierarchical_allreduce_linear); two real levels only.
template <class T, class C>
ring_stats hierarchical_linear_impl(T& t, C& codec, std::span<float> data, const schedule_options& o) {
  constexpr const char* who = "hierarchical_allreduce_linear";
  const auto started = ring_clock::now();
  ring_stats st;
  schedule_check_tags(o, who);
  const int n = static_cast<int>(t.size()), rank = static_cast<int>(t.rank()), g = o.group_size;
  const int groups = n / g, group = rank / g, local = rank % g;
  auto blk = make_linear_blocks(t, codec, data, n, o, st, who);
  auto& mail = blk.mail();
  const int tag = o.tag_base, tag2 = o.tag_base + 1;  // intra- and inter-group peers differ: they never mix
  const ring_schedule intra(local, g, 0), inter(group, groups, 0);
  // Both levels run the same two ring phases, over runs of `width` blocks
  // starting at `base` (level 1: the g super-blocks of `groups` blocks;
  // level 2: the G blocks of the owned super-block) with the level's peers.
  struct level {
    const ring_schedule& ring;
    int next, prev, base, width;
    int first(int segment) const { return base + segment * width; }
  };
  // A ring reduce-scatter in the compressed domain: the run sent at step
  // s + 1 is the one summed at step s; this rank's own part of a received
  // run is encoded while the partial sum travels (each block once: a second
  // encode of a block is a no-op).
  auto reduce_scatter = [&](const level& l) {
    for (int s = 0; s < l.ring.steps(); ++s) {
      const int out = l.first(l.ring.reduce_scatter_send(s)), in_run = l.first(l.ring.reduce_scatter_recv(s));
      auto in = mail.expect(l.prev, tag);
      blk.encode(out, out + l.width);
      blk.send(l.next, tag, out, out + l.width, true);
      mail.arm(in);
      blk.encode(in_run, in_run + l.width);
      blk.add_in(mail.collect(in), l.prev, in_run, in_run + l.width);
    }
  };
  // The blocks held for decoding (eq. 5): received from `from`, or this
  // rank's own payloads when `from` is its rank. Each run is decoded during
  // the next step's transfer, across the levels too.
  struct held_blocks {
    int lo = 0, hi = 0, from = 0;
  } held;
  auto decode_held = [&] {
    blk.decode_run(held.lo, held.hi, held.from);
    held = {};
  };
  // A ring all-gather of complete runs, byte for byte.
  auto all_gather = [&](const level& l) {
    for (int s = 0; s < l.ring.steps(); ++s) {
      const int out = l.first(l.ring.all_gather_send(s)), in_run = l.first(l.ring.all_gather_recv(s));
      auto in = mail.expect(l.prev, tag2);
      blk.send(l.next, tag2, out, out + l.width, false);
      mail.arm(in);
      decode_held();
      blk.keep_bytes(mail.collect(in), l.prev, in_run, in_run + l.width);
      held = {in_run, in_run + l.width, l.prev};
    }
  };
  const level groupwise{intra, group * g + intra.next(), group * g + intra.prev(), 0, groups};
  reduce_scatter(groupwise);
  const level across{inter, inter.next() * g + local, inter.prev() * g + local, groupwise.first(intra.owned_segment()), 1};
  reduce_scatter(across);
  const int complete = across.first(inter.owned_segment());
  blk.serialize(complete);  // from here on the blocks travel as bytes
  held = {complete, complete + 1, rank};
  all_gather(across);
  all_gather(groupwise);  // the owned super-block, complete now, goes first
  decode_held();
  mail.finish();
  st.seconds = ring_seconds_since(started);
  return st;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// The hierarchical two-level ring all-reduce in the compressed domain of a
/// LinearCodec, in place on `data` (every rank passes the same length and an
/// identically configured codec; GradiVeQ's summands() must equal N), groups
/// of options.group_size consecutive ranks (it must divide N; 0, 1 or N run
/// Algorithm 1's one-level ring, ring_allreduce_linear). Blocks:
/// ring_segmentation<C>::bounds(codec, length, N). Result: data =
/// decode(sum over ranks of encode(block)), block by block, divided by N
/// with options.average: bit-identical on every rank (each block's
/// compressed sum is computed by one rank and its bytes are decoded
/// everywhere). Tags options.tag_base (reduce-scatters) and + 1 (all-gathers).
/// Errors as ring_allreduce_linear's; invalid_argument_error for a group
/// size that does not divide N.
template <ExecutionPolicy Policy, Transport T, class C>
  requires LinearCodec<std::remove_const_t<C>>
ring_stats hierarchical_allreduce_linear(Policy, T& t, C& codec, std::span<float> data,
                                         const schedule_options& options = {}) {
  const int n = static_cast<int>(t.size()), g = options.group_size;
  if (g < 0 || (g > 1 && n % g != 0))
    throw invalid_argument_error("hierarchical_allreduce_linear: group_size " + std::to_string(g) +
                                 " does not divide the " + std::to_string(n) + " ranks");
  if (!detail::hierarchical_two_levels(n, g))
    return ring_allreduce_linear(Policy{}, t, codec, data, detail::schedule_ring_options(options));
  return detail::hierarchical_linear_impl(t, codec, data, options);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
