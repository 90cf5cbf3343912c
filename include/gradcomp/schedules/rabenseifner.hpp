#pragma once
/// \file schedules/rabenseifner.hpp
/// Rabenseifner's all-reduce of float vectors: recursive-halving
/// reduce-scatter, then an all-gather by recursive doubling (the default) or
/// in fewer steps of larger groups (R. Rabenseifner,
/// "Optimization of collective reduction operations", ICCS 2004; Thakur,
/// Rabenseifner and Gropp, IJHPCA 19(1) 2005; the all-gather's groups are
/// recursive doubling with a larger radix), for any N: with p the largest
/// power of two <= N and r = N - p, ranks 0 .. 2r-1 first fold in pairs (the
/// even rank sends its whole vector to the odd one, which adds it and takes
/// part; the even one waits), as MPICH does, and receive the result at the end.
/// Also the bookkeeping the compressed form (rabenseifner_linear.hpp) shares.
/// Part of <gradcomp/schedules.hpp>.

#include <algorithm>
#include <bit>
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

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Who does what in Rabenseifner's all-reduce over N ranks.
///
/// p = the largest power of two <= N, r = N - p. Ranks below 2r fold: the
/// even one (2i) hands its vector to the odd one (2i+1) and sits out
/// (virtual_rank() == -1); the odd one is virtual rank i. Ranks from 2r on
/// are virtual rank (rank - r). Virtual ranks 0 .. p-1 run the halving and
/// doubling over p blocks; virtual rank v owns block v after the halving.
/// At halving step k (distance d = p/2, p/4, ..., 1) virtual rank v pairs
/// with v XOR d, keeps the lower half of its current block range when bit d
/// of v is 0 (the upper half otherwise) and sends the other half; the
/// doubling retraces the steps with d = 1, 2, ..., p/2.
class rabenseifner_schedule {
 public:
  rabenseifner_schedule(int rank, int size) : rank_(rank), size_(size) {
    if (size < 1) throw invalid_argument_error("rabenseifner_schedule: size must be >= 1");
    if (rank < 0 || rank >= size) throw invalid_argument_error("rabenseifner_schedule: rank outside [0, size)");
    pof2_ = detail::schedule_pof2(size);
    rem_ = size - pof2_;
  }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// p: the largest power of two <= N (the number of blocks).
  int blocks() const noexcept { return pof2_; }
  /// r = N - p: the number of folded pairs.
  int folded_pairs() const noexcept { return rem_; }
  /// True for the even rank of a folded pair (it sits out the halving and doubling).
  bool folded_out() const noexcept { return rank_ < 2 * rem_ && rank_ % 2 == 0; }
  /// True for the odd rank of a folded pair (it adds its partner's vector first).
  bool folds_in() const noexcept { return rank_ < 2 * rem_ && rank_ % 2 == 1; }
  /// The partner of a folded pair (rank +- 1), or -1.
  int fold_partner() const noexcept { return folded_out() ? rank_ + 1 : folds_in() ? rank_ - 1 : -1; }
  /// The virtual rank in [0, p), or -1 for folded_out().
  int virtual_rank() const noexcept {
    if (folded_out()) return -1;
    return rank_ < 2 * rem_ ? rank_ / 2 : rank_ - rem_;
  }
  /// The real rank of virtual rank v.
  int real_rank(int v) const noexcept { return v < rem_ ? 2 * v + 1 : v + rem_; }
  /// Halving / doubling steps: log2(p).
  int steps() const noexcept {
    return std::countr_zero(static_cast<unsigned>(pof2_));  // log2 of a power of two
  }
  /// The distance of halving step k (p/2, p/4, ..., 1).
  int halving_distance(int k) const noexcept { return (pof2_ >> 1) >> k; }
  /// The all-gather's steps: each a group size (radix) r, their product p.
  /// At the step of radix r with stride s (the product of the steps before
  /// it), the r virtual ranks that differ only in digit (v / s) mod r form a
  /// group; each holds the s blocks from v - v mod s on and sends them to the
  /// other r - 1, so that every one then holds the r x s blocks from
  /// v - v mod (r s) on. `radix` (schedule_options::allgather_radix): 2 is
  /// recursive doubling (log2 p steps); a larger power of two r takes steps
  /// of r while p allows it and the rest in one; 0 (auto) takes two steps,
  /// the larger radix first: 2^ceil(k/2) then 2^floor(k/2) for p = 2^k
  /// (p = 256: 16 then 16; p = 4: 2 then 2; fewer when p < 4).
  std::vector<int> allgather_radices(int radix) const { return detail::schedule_allgather_radices(pof2_, radix); }

 private:
  int rank_, size_, pof2_ = 1, rem_ = 0;
};

GRADCOMP_ABI_NAMESPACE_END
namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Block bounds of Rabenseifner's p blocks over `length` floats (ring_schedule's equal split).
inline std::vector<std::size_t> rabenseifner_float_bounds(std::size_t length, int blocks) {
  const ring_schedule split(0, blocks, length);
  std::vector<std::size_t> b(static_cast<std::size_t>(blocks) + 1);
  for (int j = 0; j < blocks; ++j) b[static_cast<std::size_t>(j)] = split.begin(j);
  b.back() = length;
  return b;
}

/// A piece of the vector: floats [begin, begin + size).
struct rabenseifner_piece {
  std::size_t begin = 0, size = 0;
};

/// The chunks of blocks [lo, hi) in the order they travel at halving step k
/// (rabenseifner_impl): the half its receiver gives away at step k + 1 first,
/// itself laid out as step k + 1 sends it, then the half the receiver keeps,
/// in chunks of `cs` floats (0: one message per half). The receiver is v XOR
/// d_k, whose bits below d_k are v's, so sender and receiver lay out the
/// same range the same way; and the receiver's first pieces are exactly what
/// it sends on at step k + 1, so it can forward each as soon as it is summed.
inline void rabenseifner_layout(const rabenseifner_schedule& rs, int v, int k, int lo, int hi,
                                const std::vector<std::size_t>& b, std::size_t cs, std::vector<rabenseifner_piece>& out) {
  const auto plain = [&](int a, int z) {
    const std::size_t begin = b[std::size_t(a)], size = b[std::size_t(z)] - begin;
    for (std::size_t c = 0; c < link_chunks(size, cs); ++c) {
      const std::size_t at = cs == 0 ? 0 : c * cs;
      out.push_back({begin + at, cs == 0 ? size : std::min(cs, size - at)});
    }
  };
  if (k + 1 >= rs.steps() || cs == 0) {  // the last step, or one message per step: one piece
    plain(lo, hi);
    return;
  }
  const int mid = lo + (hi - lo) / 2;
  if ((v & rs.halving_distance(k + 1)) == 0) {  // keeps the lower half at step k + 1: gives the upper
    rabenseifner_layout(rs, v, k + 1, mid, hi, b, cs, out);
    plain(lo, mid);
  } else {
    rabenseifner_layout(rs, v, k + 1, lo, mid, b, cs, out);
    plain(mid, hi);
  }
}

/// Rabenseifner's all-reduce with an explicit addition (see rabenseifner_allreduce).
template <class T, class Add>
ring_stats rabenseifner_impl(T& t, std::span<float> data, const schedule_options& o, Add& add) {
  constexpr const char* who = "rabenseifner_allreduce";
  const auto started = ring_clock::now();
  ring_stats st;
  schedule_check_tags(o, who);
  const rabenseifner_schedule rs(static_cast<int>(t.rank()), static_cast<int>(t.size()));
  const std::vector<int> radices = rs.allgather_radices(o.allgather_radix);  // checked before any message
  if (rs.size() == 1) return st;
  const int tag = o.tag_base, tag2 = o.tag_base + 1;
  const std::size_t chunk = o.chunk_elements, max_chunks = o.max_chunks;
  float_link<T> link(t, st, who, link_element(add));
  scratch_floats scratch(o.workspace);

  // Fold: the even rank of a pair hands its vector to the odd one.
  if (rs.folded_out()) {
    link_exchange_copy(link, rs.fold_partner(), tag, std::span<const float>(data), std::span<float>(), chunk, max_chunks);
  } else if (rs.folds_in()) {
    link_exchange_add(link, rs.fold_partner(), tag, std::span<const float>(), data, scratch.first(data.size()), chunk,
                      max_chunks, add);
  }
  // The even rank's sends read `data`, which the result overwrites: done first.
  link.finish();

  const int v = rs.virtual_rank();
  if (v >= 0) {
    const int p = rs.blocks();
    const std::vector<std::size_t> b = rabenseifner_float_bounds(data.size(), p);
    auto range = [&](int lo, int hi) { return data.subspan(b[std::size_t(lo)], b[std::size_t(hi)] - b[std::size_t(lo)]); };
    // Recursive halving: at step k (distance d) keep half of the current
    // block range, send the other half to v XOR d, add what comes back.
    // Each step's pieces travel in rabenseifner_layout's order, so the
    // pieces summed first are those given away at step k + 1, and each is
    // sent on as soon as it is summed: step k + 1's transfer starts while
    // step k's additions go on (a simulated network such as SMPI's shares a
    // link fairly among a step's messages, which then land together, so
    // without this every addition would follow its step's transfer). Step
    // k + 1's receives are posted before step k's additions start; steps
    // receive into alternate halves of the scratch. Same additions in the
    // same order for every element: the bits do not depend on the layout.
    using slot = typename float_link<T>::slot;
    struct halving_step {
      int partner = 0, klo = 0, khi = 0;
      std::vector<rabenseifner_piece> keep, give;  // what arrives, what is sent (layout order)
      std::vector<slot> slots;
    };
    const int steps = rs.steps();
    // One chunk size for every step: the first step's half of the vector goes
    // as at most max_chunks messages (plus the pieces' remainders); later
    // steps move less in chunks of the same size.
    const std::size_t cs = link_chunk_size(b[std::size_t(p)] - b[std::size_t(p / 2)], chunk, max_chunks);
    std::vector<halving_step> plan(static_cast<std::size_t>(steps));
    int lo = 0, hi = p;
    for (int k = 0; k < steps; ++k) {
      const int d = rs.halving_distance(k), mid = lo + (hi - lo) / 2;
      const bool lower = (v & d) == 0;
      halving_step& h = plan[std::size_t(k)];
      h.partner = rs.real_rank(v ^ d);
      h.klo = lower ? lo : mid;
      h.khi = lower ? mid : hi;
      rabenseifner_layout(rs, v, k, h.klo, h.khi, b, cs, h.keep);
      rabenseifner_layout(rs, v, k, lower ? mid : lo, lower ? hi : mid, b, cs, h.give);
      lo = h.klo;
      hi = h.khi;
    }
    // Even steps receive at the start of the scratch, odd steps after step
    // 0's range (uneven blocks can make a kept half larger than m/2).
    const auto kept = [&](int k) { return b[std::size_t(plan[std::size_t(k)].khi)] - b[std::size_t(plan[std::size_t(k)].klo)]; };
    const std::size_t second_area = steps > 0 ? kept(0) : 0;
    const std::span<float> space = scratch.first(second_area + (steps > 1 ? kept(1) : 0));
    auto post_step = [&](int k) {
      halving_step& h = plan[std::size_t(k)];
      const std::size_t area = k % 2 == 0 ? 0 : second_area, base = b[std::size_t(h.klo)];
      h.slots.reserve(h.keep.size());  // never reallocated while posted
      for (const auto& pc : h.keep)
        h.slots.push_back(link.post(h.partner, tag, space.subspan(area + (pc.begin - base), pc.size)));
    };
    auto piece = [&](const rabenseifner_piece& pc) { return data.subspan(pc.begin, pc.size); };
    const bool forwarding = cs != 0;  // chunk_elements 0: one message per step, nothing to forward early
    if (steps > 0) post_step(0);
    for (int k = 0; k < steps; ++k) {
      halving_step& h = plan[std::size_t(k)];
      const bool last = k + 1 == steps;
      if (k == 0 || !forwarding)
        for (const auto& pc : h.give) link.send(h.partner, tag, std::span<const float>(piece(pc)));
      if (!last) post_step(k + 1);
      // h.keep begins with the pieces of plan[k + 1].give, the same ones in the same order.
      const std::size_t forward = last || !forwarding ? 0 : plan[std::size_t(k + 1)].give.size();
      for (std::size_t c = 0; c < h.keep.size(); ++c) {
        const std::span<float> acc = piece(h.keep[c]);
        link.wait_add(h.slots[c], acc, add);
        if (c < forward) link.send(plan[std::size_t(k + 1)].partner, tag, std::span<const float>(acc));
      }
      h.slots.clear();
    }
    // Every block given away is overwritten by the doubling: its sends finish first.
    link.finish();
    if (o.average) schedule_average(range(v, v + 1), rs.size());
    // The all-gather, in the steps of allgather_radices: at each, send the
    // blocks held to the other members of the group and receive theirs.
    // Fewer steps pay fewer latencies (SimGrid SMPI charges a message of 64
    // KB or more 11.64 times its route's latency) for more messages per step
    // (r - 1 peers).
    // The cap on messages holds per step: each of the r - 1 peers' ranges in
    // at most max(1, max_chunks / (r - 1)) chunks (a copy has no addition to
    // overlap; what chunks cost is CPU per message, charged under SMPI with
    // every rank's caches on one core). Copies only: the bits do not depend
    // on the radix.
    int stride = 1;
    for (const int r : radices) {
      const std::size_t cap = detail::allgather_step_cap(max_chunks, r);
      // The group: v with its digit (v / stride) mod r replaced by i, i = 0 .. r-1;
      // member i holds blocks [first + i stride, first + (i + 1) stride).
      const int first = v - v % (stride * r), mine = (v - first) / stride;
      const auto member = [&](int i) { return rs.real_rank(first + i * stride + v % stride); };
      const std::span<const float> held = range(first + mine * stride, first + (mine + 1) * stride);
      std::vector<std::vector<slot>> from(static_cast<std::size_t>(r));
      auto batch = link.batch();
      for (int i = 0; i < r; ++i) {
        if (i == mine) continue;
        const std::span<float> theirs = range(first + i * stride, first + (i + 1) * stride);
        from[std::size_t(i)] = link_post_chunks(link, member(i), tag2, theirs,
                                                link_chunk_size(theirs.size(), chunk, cap));
      }
      // Each member starts with its successor in the group, so no rank gets every first message.
      for (int j = 1; j < r; ++j) {
        const int i = (mine + j) % r;
        link_send_chunks(link, member(i), tag2, held,
                         link_chunk_size(held.size(), chunk, cap));
      }
      batch.close();
      link.wait_all_into(from);
      stride *= r;
    }
  }
  // Unfold: the odd rank of a pair returns the result.
  if (rs.folds_in())
    link_exchange_copy(link, rs.fold_partner(), tag2, std::span<const float>(data), std::span<float>(), chunk, max_chunks);
  else if (rs.folded_out())
    link_exchange_copy(link, rs.fold_partner(), tag2, std::span<const float>(), data, chunk, max_chunks);
  link.finish();
  st.seconds = ring_seconds_since(started);
  return st;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Rabenseifner's all-reduce of `data` (sum, or mean with options.average),
/// in place, for any N (see rabenseifner_schedule). Each element is summed on
/// exactly one rank, its block's owner, and the finished bits are copied to
/// every other rank: bit-identical on every rank. Per rank log2(p) halving
/// steps, then the all-gather's steps (options.allgather_radix: log2 p by
/// default, two with 0), and 2 (p-1)/p of the vector sent (plus
/// the whole vector once for the folded pairs when N is not a power of
/// two). A range exchanged with one peer goes as chunks of
/// options.chunk_elements floats, grown so that there are at most
/// options.max_chunks of them, all posted at once; tags options.tag_base (fold and
/// halving) and + 1 (all-gather and unfold). A length below p leaves blocks
/// empty (empty messages). Errors: an allgather_radix that is neither 0 nor
/// a power of two >= 2 is an invalid_argument_error (before any message); a
/// message of the wrong length is a transport_error naming both ranks;
/// transport errors propagate.
template <ExecutionPolicy Policy, Transport T>
ring_stats rabenseifner_allreduce(Policy, T& t, std::span<float> data, const schedule_options& options = {}) {
  float_adder<Policy> add;
  return detail::rabenseifner_impl(t, data, options, add);
}

/// rabenseifner_allreduce with the generic (execution::seq) kernels.
template <Transport T>
ring_stats rabenseifner_allreduce(T& t, std::span<float> data, const schedule_options& options = {}) {
  return rabenseifner_allreduce(execution::seq{}, t, data, options);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
