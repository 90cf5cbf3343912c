// LGC's ring bucket beyond the paper (exchange/lgc_bucket.hpp, lgc_options):
// periodic retraining in phase 3 with the new weights sent to every rank
// (retrain_period), and error feedback gated by the relative reconstruction
// error (feedback_max_error).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include <gradcomp/exchange/lgc_bucket.hpp>
#include <gradcomp/model_exchange.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <support/equality.hpp>
#include <support/lgc_fixtures.hpp>

namespace gx = gradcomp::exchange;
using gradcomp::test_support::bit_equal;
using gradcomp::transport::inproc_endpoint;

namespace {

using grads = std::vector<std::vector<float>>;

/// stem dense, two convs through the autoencoder, fc top-k only; phases 2 + 2 steps.
gx::plan retrain_plan(std::uint64_t period, bool feedback = false,
                      float max_error = std::numeric_limits<float>::infinity()) {
  gx::model_description m;
  m.add_conv("stem", 4, 1, 3, 3).add_conv("conv_a", 60, 10, 10, 1).add_conv("conv_b", 40, 10, 10, 1);
  m.add_dense("fc", 300, 2);
  gx::plan_options o;
  o.rules.conv = o.rules.small = o.rules.fallback = gx::codec_kind::lgc_ring;
  o.lgc.alpha_percent = 1.0;
  o.lgc.window = 32;
  o.lgc.architecture = gradcomp::test_support::small_arch();
  o.lgc.schedule = {2, 2};  // phase 3 from step 4
  o.lgc.momentum = 0.0f;
  o.lgc.seed = 9;
  o.lgc.retrain_period = period;
  o.lgc.feedback_reconstruction_error = feedback;
  o.lgc.feedback_max_error = max_error;
  o.lgc_factory = gx::lgc_bucket_factory<>();
  return gx::plan(std::move(m), o);
}

grads gradients(const gx::model_description& m, int rank, std::uint64_t step) {
  grads g;
  std::uint64_t x = 0x9E3779B97F4A7C15ull * (std::uint64_t(rank) + 3) ^ (step * 0xBF58476D1CE4E5B9ull);
  for (std::size_t l = 0; l < m.size(); ++l) {
    std::vector<float> v(m[l].shape.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      v[i] = 0.3f * std::sin(0.01f * float(i) + float(step)) + float(int((x >> 40) % 1001) - 500) / 2000.0f;
    }
    g.push_back(std::move(v));
  }
  return g;
}

std::vector<std::span<float>> spans(grads& g) { return std::vector<std::span<float>>(g.begin(), g.end()); }

struct rank_run {
  std::vector<grads> out;
  std::vector<std::uint64_t> payload;  ///< last_traffic().payload_bytes per step
  std::vector<std::byte> weights;      ///< the network in use at the end
  std::uint64_t broadcasts = 0, training = 0, feedback = 0;
};

std::vector<rank_run> run(int n, const gx::plan& plan, std::uint64_t steps) {
  std::vector<rank_run> r(static_cast<std::size_t>(n));
  gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, plan);
    auto& mine = r[std::size_t(ep.rank())];
    const auto& b = dynamic_cast<const gx::lgc_ring_bucket<>&>(ex.buckets().bucket(0));
    for (std::uint64_t s = 0; s < steps; ++s) {
      auto g = gradients(plan.model(), ep.rank(), s);
      REQUIRE_FALSE(ex.step(spans(g)).skipped);
      mine.out.push_back(g);
      mine.payload.push_back(b.last_traffic().payload_bytes);
    }
    mine.weights = gradcomp::lgc_network(b.network()).save();
    mine.broadcasts = b.weight_broadcasts();
    mine.training = b.training_steps();
    mine.feedback = b.feedback_steps();
  });
  return r;
}

}  // namespace

TEST_CASE("lgc retraining: the trainer keeps training in phase 3, every rank codes with the broadcast weights") {
  const int n = 3;
  const auto frozen = run(n, retrain_plan(0), 9);
  const auto re = run(n, retrain_plan(2), 9);  // broadcasts at steps 4, 6, 8
  for (int k = 0; k < n; ++k) {
    CAPTURE(k);
    const auto& r = re[std::size_t(k)];
    CHECK(r.broadcasts == 3);
    CHECK(frozen[std::size_t(k)].broadcasts == 1);
    CHECK(r.training == (k == 0 ? 2u + 5u : 0u));  // phase 2 (2 steps) and every compressed step (4..8)
    CHECK(frozen[std::size_t(k)].training == (k == 0 ? 2u : 0u));
    CHECK(r.weights == re[0].weights);  // the same network everywhere
    for (std::size_t s = 0; s < 9; ++s)
      for (std::size_t l = 0; l < r.out[s].size(); ++l) CHECK(bit_equal(r.out[s][l], re[0].out[s][l]));
    // Up to the first compressed step, retraining changes nothing.
    for (std::size_t s = 0; s < 5; ++s)
      for (std::size_t l = 0; l < r.out[s].size(); ++l) CHECK(bit_equal(r.out[s][l], frozen[std::size_t(k)].out[s][l]));
  }
  CHECK(re[0].weights != frozen[0].weights);  // retrained after the first broadcast
  // The trainer counts every broadcast as payload (the others send the same code bytes as before).
  const std::uint64_t w = re[0].weights.size();
  for (std::size_t s : {6u, 8u}) CHECK(re[0].payload[s] >= re[0].payload[s - 1] + w - 64);
  CHECK(re[0].payload[7] < w);
  CHECK(re[1].payload[6] < w);
  // The option enters the plan's fingerprint.
  CHECK(retrain_plan(2).fingerprint() != retrain_plan(0).fingerprint());
}

TEST_CASE("lgc retraining: checkpoints resumed between broadcasts end bit-identical (3 ranks)") {
  const int n = 3;
  const auto plan = retrain_plan(2);
  const auto straight = run(n, plan, 9);
  for (std::uint64_t k : {5u, 6u, 7u}) {
    CAPTURE(k);
    std::vector<std::vector<std::byte>> saved(n);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      for (std::uint64_t s = 0; s < k; ++s) {
        auto g = gradients(plan.model(), ep.rank(), s);
        REQUIRE_FALSE(ex.step(spans(g)).skipped);
      }
      saved[std::size_t(ep.rank())] = ex.save_state();
    });
    std::vector<grads> last(n);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      ex.restore_state(saved[std::size_t(ep.rank())]);
      for (std::uint64_t s = k; s < 9; ++s) {
        auto g = gradients(plan.model(), ep.rank(), s);
        REQUIRE_FALSE(ex.step(spans(g)).skipped);
        last[std::size_t(ep.rank())] = g;
      }
    });
    for (int r = 0; r < n; ++r)
      for (std::size_t l = 0; l < last[std::size_t(r)].size(); ++l)
        CHECK(bit_equal(last[std::size_t(r)][l], straight[std::size_t(r)].out[8][l]));
  }
}

TEST_CASE("lgc error feedback gated by the relative reconstruction error") {
  const int n = 2;
  const auto off = run(n, retrain_plan(0, false), 8);
  const auto never = run(n, retrain_plan(0, true, 0.0f), 8);  // an error of 0 is never reached
  const auto always = run(n, retrain_plan(0, true), 8);
  for (int k = 0; k < n; ++k) {
    CAPTURE(k);
    CHECK(never[std::size_t(k)].feedback == 0);
    CHECK(always[std::size_t(k)].feedback == 4);  // every compressed step (4..7)
    CHECK(off[std::size_t(k)].feedback == 0);
    for (std::size_t s = 0; s < 8; ++s)
      for (std::size_t l = 0; l < off[0].out[s].size(); ++l)
        CHECK(bit_equal(never[std::size_t(k)].out[s][l], off[std::size_t(k)].out[s][l]));
  }
  // Fed back, the residual differs, so a later aggregate does.
  bool differs = false;
  for (std::size_t l = 0; l < off[0].out[7].size(); ++l) differs |= !bit_equal(always[0].out[7][l], off[0].out[7][l]);
  CHECK(differs);
  gx::plan_options bad;
  bad.lgc.feedback_max_error = -1.0f;
  CHECK_THROWS_AS(bad.lgc.validate(), gradcomp::invalid_argument_error);
}
