// schedules/direct.hpp: the direct (pairwise-exchange) all-reduce over the
// in-process transport, 1..8 ranks, odd counts, lengths below N, chunked and
// not: identical bits on every rank, the sum within float tolerance, the
// mean, its traffic; and its price in the cost model (opt-in).
#include <doctest/doctest.h>

#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <support/equality.hpp>
#include <support/ring_fixtures.hpp>
#include <support/schedule_fixtures.hpp>

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

using vec = std::vector<float>;

TEST_CASE("direct schedule: sums, bit-identical on every rank, N = 1..8, all lengths, chunked or not") {
  for (int n = 1; n <= 8; ++n)
    for (std::size_t len : {0, 1, 2, 3, 5, 7, 8, 13, 64, 257, 1000, 4099})
      for (std::size_t chunk : {std::size_t(0), std::size_t(3), std::size_t(32768)}) {
        CAPTURE(n);
        CAPTURE(len);
        CAPTURE(chunk);
        const auto x = inputs(n, len, 11 + len);
        const auto out = run_allreduce(n, x, {.kind = schedule_kind::direct, .chunk_elements = chunk});
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
  const auto a = run_allreduce(n, x, {.kind = schedule_kind::direct, .average = true, .chunk_elements = 0}, inproc_face::moving, &st);
  const auto b = run_allreduce(n, x, {.kind = schedule_kind::direct, .average = true, .chunk_elements = 7});
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

TEST_CASE("direct schedule: one reduce-scatter message per peer, the all-gather chunked; copies cut at the cap, same bits") {
  // 5 ranks, 1003 floats: segments of 200-201; chunks of 7 floats grow to 26 to keep to
  // max_chunks = 8 in the all-gather, and the copies go whole: (N-1) + (N-1) x 8 messages.
  {
    const int n = 5;
    std::vector<gradcomp::ring_stats> st;
    (void)run_allreduce(n, inputs(n, 1003, 3), {.kind = schedule_kind::direct, .chunk_elements = 7}, inproc_face::moving, &st);
    for (const auto& s : st) CHECK(s.messages_sent == std::size_t((n - 1) + (n - 1) * 8));
  }
  // A copy longer than the cap goes as several messages; the all-gather's chunks then add
  // pieces of them (a chunk may straddle two): the same bits as whole copies, every chunk size.
  for (int n : {2, 3, 5, 7})
    for (std::size_t len : {std::size_t(1), std::size_t(13), std::size_t(257), std::size_t(1003)})
      for (std::size_t chunk : {std::size_t(0), std::size_t(3), std::size_t(7), std::size_t(64)})
        for (std::size_t cap : {std::size_t(1), std::size_t(5), std::size_t(17), std::size_t(100)}) {
          CAPTURE(n);
          CAPTURE(len);
          CAPTURE(chunk);
          CAPTURE(cap);
          const auto x = inputs(n, len, 7 + len);
          const schedule_options o{.kind = schedule_kind::direct, .chunk_elements = chunk, .max_chunks = 0};
          const auto whole = run_allreduce(n, x, o);
          std::vector<vec> cut = x;
          std::vector<gradcomp::ring_stats> st(static_cast<std::size_t>(n));
          run_workers(n, [&](inproc_endpoint& ep) {
            gradcomp::float_adder<gradcomp::execution::seq> add;
            st[std::size_t(ep.rank())] = gradcomp::detail::direct_impl(ep, std::span<float>(cut[std::size_t(ep.rank())]), o, add, cap);
          }, {.recv_timeout = 60s});
          for (int r = 0; r < n; ++r) CHECK(bit_equal(cut[std::size_t(r)], whole[0]));
          // rank 0: ceil(segment / cap) copies to each peer, then its own segment's chunks to each
          const gradcomp::ring_schedule split(0, n, len);
          std::size_t copies = 0;
          for (int j = 1; j < n; ++j) copies += (split.size(j) + cap - 1) / cap;
          CHECK(st[0].messages_sent == copies + std::size_t(n - 1) * gradcomp::detail::link_chunks(split.size(0), chunk));
        }
}

TEST_CASE("direct and Rabenseifner: a workspace kept across calls gives the same bits and grows only") {
  const int n = 5;
  for (schedule_kind kind : {schedule_kind::direct, schedule_kind::rabenseifner}) {
    CAPTURE(gradcomp::to_string(kind));
    std::vector<gradcomp::schedule_workspace> ws(static_cast<std::size_t>(n));  // one per rank (thread)
    for (std::size_t len : {std::size_t(4099), std::size_t(13), std::size_t(20000)}) {
      CAPTURE(len);
      const auto x = inputs(n, len, 5 + len);
      const auto fresh = run_allreduce(n, x, {.kind = kind, .chunk_elements = 64});
      std::vector<vec> kept = x;
      run_workers(n, [&](inproc_endpoint& ep) {
        schedule_options o{.kind = kind, .chunk_elements = 64};
        o.workspace = &ws[std::size_t(ep.rank())];
        gradcomp::allreduce(ep, kept[std::size_t(ep.rank())], o);
      }, {.recv_timeout = 60s});
      for (int r = 0; r < n; ++r) CHECK(bit_equal(kept[std::size_t(r)], fresh[std::size_t(r)]));
    }
    // Sized by the largest call so far (20000 floats; direct: a segment per peer).
    const auto capacities = [&] {
      std::vector<std::size_t> c;
      for (const auto& w : ws) c.push_back(w.capacity());
      return c;
    };
    const std::vector<std::size_t> held = capacities();
    CHECK(*std::max_element(held.begin(), held.end()) >= std::size_t(4 * (20000 / n)));
    run_workers(n, [&](inproc_endpoint& ep) {
      schedule_options o{.kind = kind};
      o.workspace = &ws[std::size_t(ep.rank())];
      vec small(10, 1.0f);
      gradcomp::allreduce(ep, small, o);
      CHECK(small[0] == float(n));
    }, {.recv_timeout = 60s});
    CHECK(capacities() == held);
  }
  // A copy holds no capacity (a workspace carries no value).
  gradcomp::schedule_workspace a;
  (void)a.floats(100);
  const gradcomp::schedule_workspace b = a;
  CHECK(a.capacity() == 100);
  CHECK(b.capacity() == 0);
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
  // Chunks hide the additions behind the all-gather, all but the first chunk's (the N-1 copies
  // arrive together, so the first phase hides none): segments of 250 floats in 3 chunks.
  m.chunk_elements = 100;
  m.message_overhead_s = 0;
  const double chunked = (1e-5 + 3000e-9) + (1e-5 + 250e-9 + 3000e-9);
  CHECK(gradcomp::predict_seconds(m, schedule_kind::direct, p) == doctest::Approx(chunked).epsilon(1e-12));
  // Additions slower than the wire: the wire then hides nothing more than its own time.
  m.add_s = 1e-8;
  const double slow = (1e-5 + 3000e-9) + (1e-5 + 2500e-9 + 5000e-9);
  CHECK(gradcomp::predict_seconds(m, schedule_kind::direct, p) == doctest::Approx(slow).epsilon(1e-12));
  m.add_s = 1e-9;
  // A measured per-message cost: one copy to each of the 3 peers, then 3 chunks to each.
  m.message_s = 1e-6;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::direct, p) == doctest::Approx(chunked + 12e-6).epsilon(1e-12));
  m.message_s = 0;
  // A codec's payloads (direct_allreduce_linear): whole blocks, the sums before the all-gather, plus encode and decode.
  gradcomp::cost_problem c = p;
  c.compressed = true;
  c.wire_ratio = 0.25;
  c.encode_s = 2e-9;
  c.decode_s = 1e-9;
  const double compressed = (1e-5 + 750e-9) + (1e-5 + 187.5e-9 + 750e-9) + 3000e-9;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::direct, c) == doctest::Approx(compressed).epsilon(1e-12));
}
