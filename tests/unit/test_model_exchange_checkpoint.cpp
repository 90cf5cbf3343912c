// Checkpoints of the whole-model exchange: a run stopped at step k and resumed
// from its checkpoints ends bit-identical to the uninterrupted run (4 workers
// over inproc, every codec of the plan), and checkpoints of another plan or
// world size, or ranks out of step, are refused with typed errors.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <gradcomp/model_exchange.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <support/equality.hpp>
#include <support/exchange_fixtures.hpp>

namespace gx = gradcomp::exchange;
using gradcomp::test_support::bit_equal;
using gradcomp::transport::inproc_endpoint;

namespace {

/// A model with every codec of the library: GradiVeQ on the convs, two-bit,
/// QSGD and top-k on the fully connected layers, dense on the biases.
gx::plan every_codec_plan(gx::codec_kind fc1 = gx::codec_kind::two_bit) {
  return gradcomp::test_support::every_codec_plan(11, fc1);
}

std::vector<std::vector<float>> gradients(const gx::model_description& m, int rank, std::uint64_t step,
                                          const std::vector<std::vector<float>>& weights) {
  std::vector<std::vector<float>> g;
  std::uint64_t x = 0x9E3779B97F4A7C15ull * (std::uint64_t(rank) + 3) ^ (step * 0xBF58476D1CE4E5B9ull);
  auto next = [&x] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return float((x >> 40) & 0xFFFFFF) / float(1 << 24) - 0.5f;
  };
  for (std::size_t l = 0; l < m.size(); ++l) {
    std::vector<float> v(m[l].shape.size());
    const float a = next();
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = a * std::cos(0.07f * float(i % 41)) + 0.1f * weights[l][i] + 0.05f * next();
    g.push_back(std::move(v));
  }
  return g;
}

/// One worker's training: w -= 0.1 * aggregate, from `first` to `last` (exclusive).
void train(gx::model_exchange<inproc_endpoint>& ex, int rank, std::vector<std::vector<float>>& w, std::uint64_t first,
           std::uint64_t last) {
  const auto& m = ex.layout().model();
  for (std::uint64_t step = first; step < last; ++step) {
    auto g = gradients(m, rank, step, w);
    std::vector<std::span<float>> s(g.begin(), g.end());
    REQUIRE_FALSE(ex.step(s).skipped);
    for (std::size_t l = 0; l < w.size(); ++l)
      for (std::size_t i = 0; i < w[l].size(); ++i) w[l][i] -= 0.1f * g[l][i];
  }
}

std::vector<std::vector<float>> zero_weights(const gx::model_description& m) {
  std::vector<std::vector<float>> w;
  for (const auto& l : m.layers()) w.emplace_back(l.shape.size(), 0.0f);
  return w;
}

}  // namespace

TEST_CASE("checkpoint: stopped at step k and resumed ends bit-identical (4 workers, every codec)") {
  const int n = 4;
  const std::uint64_t total = 12;  // warm-up 2, L_t 3, L_c 3, L_t 3, L_c ...
  const auto plan = every_codec_plan();
  const auto& m = plan.model();
  std::vector<std::vector<std::vector<float>>> straight(n);
  gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, plan);
    auto w = zero_weights(m);
    train(ex, ep.rank(), w, 0, total);
    straight[std::size_t(ep.rank())] = w;
  });
  for (std::uint64_t k : {1u, 3u, 5u, 7u}) {  // warm-up, L_t (samples held), at the fit, L_c
    CAPTURE(k);
    std::vector<std::vector<std::byte>> saved(n);
    std::vector<std::vector<std::vector<float>>> weights(n);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      auto w = zero_weights(m);
      train(ex, ep.rank(), w, 0, k);
      saved[std::size_t(ep.rank())] = ex.save_state();
      weights[std::size_t(ep.rank())] = w;
    });
    std::vector<std::vector<std::vector<float>>> resumed(n);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);  // a fresh process: same plan, state from the checkpoint
      ex.restore_state(saved[std::size_t(ep.rank())]);
      CHECK(ex.steps() == k);
      auto w = weights[std::size_t(ep.rank())];
      train(ex, ep.rank(), w, k, total);
      resumed[std::size_t(ep.rank())] = w;
    });
    for (int r = 0; r < n; ++r)
      for (std::size_t l = 0; l < m.size(); ++l) CHECK(bit_equal(resumed[std::size_t(r)][l], straight[std::size_t(r)][l]));
  }
}

TEST_CASE("checkpoint: another plan, world size or rank is refused; ranks out of step are named") {
  const auto plan = every_codec_plan();
  std::vector<std::vector<std::byte>> saved(4), first(4);
  gradcomp::transport::run_workers(4, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, plan);
    auto w = zero_weights(plan.model());
    first[std::size_t(ep.rank())] = ex.save_state();
    train(ex, ep.rank(), w, 0, 1);
    saved[std::size_t(ep.rank())] = ex.save_state();
  });
  gradcomp::transport::run_workers(4, [&](inproc_endpoint& ep) {
    gx::model_exchange other(ep, every_codec_plan(gx::codec_kind::dense));
    CHECK_THROWS_AS(other.restore_state(saved[std::size_t(ep.rank())]), gradcomp::layout_error);
    gx::model_exchange same(ep, plan);
    CHECK_THROWS_AS(same.restore_state(saved[std::size_t((ep.rank() + 1) % 4)]), gradcomp::option_mismatch_error);
    auto damaged = saved[std::size_t(ep.rank())];
    damaged[damaged.size() / 2] ^= std::byte{1};
    CHECK_THROWS_AS(same.restore_state(damaged), gradcomp::wire::wire_error);
    CHECK(same.steps() == 0);  // nothing restored
  });
  gradcomp::transport::run_workers(2, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, plan);
    CHECK_THROWS_AS(ex.restore_state(saved[std::size_t(ep.rank())]), gradcomp::option_mismatch_error);
  });
  // Rank 3 resumes from an older checkpoint than the others: every rank
  // learns it in the next step's first round and throws, naming rank 3.
  std::vector<int> named(4, -1);
  gradcomp::transport::run_workers(4, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, plan);
    ex.restore_state(ep.rank() == 3 ? first[3] : saved[std::size_t(ep.rank())]);
    auto g = gradients(plan.model(), ep.rank(), 1, zero_weights(plan.model()));
    std::vector<std::span<float>> s(g.begin(), g.end());
    try {
      ex.step(s);
    } catch (const gx::exchange_failure_error& e) {
      CHECK(e.reason() == gx::failure_reason::state_disagreement);
      named[std::size_t(ep.rank())] = e.rank();
    }
  });
  for (int r = 0; r < 4; ++r) CHECK(named[std::size_t(r)] == 3);
}
