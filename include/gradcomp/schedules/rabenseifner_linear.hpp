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

#include <cstddef>
#include <cstdint>
#include <cstring>
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
#include <gradcomp/schedules/options.hpp>
#include <gradcomp/schedules/rabenseifner.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Concatenates serialized payloads, each preceded by its length (a native uint64).
inline std::vector<std::byte> schedule_pack(std::span<const std::vector<std::byte>> parts) {
  std::size_t total = 0;
  for (const auto& p : parts) total += sizeof(std::uint64_t) + p.size();
  std::vector<std::byte> out(total);
  std::size_t at = 0;
  for (const auto& p : parts) {
    const std::uint64_t len = p.size();
    std::memcpy(out.data() + at, &len, sizeof len);
    at += sizeof len;
    if (!p.empty()) std::memcpy(out.data() + at, p.data(), p.size());
    at += p.size();
  }
  return out;
}

/// Splits schedule_pack's bytes into exactly `count` parts; transport_error if malformed.
inline std::vector<std::vector<std::byte>> schedule_unpack(std::span<const std::byte> in, std::size_t count,
                                                           const std::string& where) {
  std::vector<std::vector<std::byte>> parts(count);
  std::size_t at = 0;
  for (auto& p : parts) {
    std::uint64_t len = 0;
    if (in.size() - at < sizeof len) throw transport_error(where + ": truncated list of block payloads");
    std::memcpy(&len, in.data() + at, sizeof len);
    at += sizeof len;
    if (len > in.size() - at) throw transport_error(where + ": truncated list of block payloads");
    p.assign(in.begin() + static_cast<std::ptrdiff_t>(at), in.begin() + static_cast<std::ptrdiff_t>(at + len));
    at += static_cast<std::size_t>(len);
  }
  if (at != in.size()) throw transport_error(where + ": trailing bytes after the block payloads");
  return parts;
}

/// Rabenseifner in the compressed domain (see rabenseifner_allreduce_linear).
template <class T, class C>
ring_stats rabenseifner_linear_impl(T& t, C& codec, std::span<float> data, const schedule_options& o) {
  using payload = typename std::remove_const_t<C>::payload_type;
  using seg = ring_segmentation<std::remove_const_t<C>>;
  constexpr const char* who = "rabenseifner_allreduce_linear";
  const auto started = ring_clock::now();
  ring_stats st;
  schedule_check_tags(o, who);
  const rabenseifner_schedule rs(static_cast<int>(t.rank()), static_cast<int>(t.size()));
  const int n = rs.size(), p = rs.blocks(), self = rs.rank();
  ring_check_summands(codec, n, who);
  const std::vector<std::size_t> b =
      ring_checked_bounds(seg::bounds(std::as_const(codec), data.size(), p), data.size(), p, who);
  auto block = [&](int j) { return data.subspan(b[std::size_t(j)], b[std::size_t(j) + 1] - b[std::size_t(j)]); };
  const auto P = static_cast<std::size_t>(p);
  std::vector<payload> enc(P);
  std::vector<std::size_t> body(P);
  std::vector<std::vector<std::byte>> ser(P);
  for (int j = 0; j < p; ++j) {  // eq. 3 on every block, once
    ring_timed(st.encode_seconds, [&] { seg::encode(codec, b[std::size_t(j)], std::span<const float>(block(j)), enc[std::size_t(j)]); });
    ++st.encodes;
    body[std::size_t(j)] = enc[std::size_t(j)].body_size();
    st.own_encoded_bytes += codec.encoded_bytes(enc[std::size_t(j)]);
  }
  auto decode = [&](const payload& q, int j) {  // eq. 5 (then the mean: the same operation on the same bits everywhere)
    ring_timed(st.decode_seconds, [&] {
      codec.decode(q, block(j));
      if (o.average) schedule_average(block(j), n);
    });
    ++st.decodes;
  };
  auto parse = [&](std::span<const std::byte> bytes, int j, int source) {
    const std::string where = std::string(who) + ": rank " + std::to_string(self) + ", block " + std::to_string(j) +
                              " from rank " + std::to_string(source);
    wire::parse_limits limits;
    limits.max_element_count = b[std::size_t(j) + 1] - b[std::size_t(j)];
    limits.max_body_length = body[std::size_t(j)];  // a linear sum has the shape of one payload (eq. 4)
    payload q;
    ring_timed(st.combine_seconds, [&] {
      try {
        q = wire::parse<payload>(bytes, limits);
      } catch (const wire::wire_error& e) {
        throw wire::wire_error(e.code(), where + ": " + e.what());
      }
      if (static_cast<std::uint64_t>(q.element_count()) != static_cast<std::uint64_t>(limits.max_element_count))
        throw size_mismatch_error(where + ": payload length", limits.max_element_count,
                                  static_cast<std::size_t>(q.element_count()));
      seg::check(q, b[std::size_t(j)], where);
    });
    return q;
  };
  if (n == 1) {
    for (int j = 0; j < p; ++j) decode(enc[std::size_t(j)], j);
    st.seconds = ring_seconds_since(started);
    return st;
  }

  using send_handle = decltype(t.isend(0, 0, std::vector<std::byte>{}));
  std::vector<send_handle> sends;
  auto send = [&](int peer, int tag, int lo, int hi, bool serialize) {
    if (serialize)
      ring_timed(st.combine_seconds, [&] {
        for (int j = lo; j < hi; ++j) wire::serialize_into(enc[std::size_t(j)], ser[std::size_t(j)]);
      });
    std::vector<std::byte> m = schedule_pack(std::span<const std::vector<std::byte>>(ser).subspan(std::size_t(lo), std::size_t(hi - lo)));
    st.bytes_sent += m.size();
    ++st.messages_sent;
    sends.push_back(t.isend(peer, tag, std::move(m)));
  };
  auto receive = [&](int peer, int tag, int lo, int hi) {
    auto h = t.irecv(peer, tag);
    message m;
    ring_timed(st.wait_seconds, [&] { m = h.wait(); });
    st.bytes_received += m.bytes.size();
    return schedule_unpack(m.bytes, std::size_t(hi - lo),
                           std::string(who) + ": rank " + std::to_string(self) + " from rank " + std::to_string(peer));
  };
  const int tag = o.tag_base, tag2 = o.tag_base + 1;

  // Fold: the even rank of a pair sends all its encoded blocks; the odd one sums them in.
  if (rs.folded_out()) {
    send(rs.fold_partner(), tag, 0, p, true);
  } else if (rs.folds_in()) {
    auto parts = receive(rs.fold_partner(), tag, 0, p);
    for (int j = 0; j < p; ++j) {
      payload q = parse(parts[std::size_t(j)], j, rs.fold_partner());
      ring_timed(st.combine_seconds, [&] { codec.accumulate(enc[std::size_t(j)], q); });
    }
  }
  const int v = rs.virtual_rank();
  if (v >= 0) {
    int lo = 0, hi = p;
    for (int k = 0; k < rs.steps(); ++k) {  // recursive halving in the compressed domain
      const int d = rs.halving_distance(k), mid = lo + (hi - lo) / 2, peer = rs.real_rank(v ^ d);
      const bool lower = (v & d) == 0;
      const int klo = lower ? lo : mid, khi = lower ? mid : hi;
      send(peer, tag, lower ? mid : lo, lower ? hi : mid, true);
      auto parts = receive(peer, tag, klo, khi);
      for (int j = klo; j < khi; ++j) {
        payload q = parse(parts[std::size_t(j - klo)], j, peer);
        ring_timed(st.combine_seconds, [&] { codec.accumulate(enc[std::size_t(j)], q); });  // eq. 4
      }
      lo = klo;
      hi = khi;
    }
    // Block v is complete: serialize it once; from here on the bytes travel as they are.
    ring_timed(st.combine_seconds, [&] { wire::serialize_into(enc[std::size_t(v)], ser[std::size_t(v)]); });
    decode(enc[std::size_t(v)], v);
    for (int d = 1; d < p; d *= 2) {  // recursive doubling of the complete compressed blocks
      const int width = hi - lo, peer = rs.real_rank(v ^ d);
      const bool lower = (v & d) == 0;
      const int plo = lower ? hi : lo - width, phi = plo + width;
      send(peer, tag2, lo, hi, false);
      auto parts = receive(peer, tag2, plo, phi);
      for (int j = plo; j < phi; ++j) {
        ser[std::size_t(j)] = std::move(parts[std::size_t(j - plo)]);
        decode(parse(ser[std::size_t(j)], j, peer), j);
      }
      lo = lower ? lo : plo;
      hi = lower ? phi : hi;
    }
  }
  // Unfold: the odd rank of a pair sends the complete compressed blocks.
  if (rs.folds_in()) {
    send(rs.fold_partner(), tag2, 0, p, false);
  } else if (rs.folded_out()) {
    auto parts = receive(rs.fold_partner(), tag2, 0, p);
    for (int j = 0; j < p; ++j) decode(parse(parts[std::size_t(j)], j, rs.fold_partner()), j);
  }
  ring_timed(st.wait_seconds, [&] {
    for (auto& h : sends) h.wait();
  });
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
/// once; messages carry whole encoded half-ranges (log2 p of them each way,
/// plus the fold for N not a power of two). Tags options.tag_base and + 1.
/// Errors as ring_allreduce_linear's.
template <Transport T, class C>
  requires LinearCodec<std::remove_const_t<C>>
ring_stats rabenseifner_allreduce_linear(T& t, C& codec, std::span<float> data, const schedule_options& options = {}) {
  return detail::rabenseifner_linear_impl(t, codec, data, options);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
