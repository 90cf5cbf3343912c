// half.hpp: fp16_codec and bf16_codec as LinearCodecs (round to nearest
// even, the saturation policy, subnormals, non-finite input, the wire
// format's checks), Algorithm 1's ring with one rounding per hop
// (add_raw_and_reencode) over 2-4 in-process ranks, and the exchange's fp16
// and bf16 buckets (codec_kind 6 and 7).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include <gradcomp/half.hpp>
#include <gradcomp/model_exchange.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <support/equality.hpp>
#include <support/ring_fixtures.hpp>

using gradcomp::bf16_codec;
using gradcomp::fp16_codec;
using gradcomp::transport::inproc_endpoint;
using gradcomp::test_support::bit_equal;
namespace ge = gradcomp::execution;
namespace gx = gradcomp::exchange;

static_assert(gradcomp::ReencodingLinearCodec<fp16_codec<>> && gradcomp::ReencodingLinearCodec<bf16_codec<>>);
static_assert(!gradcomp::ReencodingLinearCodec<gradcomp::dense_codec<>>);

TEST_CASE("fp16_codec: round to nearest even, exact decode, saturation at 65504, subnormals") {
  fp16_codec<> c;
  const std::vector<float> g{1.0f, 1.0f + 0x1p-11f, -3.14159f, 70000.0f, -1e9f, 65504.0f, 0x1p-20f, 0x1p-26f, 0.0f};
  gradcomp::fp16_payload p;
  c.encode(g, p);
  CHECK(c.saturated() == 2);
  std::vector<float> out(g.size());
  c.decode(p, out);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == 1.0f);  // the tie rounds to even
  CHECK(out[2] == ge::round_to_half(-3.14159f));
  CHECK(out[3] == 65504.0f);  // saturated, not Inf
  CHECK(out[4] == -65504.0f);
  CHECK(out[5] == 65504.0f);
  CHECK(out[6] == 0x1p-20f);  // subnormal, exact (a multiple of 2^-24)
  CHECK(out[7] == 0.0f);      // below 2^-25: zero
  CHECK(c.encoded_bytes(p) == 32 + 2 * g.size());
  std::vector<float> bad = g;
  bad[4] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(c.encode(bad, p), gradcomp::non_finite_error);
  CHECK_THROWS_AS(c.decode(p, std::span<float>(out).first(3)), gradcomp::size_mismatch_error);
}

TEST_CASE("bf16_codec: 8 bits of precision, float32's range (no overflow of a finite gradient)") {
  bf16_codec<> c;
  const std::vector<float> g{1e38f, -3e38f, 1e-38f, 1.0f + 0x1p-8f, 1.0f + 0x1.8p-8f};
  gradcomp::bf16_payload p;
  c.encode(g, p);
  CHECK(c.saturated() == 0);
  std::vector<float> out(g.size());
  c.decode(p, out);
  for (std::size_t i = 0; i < 3; ++i) CHECK(std::abs(out[i] - g[i]) <= std::abs(g[i]) * 0x1p-8f);
  CHECK(out[3] == 1.0f);                 // tie to even
  CHECK(out[4] == 1.0f + 0x1p-7f);        // tie to even (up)
  // The sum of two near-max values saturates instead of overflowing.
  gradcomp::bf16_payload q = p;
  c.accumulate(q, p);
  c.decode(q, out);
  CHECK(out[1] == -ge::bfloat16_max);
  CHECK(std::isfinite(out[0]));
}

TEST_CASE("fp16 / bf16 payloads: wire round trip; Inf / NaN patterns and bad lengths are refused") {
  fp16_codec<> c;
  gradcomp::fp16_payload p;
  c.encode(gradcomp::test_support::counter_gaussian(300, 5), p);
  const auto bytes = gradcomp::wire::serialize(p);
  const auto back = gradcomp::wire::parse<gradcomp::fp16_payload>(bytes);
  CHECK(back.values == p.values);
  auto inf = p;
  inf.values[7] = 0x7C00;
  CHECK_THROWS_AS(gradcomp::wire::parse<gradcomp::fp16_payload>(gradcomp::wire::serialize(inf)), gradcomp::wire::wire_error);
  gradcomp::bf16_payload b;
  b.values = {0x3F80, 0x7FC0};
  CHECK_THROWS_AS(gradcomp::wire::parse<gradcomp::bf16_payload>(gradcomp::wire::serialize(b)), gradcomp::wire::wire_error);
  // An fp16 payload is not a bf16 one.
  CHECK_THROWS_AS(gradcomp::wire::parse<gradcomp::bf16_payload>(bytes), gradcomp::wire::wire_error);
}

TEST_CASE("fp16 / bf16: linear up to one rounding per accumulate") {
  auto x = gradcomp::test_support::inputs(4, 2000, 3, 2.0f);
  fp16_codec<> a, b;
  const double defect = gradcomp::linearity_defect(a, b, std::span<const std::vector<float>>(x));
  CHECK(defect < 4 * 0x1p-11);
  bf16_codec<> c, d;
  CHECK(gradcomp::linearity_defect(c, d, std::span<const std::vector<float>>(x)) < 4 * 0x1p-8);
}

TEST_CASE("ring_allreduce_linear with fp16 / bf16: one rounding per hop, identical bits on every rank") {
  for (int n : {2, 3, 4})
    for (bool bf : {false, true}) {
      INFO("ranks " << n << (bf ? ", bf16" : ", fp16"));
      const std::size_t len = 5001;
      const auto x = gradcomp::test_support::inputs(n, len, 11, 3.0f);
      std::vector<std::vector<float>> out(static_cast<std::size_t>(n));
      std::vector<gradcomp::ring_stats> st(static_cast<std::size_t>(n));
      gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
        auto v = x[std::size_t(ep.rank())];
        if (bf) {
          bf16_codec<> c;
          st[std::size_t(ep.rank())] = gradcomp::ring_allreduce(ep, c, std::span<float>(v));
        } else {
          fp16_codec<> c;
          st[std::size_t(ep.rank())] = gradcomp::ring_allreduce(ep, c, std::span<float>(v));
        }
        out[std::size_t(ep.rank())] = v;
      });
      for (int r = 1; r < n; ++r) CHECK(bit_equal(out[std::size_t(r)], out[0]));
      // Reference: segment j starts as rank j's rounded values; each hop adds
      // the next rank's raw floats and rounds once.
      auto round = [&](float v) { return bf ? ge::round_to_bfloat16(v) : ge::round_to_half(v); };
      const gradcomp::ring_schedule ring(0, n, len);
      std::vector<float> ref(len);
      for (int j = 0; j < n; ++j)
        for (std::size_t i = ring.begin(j); i < ring.end(j); ++i) {
          float acc = round(x[std::size_t(j)][i]);
          for (int h = 1; h < n; ++h) acc = round(acc + x[std::size_t((j + h) % n)][i]);
          ref[i] = acc;
        }
      CHECK(bit_equal(out[0], ref));
      // Error: at most n roundings of at most n * max|x|.
      const auto exact = gradcomp::test_support::exact_sum(x);
      CHECK(gradcomp::test_support::rel_error(out[0], exact) < (bf ? 5e-3 : 6e-4));
      // Each rank encodes its first segment, then one re-encode per hop; 2(N-1) messages of 32 + 2 per value.
      CHECK(st[0].encodes == std::size_t(n));
      CHECK(st[0].messages_sent == 2 * std::size_t(n - 1));
      CHECK(st[0].bytes_sent <= 2 * std::size_t(n - 1) * (32 + 2 * (len / std::size_t(n) + 1)));
    }
}

TEST_CASE("fp16 ring: a sum beyond 65504 saturates on the way, never Inf") {
  const int n = 4;
  std::vector<std::vector<float>> out(n);
  std::vector<std::size_t> sat(n);
  gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
    std::vector<float> v(64, 30000.0f);
    fp16_codec<> c;
    gradcomp::ring_allreduce(ep, c, std::span<float>(v));
    sat[std::size_t(ep.rank())] = c.saturated();
    out[std::size_t(ep.rank())] = v;
  });
  for (float v : out[0]) CHECK(v == 65504.0f);
  std::size_t total = 0;
  for (auto s : sat) total += s;
  CHECK(total > 0);
}

namespace {
gx::plan half_plan(gx::codec_kind k) {
  gx::model_description m;
  m.add_conv("conv", 8, 4, 3, 3).add_dense("fc", 500).add_dense("bias", 10, 1);
  gx::plan_options o;
  o.rules.small_below = 16;
  o.rules.conv = k;
  o.rules.fallback = k;
  return gx::plan(std::move(m), o);
}
}  // namespace

TEST_CASE("exchange: fp16 and bf16 buckets sum 16-bit buffers (2 bytes per value), identical bits") {
  for (auto k : {gx::codec_kind::fp16, gx::codec_kind::bf16})
    for (int n : {2, 4}) {
      INFO(gx::to_string(k) << ", ranks " << n);
      const auto plan = half_plan(k);
      REQUIRE(plan.buckets().front().kind == k);
      std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(n));
      std::vector<gx::step_stats> st(static_cast<std::size_t>(n));
      auto grads = [&](int r) {
        std::vector<std::vector<float>> g;
        for (const auto& l : plan.model().layers())
          g.push_back(gradcomp::test_support::counter_gaussian(l.shape.size(), 70 + std::uint64_t(r), 0.01f));
        return g;
      };
      gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
        gx::model_exchange ex(ep, plan);
        auto g = grads(ep.rank());
        std::vector<std::span<float>> s(g.begin(), g.end());
        st[std::size_t(ep.rank())] = ex.step(s);
        out[std::size_t(ep.rank())] = g;
      });
      for (int r = 0; r < n; ++r) {
        CHECK_FALSE(st[std::size_t(r)].skipped);
        for (std::size_t l = 0; l < 3; ++l) CHECK(bit_equal(out[std::size_t(r)][l], out[0][l]));
      }
      CHECK(st[0].bucket_phase[0] == gx::to_string(k));
      CHECK(st[0].layer_bytes[0] == 288 * 2);
      CHECK(st[0].layer_bytes[1] == 500 * 2);
      // The mean is within the 16-bit rounding of the exact mean.
      std::vector<std::vector<float>> layer0;
      for (int r = 0; r < n; ++r) layer0.push_back(grads(r)[0]);
      auto exact = gradcomp::test_support::exact_sum(layer0);
      for (auto& v : exact) v /= float(n);
      CHECK(gradcomp::test_support::rel_error(out[0][0], exact) < (k == gx::codec_kind::fp16 ? 2e-3 : 1e-2));
    }
}

TEST_CASE("fp16 / bf16 on Rabenseifner: the first step in pieces and the last half in two, exact receives, the same bits") {
  // The 16-bit codecs know their payload sizes (2 bytes a value), so over the
  // zero-copy face too the compressed Rabenseifner cuts its messages without
  // length messages; the additions are the same, so are the bits.
  static_assert(gradcomp::ring_segmentation<fp16_codec<>>::knows_body_size);
  fp16_codec<> probe;
  CHECK(probe.segment_body_size(7, 100) == 200);
  for (int n : {3, 4, 8})
    for (bool bf : {false, true}) {
      INFO("ranks " << n << (bf ? ", bf16" : ", fp16"));
      const std::size_t len = 3001;
      const auto x = gradcomp::test_support::inputs(n, len, 12, 3.0f);
      auto run = [&](bool zero_copy, gradcomp::schedule_options o) {
        std::vector<std::vector<float>> out = x;
        gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
          auto go = [&](auto& t, auto& c) {
            gradcomp::rabenseifner_allreduce_linear(t, c, std::span<float>(out[std::size_t(ep.rank())]), o);
          };
          auto with = [&](auto& t) {
            if (bf) {
              bf16_codec<> c;
              go(t, c);
            } else {
              fp16_codec<> c;
              go(t, c);
            }
          };
          if (zero_copy) {
            auto z = ep.zero_copy();
            with(z);
          } else {
            with(ep);
          }
        });
        return out;
      };
      const auto whole = run(false, {.chunk_elements = 0});
      for (int r = 1; r < n; ++r) CHECK(bit_equal(whole[std::size_t(r)], whole[0]));
      for (bool zc : {false, true}) {
        const auto pieces = run(zc, {.chunk_elements = 64});
        for (int r = 0; r < n; ++r) CHECK(bit_equal(pieces[std::size_t(r)], whole[0]));
      }
    }
}

TEST_CASE("fp16 on Rabenseifner: uneven halves at the split threshold, empty blocks: both peers cut alike") {
  // Every cut of the compressed Rabenseifner is decided from what both peers
  // share (the block count, the options, the length), never from the size of
  // the half one of them sends: halves of 33 and 32 floats with chunks of 16
  // once made one peer split its last step and the other not.
  for (int n : {4, 5, 8})
    for (std::size_t len : {std::size_t(1), std::size_t(3), std::size_t(9), std::size_t(63), std::size_t(64),
                            std::size_t(65), std::size_t(66), std::size_t(129)}) {
      INFO("ranks " << n << ", " << len << " floats");
      const auto x = gradcomp::test_support::inputs(n, len, 13, 2.0f);
      auto run = [&](bool zero_copy, gradcomp::schedule_options o) {
        std::vector<std::vector<float>> out = x;
        gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
          fp16_codec<> c;
          if (zero_copy) {
            auto z = ep.zero_copy();
            gradcomp::rabenseifner_allreduce_linear(z, c, std::span<float>(out[std::size_t(ep.rank())]), o);
          } else {
            gradcomp::rabenseifner_allreduce_linear(ep, c, std::span<float>(out[std::size_t(ep.rank())]), o);
          }
        });
        return out;
      };
      const auto whole = run(false, {.chunk_elements = 0});
      for (bool zc : {false, true})
        for (std::size_t chunk : {std::size_t(1), std::size_t(2), std::size_t(16)}) {
          const auto got = run(zc, {.chunk_elements = chunk});
          for (int r = 0; r < n; ++r) CHECK(bit_equal(got[std::size_t(r)], whole[0]));
        }
    }
}
