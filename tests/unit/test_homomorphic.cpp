// homomorphic.hpp: the agreed-scale integer quantizer. Properties:
// unbiasedness, the sum of codes decodes to the sum of the inputs within the
// stated bound, an error independent of the number of hops (the integer sum is
// exact: any order, any schedule gives the same bits), no overflow at the
// largest N a width allows; the wire format's lane checks; Algorithm 1's ring
// with the max round of the scales first (AgreedScaleCodec); the exchange's
// homomorphic buckets (codec_kind 8: a max round, then a sum of int32 words).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include <gradcomp/homomorphic.hpp>
#include <gradcomp/model_exchange.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <support/equality.hpp>
#include <support/ring_fixtures.hpp>

using gradcomp::homomorphic_options;
using gradcomp::homomorphic_payload;
using gradcomp::homomorphic_quantizer;
using gradcomp::transport::inproc_endpoint;
using gradcomp::test_support::bit_equal;
namespace gx = gradcomp::exchange;

static_assert(gradcomp::AgreedScaleCodec<homomorphic_quantizer<>> && gradcomp::SegmentedCodec<homomorphic_quantizer<>>);

namespace {

/// The agreed scales of several inputs: the element-wise max of their local scales.
std::vector<float> agreed(const homomorphic_quantizer<>& c, const std::vector<std::vector<float>>& x) {
  std::vector<float> s(c.scale_count(x.front().size()), 0.0f), one(s.size());
  for (const auto& v : x) {
    c.local_scales(v, one);
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = std::max(s[i], one[i]);
  }
  return s;
}

/// N workers' codes of x (seeds 1..N), summed as words, decoded once.
std::vector<float> homomorphic_sum(const std::vector<std::vector<float>>& x, std::uint64_t step_seed,
                                   homomorphic_options o = {}) {
  const std::size_t n = x.size(), len = x.front().size();
  std::vector<homomorphic_quantizer<>> c;
  for (std::size_t k = 0; k < n; ++k) {
    o.seed = step_seed * 1000 + 1;  // one seed, worker k: stratified draws
    o.worker = k;
    c.emplace_back(o, n);
  }
  const auto s = agreed(c[0], x);
  homomorphic_payload acc, p;
  for (std::size_t k = 0; k < n; ++k) {
    c[k].set_agreed_scales(s, len);
    c[k].encode(x[k], k == 0 ? acc : p);
    if (k > 0) c[0].accumulate(acc, p);
  }
  std::vector<float> out(len);
  c[0].decode(acc, out);
  return out;
}

}  // namespace

TEST_CASE("homomorphic: widths and levels from N (b >= log2 N + 2, M = floor((2^b - 1) / N))") {
  CHECK(gradcomp::homomorphic_min_bits(1) == 2);
  CHECK(gradcomp::homomorphic_min_bits(2) == 3);
  CHECK(gradcomp::homomorphic_min_bits(4) == 4);
  CHECK(gradcomp::homomorphic_min_bits(5) == 5);
  homomorphic_quantizer<> c({}, 4);
  CHECK(c.bits() == 4);
  CHECK(c.levels() == 3);
  c.set_summands(64);
  CHECK(c.bits() == 8);
  CHECK(c.levels() == 3);
  CHECK_THROWS_AS(homomorphic_quantizer<>({.bits = 4}, 5), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(homomorphic_quantizer<>({.bits = 17}, 2), gradcomp::invalid_argument_error);
  homomorphic_quantizer<> wide({.bits = 8}, 4);
  CHECK(wide.levels() == 63);
}

TEST_CASE("homomorphic: unbiased (the mean over many steps converges to the sum)") {
  const std::size_t n = 4, len = 512;
  const auto x = gradcomp::test_support::inputs(int(n), len, 21, 1.0f);
  const auto exact = gradcomp::test_support::exact_sum(x);
  homomorphic_quantizer<> probe({}, n);
  const auto s = agreed(probe, x);
  const int steps = 3000;
  std::vector<double> mean(len, 0.0);
  for (int t = 0; t < steps; ++t) {
    const auto d = homomorphic_sum(x, std::uint64_t(t));
    for (std::size_t i = 0; i < len; ++i) mean[i] += d[i] / steps;
  }
  // Each worker's rounding error has standard deviation at most S / (2M) per
  // step; the sum of N (dependent: stratified) ones at most N S / (2M); the
  // mean over the steps 1/sqrt(steps) of it.
  const double sigma = double(n) * s[0] / (2.0 * 3.0) / std::sqrt(double(steps));
  double worst = 0.0, bias2 = 0.0, bias = 0.0;
  for (std::size_t i = 0; i < len; ++i) {
    worst = std::max(worst, std::abs(mean[i] - exact[i]) / sigma);
    bias2 += (mean[i] - exact[i]) * (mean[i] - exact[i]);
    bias += (mean[i] - exact[i]) / double(len);
  }
  CHECK(worst < 5.0);                                   // every element within 5 sigma
  CHECK(std::sqrt(bias2 / double(len)) < 1.3 * sigma);  // the root mean square about 1 sigma or less
  CHECK(std::abs(bias) < 5.0 * sigma / std::sqrt(double(len)));  // and no common drift
}

TEST_CASE("homomorphic: the sum of codes decodes to the sum of the inputs within 2 S N / M") {
  for (std::size_t n : {1, 2, 3, 4, 7, 16}) {
    INFO("N = " << n);
    const std::size_t len = 3000;
    auto x = gradcomp::test_support::inputs(int(n), len, 5 + n, 2.0f);
    x[0][17] = 50.0f;  // one large value: its block's scale
    homomorphic_quantizer<> probe({}, n);
    const auto s = agreed(probe, x);
    const auto d = homomorphic_sum(x, 9);
    const auto exact = gradcomp::test_support::exact_sum(x);
    for (std::size_t i = 0; i < len; ++i) {
      const double S = s[i / 512];
      REQUIRE(std::abs(double(d[i]) - double(exact[i])) <= 2.0 * S * double(n) / probe.levels() * (1 + 1e-5) + 1e-5 * S * n);
    }
  }
}

TEST_CASE("homomorphic: the error does not depend on the hops (integer sums: any order, the same bits)") {
  for (int n : {2, 3, 4}) {
    INFO("ranks " << n);
    const std::size_t len = 4099;
    const auto x = gradcomp::test_support::inputs(n, len, 33, 1.0f);
    std::vector<std::vector<float>> out(static_cast<std::size_t>(n));
    std::vector<gradcomp::ring_stats> st(static_cast<std::size_t>(n));
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      auto v = x[std::size_t(ep.rank())];
      homomorphic_quantizer<> c({.seed = std::uint64_t(ep.rank()) + 1}, std::size_t(n));
      st[std::size_t(ep.rank())] = gradcomp::ring_allreduce(ep, c, std::span<float>(v));  // Algorithm 1 + max round
      out[std::size_t(ep.rank())] = v;
    });
    for (int r = 1; r < n; ++r) CHECK(bit_equal(out[std::size_t(r)], out[0]));
    // The same codes summed directly, in reverse order, in one payload per rank: the same bits.
    std::vector<homomorphic_quantizer<>> c;
    for (int k = 0; k < n; ++k) c.emplace_back(homomorphic_options{.seed = std::uint64_t(k) + 1}, std::size_t(n));
    const auto s = agreed(c[0], x);
    homomorphic_payload acc, p;
    for (int k = n - 1; k >= 0; --k) {
      c[std::size_t(k)].set_agreed_scales(s, len);
      c[std::size_t(k)].encode(x[std::size_t(k)], k == n - 1 ? acc : p);
      if (k < n - 1) c[0].accumulate(acc, p);
    }
    std::vector<float> direct(len);
    c[0].decode(acc, direct);
    CHECK(bit_equal(out[0], direct));
    // Bytes: the max ring of the scales plus 2(N-1) code segments of 4 bits per value.
    CHECK(st[0].messages_sent == 4 * std::size_t(n - 1));
    CHECK(st[0].bytes_sent < 2 * std::size_t(n - 1) * (len / 8 / std::size_t(n) * 4 + 200) + 4 * 9 * 2);
  }
}

TEST_CASE("homomorphic: no overflow at the largest N each width allows") {
  for (unsigned b : {2u, 3u, 4u, 5u, 8u, 12u}) {
    const std::size_t n = std::size_t{1} << (b - 2);  // b = log2 N + 2
    INFO("bits " << b << ", N = " << n);
    homomorphic_quantizer<> c({.bits = b}, n);
    REQUIRE(c.levels() * n <= (1u << b) - 1);
    // Every worker at +S: every code is M, every lane sums to N M.
    const std::size_t len = 100;
    std::vector<float> top(len, 1.0f), bottom(len, -1.0f);
    std::vector<float> s(c.scale_count(len), 1.0f);
    c.set_agreed_scales(s, len);
    homomorphic_payload acc, p;
    c.encode(top, acc);
    for (std::size_t k = 1; k < n; ++k) {
      c.encode(top, p);
      c.accumulate(acc, p);
    }
    CHECK(acc.summands == n);
    const auto bytes = gradcomp::wire::serialize(acc);
    const auto back = gradcomp::wire::parse<homomorphic_payload>(bytes);  // every lane in range
    std::vector<float> out(len);
    c.decode(back, out);
    for (float v : out) CHECK(v == doctest::Approx(double(n)).epsilon(1e-6));
    // accumulate refuses exactly the sums whose lanes could overflow.
    std::size_t more = 0;
    while (std::uint64_t(acc.summands + 1) * c.levels() <= (1u << b) - 1) {
      c.accumulate(acc, p);
      ++more;
    }
    CHECK_THROWS_AS(c.accumulate(acc, p), gradcomp::invalid_argument_error);
    CHECK(gradcomp::homomorphic_lanes_valid(acc.words, acc.count, b, std::uint64_t(acc.summands) * c.levels()));
    CHECK(more < n);
    // Every worker at -S: lanes 0, decodes to -N.
    c.encode(bottom, acc);
    for (std::size_t k = 1; k < n; ++k) {
      c.encode(bottom, p);
      c.accumulate(acc, p);
    }
    c.decode(acc, out);
    for (float v : out) CHECK(v == doctest::Approx(-double(n)).epsilon(1e-6));
  }
}

TEST_CASE("homomorphic: wire checks, non-finite input, missing scales, state") {
  homomorphic_quantizer<> c({.seed = 3}, 4);
  std::vector<float> x = gradcomp::test_support::counter_gaussian(700, 2);
  std::vector<float> s(c.scale_count(x.size()));
  homomorphic_payload p;
  CHECK_THROWS_AS(c.encode(x, p), gradcomp::state_error);
  c.local_scales(x, s);
  c.set_agreed_scales(s, x.size());
  c.encode(x, p);
  auto bytes = gradcomp::wire::serialize(p);
  CHECK(gradcomp::wire::parse<homomorphic_payload>(bytes).words == p.words);
  auto bad = p;
  bad.words[3] |= 0xFu;  // a lane of 15 > 1 x 3
  CHECK_THROWS_AS(gradcomp::wire::parse<homomorphic_payload>(gradcomp::wire::serialize(bad)), gradcomp::wire::wire_error);
  bad = p;
  bad.words.back() |= 0xF0000000u;  // a lane past n (700 = 87 x 8 + 4)
  CHECK_THROWS_AS(gradcomp::wire::parse<homomorphic_payload>(gradcomp::wire::serialize(bad)), gradcomp::wire::wire_error);
  bad = p;
  bad.summands = 6;  // 6 x 3 > 15
  CHECK_THROWS_AS(gradcomp::wire::parse<homomorphic_payload>(gradcomp::wire::serialize(bad)), gradcomp::wire::wire_error);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(c.local_scales(x, s), gradcomp::non_finite_error);
  const auto saved = c.save_state();
  homomorphic_quantizer<> d({.seed = 3}, 4);
  d.restore_state(saved);
  CHECK(d.step() == c.step());
  homomorphic_quantizer<> e({.seed = 4}, 4);
  CHECK_THROWS_AS(e.restore_state(saved), gradcomp::option_mismatch_error);
}

TEST_CASE("homomorphic: stratified draws (one seed, worker k) give a lower error than independent ones") {
  const std::size_t n = 4, len = 1 << 14;
  const auto x = gradcomp::test_support::inputs(int(n), len, 77, 1.0f);
  const auto exact = gradcomp::test_support::exact_sum(x);
  const double stratified = gradcomp::test_support::rel_error(homomorphic_sum(x, 1), exact);
  // Independent draws: every worker its own seed, worker index 0.
  std::vector<homomorphic_quantizer<>> c;
  for (std::size_t k = 0; k < n; ++k) c.emplace_back(homomorphic_options{.seed = 100 + k}, n);
  const auto s = agreed(c[0], x);
  homomorphic_payload acc, p;
  for (std::size_t k = 0; k < n; ++k) {
    c[k].set_agreed_scales(s, len);
    c[k].encode(x[k], k == 0 ? acc : p);
    if (k > 0) c[0].accumulate(acc, p);
  }
  std::vector<float> d(len);
  c[0].decode(acc, d);
  const double independent = gradcomp::test_support::rel_error(d, exact);
  // Independent N(0,1) inputs, 4-bit lanes (M = 3), S about 3.3 per block:
  // about 1.0 with independent draws, about 0.8 stratified.
  CHECK(independent < 1.15);
  CHECK(stratified < 0.9 * independent);
}

namespace {
gx::plan homomorphic_plan() {
  gx::model_description m;
  m.add_conv("conv", 16, 8, 3, 3).add_dense("fc", 1000).add_dense("bias", 10, 1);
  gx::plan_options o;
  o.rules.small_below = 16;
  o.rules.conv = gx::codec_kind::homomorphic;
  o.rules.fallback = gx::codec_kind::homomorphic;
  o.seed = 5;
  o.average = false;
  return gx::plan(std::move(m), o);
}
std::vector<std::vector<float>> grads(const gx::plan& plan, int r, int step) {
  std::vector<std::vector<float>> g;
  for (const auto& l : plan.model().layers())
    g.push_back(gradcomp::test_support::counter_gaussian(l.shape.size(), 1000 * std::uint64_t(step) + std::uint64_t(r), 0.1f));
  return g;
}
}  // namespace

TEST_CASE("exchange: homomorphic buckets (max, then a sum of int32 words), identical bits, rollback") {
  for (int n : {2, 3, 4}) {
    INFO("ranks " << n);
    const auto plan = homomorphic_plan();
    REQUIRE(plan.buckets().front().kind == gx::codec_kind::homomorphic);
    std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(n));
    std::vector<gx::step_stats> st(static_cast<std::size_t>(n));
    std::vector<int> rolled_back(static_cast<std::size_t>(n), 0);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      for (int step = 0; step < 2; ++step) {
        auto g = grads(plan, ep.rank(), step);
        std::vector<std::span<float>> s(g.begin(), g.end());
        st[std::size_t(ep.rank())] = ex.step(s);
        out[std::size_t(ep.rank())] = g;
      }
      // A NaN on the last rank: every rank skips, and the rounding step rolls back.
      const auto before = ex.save_state();
      auto g = grads(plan, ep.rank(), 2);
      if (ep.rank() == n - 1) g[1][9] = std::numeric_limits<float>::infinity();
      std::vector<std::span<float>> s(g.begin(), g.end());
      const auto& f = ex.step(s);
      rolled_back[std::size_t(ep.rank())] = f.skipped && f.failures.size() == 1 && f.failures[0].rank == n - 1 &&
                                            ex.save_state() == before;
    });
    for (int r = 0; r < n; ++r) {
      CHECK_FALSE(st[std::size_t(r)].skipped);
      CHECK(rolled_back[std::size_t(r)] == 1);
      for (std::size_t l = 0; l < 3; ++l) CHECK(bit_equal(out[std::size_t(r)][l], out[0][l]));
    }
    CHECK(st[0].rounds == 3);  // the homomorphic bucket's max and sum, the dense bias's sum
    CHECK(st[0].bucket_phase[0] == "homomorphic");
    // Bytes per layer: scales (4 per 512 values) and words (b bits per value).
    const unsigned b = gradcomp::homomorphic_min_bits(std::size_t(n));
    CHECK(st[0].layer_bytes[0] == 4 * 3 + 4 * gradcomp::homomorphic_word_count(1152, b));
    // The sum is within the quantizer's bound of the exact sum.
    std::vector<std::vector<float>> fc;
    for (int r = 0; r < n; ++r) fc.push_back(grads(plan, r, 1)[1]);
    const auto exact = gradcomp::test_support::exact_sum(fc);
    CHECK(gradcomp::test_support::rel_error(out[0][1], exact) < 0.95);
  }
}

TEST_CASE("homomorphic on Rabenseifner and the hierarchical ring: the max round first, then the ring's bits") {
  // Every schedule of an AgreedScaleCodec agrees on the scales before it
  // encodes; the integer sums are exact, so every schedule gives the bits of
  // the codes summed directly. A second call agrees anew (no stale scales).
  struct shape {
    int n, g;
  };
  for (const shape sh : {shape{2, 0}, shape{3, 0}, shape{4, 2}, shape{6, 3}, shape{8, 2}})
    for (auto kind : {gradcomp::schedule_kind::rabenseifner, gradcomp::schedule_kind::hierarchical}) {
      const int n = sh.n;
      INFO("ranks " << n << ", " << gradcomp::to_string(kind) << ", groups of " << sh.g);
      const std::size_t len = 3001;
      for (int call = 0; call < 2; ++call) {
        const auto x = gradcomp::test_support::inputs(n, len, 40 + std::uint64_t(call), call == 0 ? 1.0f : 50.0f);
        std::vector<std::vector<float>> out = x;
        std::vector<homomorphic_quantizer<>> codecs;
        for (int k = 0; k < n; ++k) codecs.emplace_back(homomorphic_options{.seed = std::uint64_t(k) + 1}, std::size_t(n));
        gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
          auto& c = codecs[std::size_t(ep.rank())];
          gradcomp::allreduce_linear(ep, c, std::span<float>(out[std::size_t(ep.rank())]),
                                     {.kind = kind, .chunk_elements = 256, .group_size = sh.g});
        });
        for (int r = 1; r < n; ++r) CHECK(bit_equal(out[std::size_t(r)], out[0]));
        // The same codes summed directly (fresh codecs: the draws of their first step).
        std::vector<homomorphic_quantizer<>> c;
        for (int k = 0; k < n; ++k) c.emplace_back(homomorphic_options{.seed = std::uint64_t(k) + 1}, std::size_t(n));
        const auto s = agreed(c[0], x);
        homomorphic_payload acc, p;
        for (int k = 0; k < n; ++k) {
          c[std::size_t(k)].set_agreed_scales(s, len);
          c[std::size_t(k)].encode(x[std::size_t(k)], k == 0 ? acc : p);
          if (k > 0) c[0].accumulate(acc, p);
        }
        std::vector<float> direct(len);
        c[0].decode(acc, direct);
        if (call == 0) CHECK(bit_equal(out[0], direct));
        // Within the codec's bound 2 S N / M of the exact sum on every call: the scales are this call's
        // (stale ones from the first call would clip the second call's 50x larger values).
        const auto exact = gradcomp::test_support::exact_sum(x);
        std::size_t beyond = 0;
        for (std::size_t i = 0; i < len; ++i) {
          const double S = s[i / 512];
          beyond += std::abs(double(out[0][i]) - double(exact[i])) >
                    2.0 * S * double(n) / c[0].levels() * (1 + 1e-5) + 1e-5 * S * n;
        }
        CAPTURE(call);
        CHECK(beyond == 0);
      }
    }
}
