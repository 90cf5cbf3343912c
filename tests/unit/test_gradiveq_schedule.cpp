// gradiveq.hpp: the GradiVeQ schedule (seed 002, Sec. 3 and Fig. 6) and the eq. 7 monitor.
#include <doctest/doctest.h>

#include <gradcomp/gradiveq.hpp>

#include <support/error_checks.hpp>
#include <support/random_vectors.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using namespace gradcomp;

namespace {

char letter(gradiveq_phase p) {
  switch (p) {
    case gradiveq_phase::warmup: return 'W';
    case gradiveq_phase::sampling: return 'S';
    case gradiveq_phase::compressed: return 'C';
  }
  return '?';
}

// Phases of the first n iterations, one letter each; '*' after the iteration
// whose advance() asked for fit_basis.
std::string run(gradiveq_schedule& s, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    out += letter(s.phase());
    if (s.advance().fit_basis) out += '*';
  }
  return out;
}

using gradcomp::test_support::splitmix;
// Counter-based standard normal for (seed, index).
double normal(std::uint64_t seed, std::uint64_t i) {
  const double u = (double(splitmix(seed * 0x9E3779B97F4A7C15ull + 2 * i) >> 11) + 0.5) * 0x1.0p-53;
  const double v = (double(splitmix(seed * 0x9E3779B97F4A7C15ull + 2 * i + 1) >> 11) + 0.5) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
}

}  // namespace

TEST_CASE("schedule: defaults are the paper's") {
  const gradiveq_schedule_options o;
  CHECK(o.warmup_iterations == 2500);
  CHECK(o.sampling_iterations == 100);
  CHECK(o.compressed_iterations == 400);
  CHECK(o.sampling == sampling_aggregation::qsgd);
  CHECK(o.qsgd_bits == 4);
  CHECK(std::isinf(o.stale_threshold));
  CHECK(gradiveq_options{}.lambda == 0.01);
  CHECK(gradiveq_options{}.reuse_factor == 0);  // s = infinity

  gradiveq_schedule s;
  std::size_t warm = 0, sampling = 0, compressed = 0, fits = 0;
  for (int i = 0; i < 2500 + 2 * 500; ++i) {
    switch (s.phase()) {
      case gradiveq_phase::warmup: ++warm; break;
      case gradiveq_phase::sampling: ++sampling; break;
      case gradiveq_phase::compressed: ++compressed; break;
    }
    fits += s.advance().fit_basis;
  }
  CHECK(warm == 2500);
  CHECK(sampling == 200);
  CHECK(compressed == 800);
  CHECK(fits == 2);
  CHECK(s.cycle() == 3);
  CHECK(s.phase() == gradiveq_phase::sampling);
  CHECK(s.sampling_quantized());
}

TEST_CASE("schedule: transitions happen at the configured iterations") {
  gradiveq_schedule_options o;
  o.warmup_iterations = 3;
  o.sampling_iterations = 2;
  o.compressed_iterations = 4;
  gradiveq_schedule s(o);
  CHECK(s.cycle() == 0);
  CHECK(run(s, 3 + 2 * 6 + 1) == "WWWSS*CCCCSS*CCCCS");
  CHECK(s.iteration() == 16);
  CHECK(s.cycle() == 3);
  CHECK(s.phase_position() == 1);

  o.warmup_iterations = 0;
  o.sampling = sampling_aggregation::uncompressed;
  gradiveq_schedule t(o);
  CHECK(t.cycle() == 1);
  CHECK(!t.sampling_quantized());
  CHECK(run(t, 8) == "SS*CCCCSS*");
}

TEST_CASE("schedule: spread_sampling spreads L_t over each cycle after the first") {
  gradiveq_schedule_options o;
  o.warmup_iterations = 2;
  o.sampling_iterations = 3;
  o.compressed_iterations = 5;
  o.spread_sampling = true;
  gradiveq_schedule s(o);
  // Cycle 1 as without the option; then cycles of C = 8: iteration p samples
  // when floor(3 (p+1) / 8) > floor(3 p / 8), i.e. p = 2, 5, 7; refit after 7.
  CHECK(run(s, 2 + 8 + 8 + 8 + 3) == "WWSSS*CCCCCCCSCCSCS*CCSCCSCS*CCS");
  CHECK(s.cycle() == 4);
  CHECK(s.spread());
  CHECK(s.phase_position() == 3);
  // Every cycle samples L_t times and compresses L_c times, as without it.
  o.sampling_iterations = 150;
  o.compressed_iterations = 400;
  gradiveq_schedule big(o);
  (void)run(big, 2 + 550);  // warm-up and the contiguous first cycle
  const std::string cycle = run(big, 550);
  CHECK(std::count(cycle.begin(), cycle.end(), 'S') == 150);
  CHECK(std::count(cycle.begin(), cycle.end(), 'C') == 400);
  CHECK(cycle.back() == '*');
  CHECK(cycle.find("SS") == std::string::npos);  // never two sampling iterations in a row
  // A state saved in a spread cycle continues identically; one whose phase
  // disagrees with its cycle position is refused.
  gradiveq_schedule a(o), b(o);
  (void)run(a, 2 + 550 + 123);
  const auto state = a.save_state();
  b.restore_state(state);
  CHECK(run(a, 1000) == run(b, 1000));
  // The same body with the phase byte (before 5 u64 counters) changed, in a valid container.
  std::vector<std::byte> body(state.begin() + wire::header_size, state.end());
  const std::size_t phase_at = body.size() - 41;
  body[phase_at] = body[phase_at] == std::byte{1} ? std::byte{2} : std::byte{1};
  const auto bad = wire::serialize_state(wire::codec_id::control, 0, [&](wire::writer& w) { w.put_bytes(body); });
  gradiveq_schedule c(o);
  CHECK_THROWS_WITH_AS(c.restore_state(bad), doctest::Contains("phase and cycle position disagree"), gradcomp::error);
  CHECK(c.iteration() == 0);
  // A state of the contiguous schedule is refused, naming the option.
  auto contiguous = o;
  contiguous.spread_sampling = false;
  gradiveq_schedule d(contiguous);
  CHECK(test_support::mismatched_option_of(d, state) == "spread_sampling");
  // A fixed L_c is required.
  auto voting = o;
  voting.stale_threshold = 0.5;
  CHECK_THROWS_AS(gradiveq_schedule{voting}, invalid_argument_error);
  auto adaptive = o;
  adaptive.adaptive_cycles = true;
  CHECK_THROWS_AS(gradiveq_schedule{adaptive}, invalid_argument_error);
}

TEST_CASE("schedule: a majority of stale votes ends L_c early") {
  gradiveq_schedule_options o;
  o.warmup_iterations = 1;
  o.sampling_iterations = 2;
  o.compressed_iterations = 10;
  gradiveq_schedule s(o);
  run(s, 3);
  REQUIRE(s.phase() == gradiveq_phase::compressed);
  // Minorities and exact halves do not end it.
  CHECK(s.advance(1, 3).next == gradiveq_phase::compressed);
  CHECK(s.advance(2, 4).next == gradiveq_phase::compressed);
  CHECK(s.advance(0, 1).next == gradiveq_phase::compressed);
  const auto step = s.advance(2, 3);
  CHECK(step.ended_early);
  CHECK(step.next == gradiveq_phase::sampling);
  CHECK(!step.fit_basis);
  CHECK(s.iteration() == 7);
  CHECK(s.cycle() == 2);
  // Votes outside a compressed phase are ignored.
  CHECK(s.advance(3, 3).next == gradiveq_phase::sampling);
  CHECK(s.advance(3, 3).fit_basis);
  // A majority on the last compressed iteration is a normal end, not an early one.
  for (int i = 0; i < 9; ++i) (void)s.advance(0, 3);
  const auto last = s.advance(3, 3);
  CHECK(last.next == gradiveq_phase::sampling);
  CHECK(!last.ended_early);
}

TEST_CASE("schedule: patience needs consecutive majority iterations") {
  gradiveq_schedule_options o;
  o.warmup_iterations = 0;
  o.sampling_iterations = 2;
  o.compressed_iterations = 20;
  o.patience = 3;
  gradiveq_schedule s(o);
  run(s, 2);
  CHECK(!s.advance(3, 4).ended_early);
  CHECK(!s.advance(3, 4).ended_early);
  CHECK(!s.advance(1, 4).ended_early);  // run broken
  CHECK(!s.advance(3, 4).ended_early);
  CHECK(!s.advance(3, 4).ended_early);
  const auto step = s.advance(4, 4);
  CHECK(step.ended_early);
  CHECK(s.iteration() == 2 + 6);
}

TEST_CASE("schedule: adaptive cycles shorten after an early end and grow back") {
  gradiveq_schedule_options o;
  o.warmup_iterations = 0;
  o.sampling_iterations = 2;
  o.compressed_iterations = 40;
  o.min_compressed_iterations = 4;
  o.adaptive_cycles = true;
  gradiveq_schedule s(o);
  auto sample = [&] {
    while (s.phase() == gradiveq_phase::sampling) (void)s.advance();
  };
  sample();
  CHECK(s.compressed_length() == 40);
  for (int i = 0; i < 9; ++i) (void)s.advance(0, 2);
  CHECK(s.advance(2, 2).ended_early);  // ended after 10
  CHECK(s.compressed_length() == 10);
  sample();
  (void)s.advance(2, 2);  // ended after 1: floor at min_compressed_iterations
  CHECK(s.compressed_length() == 4);
  sample();
  std::size_t n = 0;
  while (s.phase() == gradiveq_phase::compressed) {
    (void)s.advance(0, 2);
    ++n;
  }
  CHECK(n == 4);
  CHECK(s.compressed_length() == 8);  // full cycle: doubles
  sample();
  for (int i = 0; i < 8; ++i) (void)s.advance(0, 2);
  CHECK(s.compressed_length() == 16);
  sample();
  for (int i = 0; i < 16; ++i) (void)s.advance(0, 2);
  sample();
  for (int i = 0; i < 32; ++i) (void)s.advance(0, 2);
  CHECK(s.compressed_length() == 40);  // capped at L_c

  // Without the option L_c never changes.
  o.adaptive_cycles = false;
  gradiveq_schedule f(o);
  (void)f.advance();
  (void)f.advance();
  (void)f.advance(2, 2);
  CHECK(f.compressed_length() == 40);
}

TEST_CASE("schedule: the eq. 7 monitor ends L_c early on drifting gradients, not on steady ones") {
  // 4 nodes, one conv-like layer of 4 slices of K = 32. During sampling the
  // gradients live in a rank-3 subspace A; in the compressed phase the
  // subspace rotates towards B by an angle growing with the iteration.
  const std::size_t K = 32, S = 4, N = 4, r = 3;
  auto direction = [&](std::size_t j, double angle, std::vector<double>& out) {
    // Column j of A rotated towards column j of B: cos(a) A_j + sin(a) B_j,
    // with A_j = e_j and B_j = e_{16 + j} (orthonormal, so the rotation keeps norms).
    out.assign(K, 0.0);
    out[j] = std::cos(angle);
    out[16 + j] = std::sin(angle);
  };
  auto gradient = [&](std::uint64_t seed, double angle, double scale) {
    std::vector<float> g(K * S);
    std::vector<double> dir;
    for (std::size_t m = 0; m < S; ++m)
      for (std::size_t j = 0; j < r; ++j) {
        direction(j, angle, dir);
        const double a = normal(seed, m * r + j) * (3.0 - double(j));
        for (std::size_t i = 0; i < K; ++i) g[m * K + i] += static_cast<float>(scale * a * dir[i]);
      }
    for (std::size_t i = 0; i < g.size(); ++i) g[i] += static_cast<float>(0.001 * normal(seed + 7777, i));
    return g;
  };

  for (bool drift : {true, false}) {
    CAPTURE(drift);
    gradiveq_schedule_options so;
    so.warmup_iterations = 2;
    so.sampling_iterations = 20;
    so.compressed_iterations = 100;
    so.stale_threshold = 0.05;  // relative eq. 7 loss
    gradiveq_schedule sched(so);
    gradiveq_options co;
    co.slice_size = K;
    co.summands = N;
    linear_compressor<> codec(K * S, co);  // every node holds an identical codec
    std::size_t compressed_done = 0;
    bool ended_early = false;
    for (std::uint64_t t = 0; t < 200 && !ended_early; ++t) {
      const auto phase = sched.phase();
      std::size_t stale = 0;
      if (phase == gradiveq_phase::sampling) {
        // The aggregated gradient (sum over nodes) is the PCA sample.
        std::vector<float> agg(K * S, 0.0f);
        for (std::size_t n = 0; n < N; ++n) {
          const auto g = gradient(t * 100 + n, 0.0, 1.0);
          for (std::size_t i = 0; i < agg.size(); ++i) agg[i] += g[i];
        }
        codec.add_sample(agg);
      } else if (phase == gradiveq_phase::compressed) {
        const double angle = drift ? 0.02 * double(sched.phase_position()) : 0.0;
        for (std::size_t n = 0; n < N; ++n) {
          const auto g = gradient(t * 100 + n, angle, 1.0);
          gradiveq_payload p;
          codec.encode(g, p);
          stale += sched.vote(codec.local_loss(g, p));
        }
        ++compressed_done;
      }
      const auto step = sched.advance(stale, N);
      if (step.fit_basis) {
        codec.fit();
        CHECK(codec.dimension() == 3);
      }
      ended_early = step.ended_early;
    }
    if (drift) {
      // sin^2(angle) of the energy leaves the basis: above 5% once angle > 0.23 rad, i.e. ~12 iterations in.
      CHECK(ended_early);
      CHECK(compressed_done > 5);
      CHECK(compressed_done < 30);
    } else {
      CHECK(!ended_early);
      CHECK(compressed_done >= 100);
    }
    MESSAGE("drift=" << drift << ": compressed iterations before the end of L_c: " << compressed_done);
  }
}

TEST_CASE("schedule: state save/restore continues identically") {
  gradiveq_schedule_options o;
  o.warmup_iterations = 3;
  o.sampling_iterations = 2;
  o.compressed_iterations = 7;
  o.patience = 2;
  o.adaptive_cycles = true;
  o.min_compressed_iterations = 2;
  gradiveq_schedule a(o);
  for (int i = 0; i < 6; ++i) (void)a.advance(i % 2, 2);
  (void)a.advance(2, 2);  // a stale run in progress
  const auto state = a.save_state();
  gradiveq_schedule b(o);
  b.restore_state(state);
  CHECK(b.save_state() == state);
  for (int i = 0; i < 40; ++i) {
    const std::size_t votes = (i * 7) % 3;
    const auto sa = a.advance(votes, 2), sb = b.advance(votes, 2);
    CHECK(sa.next == sb.next);
    CHECK(sa.fit_basis == sb.fit_basis);
    CHECK(sa.ended_early == sb.ended_early);
    CHECK(a.compressed_length() == b.compressed_length());
  }
  CHECK(a.iteration() == b.iteration());
  CHECK(a.cycle() == b.cycle());

  // Other options, corrupted bytes, a codec state: rejected, schedule unchanged.
  auto other = o;
  other.compressed_iterations = 8;
  gradiveq_schedule c(other);
  CHECK_THROWS_AS(c.restore_state(state), state_error);
  // The typed error names the option that differs; nothing is restored.
  auto mismatched_option = [&](gradiveq_schedule& x) { return test_support::mismatched_option_of(x, state); };
  CHECK(mismatched_option(c) == "compressed_iterations");
  CHECK(c.iteration() == 0);
  auto other_threshold = o;
  other_threshold.stale_threshold = 0.5;
  gradiveq_schedule e(other_threshold);
  CHECK(mismatched_option(e) == "stale_threshold");
  auto other_bits = o;
  other_bits.qsgd_bits = o.qsgd_bits + 1;
  gradiveq_schedule f(other_bits);
  CHECK(mismatched_option(f) == "qsgd_bits");
  CHECK(f.iteration() == 0);
  auto other_feedback = o;
  other_feedback.error_feedback = true;
  gradiveq_schedule g(other_feedback);
  CHECK(mismatched_option(g) == "error_feedback");
  CHECK(g.iteration() == 0);
  gradiveq_schedule d(o);
  for (std::size_t i = 0; i < state.size(); i += 5) {
    auto bad = state;
    bad[i] ^= std::byte{0x04};
    CHECK_THROWS_AS(d.restore_state(bad), gradcomp::error);
  }
  CHECK(d.iteration() == 0);
  linear_compressor<> codec(std::size_t{64});
  CHECK_THROWS_AS(d.restore_state(codec.save_state()), wire::wire_error);
}

TEST_CASE("schedule: bad input") {
  auto bad = [](auto mutate) {
    gradiveq_schedule_options o;
    mutate(o);
    CHECK_THROWS_AS(gradiveq_schedule{o}, invalid_argument_error);
  };
  bad([](auto& o) { o.sampling_iterations = 1; });
  bad([](auto& o) { o.compressed_iterations = 0; });
  bad([](auto& o) { o.patience = 0; });
  bad([](auto& o) { o.min_compressed_iterations = 0; });
  bad([](auto& o) { o.stale_threshold = -1.0; });
  bad([](auto& o) { o.stale_threshold = std::nan(""); });
  bad([](auto& o) { o.qsgd_bits = 0; });
  gradiveq_schedule s;
  CHECK_THROWS_AS((void)s.advance(3, 2), invalid_argument_error);
  CHECK_THROWS_AS((void)s.advance(0, 0), invalid_argument_error);
  CHECK(s.iteration() == 0);
}
