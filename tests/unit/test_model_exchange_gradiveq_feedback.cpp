// GradiVeQ's error feedback in the whole-model exchange
// (gradiveq_schedule_options::error_feedback), the spread sampling steps
// (spread_sampling) and the sampler's rounding fed back
// (sampling_error_feedback): what the basis leaves out is delayed, never
// dropped (residual conservation through a whole cycle), what the sampler
// rounds away stays bounded, the memory survives
// checkpoints, an abandoned step leaves it as it was, and a plan with either
// option differs from one without.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include <gradcomp/model_exchange.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <support/equality.hpp>
#include <support/exchange_fixtures.hpp>

namespace gx = gradcomp::exchange;
using gradcomp::test_support::bit_equal;
using gradcomp::transport::inproc_endpoint;

namespace {

gx::model_description conv_model() {
  gx::model_description m;
  m.add_conv("conv1", 8, 4, 3, 3).add_dense("conv1.bias", 8, 1).add_conv("conv2", 8, 8, 3, 3);
  return m;
}

/// warm-up 2, L_t 3, L_c 3 (steps 0-1 warm-up, 2-4 sampling, 5-7 compressed,
/// 8-10 sampling, ...; spread: 8 C, 9 S, 10 C, 11 S, 12 C, 13 S and refit,
/// ...); `feedback` on or off; sampling dense or QSGD; `rounding`: the QSGD
/// sampler's rounding fed back too (with the max-norm sampler it needs).
gx::plan_options feedback_options(bool feedback, bool dense_sampling, bool spread = false, bool rounding = false) {
  gx::plan_options o = gradcomp::test_support::short_exchange_options(5);
  o.gradiveq_schedule.error_feedback = feedback;
  o.gradiveq_schedule.spread_sampling = spread;
  o.gradiveq_schedule.sampling_error_feedback = rounding;
  if (rounding) o.qsgd.norm = gradcomp::execution::qsgd_norm::max;
  if (dense_sampling) o.gradiveq_schedule.sampling = gradcomp::sampling_aggregation::uncompressed;
  return o;
}

/// Gradients of (rank, step) with more directions than three samples can span,
/// so the basis leaves a part of every compressed step out.
std::vector<std::vector<float>> gradients(const gx::model_description& m, int rank, std::uint64_t step) {
  const gradcomp::test_support::gradient_recipe recipe{0xD1B54A32D192ED03ull, 0x9E3779B97F4A7C15ull, 0.2f, 29, 3, 0.3f};
  return gradcomp::test_support::exchange_gradients(m, rank, step, recipe);
}

struct run_result {
  std::vector<std::vector<double>> applied;  // sum over steps of the exchange's output (the mean), per layer
  std::vector<std::vector<double>> sent;     // sum over steps and ranks of the gradients / N, per layer
  std::vector<std::vector<float>> last;      // the last step's output
};

/// n ranks, `steps` steps; rank 0's sums.
run_result run(int n, std::uint64_t steps, const gx::plan_options& o) {
  const auto m = conv_model();
  run_result res;
  for (const auto& l : m.layers()) {
    res.applied.emplace_back(l.shape.size(), 0.0);
    res.sent.emplace_back(l.shape.size(), 0.0);
  }
  gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, gx::plan(m, o));
    for (std::uint64_t step = 0; step < steps; ++step) {
      auto g = gradients(m, ep.rank(), step);
      std::vector<std::span<float>> s(g.begin(), g.end());
      REQUIRE_FALSE(ex.step(s).skipped);
      if (ep.rank() != 0) continue;
      for (std::size_t l = 0; l < m.size(); ++l)
        for (std::size_t i = 0; i < g[l].size(); ++i) res.applied[l][i] += g[l][i];
      if (step + 1 == steps) res.last = g;
    }
  });
  for (std::uint64_t step = 0; step < steps; ++step)
    for (int r = 0; r < n; ++r) {
      const auto g = gradients(m, r, step);
      for (std::size_t l = 0; l < m.size(); ++l)
        for (std::size_t i = 0; i < g[l].size(); ++i) res.sent[l][i] += double(g[l][i]) / n;
    }
  return res;
}

/// max |applied - sent| over the conv layers, relative to max |sent|.
double conservation_gap(const run_result& r) {
  double gap = 0.0, scale = 0.0;
  for (std::size_t l : {std::size_t(0), std::size_t(2)})
    for (std::size_t i = 0; i < r.sent[l].size(); ++i) {
      gap = std::max(gap, std::abs(r.applied[l][i] - r.sent[l][i]));
      scale = std::max(scale, std::abs(r.sent[l][i]));
    }
  return gap / scale;
}

}  // namespace

TEST_CASE("gradiveq error feedback: a cycle's left-out part arrives in the next sampling step (conservation)") {
  for (int n : {1, 3}) {
    CAPTURE(n);
    // Through step 8, the first sampling step after L_c: every rank's gradients
    // have reached the model, in full, with error feedback; without it the
    // compressed steps' out-of-span parts are lost.
    const auto with = run(n, 9, feedback_options(true, true));
    const auto without = run(n, 9, feedback_options(false, true));
    CHECK(conservation_gap(with) < 1e-5);
    CHECK(conservation_gap(without) > 1e-2);
    // In the middle of L_c the residual is held back, not yet applied.
    CHECK(conservation_gap(run(n, 7, feedback_options(true, true))) > 1e-2);
    // The dense bias is untouched by the option.
    CHECK(bit_equal(with.last[1], without.last[1]));
  }
}

TEST_CASE("gradiveq error feedback with spread sampling: every sampling step sends what was left out") {
  for (int n : {1, 3}) {
    CAPTURE(n);
    for (std::uint64_t steps : {10u, 12u, 14u, 16u}) {  // through a sampling step
      CAPTURE(steps);
      CHECK(conservation_gap(run(n, steps, feedback_options(true, true, true))) < 1e-5);
      CHECK(conservation_gap(run(n, steps, feedback_options(false, true, true))) > 1e-2);
    }
    for (std::uint64_t steps : {9u, 11u, 15u})  // through a compressed step: held back
      CHECK(conservation_gap(run(n, steps, feedback_options(true, true, true))) > 1e-2);
  }
  // A plan with spread sampling is another plan (its checkpoints are refused
  // by the contiguous one); how many steps a cycle samples is the schedule
  // test's (test_gradiveq_schedule.cpp).
  CHECK(gx::plan(conv_model(), feedback_options(true, false, true)).fingerprint() !=
        gx::plan(conv_model(), feedback_options(true, false, false)).fingerprint());
  // The plan checks the schedule's options where it is made: spread sampling needs a fixed L_c.
  auto voting = feedback_options(true, false, true);
  voting.gradiveq_schedule.stale_threshold = 0.5;
  CHECK_THROWS_AS(gx::plan(conv_model(), voting), gradcomp::invalid_argument_error);
}

TEST_CASE("gradiveq error feedback: compressed steps send what they send without it; sampling steps differ") {
  // Warm-up, the first sampling phase and the whole L_c (steps 0-7) are the
  // same bits with and without error feedback: a residual is orthogonal to
  // the basis that left it out, so it changes no compressed message. Step 8,
  // the next sampling step, sends it.
  for (std::uint64_t steps : {2u, 5u, 6u, 8u}) {
    CAPTURE(steps);
    const auto with = run(2, steps, feedback_options(true, false));
    const auto without = run(2, steps, feedback_options(false, false));
    for (std::size_t l = 0; l < with.last.size(); ++l) CHECK(bit_equal(with.last[l], without.last[l]));
  }
  const auto with = run(2, 9, feedback_options(true, false));
  const auto without = run(2, 9, feedback_options(false, false));
  CHECK_FALSE(bit_equal(with.last[0], without.last[0]));
  CHECK_FALSE(bit_equal(with.last[2], without.last[2]));
  CHECK(bit_equal(with.last[1], without.last[1]));  // the dense bias
}

/// max |g| over every rank's conv-layer gradients of steps [0, steps).
double largest_gradient(int n, std::uint64_t steps) {
  const auto m = conv_model();
  double g_max = 0.0;
  for (std::uint64_t step = 0; step < steps; ++step)
    for (int r = 0; r < n; ++r) {
      const auto g = gradients(m, r, step);
      for (std::size_t l : {std::size_t(0), std::size_t(2)})
        for (float x : g[l]) g_max = std::max(g_max, double(std::abs(x)));
    }
  return g_max;
}

/// max |applied - sent| over the conv layers (absolute).
double absolute_gap(const run_result& r) {
  double gap = 0.0;
  for (std::size_t l : {std::size_t(0), std::size_t(2)})
    for (std::size_t i = 0; i < r.sent[l].size(); ++i) gap = std::max(gap, std::abs(r.applied[l][i] - r.sent[l][i]));
  return gap;
}

TEST_CASE("gradiveq sampling error feedback: what the sampler rounds away stays bounded (max-norm QSGD)") {
  // 40 QSGD sampling steps in a row (4 bits, s = 7 levels, max-norm scale):
  // applied - sent = -(1/N) sum_r e_r, and with the rounding fed back
  // |e|_inf <= |g + e|_inf / s, so |applied - sent|_inf <= max |g| / (s - 1)
  // at every step; without it the roundings add up like a random walk.
  for (int n : {1, 3}) {
    CAPTURE(n);
    auto o = feedback_options(true, false, false, true);
    o.gradiveq_schedule.sampling_iterations = 40;
    auto plain = o;
    plain.gradiveq_schedule.sampling_error_feedback = false;
    for (std::uint64_t steps : {3u, 12u, 41u}) {
      CAPTURE(steps);
      const double bound = largest_gradient(n, steps) / 6.0;
      CHECK(absolute_gap(run(n, steps, o)) <= bound * (1 + 1e-5));
      if (steps == 41) CHECK(absolute_gap(run(n, steps, plain)) > 2 * bound);
    }
  }
  // Through L_c and the next sampling steps the rounding is carried too: a
  // compressed step after a sampling step encodes g + e (so its message
  // differs from the one without the option) and the conservation holds to
  // the last step's rounding.
  const auto rounding = run(2, 9, feedback_options(true, false, false, true));
  auto no_rounding_options = feedback_options(true, false, false, true);
  no_rounding_options.gradiveq_schedule.sampling_error_feedback = false;
  const auto no_rounding = run(2, 6, no_rounding_options);
  CHECK_FALSE(bit_equal(run(2, 6, feedback_options(true, false, false, true)).last[0], no_rounding.last[0]));
  CHECK(absolute_gap(rounding) <= largest_gradient(2, 9));

  // The first compressed step sends the last sampling step's rounding: with
  // a basis that spans every direction (lambda 0, every slice of 80 samples
  // pooled: 240 rows, more than conv2's slice length 192) it arrives whole, the conservation is exact again there,
  // while the sampling steps before it leave their last rounding out.
  auto spanning = feedback_options(true, false, false, true);
  spanning.gradiveq_schedule.sampling_iterations = 80;
  spanning.gradiveq.lambda = 0.0;
  spanning.gradiveq.source = gradcomp::basis_source::pooled;  // every slice of a sample is a row
  spanning.gradiveq.pool_slices = 0;
  for (int n : {1, 2}) {
    CAPTURE(n);
    const double g_max = largest_gradient(n, 83);
    MESSAGE("through sampling: " << absolute_gap(run(n, 82, spanning)) / g_max
            << ", through the first compressed step: " << absolute_gap(run(n, 83, spanning)) / g_max);
    CHECK(absolute_gap(run(n, 82, spanning)) > 1e-3 * g_max);
    CHECK(absolute_gap(run(n, 83, spanning)) < 1e-5 * g_max);
  }

  // Refused where it is not bounded or has nothing to feed back.
  const auto m = conv_model();
  auto l2 = feedback_options(true, false, false, true);
  l2.qsgd.norm = gradcomp::execution::qsgd_norm::l2;
  CHECK_THROWS_AS(gx::plan(m, l2), gradcomp::invalid_argument_error);
  auto no_feedback = feedback_options(false, false, false, true);
  CHECK_THROWS_AS(gx::plan(m, no_feedback), gradcomp::invalid_argument_error);
  auto dense = feedback_options(true, true, false, true);
  CHECK_THROWS_AS(gx::plan(m, dense), gradcomp::invalid_argument_error);
  auto one_level = feedback_options(true, false, false, true);
  one_level.gradiveq_schedule.qsgd_bits = 2;
  CHECK_THROWS_AS(gx::plan(m, one_level), gradcomp::invalid_argument_error);
  CHECK(gx::plan(m, feedback_options(true, false, false, true)).fingerprint() != gx::plan(m, no_rounding_options).fingerprint());
}

TEST_CASE("gradiveq error feedback: the memory is part of the checkpoint; a skipped step keeps it") {
  for (int config : {0, 1, 2}) {  // contiguous, spread, spread with the sampler's rounding fed back
    CAPTURE(config);
    const int n = 3;
    const auto o = feedback_options(true, false, config >= 1, config == 2);
    const auto m = conv_model();
    const std::uint64_t total = 16;
    auto train = [&](gx::model_exchange<inproc_endpoint>& ex, int rank, std::vector<std::vector<float>>& acc,
                     std::uint64_t first, std::uint64_t last) {
      for (std::uint64_t step = first; step < last; ++step) {
        auto g = gradients(m, rank, step);
        std::vector<std::span<float>> s(g.begin(), g.end());
        REQUIRE_FALSE(ex.step(s).skipped);
        for (std::size_t l = 0; l < m.size(); ++l)
          for (std::size_t i = 0; i < g[l].size(); ++i) acc[l][i] += g[l][i];
      }
    };
    auto zeros = [&] {
      std::vector<std::vector<float>> z;
      for (const auto& l : m.layers()) z.emplace_back(l.shape.size(), 0.0f);
      return z;
    };
    std::vector<std::vector<std::vector<float>>> straight(n);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, gx::plan(m, o));
      auto acc = zeros();
      train(ex, ep.rank(), acc, 0, total);
      straight[std::size_t(ep.rank())] = acc;
    });
    for (std::uint64_t k : {6u, 7u, 9u, 10u, 13u}) {  // inside L_c (residual held), after a flush, a spread cycle
      CAPTURE(k);
      std::vector<std::vector<std::byte>> saved(n);
      std::vector<std::vector<std::vector<float>>> partial(n), resumed(n);
      gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
        gx::model_exchange ex(ep, gx::plan(m, o));
        auto acc = zeros();
        train(ex, ep.rank(), acc, 0, k);
        saved[std::size_t(ep.rank())] = ex.save_state();
        partial[std::size_t(ep.rank())] = acc;
      });
      gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
        gx::model_exchange ex(ep, gx::plan(m, o));
        ex.restore_state(saved[std::size_t(ep.rank())]);
        auto acc = partial[std::size_t(ep.rank())];
        train(ex, ep.rank(), acc, k, total);
        resumed[std::size_t(ep.rank())] = acc;
      });
      for (int r = 0; r < n; ++r)
        for (std::size_t l = 0; l < m.size(); ++l)
          CHECK(bit_equal(resumed[std::size_t(r)][l], straight[std::size_t(r)][l]));
    }
    // A step in L_c that one rank's NaN makes every rank skip leaves the state
    // (residual included) byte for byte as it was; a plan without error
    // feedback refuses the checkpoint (another plan).
    std::vector<int> same(n, 0);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, gx::plan(m, o));
      auto acc = zeros();
      train(ex, ep.rank(), acc, 0, 6);
      const auto before = ex.save_state();
      auto g = gradients(m, ep.rank(), 6);
      if (ep.rank() == 1) g[2][3] = std::numeric_limits<float>::quiet_NaN();
      std::vector<std::span<float>> s(g.begin(), g.end());
      const bool skipped = ex.step(s).skipped;
      same[std::size_t(ep.rank())] = skipped && ex.save_state() == before;
      gx::model_exchange plain(ep, gx::plan(m, feedback_options(false, false)));
      CHECK_THROWS_AS(plain.restore_state(before), gradcomp::layout_error);
    });
    for (int r = 0; r < n; ++r) CHECK(same[std::size_t(r)] == 1);
    CHECK(gx::plan(m, o).fingerprint() != gx::plan(m, feedback_options(false, false)).fingerprint());
  }
}
