// schedules/rabenseifner.hpp: the all-gather's radix
// (schedule_options::allgather_radix). The steps' group sizes for every
// setting, the same bits with every radix (copies only) over both in-process
// faces, 1..17 ranks and odd lengths, packed float16 cells and the mean, the
// messages and bytes each rank sends (the cap on messages per step), the typed error for a radix that is
// not a power of two (before any message), and the cost model pricing the
// steps the schedule takes.
#include <doctest/doctest.h>

#include <gradcomp/errors.hpp>
#include <gradcomp/exchange/schedule_collectives.hpp>
#include <gradcomp/schedules.hpp>

#include <support/equality.hpp>
#include <support/ring_fixtures.hpp>
#include <support/schedule_fixtures.hpp>

#include <cstddef>
#include <vector>

using gradcomp::cost_model;
using gradcomp::cost_problem;
using gradcomp::ring_stats;
using gradcomp::schedule_kind;
using gradcomp::schedule_options;
using gradcomp::detail::schedule_allgather_radices;
using namespace gradcomp::test_support;

namespace {
using vec = std::vector<float>;
using radices = std::vector<int>;
}  // namespace

TEST_CASE("allgather_radix: the steps' group sizes multiply to p") {
  // auto (0): two steps, the larger first
  CHECK(schedule_allgather_radices(1, 0) == radices{});
  CHECK(schedule_allgather_radices(2, 0) == radices{2});
  CHECK(schedule_allgather_radices(4, 0) == radices{2, 2});
  CHECK(schedule_allgather_radices(8, 0) == radices{4, 2});
  CHECK(schedule_allgather_radices(16, 0) == radices{4, 4});
  CHECK(schedule_allgather_radices(64, 0) == radices{8, 8});
  CHECK(schedule_allgather_radices(256, 0) == radices{16, 16});
  CHECK(schedule_allgather_radices(512, 0) == radices{32, 16});
  // 2: recursive doubling
  CHECK(schedule_allgather_radices(8, 2) == radices{2, 2, 2});
  CHECK(schedule_allgather_radices(1, 2) == radices{});
  // r: steps of r, the rest in one
  CHECK(schedule_allgather_radices(32, 4) == radices{4, 4, 2});
  CHECK(schedule_allgather_radices(16, 64) == radices{16});
  for (int bad : {-2, 1, 3, 6, 12})
    CHECK_THROWS_AS(schedule_allgather_radices(16, bad), gradcomp::invalid_argument_error);
  for (int k = 0; k <= 12; ++k)
    for (int radix : {0, 2, 4, 8, 32}) {
      int product = 1;
      for (int r : schedule_allgather_radices(1 << k, radix)) {
        CHECK(r >= 2);
        product *= r;
      }
      CHECK(product == 1 << k);
    }
}

TEST_CASE("allgather_radix: every radix gives the same bits on every rank, N = 1..17, both faces") {
  for (int n = 1; n <= 17; ++n)
    for (std::size_t len : {0, 1, 7, 100, 1001})
      for (inproc_face f : {inproc_face::moving, inproc_face::zero_copy}) {
        CAPTURE(n);
        CAPTURE(len);
        CAPTURE(int(f));
        const auto x = inputs(n, len, 11 + len);
        schedule_options o{.kind = schedule_kind::rabenseifner, .chunk_elements = 8, .max_chunks = 4, .allgather_radix = 2};
        const auto doubling = run_allreduce(n, x, o, f);
        for (int r = 0; r < n; ++r) CHECK(bit_equal(doubling[std::size_t(r)], doubling[0]));
        CHECK(max_rel(doubling[0], exact_sum(x)) < 1e-5);
        for (int radix : {0, 4, 8, 16}) {
          CAPTURE(radix);
          o.allgather_radix = radix;
          const auto got = run_allreduce(n, x, o, f);
          for (int r = 0; r < n; ++r) CHECK(bit_equal(got[std::size_t(r)], doubling[0]));
        }
      }
}

TEST_CASE("allgather_radix: packed float16 cells and the mean, the same bits as doubling") {
  const int n = 8;
  auto x = inputs(n, 999, 3);
  for (auto& v : x) gradcomp::summable::round_cells(gradcomp::summable_element::float16, std::span<float>(v));
  for (bool average : {false, true}) {
    CAPTURE(average);
    std::vector<vec> got[2];
    for (int radix : {2, 0}) {
      std::vector<vec> out = x;
      gradcomp::transport::run_workers(n, [&](gradcomp::transport::inproc_endpoint& ep) {
        const gradcomp::exchange::element_adder<> add{gradcomp::summable_element::float16};
        auto z = ep.zero_copy();
        const schedule_options o{.average = average, .chunk_elements = 16, .allgather_radix = radix};
        gradcomp::detail::rabenseifner_impl(z, std::span<float>(out[std::size_t(ep.rank())]), o, add);
      });
      got[radix == 0 ? 1 : 0] = out;
    }
    for (int r = 0; r < n; ++r) CHECK(bit_equal(got[1][std::size_t(r)], got[0][0]));
    vec want = exact_sum(x);
    if (average)
      for (float& v : want) v /= float(n);
    CHECK(max_rel(got[1][0], want) < 2e-2);  // float16 rounding per halving step
  }
}

TEST_CASE("allgather_radix: each step sends the blocks held to r - 1 peers, one message each without chunks") {
  // 16 ranks, 1600 floats: blocks of 100. Halving: 4 messages (800, 400, 200, 100 floats).
  const int n = 16;
  const std::size_t len = 1600;
  const auto x = inputs(n, len, 21);
  for (int radix : {2, 4, 16, 0}) {
    CAPTURE(radix);
    std::vector<ring_stats> st;
    run_allreduce(n, x, {.kind = schedule_kind::rabenseifner, .chunk_elements = 0, .allgather_radix = radix},
                  inproc_face::zero_copy, &st);
    // all-gather messages: sum over its steps of r - 1
    std::size_t ag = 0;
    for (int r : schedule_allgather_radices(n, radix)) ag += std::size_t(r - 1);
    for (const auto& s : st) {
      CHECK(s.messages_sent == 4 + ag);
      CHECK(s.bytes_sent == 2 * (len - len / n) * sizeof(float));  // 2 (p-1)/p of the vector, any radix
    }
  }
}

TEST_CASE("allgather_radix: max_chunks caps a step's messages, shared among its r - 1 peers") {
  using gradcomp::detail::allgather_step_cap;
  CHECK(allgather_step_cap(8, 2) == 8);  // doubling: the cap per exchange, as before
  CHECK(allgather_step_cap(8, 4) == 2);
  CHECK(allgather_step_cap(8, 9) == 1);
  CHECK(allgather_step_cap(8, 16) == 1);  // at least one message per peer
  CHECK(allgather_step_cap(16, 8) == 2);
  CHECK(allgather_step_cap(0, 16) == 0);  // no cap
  // 16 ranks, blocks of 100 floats, chunks of 10 floats, at most 8 messages per step.
  const int n = 16;
  const auto x = inputs(n, 1600, 8);
  auto messages = [&](int radix) {
    std::vector<ring_stats> st;
    const auto out = run_allreduce(
        n, x, {.kind = schedule_kind::rabenseifner, .chunk_elements = 10, .max_chunks = 8, .allgather_radix = radix},
        inproc_face::zero_copy, &st);
    for (const auto& s : st) CHECK(s.messages_sent == st[0].messages_sent);
    return st[0].messages_sent;
  };
  const std::size_t doubling = messages(2);  // all-gather: 4 steps of 8 chunks (100, 200, 400, 800 floats)
  CHECK(messages(16) == doubling - 32 + 15);  // one step: 15 peers, one message each
  CHECK(messages(4) == doubling - 32 + 12);   // two steps: 3 peers x 2 chunks each
}

TEST_CASE("allgather_radix: a radix that is not a power of two is an invalid_argument_error on every rank") {
  const auto x = inputs(4, 100, 1);
  for (int n : {1, 4})
    CHECK_THROWS_AS(run_allreduce(n, x, {.kind = schedule_kind::rabenseifner, .allgather_radix = 3}),
                    gradcomp::invalid_argument_error);
}

TEST_CASE("cost model: Rabenseifner's all-gather priced by the steps it takes") {
  const double a = 1e-5, b = 1e-9;
  cost_model m;
  m.inter = {a, b};
  m.add_s = 2e-9;
  m.chunk_elements = 0;
  m.message_overhead_s = 0;
  const cost_problem p{.elements = 1600, .ranks = 16};
  const double halving = (a + 3200 * b + 800 * 2e-9) + (a + 1600 * b + 400 * 2e-9) + (a + 800 * b + 200 * 2e-9) +
                         (a + 400 * b + 100 * 2e-9);
  // doubling: 4 steps of 100, 200, 400, 800 floats
  m.allgather_radix = 2;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p) ==
        doctest::Approx(halving + (a + 400 * b) + (a + 800 * b) + (a + 1600 * b) + (a + 3200 * b)).epsilon(1e-12));
  // auto (4 then 4): 3 peers x 100 floats, then 3 peers x 400 floats; two latencies instead of four
  m.allgather_radix = 0;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p) ==
        doctest::Approx(halving + (a + 1200 * b) + (a + 4800 * b)).epsilon(1e-12));
  // a measured message_s is paid per peer: 4 + (3 + 3) messages against 4 + 4
  m.message_s = 1e-6;
  m.allgather_radix = 0;
  const double auto_s = gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p);
  m.allgather_radix = 2;
  const double doubling_s = gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p);
  CHECK(auto_s == doctest::Approx(halving + (a + 1200 * b) + (a + 4800 * b) + 10e-6).epsilon(1e-12));
  CHECK(doubling_s - auto_s == doctest::Approx(2 * a - 2e-6).epsilon(1e-9));
  // the compressed form doubles whatever the setting
  const cost_problem c{.elements = 1600, .ranks = 16, .wire_ratio = 0.5, .compressed = true};
  m.allgather_radix = 0;
  const double c0 = gradcomp::predict_seconds(m, schedule_kind::rabenseifner, c);
  m.allgather_radix = 2;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner, c) == c0);
}
