#pragma once
/// \file schedules/codec_group.hpp
/// codec_group: several buckets' LinearCodecs (each with its own state:
/// GradiVeQ's basis, a residual), of one type or of several (GradiVeQ
/// buckets beside dense ones), as one LinearCodec over the concatenation of
/// their vectors, so that one compressed all-reduce runs every bucket's
/// steps together instead of one all-reduce per bucket after the other
/// (issue 21): one set of latency steps for the group, and each bucket's
/// encode, sums and decode overlap the other buckets' transfers in the
/// schedule's pieces. Linearity (GradiVeQ eq. 4) holds member by member, so
/// the group's sum is each member's sum: the same bits as running each
/// member's all-reduce on its own with the same blocks.
/// Part of <gradcomp/schedules.hpp>.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/ring/linear.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

GRADCOMP_ABI_NAMESPACE_BEGIN

/// Payload of codec_group<Cs...>: a run [offset, offset + length) of the
/// group's vector as the payloads of the members it overlaps, in order,
/// each of the member's own run (its part of the group's run). A part is one
/// of the member payload types Ps (a std::variant).
///
/// Body (little-endian, docs/codecs.md):
///     u64 offset        first element of the run in the group's vector
///     u64 parts         member payloads that follow
///     per part: u64 codec (the part's wire codec id), u64 element_count,
///               u64 body_length, the member payload's body
/// element_count (header) is the run's length; the parts' counts add up to it.
template <class... Ps>
struct codec_group_payload {
  static_assert(sizeof...(Ps) >= 1, "codec_group_payload: at least one member payload type");
  static constexpr wire::codec_id wire_codec = wire::codec_id::codec_group;
  static constexpr std::size_t fixed_body_size = 8 + 8;
  static constexpr std::size_t part_prefix_size = 8 + 8 + 8;
  using part_type = std::variant<Ps...>;

  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::vector<part_type> parts;
  /// Part objects kept, with their buffers, while the payload holds fewer
  /// parts or parts of another type (not part of its value), one pool per
  /// type: one payload parsed or encoded again and again for runs of
  /// different part counts and types then stops allocating.
  std::tuple<std::vector<Ps>...> spare;

  /// Makes `parts` hold `count` parts, moving extra ones to `spare`; new
  /// parts are of the first type (set_part gives a part its type).
  void resize_parts(std::size_t count) {
    while (parts.size() > count) {
      stash(std::move(parts.back()));
      parts.pop_back();
    }
    while (parts.size() < count) parts.emplace_back(take<0>());
  }
  /// Part k as a P, its current value stashed (if of another type) and a spare P taken.
  template <class P>
  P& set_part(std::size_t k) {
    if (!std::holds_alternative<P>(parts[k])) {
      stash(std::move(parts[k]));
      parts[k].template emplace<P>(take<index_of<P>()>());
    }
    return std::get<P>(parts[k]);
  }

  std::uint64_t element_count() const noexcept { return length; }
  std::size_t body_size() const noexcept {
    std::size_t s = fixed_body_size;
    for (const auto& p : parts) s += part_prefix_size + std::visit([](const auto& q) { return q.body_size(); }, p);
    return s;
  }
  void write_body(wire::writer& w) const {
    w.put<std::uint64_t>(offset);
    w.put<std::uint64_t>(parts.size());
    for (const auto& part : parts)
      std::visit(
          [&w](const auto& p) {
            w.put<std::uint64_t>(static_cast<std::uint64_t>(std::remove_cvref_t<decltype(p)>::wire_codec));
            w.put<std::uint64_t>(static_cast<std::uint64_t>(p.element_count()));
            w.put<std::uint64_t>(p.body_size());
            p.write_body(w);
          },
          part);
  }
  static codec_group_payload read_body(wire::reader& r, const wire::header& h) {
    codec_group_payload p;
    read_body_into(r, h, p);
    return p;
  }
  /// read_body into `p`, keeping its parts' buffers (wire::parse_into,
  /// set_part). Each part is parsed by its payload type's own reader over
  /// exactly its body's bytes (the outer checksum covers them); a codec id
  /// none of Ps has is a wire error.
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
    for (std::size_t k = 0; k < p.parts.size(); ++k) {
      const std::uint64_t codec = r.get<std::uint64_t>();
      wire::header ph;
      ph.element_count = r.get<std::uint64_t>();
      ph.body_length = r.get<std::uint64_t>();
      reader::check(ph.element_count <= p.length - elements, "codec group payload: parts longer than the run");
      elements += ph.element_count;
      reader sub(r.get_bytes(ph.body_length));
      const bool known = (read_part_as<Ps>(codec, sub, ph, p, k) || ...);
      if (!known)
        reader::fail(wire::wire_errc::malformed_body,
                     "codec group payload: a part of codec id " + std::to_string(codec) +
                         ", which is not one of this group's member payload types");
    }
    reader::check(elements == p.length, "codec group payload: the parts do not cover the run");
  }

 private:
  template <class P>
  static constexpr std::size_t index_of() {
    std::size_t i = 0;
    const bool found = ((std::is_same_v<P, Ps> ? true : (++i, false)) || ...);
    return found ? i : sizeof...(Ps);
  }
  void stash(part_type&& v) {
    std::visit([this](auto&& q) {
      using Q = std::remove_cvref_t<decltype(q)>;
      std::get<index_of<Q>()>(spare).push_back(std::move(q));
    }, std::move(v));
  }
  template <std::size_t I>
  std::tuple_element_t<I, std::tuple<Ps...>> take() {
    auto& pool = std::get<I>(spare);
    if (pool.empty()) return {};
    auto q = std::move(pool.back());
    pool.pop_back();
    return q;
  }
  /// Parses part k as a P if `codec` is P's id (false otherwise).
  template <class P>
  static bool read_part_as(std::uint64_t codec, wire::reader& sub, wire::header ph, codec_group_payload& p,
                           std::size_t k) {
    if (codec != static_cast<std::uint64_t>(P::wire_codec)) return false;
    ph.codec = P::wire_codec;
    P& part = p.template set_part<P>(k);
    if constexpr (requires { P::read_body_into(sub, ph, part); })
      P::read_body_into(sub, ph, part);
    else
      part = P::read_body(sub, ph);
    sub.expect_end();
    wire::reader::check(static_cast<std::uint64_t>(part.element_count()) == ph.element_count,
                        "codec group payload: a part decodes another element count than it says");
    return true;
  }
};

/// Several LinearCodecs, one per bucket, each of one of the types Cs, as one
/// LinearCodec over the concatenation of their vectors (add() them in the
/// vector's order, each with its length). codec_group<gradiveq_codec>
/// groups GradiVeQ buckets; codec_group<gradiveq_codec, dense_codec<>> also
/// takes the model's uncompressed buckets (the fc layer, the norms), so
/// their transfers too overlap the GradiVeQ buckets' encodes and decodes in
/// one collective. The members are referenced, not owned: they keep their
/// state across steps, as the buckets' codecs do, and must outlive the
/// group. Every rank builds its group from identically configured members in
/// the same order.
///
/// Run it through any compressed schedule (allreduce_linear with
/// schedule_kind::rabenseifner, hierarchical, ring) on the span of the
/// buckets' concatenated gradients. Its segment bounds cut the vector near
/// equal parts, on a member's own granules (GradiVeQ: slices of K; fp16 and
/// dense: any element) or its ends, so a segment's payload is each
/// overlapped member's encode_segment of its part: the same arithmetic as
/// the member's own all-reduce on those bounds. Not for AgreedScaleCodec
/// members (the homomorphic quantizer's scale agreement is per member's
/// vector). The member types must be distinct and have distinct payload
/// wire ids (a part on the wire is told by its id).
template <class... Cs>
  requires(sizeof...(Cs) >= 1 && (LinearCodec<Cs> && ...))
class codec_group {
  static_assert((!AgreedScaleCodec<Cs> && ...),
                "codec_group: members that agree on scales first (the homomorphic quantizer) need one scale round "
                "per member; run them one by one");
  static_assert(
      [] {
        const std::uint64_t ids[] = {static_cast<std::uint64_t>(Cs::payload_type::wire_codec)...};
        for (std::size_t i = 0; i < sizeof...(Cs); ++i)
          for (std::size_t j = 0; j < i; ++j)
            if (ids[i] == ids[j]) return false;
        return true;
      }(),
      "codec_group: two member types with the same payload wire id (the same codec with two policies?) cannot be "
      "told apart on the wire");

  template <class C>
  static constexpr bool has_summands = requires(const C& c) {
    { c.summands() } -> std::convertible_to<std::size_t>;
  };

 public:
  /// The member type of a group of one type (codec_group<C>::member_type is C).
  using member_type = std::tuple_element_t<0, std::tuple<Cs...>>;
  using payload_type = codec_group_payload<typename Cs::payload_type...>;
  using codec_concept = linear_codec_tag;

  codec_group() = default;

  /// Appends a member covering the next `length` elements of the group's
  /// vector. Throws invalid_argument_error for length 0, for a length other
  /// than the member's own (where it says: GradiVeQ's layer_length()), or for a
  /// member configured for another number of summands than the members before it.
  template <class M>
    requires(std::is_same_v<M, Cs> || ...)
  void add(M& member, std::size_t length) {
    if (length == 0) throw invalid_argument_error("codec_group: a member of length 0");
    if constexpr (requires(const M& c) {
                    { c.layer_length() } -> std::convertible_to<std::size_t>;
                  }) {
      if (static_cast<std::size_t>(member.layer_length()) != length)
        throw size_mismatch_error("codec_group: member " + std::to_string(members_.size()) + "'s length",
                                  static_cast<std::size_t>(member.layer_length()), length);
    }
    if constexpr (has_summands<M>) {
      const auto n = static_cast<std::size_t>(member.summands());
      if (summands_ && *summands_ != n)
        throw invalid_argument_error("codec_group: member " + std::to_string(members_.size()) + " is configured for " +
                                     std::to_string(n) + " summands, the members before it for " +
                                     std::to_string(*summands_));
      summands_ = n;
    }
    members_.emplace_back(std::in_place_type<M*>, &member);
    offsets_.push_back(offsets_.back() + length);
  }

  std::size_t members() const noexcept { return members_.size(); }
  /// The group's vector length: the members' lengths added up.
  std::size_t length() const noexcept { return offsets_.back(); }
  /// Where member i's elements begin in the group's vector (members() + 1 offsets).
  std::span<const std::size_t> offsets() const noexcept { return offsets_; }
  /// Member i as an M (invalid_argument_error if it is of another type).
  template <class M = member_type>
  M& member(std::size_t i) const {
    M* const* m = std::get_if<M*>(&members_.at(i));
    if (m == nullptr) throw invalid_argument_error("codec_group::member: member " + std::to_string(i) + " is of another type");
    return **m;
  }

  /// The members' N (GradiVeQ eq. 3's mu/N), for a group of one type that has one.
  std::size_t summands() const
    requires(sizeof...(Cs) == 1 && (has_summands<Cs> && ...))
  {
    if (!summands_) throw state_error("codec_group: no members");
    return *summands_;
  }
  /// The drivers' check (ring_check_summands) that every member with an N
  /// (GradiVeQ) was configured for the schedule's `n` ranks.
  void check_summands(std::size_t n, const char* who) const {
    if (summands_ && *summands_ != n)
      throw invalid_argument_error(std::string(who) + ": the group's members are configured for " +
                                   std::to_string(*summands_) + " summands but the schedule has " + std::to_string(n) +
                                   " ranks (set_summands(N))");
  }

  /// `parts` + 1 offsets from 0 to length(), never decreasing: the cut at
  /// or below each j/parts of the group's payload bytes (where every member
  /// type knows its body sizes; else of its elements) that starts a granule
  /// of the member holding it (a member's start where it has no granules).
  /// Cutting by bytes balances the wire: a dense member carries 8 times the
  /// bytes per element of a GradiVeQ one at K/d = 8, and a schedule's
  /// blocks of equal elements would make the ranks owning the dense part
  /// receive it at every halving step. Every rank encodes and decodes its
  /// whole vector whatever the cuts, so the codecs' work stays balanced.
  std::vector<std::size_t> segment_bounds(std::size_t parts) const {
    if (parts == 0) throw invalid_argument_error("codec_group: segment_bounds needs at least one part");
    require_members("codec_group::segment_bounds");
    // weight[i]: where member i begins in the group's weight (bytes, or elements).
    std::vector<double> weight(members_.size() + 1, 0.0);
    for (std::size_t i = 0; i < members_.size(); ++i) weight[i + 1] = weight[i] + member_weight(i);
    std::vector<std::size_t> b(parts + 1, 0);
    for (std::size_t j = 1; j < parts; ++j) {
      const double target = weight.back() * static_cast<double>(j) / static_cast<double>(parts);
      const std::size_t i = std::min<std::size_t>(
          static_cast<std::size_t>(std::upper_bound(weight.begin(), weight.end(), target) - weight.begin()) - 1,
          members_.size() - 1);
      const std::size_t len = offsets_[i + 1] - offsets_[i];
      const double share = weight[i + 1] > weight[i] ? (target - weight[i]) / (weight[i + 1] - weight[i]) : 0.0;
      const std::size_t local = std::min(len, static_cast<std::size_t>(share * static_cast<double>(len)));
      const std::size_t g = granularity_of(i);
      const std::size_t cut = offsets_[i] + (g == 0 ? 0 : local / g * g);
      b[j] = std::max(b[j - 1], cut);
    }
    b[parts] = length();
    return b;
  }

  /// Encodes [offset, offset + segment.size()) of the group's vector: each
  /// overlapped member's part at its own offset (ring_segmentation).
  void encode_segment(std::size_t offset, std::span<const float> segment, payload_type& out) const {
    check_run(offset, segment.size(), "codec_group::encode_segment");
    out.offset = offset;
    out.length = segment.size();
    const auto [first, count] = members_of(offset, segment.size());
    out.resize_parts(count);
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t i = first + k;  // (clang 14 lambdas cannot capture structured bindings)
      const auto [at, len] = part_of(i, offset, segment.size());
      std::visit(
          [&, i, at = at, len = len]<class M>(M* m) {
            ring_segmentation<M>::encode(*m, at - offsets_[i], segment.subspan(at - offset, len),
                                         out.template set_part<typename M::payload_type>(k));
          },
          members_[i]);
    }
  }
  /// Encodes the whole vector (in.size() == length()).
  void encode(std::span<const float> in, payload_type& out) {
    if (in.size() != length()) throw size_mismatch_error("codec_group::encode: input length", length(), in.size());
    encode_segment(0, in, out);
  }
  /// Body bytes of encode_segment's payload for [offset, offset + n), where
  /// every member type knows its own (GradiVeQ, fp16, bf16, dense): the
  /// compressed schedules then size their receives exactly.
  std::size_t segment_body_size(std::size_t offset, std::size_t n) const
    requires(KnowsBodySize<Cs> && ...)
  {
    check_run(offset, n, "codec_group::segment_body_size");
    std::size_t s = payload_type::fixed_body_size;
    const auto [first, count] = members_of(offset, n);
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t i = first + k;
      const auto [at, len] = part_of(i, offset, n);
      s += payload_type::part_prefix_size + body_size_of(i, at - offsets_[i], len);
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
    for (std::size_t k = 0; k < into.parts.size(); ++k)
      std::visit(
          [&]<class M>(M* m) {
            using P = typename M::payload_type;
            m->accumulate(std::get<P>(into.parts[k]), std::get<P>(from.parts[k]));
          },
          members_[first + k]);
  }
  /// Eq. 5 member by member into `out` (the run's length).
  void decode(const payload_type& p, std::span<float> out) const {
    const std::size_t first = check_payload(p, "codec_group::decode");
    if (out.size() != p.length)
      throw size_mismatch_error("codec_group::decode: output length", static_cast<std::size_t>(p.length), out.size());
    const auto offset = static_cast<std::size_t>(p.offset);
    for (std::size_t k = 0; k < p.parts.size(); ++k) {
      const auto [at, len] = part_of(first + k, offset, out.size());
      std::visit(
          [&, at = at, len = len]<class M>(M* m) {
            using P = typename M::payload_type;
            m->decode(std::get<P>(p.parts[k]), out.subspan(at - offset, len));
          },
          members_[first + k]);
    }
  }
  std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }

 private:
  std::vector<std::variant<Cs*...>> members_;
  std::vector<std::size_t> offsets_{0};
  std::optional<std::size_t> summands_;  // the N of the members that have one (all alike)

  /// Member i's share of the group for segment_bounds: its payload's body
  /// bytes where every member type knows them, else its element count.
  double member_weight(std::size_t i) const {
    const std::size_t len = offsets_[i + 1] - offsets_[i];
    if constexpr ((KnowsBodySize<Cs> && ...)) {
      return static_cast<double>(body_size_of(i, 0, len));
    } else {
      return static_cast<double>(len);
    }
  }
  /// Member i's granule (ring_segmentation::granularity).
  std::size_t granularity_of(std::size_t i) const {
    return std::visit([]<class M>(M* m) { return ring_segmentation<M>::granularity(*m); }, members_[i]);
  }
  /// Body bytes of member i's payload for its elements [offset, offset + n) (ring_segmentation::body_size).
  std::size_t body_size_of(std::size_t i, std::size_t offset, std::size_t n) const
    requires(KnowsBodySize<Cs> && ...)
  {
    return std::visit([&]<class M>(M* m) { return ring_segmentation<M>::body_size(*m, offset, n); }, members_[i]);
  }
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
  /// per member it overlaps, each of that member's payload type and of that
  /// member's part's length. Returns the first member the run overlaps.
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
      // Member i's alternative index in Cs... is its payload's in Ps... (the same order).
      if (p.parts[k].index() != members_[first + k].index())
        throw invalid_argument_error(std::string(who) + ": member " + std::to_string(first + k) +
                                     "'s part is another codec's payload");
      const std::size_t len = part_of(first + k, offset, n).second;
      const auto count_k =
          static_cast<std::size_t>(std::visit([](const auto& q) { return q.element_count(); }, p.parts[k]));
      if (count_k != len)
        throw size_mismatch_error(std::string(who) + ": member " + std::to_string(first + k) + "'s part length", len,
                                  count_k);
    }
    return first;
  }
};

GRADCOMP_ABI_NAMESPACE_END

}  // namespace gradcomp
