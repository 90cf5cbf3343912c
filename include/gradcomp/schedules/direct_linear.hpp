#pragma once
/// \file schedules/direct_linear.hpp
/// The direct (pairwise exchange) all-reduce in the compressed domain of a
/// LinearCodec (GradiVeQ eq. 4 holds for any order of summation): the
/// vector is cut into N blocks by Algorithm 1's customization point
/// (ring_segmentation<C>: GradiVeQ's slice boundaries); every rank encodes
/// each block once (eq. 3) and sends block j to rank j; rank j sums the N
/// encodings of its block in the compressed domain (codec.accumulate, eq.
/// 4: its own, then ranks j+1, j+2, ... in that fixed order), sends the
/// complete block's bytes to every other rank, and every rank decodes
/// every block (eq. 5). Two latency steps, 2 (N-1)/N of the compressed
/// vector each way, 2 (N-1) messages a rank. Part of <gradcomp/schedules.hpp>.

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/schedules/linear_blocks.hpp>
#include <gradcomp/schedules/options.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The compressed direct schedule (see direct_allreduce_linear).
template <class T, class C>
ring_stats direct_linear_impl(T& t, C& codec, std::span<float> data, const schedule_options& o) {
  constexpr const char* who = "direct_allreduce_linear";
  const auto started = ring_clock::now();
  ring_stats st;
  schedule_check_tags(o, who);
  const int n = static_cast<int>(t.size()), r = static_cast<int>(t.rank());
  auto blk = make_linear_blocks(t, codec, data, n, o, st, who);
  if (n == 1) {
    blk.encode(0, 1);
    blk.decode(blk.own(0), 0);
    st.seconds = ring_seconds_since(started);
    return st;
  }
  auto& mail = blk.mail();
  const int tag = o.tag_base, tag2 = o.tag_base + 1;
  const auto ahead = [&](int k) { return (r + k) % n; };      // the peers whose copies of block r come in, in summation order
  const auto behind = [&](int k) { return (r - k + n) % n; };  // the owners of the blocks sent, rank r-1 first
  // Reduce-scatter: every receive is posted before any send (no peer's bytes are held back);
  // block j leaves for rank j as soon as it is encoded, rank r-1's first, so that every
  // rank's first message goes to a different rank.
  std::vector<typename linear_mailbox<T>::incoming> copies;
  copies.reserve(std::size_t(n - 1));
  for (int k = 1; k < n; ++k) copies.push_back(mail.expect(ahead(k), tag));
  for (int k = 1; k < n; ++k) {
    const int j = behind(k);
    blk.encode(j, j + 1);
    blk.send(j, tag, j, j + 1, true);
  }
  blk.encode(r, r + 1);
  for (auto& in : copies) mail.arm(in);
  // Eq. 4 on block r: this rank's encoding, then ranks r+1, r+2, ... (fixed order: one owner, one sum).
  for (int k = 1; k < n; ++k) blk.add_in(mail.collect(copies[std::size_t(k - 1)]), ahead(k), r, r + 1);
  // The complete block's bytes to every peer; block r decoded while they travel.
  blk.serialize(r);
  std::vector<typename linear_mailbox<T>::incoming> blocks;
  blocks.reserve(std::size_t(n - 1));
  for (int k = 1; k < n; ++k) blocks.push_back(mail.expect(behind(k), tag2));
  for (int k = 1; k < n; ++k) blk.send(ahead(k), tag2, r, r + 1, false);
  for (auto& in : blocks) mail.arm(in);
  blk.decode(blk.own(r), r);
  for (int k = 1; k < n; ++k) {
    const int j = behind(k);
    blk.decode_message(mail.collect(blocks[std::size_t(k - 1)]), j, j, j + 1);
  }
  mail.finish();
  st.seconds = ring_seconds_since(started);
  return st;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// The direct all-reduce in the compressed domain of a LinearCodec, in
/// place on `data` (every rank passes the same length and an identically
/// configured codec: same basis; GradiVeQ's summands() must equal N).
/// Blocks: ring_segmentation<C>::bounds(codec, length, N). Result: data =
/// decode(sum over ranks of encode(block)), block by block, divided by N
/// with options.average: bit-identical on every rank (each block's
/// compressed sum is computed by its owner and its bytes are decoded
/// everywhere). Each rank encodes its vector once and decodes it once; one
/// message per peer each way (with a length message first over a zero-copy
/// transport: the receiver learns the payload's size from it). Tags
/// options.tag_base and + 1. Errors as ring_allreduce_linear's.
template <Transport T, class C>
  requires LinearCodec<std::remove_const_t<C>>
ring_stats direct_allreduce_linear(T& t, C& codec, std::span<float> data, const schedule_options& options = {}) {
  return detail::direct_linear_impl(t, codec, data, options);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
