// schedules/codec_group.hpp: several buckets' LinearCodecs as one LinearCodec
// over their concatenated vectors, so one compressed all-reduce runs every
// bucket's steps together. Each bucket gets its own compressed-domain sum
// (eq. 4 member by member), bit-identical on every rank, over Rabenseifner
// (both faces, with and without pieces), the ring and the hierarchical ring;
// its wire format; its errors.
#include <doctest/doctest.h>

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
};

}  // namespace

TEST_CASE("codec_group: GradiVeQ buckets on Rabenseifner: each bucket's compressed sum, the same bits on every rank and every cut, N = 2-8") {
  for (int n : {2, 3, 4, 5, 6, 8}) {
    CAPTURE(n);
    const three_buckets b(n, 70 + std::uint64_t(n));
    auto run_face = [&](bool zero_copy, schedule_options o) {
      std::vector<vec> out;
      for (int r = 0; r < n; ++r) out.push_back(b.concatenated(r));
      run_workers(n, [&](inproc_endpoint& ep) {
        auto mine = b.codecs;
        auto group = three_buckets::group_of(mine);
        auto& v = out[std::size_t(ep.rank())];
        if (zero_copy) {
          auto z = ep.zero_copy();
          gradcomp::allreduce_linear(z, group, v, o);
        } else {
          gradcomp::allreduce_linear(ep, group, v, o);
        }
      }, {.recv_timeout = 60s});
      return out;
    };
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
      std::vector<vec> out;
      for (int r = 0; r < n; ++r) out.push_back(b.concatenated(r));
      run_workers(n, [&](inproc_endpoint& ep) {
        auto mine = b.codecs;
        auto group = three_buckets::group_of(mine);
        gradcomp::allreduce_linear(ep, group, out[std::size_t(ep.rank())], {.kind = kind, .group_size = n % 2 == 0 ? 2 : n});
      }, {.recv_timeout = 60s});
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
  CHECK_THROWS_AS(gradcomp::wire::parse<gradiveq_group::payload_type>(lie(8, 1u << 30)), gradcomp::wire::wire_error);
  CHECK_THROWS_AS(gradcomp::wire::parse<gradiveq_group::payload_type>(lie(16, x.size() + 1)), gradcomp::wire::wire_error);
  CHECK_THROWS_AS(gradcomp::wire::parse<gradiveq_group::payload_type>(lie(8, 2)), gradcomp::wire::wire_error);
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
