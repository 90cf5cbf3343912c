#pragma once
/// \file schedules/codec_group.hpp
/// codec_group: several buckets' LinearCodecs of one type (each with its own
/// state: GradiVeQ's basis, a residual) as one LinearCodec over the
/// concatenation of their vectors, so that one compressed all-reduce runs
/// every bucket's steps together instead of one all-reduce per bucket after
/// the other (issue 21): one set of latency steps for the group, and each
/// bucket's encode, sums and decode overlap the other buckets' transfers in
/// the schedule's pieces. Linearity (GradiVeQ eq. 4) holds member by member,
/// so the group's sum is each member's sum: the same bits as running each
/// member's all-reduce on its own with the same blocks.
/// Part of <gradcomp/schedules.hpp>.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/ring/linear.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

GRADCOMP_ABI_NAMESPACE_BEGIN

/// Payload of codec_group<C>: a run [offset, offset + length) of the
/// group's vector as the payloads of the members it overlaps, in order,
/// each of the member's own run (its part of the group's run).
///
/// Body (little-endian, docs/codecs.md):
///     u64 offset        first element of the run in the group's vector
///     u64 parts         member payloads that follow
///     per part: u64 element_count, u64 body_length, the member payload's body
/// element_count (header) is the run's length; the parts' counts add up to it.
template <class P>
struct codec_group_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::codec_group;
  static constexpr std::size_t fixed_body_size = 8 + 8;
  static constexpr std::size_t part_prefix_size = 8 + 8;

  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::vector<P> parts;
  /// Part objects kept, with their buffers, while the payload holds fewer
  /// parts (not part of its value): one payload parsed or encoded again and
  /// again for runs of different part counts then stops allocating.
  std::vector<P> spare;

  /// Makes `parts` hold `count` parts, moving extra ones to `spare` and taking from it first.
  void resize_parts(std::size_t count) {
    while (parts.size() > count) {
      spare.push_back(std::move(parts.back()));
      parts.pop_back();
    }
    while (parts.size() < count) {
      if (spare.empty()) {
        parts.emplace_back();
      } else {
        parts.push_back(std::move(spare.back()));
        spare.pop_back();
      }
    }
  }

  std::uint64_t element_count() const noexcept { return length; }
  std::size_t body_size() const noexcept {
    std::size_t s = fixed_body_size;
    for (const auto& p : parts) s += part_prefix_size + p.body_size();
    return s;
  }
  void write_body(wire::writer& w) const {
    w.put<std::uint64_t>(offset);
    w.put<std::uint64_t>(parts.size());
    for (const auto& p : parts) {
      w.put<std::uint64_t>(static_cast<std::uint64_t>(p.element_count()));
      w.put<std::uint64_t>(p.body_size());
      p.write_body(w);
    }
  }
  static codec_group_payload read_body(wire::reader& r, const wire::header& h) {
    codec_group_payload p;
    read_body_into(r, h, p);
    return p;
  }
  /// read_body into `p`, keeping its parts' buffers (wire::parse_into, resize_parts). Each
  /// part is parsed by the member payload's own reader over exactly its
  /// body's bytes (the outer checksum covers them).
  static void read_body_into(wire::reader& r, const wire::header& h, codec_group_payload& p) {
    using wire::reader;
    p.length = h.element_count;
    p.offset = r.get<std::uint64_t>();
    const std::uint64_t count = r.get<std::uint64_t>();
    reader::check(p.offset <= std::numeric_limits<std::uint64_t>::max() - p.length,
                  "codec group payload: offset + length overflows");
    // Every part takes at least its prefix: a lying count cannot over-allocate.
    if (count > r.remaining() / part_prefix_size)
      reader::fail(wire::wire_errc::truncated, "codec group payload: " + std::to_string(count) + " parts in " +
                                                   std::to_string(r.remaining()) + " bytes");
    p.resize_parts(static_cast<std::size_t>(count));
    std::uint64_t elements = 0;
    for (auto& part : p.parts) {
      wire::header ph;
      ph.codec = P::wire_codec;
      ph.element_count = r.get<std::uint64_t>();
      ph.body_length = r.get<std::uint64_t>();
      reader::check(ph.element_count <= p.length - elements, "codec group payload: parts longer than the run");
      elements += ph.element_count;
      reader sub(r.get_bytes(ph.body_length));
      if constexpr (requires { P::read_body_into(sub, ph, part); })
        P::read_body_into(sub, ph, part);
      else
        part = P::read_body(sub, ph);
      sub.expect_end();
      reader::check(static_cast<std::uint64_t>(part.element_count()) == ph.element_count,
                    "codec group payload: a part decodes another element count than it says");
    }
    reader::check(elements == p.length, "codec group payload: the parts do not cover the run");
  }
};

/// Several LinearCodecs of type C, one per bucket, as one LinearCodec over
/// the concatenation of their vectors (add() them in the vector's order,
/// each with its length). The members are referenced, not owned: they keep
/// their state across steps, as the buckets' codecs do, and must outlive
/// the group. Every rank builds its group from identically configured
/// members in the same order.
///
/// Run it through any compressed schedule (allreduce_linear with
/// schedule_kind::rabenseifner, hierarchical, ring) on the span of the
/// buckets' concatenated gradients. Its segment bounds cut the vector near
/// equal parts, on a member's own granules (GradiVeQ: slices of K; fp16:
/// any element) or its ends, so a segment's payload is each overlapped
/// member's encode_segment of its part: the same arithmetic as the member's
/// own all-reduce on those bounds. Not for AgreedScaleCodec members (the
/// homomorphic quantizer's scale agreement is per member's vector).
template <class C>
  requires LinearCodec<C>
class codec_group {
  static_assert(!AgreedScaleCodec<C>,
                "codec_group: members that agree on scales first (the homomorphic quantizer) need one scale round "
                "per member; run them one by one");

 public:
  using member_type = C;
  using member_payload = typename C::payload_type;
  using payload_type = codec_group_payload<member_payload>;
  using codec_concept = linear_codec_tag;

  codec_group() = default;

  /// Appends a member covering the next `length` elements of the group's
  /// vector. Throws invalid_argument_error for length 0, for a length other
  /// than the member's own (where it says: GradiVeQ's layer_length()), or for a
  /// member configured for another number of summands than the first.
  void add(C& member, std::size_t length) {
    if (length == 0) throw invalid_argument_error("codec_group: a member of length 0");
    if constexpr (requires(const C& c) {
                    { c.layer_length() } -> std::convertible_to<std::size_t>;
                  }) {
      if (static_cast<std::size_t>(member.layer_length()) != length)
        throw size_mismatch_error("codec_group: member " + std::to_string(members_.size()) + "'s length",
                                  static_cast<std::size_t>(member.layer_length()), length);
    }
    if constexpr (requires(const C& c) {
                    { c.summands() } -> std::convertible_to<std::size_t>;
                  }) {
      if (!members_.empty() && static_cast<std::size_t>(member.summands()) != summands())
        throw invalid_argument_error("codec_group: member " + std::to_string(members_.size()) + " is configured for " +
                                     std::to_string(member.summands()) + " summands, the first for " +
                                     std::to_string(summands()));
    }
    members_.push_back(&member);
    offsets_.push_back(offsets_.back() + length);
  }

  std::size_t members() const noexcept { return members_.size(); }
  /// The group's vector length: the members' lengths added up.
  std::size_t length() const noexcept { return offsets_.back(); }
  /// Where member i's elements begin in the group's vector (members() + 1 offsets).
  std::span<const std::size_t> offsets() const noexcept { return offsets_; }
  C& member(std::size_t i) const { return *members_.at(i); }

  /// The members' N (GradiVeQ eq. 3's mu/N), checked by the drivers against the ranks.
  std::size_t summands() const
    requires requires(const C& c) { c.summands(); }
  {
    if (members_.empty()) throw state_error("codec_group: no members");
    return static_cast<std::size_t>(members_.front()->summands());
  }

  /// `parts` + 1 offsets from 0 to length(): the cut nearest each j/parts of
  /// the vector at or below it that starts a granule of the member holding
  /// it (a member's start where it has no granules), never decreasing.
  std::vector<std::size_t> segment_bounds(std::size_t parts) const {
    if (parts == 0) throw invalid_argument_error("codec_group: segment_bounds needs at least one part");
    require_members("codec_group::segment_bounds");
    std::vector<std::size_t> b(parts + 1, 0);
    const std::size_t n = length();
    for (std::size_t j = 1; j < parts; ++j) {
      const std::size_t target = n / parts * j + n % parts * j / parts;  // floor(n j / parts), no overflow
      const std::size_t i = member_at(target);
      const std::size_t local = target - offsets_[i];
      const std::size_t g = ring_segmentation<C>::granularity(*members_[i]);
      const std::size_t cut = offsets_[i] + (g == 0 ? 0 : local / g * g);
      b[j] = std::max(b[j - 1], cut);
    }
    b[parts] = n;
    return b;
  }

  /// Encodes [offset, offset + segment.size()) of the group's vector: each
  /// overlapped member's part at its own offset (ring_segmentation<C>).
  void encode_segment(std::size_t offset, std::span<const float> segment, payload_type& out) const {
    check_run(offset, segment.size(), "codec_group::encode_segment");
    out.offset = offset;
    out.length = segment.size();
    const auto [first, count] = members_of(offset, segment.size());
    out.resize_parts(count);
    for (std::size_t k = 0; k < count; ++k) {
      const auto [at, len] = part_of(first + k, offset, segment.size());
      ring_segmentation<C>::encode(*members_[first + k], at - offsets_[first + k],
                                   segment.subspan(at - offset, len), out.parts[k]);
    }
  }
  /// Encodes the whole vector (in.size() == length()).
  void encode(std::span<const float> in, payload_type& out) {
    if (in.size() != length()) throw size_mismatch_error("codec_group::encode: input length", length(), in.size());
    encode_segment(0, in, out);
  }
  /// Body bytes of encode_segment's payload for [offset, offset + n), where
  /// the members know theirs (GradiVeQ): the compressed schedules then size
  /// their receives exactly.
  std::size_t segment_body_size(std::size_t offset, std::size_t n) const
    requires KnowsBodySize<C>
  {
    check_run(offset, n, "codec_group::segment_body_size");
    std::size_t s = payload_type::fixed_body_size;
    const auto [first, count] = members_of(offset, n);
    for (std::size_t k = 0; k < count; ++k) {
      const auto [at, len] = part_of(first + k, offset, n);
      s += payload_type::part_prefix_size +
           ring_segmentation<C>::body_size(*members_[first + k], at - offsets_[first + k], len);
    }
    return s;
  }
  /// Eq. 4 member by member: `from` summed into `into` (the same run).
  void accumulate(payload_type& into, const payload_type& from) const {
    const std::size_t first = check_payload(into, "codec_group::accumulate (into)");
    check_payload(from, "codec_group::accumulate (from)");
    if (into.offset != from.offset)
      throw size_mismatch_error("codec_group::accumulate: payloads of different runs (offset)",
                                static_cast<std::size_t>(into.offset), static_cast<std::size_t>(from.offset));
    if (into.length != from.length)
      throw size_mismatch_error("codec_group::accumulate: payloads of different runs (length)",
                                static_cast<std::size_t>(into.length), static_cast<std::size_t>(from.length));
    for (std::size_t k = 0; k < into.parts.size(); ++k) members_[first + k]->accumulate(into.parts[k], from.parts[k]);
  }
  /// Eq. 5 member by member into `out` (the run's length).
  void decode(const payload_type& p, std::span<float> out) const {
    const std::size_t first = check_payload(p, "codec_group::decode");
    if (out.size() != p.length)
      throw size_mismatch_error("codec_group::decode: output length", static_cast<std::size_t>(p.length), out.size());
    const auto offset = static_cast<std::size_t>(p.offset);
    for (std::size_t k = 0; k < p.parts.size(); ++k) {
      const auto [at, len] = part_of(first + k, offset, out.size());
      members_[first + k]->decode(p.parts[k], out.subspan(at - offset, len));
    }
  }
  std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }

 private:
  std::vector<C*> members_;
  std::vector<std::size_t> offsets_{0};

  void require_members(const char* who) const {
    if (members_.empty()) throw state_error(std::string(who) + ": the group has no members (add() them first)");
  }
  void check_run(std::size_t offset, std::size_t n, const char* who) const {
    require_members(who);
    if (offset > length() || n > length() - offset)
      throw size_mismatch_error(std::string(who) + ": run [" + std::to_string(offset) + ", +" + std::to_string(n) +
                                    ") beyond the group's length",
                                length(), offset + n);
  }
  /// The member holding element `at` (< length()).
  std::size_t member_at(std::size_t at) const {
    return static_cast<std::size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), at) - offsets_.begin()) - 1;
  }
  /// The first member a run [offset, offset + n) overlaps and how many it overlaps (0 for an empty run).
  std::pair<std::size_t, std::size_t> members_of(std::size_t offset, std::size_t n) const {
    if (n == 0) return {0, 0};
    const std::size_t first = member_at(offset), last = member_at(offset + n - 1);
    return {first, last - first + 1};
  }
  /// Member i's part [at, at + len) of the run [offset, offset + n), in the group's coordinates.
  std::pair<std::size_t, std::size_t> part_of(std::size_t i, std::size_t offset, std::size_t n) const {
    const std::size_t at = std::max(offset, offsets_[i]);
    return {at, std::min(offset + n, offsets_[i + 1]) - at};
  }
  /// A (received) payload must describe a run of this group with one part
  /// per member it overlaps, each of that member's part's length. Returns
  /// the first member the run overlaps.
  std::size_t check_payload(const payload_type& p, const char* who) const {
    require_members(who);
    if (p.offset > length() || p.length > length() - p.offset)
      throw size_mismatch_error(std::string(who) + ": payload run beyond the group's length", length(),
                                static_cast<std::size_t>(p.offset + std::min<std::uint64_t>(p.length, length())));
    const auto offset = static_cast<std::size_t>(p.offset), n = static_cast<std::size_t>(p.length);
    const auto [first, count] = members_of(offset, n);
    if (p.parts.size() != count)
      throw size_mismatch_error(std::string(who) + ": member payloads in the run", count, p.parts.size());
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t len = part_of(first + k, offset, n).second;
      if (static_cast<std::size_t>(p.parts[k].element_count()) != len)
        throw size_mismatch_error(std::string(who) + ": member " + std::to_string(first + k) + "'s part length", len,
                                  static_cast<std::size_t>(p.parts[k].element_count()));
    }
    return first;
  }
};

GRADCOMP_ABI_NAMESPACE_END

}  // namespace gradcomp
