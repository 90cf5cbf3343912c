// ring/chunks.hpp and ring_options::chunk_elements: the compressed linear
// ring (Algorithm 1 of seed 002) with each hop's segment cut into chunks.
// The sums are element by element, so chunked and whole-segment rings give
// the same bits (fp16, bf16, dense, the homomorphic quantizer); GradiVeQ
// chunks on slice boundaries; odd sizes, chunk boundaries, the automatic
// chunk size, and errors in the middle of a segment's stream of chunks.
#include <doctest/doctest.h>

#include <gradcomp/dense.hpp>
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/half.hpp>
#include <gradcomp/homomorphic.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/fault_injection.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <support/equality.hpp>
#include <support/ring_fixtures.hpp>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using gradcomp::ring_options;
using gradcomp::ring_stats;
using gradcomp::transport::fault_injecting;
using gradcomp::transport::fault_plan;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::run_workers;
namespace faults = gradcomp::transport::faults;
using namespace gradcomp::test_support;

namespace {

using vec = std::vector<float>;

// Runs ring_allreduce_linear on n workers, each with make(rank) as its codec
// and the given options; returns every rank's result and stats.
template <class Make>
std::pair<std::vector<vec>, std::vector<ring_stats>> run_ring(int n, const std::vector<vec>& x, Make make,
                                                               const ring_options& o) {
  std::vector<vec> out = x;
  std::vector<ring_stats> st(static_cast<std::size_t>(n));
  run_workers(n, [&](inproc_endpoint& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    auto c = make(ep.rank());
    st[r] = gradcomp::ring_allreduce_linear(ep, c, std::span<float>(out[r]), o);
  }, {.recv_timeout = 60s});
  return {out, st};
}

ring_options chunks_of(std::size_t e, bool average = false) {
  ring_options o;
  o.chunk_elements = e;
  o.average = average;
  return o;
}

}  // namespace

TEST_CASE("chunk plan: chunks start on the granularity, cover each segment, a short last piece joins its chunk") {
  using gradcomp::detail::ring_chunk_plan;
  const std::vector<std::size_t> b{0, 100, 200, 305};
  SUBCASE("granularity 1") {
    const ring_chunk_plan p(b, 1, 30);
    CHECK(p.count(0) == 4);  // 0 30 60 90 100
    CHECK(p.begin(0, 3) == 90);
    CHECK(p.end(0, 3) == 100);
    CHECK(p.count(2) == 4);  // 200 230 260 290 305
    CHECK(p.size(2, 3) == 15);
  }
  SUBCASE("granularity 16: chunks of 32, the 9-element tail joins the last chunk") {
    const ring_chunk_plan p(std::vector<std::size_t>{0, 96, 201}, 16, 20);
    CHECK(p.count(0) == 3);
    CHECK(p.begin(0, 1) == 32);
    CHECK(p.count(1) == 3);  // 96 128 160 201 (160 + 32 = 192 leaves 9 < 16)
    CHECK(p.end(1, 2) == 201);
  }
  SUBCASE("granularity 0 or a chunk at least the largest segment: whole segments") {
    CHECK(ring_chunk_plan(b, 0, 10).count(1) == 1);
    CHECK(ring_chunk_plan(b, 1, 105).count(2) == 1);
    CHECK(ring_chunk_plan(b, 1, gradcomp::ring_whole_segments).count(0) == 1);
  }
  SUBCASE("empty segments: one empty chunk") {
    const ring_chunk_plan p(std::vector<std::size_t>{0, 0, 3}, 1, 1);
    CHECK(p.count(0) == 1);
    CHECK(p.size(0, 0) == 0);
    CHECK(p.count(1) == 3);
  }
  SUBCASE("automatic: whole up to 131,072 elements, else about 16 chunks") {
    CHECK(gradcomp::ring_auto_chunk_elements(1000) == 131072);
    CHECK(ring_chunk_plan(std::vector<std::size_t>{0, 131072, 262144}, 1, 0).count(0) == 1);
    const ring_chunk_plan big(std::vector<std::size_t>{0, 2000000, 4000000}, 1, 0);
    CHECK(big.count(0) == 16);
    CHECK(big.end(1, 15) == 4000000);
  }
}

TEST_CASE("chunked fp16 / bf16 ring: the same bits as whole segments, odd sizes and chunk boundaries") {
  for (int n : {2, 3, 4, 5})
    for (std::size_t len : {std::size_t(1), std::size_t(n + 1), std::size_t(97), std::size_t(1001), std::size_t(4099)})
      for (std::size_t chunk : {std::size_t(1), std::size_t(7), std::size_t(64), std::size_t(333)})
        for (bool bf : {false, true}) {
          CAPTURE(n);
          CAPTURE(len);
          CAPTURE(chunk);
          CAPTURE(bf);
          const auto x = inputs(n, len, 5 + len, 50.0f);
          auto run = [&](std::size_t e) {
            if (bf) return run_ring(n, x, [](int) { return gradcomp::bf16_codec<>{}; }, chunks_of(e));
            return run_ring(n, x, [](int) { return gradcomp::fp16_codec<>{}; }, chunks_of(e));
          };
          const auto [whole, ws] = run(gradcomp::ring_whole_segments);
          const auto [chunked, cs] = run(chunk);
          for (int r = 0; r < n; ++r) {
            CHECK(bit_equal(chunked[std::size_t(r)], whole[0]));
            CHECK(bit_equal(whole[std::size_t(r)], whole[0]));
          }
          // Messages: one per chunk of each segment sent (2(N-1) segments).
          const gradcomp::ring_schedule ring(0, n, len);
          std::size_t chunks_total = 0;
          for (int j = 0; j < n; ++j)
            chunks_total += ring.size(j) == 0 ? 1 : (ring.size(j) + chunk - 1) / chunk;
          std::size_t sent = 0, whole_sent = 0;
          for (int r = 0; r < n; ++r) {
            sent += cs[std::size_t(r)].messages_sent;
            whole_sent += ws[std::size_t(r)].messages_sent;
          }
          CHECK(whole_sent == std::size_t(2 * n * (n - 1)));
          CHECK(sent == 2 * std::size_t(n - 1) * chunks_total);
        }
}

TEST_CASE("chunked dense ring equals the plain ring bit for bit, sum and mean") {
  for (int n : {2, 3, 7})
    for (std::size_t len : {std::size_t(5), std::size_t(1001), std::size_t(3000)})
      for (bool average : {false, true}) {
        CAPTURE(n);
        CAPTURE(len);
        CAPTURE(average);
        auto plain = inputs(n, len, 11 + len, 100.0f);
        std::vector<vec> want = plain;
        run_workers(n, [&](inproc_endpoint& ep) {
          gradcomp::ring_allreduce(ep, want[std::size_t(ep.rank())], {.average = average});
        });
        const auto [got, st] = run_ring(n, plain, [](int) { return gradcomp::dense_codec<>{}; }, chunks_of(13, average));
        for (int r = 0; r < n; ++r) CHECK(bit_equal(got[std::size_t(r)], want[std::size_t(r)]));
      }
}

TEST_CASE("chunked homomorphic ring: the same bits as whole segments (chunks on scale blocks)") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    const std::size_t len = 5000;
    const auto x = inputs(n, len, 77, 1.0f);
    auto make = [&](int r) {
      return gradcomp::homomorphic_quantizer<>({.block_size = 64, .seed = 9, .worker = std::size_t(r)}, std::size_t(n));
    };
    const auto [whole, ws] = run_ring(n, x, make, chunks_of(gradcomp::ring_whole_segments));
    const auto [chunked, cs] = run_ring(n, x, make, chunks_of(100));  // rounded up to 128: two blocks
    for (int r = 0; r < n; ++r) CHECK(bit_equal(chunked[std::size_t(r)], whole[0]));
    CHECK(cs[0].messages_sent > ws[0].messages_sent);
  }
}

TEST_CASE("chunked GradiVeQ ring: chunks of whole slices (the tail in the last), identical on every rank") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    const low_rank_layer layer(16, 3, 16 * 50 + 5, 41);  // a 5-element tail
    const auto codec = fitted_codec(layer, std::size_t(n));
    const auto x = rank_samples(layer, n, 7);
    auto make = [&](int) { return codec; };
    const auto [whole, ws] = run_ring(n, x, make, chunks_of(gradcomp::ring_whole_segments));
    for (std::size_t chunk : {std::size_t(1), std::size_t(20), std::size_t(48)}) {
      CAPTURE(chunk);
      const auto [chunked, cs] = run_ring(n, x, make, chunks_of(chunk));
      for (int r = 0; r < n; ++r) CHECK(bit_equal(chunked[std::size_t(r)], chunked[0]));
      // Each slice is compressed on its own (eq. 3) and the sums are per
      // coefficient (eq. 4): chunking changes no value beyond the GEMM's rounding.
      CHECK(rel_error(chunked[0], whole[0]) < 1e-5);
      CHECK(cs[0].messages_sent > ws[0].messages_sent);
      CHECK(cs[0].encodes > std::size_t(n));
    }
  }
}

TEST_CASE("chunked ring: a corrupted or truncated chunk in the middle of a segment is a typed error, not a hang") {
  const int n = 3;
  const std::size_t len = 3001;
  const auto x = inputs(n, len, 3, 1.0f);
  for (int mode = 0; mode < 3; ++mode)
    for (std::uint64_t which : {1u, 5u, 12u}) {  // chunks of the first segment, of a later hop, of the all-gather
      CAPTURE(mode);
      CAPTURE(which);
      const auto t0 = std::chrono::steady_clock::now();
      bool typed = false;
      std::string what;
      try {
        run_workers(n, [&](inproc_endpoint& ep) {
          fault_plan plan(which + 7);
          if (ep.rank() == 1) {
            if (mode == 0) plan.flip_random_bits(faults::nth_send(which), 1);
            if (mode == 1) plan.truncate(faults::nth_send(which), 20);
            if (mode == 2) plan.truncate(faults::nth_send(which), 100);
          }
          fault_injecting<inproc_endpoint> t(ep, plan);
          gradcomp::fp16_codec<> c;
          vec v = x[std::size_t(ep.rank())];
          gradcomp::ring_allreduce_linear(t, c, std::span<float>(v), chunks_of(200));  // 5 chunks per segment
        }, {.recv_timeout = 5s});
      } catch (const gradcomp::wire::wire_error& e) {
        typed = true;
        what = e.what();
      } catch (const gradcomp::size_mismatch_error& e) {
        typed = true;
        what = e.what();
      } catch (const gradcomp::transport_error& e) {
        typed = true;
        what = e.what();
      }
      CAPTURE(what);
      CHECK(typed);
      CHECK(std::chrono::steady_clock::now() - t0 < 30s);
    }
}

TEST_CASE("chunked ring: the error names the chunk") {
  const int n = 2;
  const std::size_t len = 1000;
  const auto x = inputs(n, len, 4, 1.0f);
  std::string what;
  try {
    run_workers(n, [&](inproc_endpoint& ep) {
      fault_plan plan(1);
      if (ep.rank() == 0) plan.flip_random_bits(faults::nth_send(2), 1);
      fault_injecting<inproc_endpoint> t(ep, plan);
      gradcomp::fp16_codec<> c;
      vec v = x[std::size_t(ep.rank())];
      gradcomp::ring_allreduce_linear(t, c, std::span<float>(v), chunks_of(100));
    }, {.recv_timeout = 5s});
  } catch (const gradcomp::wire::wire_error& e) {
    what = e.what();
  } catch (const gradcomp::transport_error&) {
  }
  CAPTURE(what);
  CHECK(what.find("chunk 2 of 5") != std::string::npos);
}

TEST_CASE("automatic chunks: about 16 per large segment for fp16 and GradiVeQ") {
  const int n = 2;
  const std::size_t len = 600000;  // segments of 300,000: chunks of 131,072 (the automatic minimum), 3 per segment
  const auto x = inputs(n, len, 8, 1.0f);
  const auto [autom, as] = run_ring(n, x, [](int) { return gradcomp::fp16_codec<>{}; }, ring_options{});
  const auto [whole, ws] = run_ring(n, x, [](int) { return gradcomp::fp16_codec<>{}; },
                                    chunks_of(gradcomp::ring_whole_segments));
  CHECK(as[0].messages_sent == 6);
  CHECK(ws[0].messages_sent == 2);
  for (int r = 0; r < n; ++r) CHECK(bit_equal(autom[std::size_t(r)], whole[0]));
  const low_rank_layer layer(16, 2, 16 * 8, 3);
  const auto gq = fitted_codec(layer, 2);
  // Since issue 21 GradiVeQ's segments are chunked too (its seq kernels are
  // per slice and single-threaded: same bits, tests/unit/test_gradiveq_kernels.cpp).
  CHECK(gradcomp::ring_segmentation<gradcomp::linear_compressor<>>::auto_chunk_elements(gq, 10000000) ==
        gradcomp::ring_auto_chunk_elements(10000000));
  CHECK(gradcomp::ring_segmentation<gradcomp::fp16_codec<>>::auto_chunk_elements(gradcomp::fp16_codec<>{}, 10000000) ==
        gradcomp::ring_auto_chunk_elements(10000000));
}
