// schedules/codec_group.hpp: several buckets' LinearCodecs as one LinearCodec
// over their concatenated vectors, so one compressed all-reduce runs every
// bucket's steps together. Each bucket gets its own compressed-domain sum
// (eq. 4 member by member), bit-identical on every rank, over Rabenseifner
// (both faces, with and without pieces), the ring and the hierarchical ring;
// its wire format; its errors.
#include <doctest/doctest.h>

#include <gradcomp/dense.hpp>
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/half.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <support/equality.hpp>
#include <support/ring_fixtures.hpp>
#include <support/wire_checks.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

using namespace std::chrono_literals;
using gradcomp::codec_group;
using gradcomp::schedule_kind;
using gradcomp::schedule_options;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::run_workers;
using namespace gradcomp::test_support;

namespace {

using vec = std::vector<float>;
using gradiveq = gradcomp::linear_compressor<>;
using gradiveq_group = codec_group<gradiveq>;

static_assert(gradcomp::LinearCodec<gradiveq_group>);
static_assert(gradcomp::SegmentedCodec<gradiveq_group>);
static_assert(gradcomp::KnowsBodySize<gradiveq_group>);
static_assert(gradcomp::LinearCodec<codec_group<gradcomp::fp16_codec<>>>);
static_assert(gradcomp::KnowsBodySize<codec_group<gradcomp::fp16_codec<>>>);  // fp16 knows its sizes too

/// Three buckets of GradiVeQ layers (K = 16; lengths with and without a
/// tail), each fitted for n ranks, and every rank's gradient of each.
struct three_buckets {
  std::vector<low_rank_layer> layers;
  std::vector<gradiveq> codecs;
  std::vector<std::vector<vec>> x;  // x[bucket][rank]
  three_buckets(int n, std::uint64_t seed) {
    const std::size_t K = 16, lengths[] = {K * std::size_t(4 * n + 1) + 5, K * std::size_t(2 * n + 3), K * 7 + 3};
    for (std::size_t b = 0; b < 3; ++b) {
      layers.emplace_back(K, 3, lengths[b], seed + 10 * b);
      codecs.push_back(fitted_codec(layers.back(), std::size_t(n)));
      x.push_back(rank_samples(layers.back(), n, 5000 + 100 * b));
    }
  }
  std::size_t total() const { return layers[0].length + layers[1].length + layers[2].length; }
  /// Rank r's concatenated gradient.
  vec concatenated(int r) const {
    vec out;
    for (const auto& b : x) out.insert(out.end(), b[std::size_t(r)].begin(), b[std::size_t(r)].end());
    return out;
  }
  /// The largest relative error of each bucket's part of `result` against
  /// that bucket's compressed-domain sum (eq. 4 member by member).
  double worst_bucket_error(const vec& result) const {
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t k = 0; k < codecs.size(); ++k) {
      const vec want = compressed_domain_sum(codecs[k], x[k]);
      worst = std::max(worst, rel_error(std::span<const float>(result).subspan(at, want.size()), want));
      at += want.size();
    }
    return worst;
  }
  /// A group over copies of the codecs (`mine`, one per rank, as each rank holds its own).
  static gradiveq_group group_of(std::vector<gradiveq>& mine) {
    gradiveq_group g;
    for (auto& c : mine) g.add(c, c.layer_length());
    return g;
  }
  /// f(group) with a group over this rank's own copies of the codecs.
  template <class F>
  void with_group(F&& f) const {
    auto mine = codecs;
    auto g = group_of(mine);
    f(g);
  }
};

/// Every rank's concatenated gradient of fixture `b` all-reduced through its
/// group (b.with_group) by allreduce_linear with `o`, over the moving face or
/// the zero-copy one; each rank's result.
template <class Fixture>
std::vector<vec> allreduce_groups(const Fixture& b, int n, bool zero_copy, schedule_options o) {
  std::vector<vec> out;
  for (int r = 0; r < n; ++r) out.push_back(b.concatenated(r));
  run_workers(n, [&](inproc_endpoint& ep) {
    b.with_group([&](auto& group) {
      auto& v = out[std::size_t(ep.rank())];
      if (zero_copy) {
        auto z = ep.zero_copy();
        gradcomp::allreduce_linear(z, group, v, o);
      } else {
        gradcomp::allreduce_linear(ep, group, v, o);
      }
    });
  }, {.recv_timeout = 60s});
  return out;
}

}  // namespace

TEST_CASE("codec_group: GradiVeQ buckets on Rabenseifner: each bucket's compressed sum, the same bits on every rank and every cut, N = 2-8") {
  for (int n : {2, 3, 4, 5, 6, 8}) {
    CAPTURE(n);
    const three_buckets b(n, 70 + std::uint64_t(n));
    auto run_face = [&](bool zero_copy, schedule_options o) { return allreduce_groups(b, n, zero_copy, o); };
    const auto whole = run_face(false, {.kind = schedule_kind::rabenseifner, .chunk_elements = 0});
    for (int r = 0; r < n; ++r) CHECK(bit_equal(whole[std::size_t(r)], whole[0]));
    CHECK(b.worst_bucket_error(whole[0]) < 1e-5);
    // Pieces (chunk_elements 1: as many as the blocks allow), over both faces: the same bits.
    for (bool zc : {false, true}) {
      CAPTURE(zc);
      const auto cut = run_face(zc, {.kind = schedule_kind::rabenseifner, .chunk_elements = 1});
      for (int r = 0; r < n; ++r) CHECK(bit_equal(cut[std::size_t(r)], whole[0]));
    }
  }
}

TEST_CASE("codec_group: the ring and the hierarchical ring give each bucket its compressed sum too") {
  for (int n : {3, 4}) {
    CAPTURE(n);
    const three_buckets b(n, 120 + std::uint64_t(n));
    for (schedule_kind kind : {schedule_kind::ring, schedule_kind::hierarchical}) {
      const auto out = allreduce_groups(b, n, false, {.kind = kind, .group_size = n % 2 == 0 ? 2 : n});
      for (int r = 0; r < n; ++r) CHECK(bit_equal(out[std::size_t(r)], out[0]));
      CHECK(b.worst_bucket_error(out[0]) < 1e-5);
    }
  }
}

TEST_CASE("codec_group: fp16 buckets (cut anywhere) on Rabenseifner: the same bits everywhere, the sum within fp16's rounding") {
  using fp16 = gradcomp::fp16_codec<>;
  const int n = 5;
  const std::size_t lengths[] = {37, 1000, 3};
  std::vector<vec> out(static_cast<std::size_t>(n));
  vec sum(37 + 1000 + 3, 0.0f);
  for (int r = 0; r < n; ++r) {
    out[std::size_t(r)] = counter_gaussian(sum.size(), 900 + std::uint64_t(r));
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += out[std::size_t(r)][i];
  }
  run_workers(n, [&](inproc_endpoint& ep) {
    std::vector<fp16> mine(3);
    codec_group<fp16> group;
    for (std::size_t k = 0; k < 3; ++k) group.add(mine[k], lengths[k]);
    gradcomp::allreduce_linear(ep, group, out[std::size_t(ep.rank())], {.kind = schedule_kind::rabenseifner});
  }, {.recv_timeout = 60s});
  for (int r = 0; r < n; ++r) CHECK(bit_equal(out[std::size_t(r)], out[0]));
  CHECK(rel_error(out[0], sum) < 3e-3);
}

TEST_CASE("codec_group: segment bounds fall on each member's slices or its ends, and the body sizes are exact") {
  const three_buckets b(4, 33);
  auto mine = b.codecs;
  const auto group = three_buckets::group_of(mine);
  const auto offsets = group.offsets();
  for (std::size_t parts : {std::size_t(1), std::size_t(2), std::size_t(5), std::size_t(16), std::size_t(1000)}) {
    CAPTURE(parts);
    const auto bounds = group.segment_bounds(parts);
    REQUIRE(bounds.size() == parts + 1);
    CHECK(bounds.front() == 0);
    CHECK(bounds.back() == group.length());
    for (std::size_t j = 1; j < bounds.size(); ++j) {
      CHECK(bounds[j] >= bounds[j - 1]);
      std::size_t m = 0;
      while (offsets[m + 1] <= bounds[j] && m + 1 < group.members()) ++m;
      CHECK((bounds[j] == offsets[m] || bounds[j] == offsets[m + 1] || (bounds[j] - offsets[m]) % 16 == 0));
    }
    // Every segment's payload is exactly as big as segment_body_size says.
    const vec x = b.concatenated(0);
    for (std::size_t j = 0; j + 1 < bounds.size(); ++j) {
      gradiveq_group::payload_type p;
      group.encode_segment(bounds[j], std::span<const float>(x).subspan(bounds[j], bounds[j + 1] - bounds[j]), p);
      CHECK(p.body_size() == group.segment_body_size(bounds[j], bounds[j + 1] - bounds[j]));
      CHECK(p.element_count() == bounds[j + 1] - bounds[j]);
    }
  }
}

TEST_CASE("codec_group: the payload's wire format round-trips; truncated or lying bytes are wire errors") {
  const three_buckets b(2, 44);
  auto mine = b.codecs;
  auto group = three_buckets::group_of(mine);
  const vec x = b.concatenated(1);
  gradiveq_group::payload_type p;
  group.encode(x, p);
  REQUIRE(p.parts.size() == 3);
  CHECK(group.encoded_bytes(p) == gradcomp::wire::serialized_size(p));
  const auto bytes = gradcomp::wire::serialize(p);
  const auto back = gradcomp::wire::parse<gradiveq_group::payload_type>(bytes);
  CHECK(gradcomp::wire::serialize(back) == bytes);
  vec a(x.size()), c(x.size());
  group.decode(p, a);
  group.decode(back, c);
  CHECK(bit_equal(a, c));
  // Every truncation is a wire error, never a crash.
  for (std::size_t cut : {std::size_t(0), std::size_t(31), std::size_t(40), bytes.size() / 2, bytes.size() - 1}) {
    CAPTURE(cut);
    CHECK_THROWS_AS(gradcomp::wire::parse<gradiveq_group::payload_type>(std::span<const std::byte>(bytes).first(cut)),
                    gradcomp::wire::wire_error);
  }
  // Lying counts, re-sealed so that the checksum passes: a part count beyond
  // the bytes, a part's element count beyond the run.
  auto lie = [&](std::size_t at, std::uint64_t value) {
    auto m = bytes;
    std::memcpy(m.data() + gradcomp::wire::header_size + at, &value, sizeof value);
    reseal(m);
    return m;
  };
  // Body: offset (0), part count (8), then the first part's codec id (16)
  // and element count (24).
  CHECK_THROWS_AS(gradcomp::wire::parse<gradiveq_group::payload_type>(lie(8, 1u << 30)), gradcomp::wire::wire_error);
  CHECK_THROWS_AS(gradcomp::wire::parse<gradiveq_group::payload_type>(lie(24, x.size() + 1)), gradcomp::wire::wire_error);
  CHECK_THROWS_AS(gradcomp::wire::parse<gradiveq_group::payload_type>(lie(8, 2)), gradcomp::wire::wire_error);
  // A part of a codec this payload type does not hold (dense's id in a GradiVeQ group's payload).
  CHECK_THROWS_AS(gradcomp::wire::parse<gradiveq_group::payload_type>(
                      lie(16, static_cast<std::uint64_t>(gradcomp::wire::codec_id::dense))),
                  gradcomp::wire::wire_error);
}

TEST_CASE("codec_group: bad members and payloads of another run are typed errors") {
  const three_buckets b(3, 55);
  auto mine = b.codecs;
  gradiveq_group empty;
  gradiveq_group::payload_type p;
  CHECK_THROWS_AS(empty.encode(vec{}, p), gradcomp::state_error);
  CHECK_THROWS_AS(empty.segment_bounds(2), gradcomp::state_error);
  gradiveq_group g;
  CHECK_THROWS_AS(g.add(mine[0], mine[0].layer_length() + 1), gradcomp::size_mismatch_error);
  CHECK_THROWS_AS(g.add(mine[0], 0), gradcomp::invalid_argument_error);
  auto other_n = fitted_codec(b.layers[1], 5);
  g.add(mine[0], mine[0].layer_length());
  CHECK_THROWS_AS(g.add(other_n, other_n.layer_length()), gradcomp::invalid_argument_error);
  g.add(mine[1], mine[1].layer_length());
  CHECK(g.members() == 2);
  CHECK(g.summands() == 3);

  const vec x = b.concatenated(0);
  const std::size_t n01 = mine[0].layer_length() + mine[1].layer_length();
  gradiveq_group::payload_type whole, front;
  g.encode(std::span<const float>(x).first(n01), whole);
  CHECK_THROWS_AS(g.encode(x, whole), gradcomp::size_mismatch_error);
  g.encode_segment(0, std::span<const float>(x).first(16), front);
  CHECK_THROWS_AS(g.accumulate(whole, front), gradcomp::size_mismatch_error);
  vec out(n01 - 1);
  CHECK_THROWS_AS(g.decode(whole, out), gradcomp::size_mismatch_error);
  // A payload whose parts do not match the members it overlaps.
  auto broken = whole;
  broken.parts.pop_back();
  out.resize(n01);
  CHECK_THROWS_AS(g.decode(broken, out), gradcomp::size_mismatch_error);
  CHECK_THROWS_AS(g.encode_segment(n01 - 16, std::span<const float>(x).first(32), front), gradcomp::size_mismatch_error);
}

namespace {

using dense = gradcomp::dense_codec<>;
using mixed_group = codec_group<gradiveq, dense>;
static_assert(gradcomp::LinearCodec<mixed_group>);
static_assert(gradcomp::KnowsBodySize<mixed_group>);  // dense knows its sizes: exact receives over MPI

/// GradiVeQ's three buckets with dense buckets between and after them (the
/// fc layer and the norms of a model): G0, D0, G1, G2, D1.
struct mixed_buckets {
  three_buckets g;
  std::size_t dense_lengths[2];
  std::vector<std::vector<vec>> d;  // d[dense bucket][rank]
  mixed_buckets(int n, std::uint64_t seed) : g(n, seed), dense_lengths{1000, 37} {
    for (std::size_t k = 0; k < 2; ++k) {
      d.emplace_back();
      for (int r = 0; r < n; ++r) d.back().push_back(counter_gaussian(dense_lengths[k], seed * 31 + 7 * k + std::uint64_t(r)));
    }
  }
  /// Rank r's vector in the group's order.
  vec concatenated(int r) const {
    vec out;
    auto append = [&](const vec& v) { out.insert(out.end(), v.begin(), v.end()); };
    append(g.x[0][std::size_t(r)]);
    append(d[0][std::size_t(r)]);
    append(g.x[1][std::size_t(r)]);
    append(g.x[2][std::size_t(r)]);
    append(d[1][std::size_t(r)]);
    return out;
  }
  /// f(group) with a group over this rank's own codecs.
  template <class F>
  void with_group(F&& f) const {
    auto mine = g.codecs;
    std::vector<dense> plain(2);
    auto group = group_of(mine, plain);
    f(group);
  }
  /// The group over this rank's codecs, in the vector's order.
  mixed_group group_of(std::vector<gradiveq>& mine, std::vector<dense>& plain) const {
    mixed_group m;
    m.add(mine[0], mine[0].layer_length());
    m.add(plain[0], dense_lengths[0]);
    m.add(mine[1], mine[1].layer_length());
    m.add(mine[2], mine[2].layer_length());
    m.add(plain[1], dense_lengths[1]);
    return m;
  }
  /// The largest relative error of each bucket's part of `result`: a
  /// GradiVeQ bucket against its compressed-domain sum, a dense one against
  /// its float sum (in double).
  double worst_bucket_error(const vec& result) const {
    double worst = 0;
    std::size_t at = 0;
    auto check = [&](const vec& want) {
      worst = std::max(worst, rel_error(std::span<const float>(result).subspan(at, want.size()), want));
      at += want.size();
    };
    auto dense_sum = [&](std::size_t k) {
      std::vector<double> acc(dense_lengths[k], 0.0);
      for (const auto& v : d[k])
        for (std::size_t i = 0; i < v.size(); ++i) acc[i] += v[i];
      return vec(acc.begin(), acc.end());
    };
    check(compressed_domain_sum(g.codecs[0], g.x[0]));
    check(dense_sum(0));
    check(compressed_domain_sum(g.codecs[1], g.x[1]));
    check(compressed_domain_sum(g.codecs[2], g.x[2]));
    check(dense_sum(1));
    return worst;
  }
};

}  // namespace

TEST_CASE("codec_group of GradiVeQ and dense buckets: each bucket's sum, the same bits on every rank, schedule face and cut, N = 2-8") {
  for (int n : {2, 3, 4, 5, 8}) {
    CAPTURE(n);
    const mixed_buckets b(n, 300 + std::uint64_t(n));
    auto run = [&](bool zero_copy, schedule_options o) { return allreduce_groups(b, n, zero_copy, o); };
    const auto whole = run(false, {.kind = schedule_kind::rabenseifner, .chunk_elements = 0});
    for (int r = 0; r < n; ++r) CHECK(bit_equal(whole[std::size_t(r)], whole[0]));
    CHECK(b.worst_bucket_error(whole[0]) < 1e-5);
    for (bool zc : {false, true}) {
      CAPTURE(zc);
      const auto cut = run(zc, {.kind = schedule_kind::rabenseifner, .chunk_elements = 1});
      for (int r = 0; r < n; ++r) CHECK(bit_equal(cut[std::size_t(r)], whole[0]));
    }
    for (schedule_kind kind : {schedule_kind::ring, schedule_kind::hierarchical}) {
      const auto other = run(false, {.kind = kind, .group_size = n % 2 == 0 ? 2 : n});
      for (int r = 0; r < n; ++r) CHECK(bit_equal(other[std::size_t(r)], other[0]));
      CHECK(b.worst_bucket_error(other[0]) < 1e-5);
    }
  }
}

TEST_CASE("codec_group of GradiVeQ and dense buckets: exact body sizes, the wire round trip, parts of the wrong codec") {
  const mixed_buckets b(3, 77);
  auto mine = b.g.codecs;
  std::vector<dense> plain(2);
  const auto group = b.group_of(mine, plain);
  const vec x = b.concatenated(2);
  for (std::size_t parts : {std::size_t(1), std::size_t(3), std::size_t(7)}) {
    const auto bounds = group.segment_bounds(parts);
    for (std::size_t j = 0; j + 1 < bounds.size(); ++j) {
      mixed_group::payload_type p;
      group.encode_segment(bounds[j], std::span<const float>(x).subspan(bounds[j], bounds[j + 1] - bounds[j]), p);
      CHECK(p.body_size() == group.segment_body_size(bounds[j], bounds[j + 1] - bounds[j]));
    }
  }
  // The bounds cut the payload bytes, not the elements, near equal parts:
  // each segment within a GradiVeQ slice's or a few dense elements' bytes
  // of its share (a dense element is 8 GradiVeQ ones' bytes here).
  {
    const std::size_t parts = 6;
    const auto bounds = group.segment_bounds(parts);
    const double total = double(group.segment_body_size(0, group.length()));
    for (std::size_t j = 0; j + 1 < bounds.size(); ++j) {
      CAPTURE(j);
      const double bytes = double(group.segment_body_size(bounds[j], bounds[j + 1] - bounds[j]));
      CHECK(std::abs(bytes - total / double(parts)) < 0.25 * total / double(parts));
    }
  }
  mixed_group::payload_type p;
  group.encode_segment(0, x, p);
  REQUIRE(p.parts.size() == 5);
  CHECK(std::holds_alternative<gradcomp::dense_payload>(p.parts[1]));
  const auto bytes = gradcomp::wire::serialize(p);
  auto back = gradcomp::wire::parse<mixed_group::payload_type>(bytes);
  CHECK(gradcomp::wire::serialize(back) == bytes);
  vec a(x.size()), c(x.size());
  group.decode(p, a);
  group.decode(back, c);
  CHECK(bit_equal(a, c));
  // The dense parts carry the floats themselves.
  const std::size_t d0 = group.offsets()[1];
  CHECK(bit_equal(std::span<const float>(a).subspan(d0, 1000), std::span<const float>(x).subspan(d0, 1000)));
  // Parsing into a payload that held other parts keeps working (spare parts of each type).
  gradcomp::wire::parse_into(bytes, back);
  CHECK(gradcomp::wire::serialize(back) == bytes);
  // A payload whose part is another codec's than its member's is a typed error.
  auto swapped = p;
  swapped.parts[1] = gradcomp::gradiveq_payload{};
  CHECK_THROWS_AS(group.decode(swapped, a), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(group.accumulate(swapped, p), gradcomp::invalid_argument_error);
  // A GradiVeQ group's payload type cannot parse a dense part.
  CHECK_THROWS_AS(gradcomp::wire::parse<gradiveq_group::payload_type>(bytes), gradcomp::wire::wire_error);
  // member<M>() of the wrong type.
  CHECK(&group.member<dense>(1) == &plain[0]);
  CHECK_THROWS_AS(group.member<dense>(0), gradcomp::invalid_argument_error);
}

TEST_CASE("codec_group of GradiVeQ and dense buckets: N is checked on the GradiVeQ members only") {
  const mixed_buckets b(3, 91);
  // GradiVeQ members fitted for 3 ranks on 4: rejected before any transfer.
  std::vector<vec> x(4, b.concatenated(0));
  CHECK_THROWS_AS(run_workers(4, [&](inproc_endpoint& ep) {
    auto mine = b.g.codecs;
    std::vector<dense> plain(2);
    auto group = b.group_of(mine, plain);
    gradcomp::allreduce_linear(ep, group, x[std::size_t(ep.rank())], {.kind = schedule_kind::rabenseifner});
  }), gradcomp::invalid_argument_error);
  // Dense members only: no N to check, any number of ranks.
  std::vector<vec> y(4);
  for (int r = 0; r < 4; ++r) y[std::size_t(r)] = counter_gaussian(500, 40 + std::uint64_t(r));
  vec want(500, 0.0f);
  run_workers(4, [&](inproc_endpoint& ep) {
    std::vector<dense> plain(2);
    mixed_group group;
    group.add(plain[0], 200);
    group.add(plain[1], 300);
    gradcomp::allreduce_linear(ep, group, y[std::size_t(ep.rank())], {.kind = schedule_kind::rabenseifner});
  }, {.recv_timeout = 60s});
  for (int r = 1; r < 4; ++r) CHECK(bit_equal(y[std::size_t(r)], y[0]));
  // Two GradiVeQ members configured for different N cannot join one group, dense between them or not.
  auto mine = b.g.codecs;
  auto other_n = fitted_codec(b.g.layers[1], 5);
  dense plain;
  mixed_group g;
  g.add(mine[0], mine[0].layer_length());
  g.add(plain, 10);
  CHECK_THROWS_AS(g.add(other_n, other_n.layer_length()), gradcomp::invalid_argument_error);
}
