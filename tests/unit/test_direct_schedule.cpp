// schedules/direct.hpp: the direct (pairwise-exchange) all-reduce over the
// in-process transport, 1..8 ranks, odd counts, lengths below N, chunked and
// not: identical bits on every rank, the sum within float tolerance, the
// mean, its traffic; and its price in the cost model (opt-in).
#include <doctest/doctest.h>

#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <support/equality.hpp>
#include <support/ring_fixtures.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <vector>

using namespace std::chrono_literals;
using gradcomp::schedule_kind;
using gradcomp::schedule_options;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::run_workers;
using namespace gradcomp::test_support;

namespace {

using vec = std::vector<float>;

std::vector<vec> run_direct(int n, const std::vector<vec>& x, schedule_options o, std::vector<gradcomp::ring_stats>* st = nullptr) {
  std::vector<vec> out = x;
  if (st) st->assign(std::size_t(n), {});
  run_workers(n, [&](inproc_endpoint& ep) {
    const auto s = gradcomp::allreduce(ep, out[std::size_t(ep.rank())], o);
    if (st) (*st)[std::size_t(ep.rank())] = s;
  }, {.recv_timeout = 60s});
  return out;
}

}  // namespace

TEST_CASE("direct schedule: sums, bit-identical on every rank, N = 1..8, all lengths, chunked or not") {
  for (int n = 1; n <= 8; ++n)
    for (std::size_t len : {0, 1, 2, 3, 5, 7, 8, 13, 64, 257, 1000, 4099})
      for (std::size_t chunk : {std::size_t(0), std::size_t(3), std::size_t(32768)}) {
        CAPTURE(n);
        CAPTURE(len);
        CAPTURE(chunk);
        const auto x = inputs(n, len, 11 + len);
        const auto out = run_direct(n, x, {.kind = schedule_kind::direct, .chunk_elements = chunk});
        const vec truth = exact_sum(x);
        for (int r = 0; r < n; ++r) CHECK(bit_equal(out[std::size_t(r)], out[0]));
        CHECK(max_rel(out[0], truth) < 1e-5);
      }
}

TEST_CASE("direct schedule: the mean, the same bits whatever the chunk, and 2(N-1)/N of the vector sent") {
  const int n = 5;
  const std::size_t len = 1003;
  const auto x = inputs(n, len, 3);
  std::vector<gradcomp::ring_stats> st;
  const auto a = run_direct(n, x, {.kind = schedule_kind::direct, .average = true, .chunk_elements = 0}, &st);
  const auto b = run_direct(n, x, {.kind = schedule_kind::direct, .average = true, .chunk_elements = 7});
  CHECK(bit_equal(a[0], b[0]));
  vec mean = exact_sum(x);
  for (auto& v : mean) v /= float(n);
  CHECK(max_rel(a[0], mean) < 1e-5);
  // Rank 0 sends the 4 other segments (the vector less its own) and its own segment 4 times.
  const gradcomp::ring_schedule split(0, n, len);
  CHECK(st[0].bytes_sent == sizeof(float) * ((len - split.size(0)) + std::size_t(n - 1) * split.size(0)));
  CHECK(st[0].messages_sent == std::size_t(2 * (n - 1)));
  CHECK(gradcomp::parse_schedule_kind("direct") == schedule_kind::direct);
  CHECK(std::string(gradcomp::to_string(schedule_kind::direct)) == "direct");
}

TEST_CASE("cost model: the direct schedule is priced only on request, two phases of one link's worth") {
  gradcomp::cost_model m;
  m.inter = {1e-5, 1e-9};
  m.intra = m.inter;
  m.add_s = 1e-9;
  m.chunk_elements = 0;
  const gradcomp::cost_problem p{.elements = 1000, .ranks = 4};
  CHECK(std::isinf(gradcomp::predict_seconds(m, schedule_kind::direct, p)));
  m.price_direct = true;
  // Each rank sends and receives 750 floats per phase, adds 750 in the first.
  const double want = (1e-5 + 3000e-9 + 750e-9) + (1e-5 + 3000e-9);
  CHECK(gradcomp::predict_seconds(m, schedule_kind::direct, p) == doctest::Approx(want).epsilon(1e-12));
  // Two latency steps against Rabenseifner's four: small messages go direct.
  CHECK(gradcomp::predict(m, p).best == schedule_kind::direct);
  // Chunks do not hide the additions of the direct schedule (the N-1 copies arrive together).
  m.chunk_elements = 100;
  m.message_overhead_s = 0;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::direct, p) == doctest::Approx(want).epsilon(1e-12));
  gradcomp::cost_problem c = p;
  c.compressed = true;
  CHECK(std::isinf(gradcomp::predict_seconds(m, schedule_kind::direct, c)));
}
