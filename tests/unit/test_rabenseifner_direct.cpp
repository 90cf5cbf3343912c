// schedules/rabenseifner.hpp, rabenseifner_direct_allreduce: Rabenseifner's
// recursive halving followed by a direct all-gather, over the in-process
// transport (both faces), 1..8 ranks (folded pairs for N not a power of
// two), lengths below N: the same bits as Rabenseifner's all-reduce (the same
// additions on the same owners; only the all-gather differs), on every rank;
// the mean; its traffic and messages; and its price in the cost model
// (opt-in, with the direct schedule).
#include <doctest/doctest.h>

#include <support/equality.hpp>
#include <support/ring_fixtures.hpp>
#include <support/schedule_fixtures.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

using gradcomp::schedule_kind;
using namespace gradcomp::test_support;
using vec = std::vector<float>;


TEST_CASE("rabenseifner_direct: Rabenseifner's bits on every rank, N = 1..8, all lengths, both faces, chunked or not") {
  for (int n = 1; n <= 8; ++n)
    for (std::size_t len : {std::size_t(0), std::size_t(1), std::size_t(5), std::size_t(97), std::size_t(1000)})
      for (std::size_t chunk : {std::size_t(0), std::size_t(7), std::size_t(32768)})
        for (inproc_face face : {inproc_face::moving, inproc_face::zero_copy}) {
          CAPTURE(n);
          CAPTURE(len);
          CAPTURE(chunk);
          CAPTURE(int(face));
          const auto x = inputs(n, len, 11);
          const auto rab = run_allreduce(n, x, {.kind = schedule_kind::rabenseifner, .chunk_elements = chunk}, face);
          const auto out = run_allreduce(n, x, {.kind = schedule_kind::rabenseifner_direct, .chunk_elements = chunk}, face);
          const auto want = exact_sum(x);
          for (int r = 0; r < n; ++r) {
            CHECK(bit_equal(out[std::size_t(r)], rab[0]));
            if (len > 0) CHECK(rel_error(out[std::size_t(r)], want) < 1e-5);
          }
        }
}

TEST_CASE("rabenseifner_direct: the mean, and what a rank sends: Rabenseifner's bytes, one all-gather message per peer") {
  for (int n : {4, 6, 8}) {
    CAPTURE(n);
    const std::size_t len = 4096;
    const auto x = inputs(n, len, 5);
    std::vector<gradcomp::ring_stats> rs, ds;
    const auto rab = run_allreduce(n, x, {.kind = schedule_kind::rabenseifner, .average = true, .chunk_elements = 0}, inproc_face::moving, &rs);
    const auto out =
        run_allreduce(n, x, {.kind = schedule_kind::rabenseifner_direct, .average = true, .chunk_elements = 0},
                      inproc_face::moving, &ds);
    for (int r = 0; r < n; ++r) CHECK(bit_equal(out[std::size_t(r)], rab[0]));
    // The same bytes (2 (p-1)/p of the vector, plus the folds); the all-gather as p - 1
    // messages instead of log2 p.
    const int p = n == 6 ? 4 : n, steps = p == 4 ? 2 : 3;
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(ds[std::size_t(r)].bytes_sent == rs[std::size_t(r)].bytes_sent);
      const bool folded_out = r < 2 * (n - p) && r % 2 == 0;
      if (!folded_out)
        CHECK(ds[std::size_t(r)].messages_sent == rs[std::size_t(r)].messages_sent - std::size_t(steps) + std::size_t(p - 1));
    }
  }
}

TEST_CASE("rabenseifner_direct: a rank whose length differs is a transport_error, not a hang") {
  std::vector<vec> x = inputs(4, 100, 3);
  x[2].resize(90);
  CHECK_THROWS_AS(run_allreduce(4, x, {.kind = schedule_kind::rabenseifner_direct}), gradcomp::transport_error);
}

TEST_CASE("rabenseifner_direct: its name, and no compressed form") {
  CHECK(gradcomp::parse_schedule_kind("rabenseifner_direct") == schedule_kind::rabenseifner_direct);
  CHECK(std::string(gradcomp::to_string(schedule_kind::rabenseifner_direct)) == "rabenseifner_direct");
  CHECK(gradcomp::schedule_kind_count == 7);
}

TEST_CASE("cost model: rabenseifner_direct is priced with direct, Rabenseifner's halving plus one all-gather step") {
  gradcomp::cost_model m;
  m.inter = {1e-5, 1e-9};
  m.intra = m.inter;
  m.add_s = 1e-9;
  m.chunk_elements = 0;
  m.message_overhead_s = 0;
  const gradcomp::cost_problem p{.elements = 1000, .ranks = 4};
  CHECK(std::isinf(gradcomp::predict_seconds(m, schedule_kind::rabenseifner_direct, p)));
  m.price_direct = true;
  // Halving: 500 then 250 floats sent and added; the all-gather: 750 floats in one step.
  const double halving = (1e-5 + 2000e-9 + 500e-9) + (1e-5 + 1000e-9 + 250e-9);
  const double want = halving + 1e-5 + 3000e-9;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner_direct, p) == doctest::Approx(want).epsilon(1e-12));
  // Rabenseifner's doubling takes two steps where this takes one.
  const double rab = gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p);
  CHECK(rab - gradcomp::predict_seconds(m, schedule_kind::rabenseifner_direct, p) == doctest::Approx(1e-5).epsilon(1e-9));
  // A measured per-message cost: the all-gather's 3 messages, one per halving step.
  m.message_s = 1e-6;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner_direct, p) == doctest::Approx(want + 5e-6).epsilon(1e-12));
  // Not a power of two: the fold (the whole vector sent and added) and the unfold.
  m.message_s = 0;
  const gradcomp::cost_problem five{.elements = 1000, .ranks = 5};
  const double fold = (1e-5 + 4000e-9 + 1000e-9) + (1e-5 + 4000e-9);
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner_direct, five) == doctest::Approx(fold + want).epsilon(1e-12));
  gradcomp::cost_problem c = p;
  c.compressed = true;
  CHECK(std::isinf(gradcomp::predict_seconds(m, schedule_kind::rabenseifner_direct, c)));
}
