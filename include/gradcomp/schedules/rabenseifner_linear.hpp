#pragma once
/// \file schedules/rabenseifner_linear.hpp
/// Rabenseifner's all-reduce in the compressed domain of a LinearCodec
/// (GradiVeQ eq. 4 holds for any order of summation, not only a ring): the
/// vector is cut into p blocks by the same customization point Algorithm 1
/// uses (ring_segmentation<C>: GradiVeQ's slice boundaries), every rank
/// encodes its p blocks once (eq. 3), each halving step sends the encoded
/// half it gives away and the receiver sums in the compressed domain
/// (codec.accumulate, eq. 4); the doubling distributes the complete
/// compressed blocks byte for byte, and every rank decodes them (eq. 5).
/// Part of <gradcomp/schedules.hpp>.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring/linear.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/schedules/linear_blocks.hpp>
#include <gradcomp/schedules/link.hpp>
#include <gradcomp/schedules/options.hpp>
#include <gradcomp/schedules/rabenseifner.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Rabenseifner in the compressed domain (see rabenseifner_allreduce_linear).
template <class T, class C>
ring_stats rabenseifner_linear_impl(T& t, C& codec, std::span<float> data, const schedule_options& o) {
  constexpr const char* who = "rabenseifner_allreduce_linear";
  const auto started = ring_clock::now();
  ring_stats st;
  schedule_check_tags(o, who);
  const rabenseifner_schedule rs(static_cast<int>(t.rank()), static_cast<int>(t.size()));
  const int n = rs.size(), p = rs.blocks(), self = rs.rank();
  auto blk = make_linear_blocks(t, codec, data, p, o, st, who);
  // Folded pairs and a single rank encode everything now; the others encode
  // the half they give away first and the half they keep while it travels.
  if (n == 1 || rs.folded_out() || rs.folds_in()) blk.encode(0, p);
  if (n == 1) {
    for (int j = 0; j < p; ++j) blk.decode(blk.own(j), j);
    st.seconds = ring_seconds_since(started);
    return st;
  }
  auto& mail = blk.mail();
  const int tag = o.tag_base, tag2 = o.tag_base + 1;

  // Fold: the even rank of a pair sends all its encoded blocks; the odd one sums them in.
  if (rs.folded_out()) {
    blk.send(rs.fold_partner(), tag, 0, p, true);
  } else if (rs.folds_in()) {
    auto in = mail.expect(rs.fold_partner(), tag);
    blk.add_in(mail.collect(in), rs.fold_partner(), 0, p);
  }
  // Halving step k gives away a half of the blocks, kept by the peer, in
  // pieces of whole blocks (at most max_chunks, a power of two, each of at
  // least chunk_elements floats' worth; none with chunk_elements 0), each
  // sent as soon as its sums are complete, cut the same way on both sides
  // (the peer's given half is this rank's kept half).
  // Encoding is lazy: a block is encoded (eq. 3) just before its first sum,
  // so the encode of the blocks the next step gives away runs while this
  // step's pieces travel, and step k + 1's first piece leaves once its
  // blocks have this rank's encoding and the sums of steps 0 .. k (eq. 4,
  // in that order: the same additions, in the same order, as one message
  // per step). The pieces a rank sends go in the order its peer forwards
  // them: the half the peer gives away at the next step first. Over a
  // zero-copy transport only where the codec knows its payload sizes in
  // advance: the receives are then exact and posted before the data is
  // due, with no length messages (with them, a piece's receive could be
  // posted only once its length had arrived, which holds a large message
  // back under SMPI).
  constexpr bool exact_sizes = linear_mailbox<T>::zero_copy && KnowsBodySize<std::remove_const_t<C>>;
  constexpr bool may_cut = !linear_mailbox<T>::zero_copy || exact_sizes;
  const int v = rs.virtual_rank(), steps = rs.steps();
  struct halving_step {
    int peer = 0, klo = 0, khi = 0, glo = 0, ghi = 0, pieces = 1;
    bool upper_first = false;  // the pieces of the upper half travel first (see above)
    std::vector<typename linear_mailbox<T>::incoming> in;  // the pieces of [klo, khi), in the order they travel
    std::vector<std::optional<std::span<const std::byte>>> got;  // their bytes once collected
  };
  std::vector<halving_step> hs(static_cast<std::size_t>(v >= 0 ? steps : 0));
  // Every choice below depends on p, the options, the length and the
  // codec's sizes of the range both peers split, never on one side's half
  // (halves can differ by a block's tail), so both make the same one.
  // A piece is at least chunk_elements floats' worth of bytes (payload
  // bytes where the codec knows them, else elements): 128 KiB at the
  // default, no message under the 64 KB from which SMPI's bandwidth factors
  // stop rewarding small ones.
  auto pieces_of = [&](int lo, int hi) {
    const int given = (hi - lo) / 2;
    if (!may_cut || o.chunk_elements == 0 || given < 2) return 1;
    std::size_t units = 0;  // floats' worth in half the range
    if constexpr (KnowsBodySize<std::remove_const_t<C>>)
      units = blk.packed_bytes(lo, hi) / sizeof(float) / 2;
    else
      units = blk.elements(lo, hi) / 2;
    std::size_t cap = std::min<std::size_t>(std::size_t(given), std::max<std::size_t>(1, units / o.chunk_elements));
    if (o.max_chunks != 0) cap = std::min(cap, o.max_chunks);
    int m = 1;
    while (std::size_t(m) * 2 <= cap) m *= 2;
    return m;
  };
  int lo = 0, hi = p;
  for (int k = 0; k < int(hs.size()); ++k) {
    auto& h = hs[std::size_t(k)];
    const int d = rs.halving_distance(k), mid = lo + (hi - lo) / 2;
    const bool lower = (v & d) == 0;
    h.peer = rs.real_rank(v ^ d);
    h.klo = lower ? lo : mid;
    h.khi = lower ? mid : hi;
    h.glo = lower ? mid : lo;
    h.ghi = lower ? hi : mid;
    h.pieces = pieces_of(lo, hi);
    // the peer (v ^ d) has v's bit of the next distance: it keeps its lower half there when v does
    h.upper_first = k + 1 < steps && h.pieces >= 2 && (v & rs.halving_distance(k + 1)) == 0;
    lo = h.klo;
    hi = h.khi;
  }
  // From here on (v >= 0) [lo, hi) is block v's range, where the doubling starts.
  const int m0 = hs.empty() ? 1 : hs[0].pieces;
  // Piece i (in travel order) of step k's range [from, to).
  auto piece = [&](int k, int from, int to, int i) {
    const auto& h = hs[std::size_t(k)];
    const int at = h.upper_first ? (i + h.pieces / 2) % h.pieces : i;
    auto cut = [&](int c) { return from + static_cast<int>(static_cast<long long>(to - from) * c / h.pieces); };
    return std::pair{cut(at), cut(at + 1)};
  };
  // The last doubling step carries half of the blocks, and their decode
  // could only follow the transfer. Where the vector is large it goes as two
  // messages, the second sent once the first has left: the first half's
  // blocks are then decoded while the second travels, for one more latency.
  const bool split_last = m0 > 1 && o.max_chunks != 1 && data.size() > 4 * o.chunk_elements;
  const bool exact = exact_sizes && m0 > 1;  // exact receives, no length messages
  if (v >= 0) {
    // Exact receives trust this rank's own idea of the peer's payload sizes,
    // and some MPI libraries write past a receive that is too small instead
    // of failing. So every halving peer (the doubling's peers too) first
    // swaps a digest of every block's size with this rank: a rank with
    // another length or codec configuration (another GradiVeQ basis) is an
    // error on both sides before any data is sent to it.
    std::vector<typename linear_mailbox<T>::incoming> digests;
    const std::uint64_t mine = exact ? blk.sizes_digest() : 0;
    if (exact) {
      for (const auto& h : hs) digests.push_back(mail.expect_exact(h.peer, tag, sizeof mine));
      for (const auto& h : hs) {
        std::vector<std::byte>& out = mail.outgoing();
        out.resize(sizeof mine);
        std::memcpy(out.data(), &mine, sizeof mine);
        mail.send(h.peer, tag, false);
      }
    }
    // Posts the receives of step k's pieces once its peer's digest has matched.
    auto post = [&](int k) {
      auto& h = hs[std::size_t(k)];
      if (exact) {
        const auto got = mail.collect(digests[std::size_t(k)]);
        std::uint64_t other = 0;
        std::memcpy(&other, got.data(), sizeof other);
        if (other != mine)
          throw transport_error(std::string(who) + ": rank " + std::to_string(self) + " and rank " + std::to_string(h.peer) +
                                " disagree on the sizes of their blocks' payloads (another vector length or codec "
                                "configuration, e.g. another GradiVeQ basis)");
      }
      for (int i = 0; i < h.pieces; ++i) {
        const auto [a, z] = piece(k, h.klo, h.khi, i);
        h.in.push_back(blk.expect(h.peer, tag, a, z, exact));
      }
      h.got.resize(h.in.size());
    };
    // Step t's sums (eq. 4) into blocks [from, to), from the pieces that hold them.
    auto add_from = [&](int t, int from, int to) {
      auto& h = hs[std::size_t(t)];
      for (int i = 0; i < h.pieces; ++i) {
        const auto [a, z] = piece(t, h.klo, h.khi, i);
        if (z <= from || a >= to) continue;
        auto& bytes = h.got[std::size_t(i)];
        if (!bytes) bytes = mail.collect(h.in[std::size_t(i)]);
        blk.add_in(*bytes, h.peer, a, z, from, to);
      }
    };
    // Step k sends its given half piece by piece, each completed just before it leaves.
    auto give = [&](int k) {
      auto& h = hs[std::size_t(k)];
      for (int i = 0; i < h.pieces; ++i) {
        const auto [a, z] = piece(k, h.glo, h.ghi, i);
        blk.encode(a, z);
        for (int t = 0; t < k; ++t) add_from(t, a, z);
        blk.send(h.peer, tag, a, z, true, !exact);
      }
      if (h.pieces == 1) mail.arm(h.in[0]);  // a length message: post the bytes' receive now
    };
    // Every step's receives are posted before the first send (the peers'
    // bytes are never held back), the first piece encoded while the digests travel.
    if (steps > 0) {
      const auto [a, z] = piece(0, hs[0].glo, hs[0].ghi, 0);
      blk.encode(a, z);
    }
    for (int k = 0; k < steps; ++k) post(k);
    for (int k = 0; k < steps; ++k) give(k);
    blk.encode(v, v + 1);  // block v: this rank's encoding, then every step's sum
    for (int t = 0; t < steps; ++t) add_from(t, v, v + 1);
    // Block v is complete: serialize it once; from here on the bytes travel
    // as they are (with exact sizes, sent from and received into one
    // buffer of all blocks: no copy).
    if (exact) blk.assemble();
    blk.serialize(v);
    // Recursive doubling of the complete compressed blocks. Each step's
    // blocks are decoded (eq. 5) during the next step's transfer: only the
    // last step's blocks are decoded after the wire is done.
    int dlo = v, dhi = v + 1, from = self;  // blocks to decode, from whom (block v first, from its payload)
    for (int d = 1; d < p; d *= 2) {
      const int width = hi - lo, peer = rs.real_rank(v ^ d);
      const bool lower = (v & d) == 0;
      const int plo = lower ? hi : lo - width, phi = plo + width;
      if (2 * d >= p && split_last) {
        const int pmid = plo + width / 2, mid = lo + width / 2;  // split_last implies pieces: exact where sizes are known
        auto first = blk.expect(peer, tag2, plo, pmid, exact);
        auto second = blk.expect(peer, tag2, pmid, phi, exact);
        blk.send(peer, tag2, lo, mid, false, !exact);
        blk.decode_run(dlo, dhi, from);
        mail.wait_sends();  // the first message has left: the second has the link to itself
        blk.send(peer, tag2, mid, hi, false, !exact);
        blk.keep_bytes(mail.collect(first), peer, plo, pmid);
        blk.decode_run(plo, pmid, peer);  // while the second message travels
        blk.keep_bytes(mail.collect(second), peer, pmid, phi);
        dlo = pmid;
        dhi = phi;
      } else {
        auto in = blk.expect(peer, tag2, plo, phi, exact);
        blk.send(peer, tag2, lo, hi, false, !exact);
        mail.arm(in);
        blk.decode_run(dlo, dhi, from);
        blk.keep_bytes(mail.collect(in), peer, plo, phi);
        dlo = plo;
        dhi = phi;
      }
      from = peer;
      lo = lower ? lo : plo;
      hi = lower ? phi : hi;
    }
    blk.decode_run(dlo, dhi, from);
  }
  // Unfold: the odd rank of a pair sends the complete compressed blocks.
  if (rs.folds_in()) {
    blk.send(rs.fold_partner(), tag2, 0, p, false);
  } else if (rs.folded_out()) {
    auto in = mail.expect(rs.fold_partner(), tag2);
    blk.decode_message(mail.collect(in), rs.fold_partner(), 0, p);
  }
  mail.finish();
  st.seconds = ring_seconds_since(started);
  return st;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Rabenseifner's all-reduce in the compressed domain of a LinearCodec, in
/// place on `data` (every rank passes the same length and an identically
/// configured codec: same basis; GradiVeQ's summands() must equal N).
/// Blocks: ring_segmentation<C>::bounds(codec, length, p), p the largest
/// power of two <= N. Result: data = decode(sum over ranks of encode(block)),
/// block by block, divided by N with options.average: bit-identical on every
/// rank (each block's compressed sum is computed by one rank and its bytes
/// are decoded everywhere). Each rank encodes its vector once and decodes it
/// once; messages carry encoded half-ranges (log2 p of them each way, plus
/// the fold for N not a power of two), the halving's in pieces of whole
/// blocks where the transport moves messages or the codec knows its payload
/// sizes (options.max_chunks, chunk_elements 0: whole). Tags
/// options.tag_base and + 1.
/// Errors as ring_allreduce_linear's.
template <Transport T, class C>
  requires LinearCodec<std::remove_const_t<C>>
ring_stats rabenseifner_allreduce_linear(T& t, C& codec, std::span<float> data, const schedule_options& options = {}) {
  return detail::rabenseifner_linear_impl(t, codec, data, options);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
