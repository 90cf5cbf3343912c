// ring_allreduce.hpp, compressed forms: Algorithm 1 of seed 002 over GradiVeQ
// and dense_codec, the decode-add-re-encode and all-gather baselines over
// two-bit, QSGD and the sparsifier, bit-identical results, statistics, and
// bad input / bad networks (corrupted, truncated, mismatched segments, dead
// peers): typed errors, never a hang. Runs under TSan in CI.
#include <doctest/doctest.h>

#include <gradcomp/dense.hpp>
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/half.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/transport/emulated_link.hpp>
#include <gradcomp/transport/fault_injection.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <gradcomp/two_bit.hpp>
#include <gradcomp/detail/random.hpp>

#include <support/equality.hpp>
#include <support/ring_fixtures.hpp>
#include <support/wire_checks.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using gradcomp::dense_codec;
using gradcomp::gradiveq_options;
using gradcomp::gradiveq_payload;
using gradcomp::linear_compressor;
using gradcomp::ring_options;
using gradcomp::ring_stats;
using gradcomp::transport::fault_injecting;
using gradcomp::transport::fault_plan;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::run_workers;
namespace faults = gradcomp::transport::faults;

static_assert(gradcomp::SegmentedCodec<linear_compressor<>>);
static_assert(!gradcomp::SegmentedCodec<dense_codec<>>);
static_assert(gradcomp::LinearCodec<linear_compressor<>> && gradcomp::LinearCodec<dense_codec<>>);

namespace {

using vec = std::vector<float>;

// bit_equal, inputs (rank r: counter_gaussian(len, seed * 131 + r)), exact_sum, rel_error,
// low_rank_layer, fitted_codec, rank_samples, compressed_domain_sum.
using namespace gradcomp::test_support;

// Runs `fn(rank, transport)` on n in-process workers, each with its stats slot.
template <class Fn>
void on_ring(int n, Fn fn, std::chrono::nanoseconds timeout = 60s) {
  run_workers(n, [&](inproc_endpoint& ep) { fn(ep.rank(), ep); }, {.recv_timeout = timeout});
}

}  // namespace

// ---------------------------------------------------------------------------
// Algorithm 1 (LinearCodec)

TEST_CASE("linear ring: dense_codec equals the plain ring bit for bit, sum and mean, N = 1..8, many lengths") {
  for (int n = 1; n <= 8; ++n)
    for (std::size_t len : {std::size_t(0), std::size_t(1), std::size_t(n - 1), std::size_t(n + 1), std::size_t(97),
                            std::size_t(1001)})
      for (bool average : {false, true}) {
        CAPTURE(n);
        CAPTURE(len);
        CAPTURE(average);
        auto plain = inputs(n, len, 17 + len, 100.0f);  // wide exponents: rounding depends on the order
        auto compressed = plain;
        on_ring(n, [&](int r, inproc_endpoint& ep) {
          gradcomp::ring_allreduce(ep, plain[std::size_t(r)], {.average = average});
          dense_codec<> c;
          const ring_stats st = gradcomp::ring_allreduce_linear(ep, c, compressed[std::size_t(r)], {.average = average});
          CHECK(st.messages_sent == std::size_t(2 * (n - 1)));
          CHECK(st.encodes == static_cast<std::size_t>(n));
          CHECK(st.decodes == static_cast<std::size_t>(n));
        });
        for (int r = 0; r < n; ++r) CHECK(bit_equal(compressed[std::size_t(r)], plain[std::size_t(r)]));
      }
}

TEST_CASE("linear ring: uncompressed (dense) result equals the exact sum for integer-valued inputs") {
  for (int n : {2, 3, 5, 8}) {
    CAPTURE(n);
    const std::size_t len = 333;
    std::vector<vec> x(static_cast<std::size_t>(n), vec(len));
    vec want(len, 0.0f);
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < len; ++i) {
        x[std::size_t(r)][i] = float(int((i * 7 + std::size_t(r) * 13) % 101) - 50);
        want[i] += x[std::size_t(r)][i];
      }
    on_ring(n, [&](int r, inproc_endpoint& ep) {
      dense_codec<> c;
      gradcomp::ring_allreduce(ep, c, x[std::size_t(r)]);  // dispatches to the linear form
    });
    for (int r = 0; r < n; ++r) CHECK(x[std::size_t(r)] == want);
  }
}

TEST_CASE("linear ring: GradiVeQ result == decode(sum of encodes) on every node, bit-identical, N = 1..8, tails") {
  for (int n = 1; n <= 8; ++n)
    for (std::size_t tail : {std::size_t(0), std::size_t(5)}) {
      const std::size_t K = 16, slices = std::size_t(3 * n + 1);  // uneven slices per segment
      const low_rank_layer layer(K, 3, slices * K + tail, 40 + std::uint64_t(n));
      CAPTURE(n);
      CAPTURE(tail);
      const auto codec = fitted_codec(layer, static_cast<std::size_t>(n));
      std::vector<vec> x = rank_samples(layer, n, 5000);
      // Reference: encode each whole layer, sum in the compressed domain, decode once.
      gradiveq_payload acc;
      const vec reference = compressed_domain_sum(codec, x, &acc);
      const vec truth = exact_sum(x);

      std::vector<std::size_t> own_bytes(static_cast<std::size_t>(n)), sent(static_cast<std::size_t>(n));
      on_ring(n, [&](int r, inproc_endpoint& ep) {
        auto mine = codec;  // every node holds the same basis
        const auto st = gradcomp::ring_allreduce_linear(ep, mine, x[std::size_t(r)]);
        own_bytes[std::size_t(r)] = st.own_encoded_bytes;
        sent[std::size_t(r)] = st.bytes_sent;
      });
      for (int r = 0; r < n; ++r) {
        CHECK(bit_equal(x[std::size_t(r)], x[0]));
        // Segment sums differ from the whole-layer sum only by float rounding of the additions.
        CHECK(rel_error(x[std::size_t(r)], reference) < 1e-5);
        CHECK(own_bytes[std::size_t(r)] >= codec.encoded_bytes(acc));  // N segment payloads, N headers
      }
      CHECK(rel_error(x[0], truth) < 1e-2);  // lossy, but the layer is low rank
      if (n > 1) {
        // Each rank sends 2(N-1) compressed segments: about 2(N-1)/N of its compressed layer.
        const double per_rank = double(sent[0]), compressed = double(codec.encoded_bytes(acc));
        CHECK(per_rank < 2.0 * compressed + 64.0 * 2 * n);
      }
    }
}

TEST_CASE("linear ring over the zero-copy face: exact receives, the moving face's bits, chunked and whole, N = 1..8") {
  // GradiVeQ, dense_codec and fp16 know their payload sizes (KnowsBodySize): over a
  // ZeroCopyTransport every receive is posted with its exact size; the bits must not change.
  static_assert(gradcomp::KnowsBodySize<linear_compressor<>> && gradcomp::KnowsBodySize<dense_codec<>> &&
                gradcomp::KnowsBodySize<gradcomp::fp16_codec<>>);
  for (int n = 1; n <= 8; ++n)
    for (std::size_t chunk : {std::size_t(0), std::size_t(32), gradcomp::ring_whole_segments}) {
      CAPTURE(n);
      CAPTURE(chunk);
      const std::size_t K = 16;
      const low_rank_layer layer(K, 3, K * std::size_t(5 * n + 1) + 5, 60 + std::uint64_t(n));
      const auto gq = fitted_codec(layer, static_cast<std::size_t>(n));
      const std::vector<vec> x = rank_samples(layer, n, 7000);
      const ring_options o{.chunk_elements = chunk};
      auto run = [&](auto codec, bool zero_copy) {
        std::vector<vec> out = x;
        std::vector<ring_stats> st(static_cast<std::size_t>(n));
        on_ring(n, [&](int r, inproc_endpoint& ep) {
          auto c = codec;
          if (zero_copy) {
            auto z = ep.zero_copy();
            st[std::size_t(r)] = gradcomp::ring_allreduce_linear(z, c, out[std::size_t(r)], o);
          } else {
            st[std::size_t(r)] = gradcomp::ring_allreduce_linear(ep, c, out[std::size_t(r)], o);
          }
        });
        return std::make_pair(out, st);
      };
      auto check_same = [&](auto codec) {
        const auto moving = run(codec, false), exact = run(codec, true);
        for (int r = 0; r < n; ++r) {
          CHECK(bit_equal(exact.first[std::size_t(r)], moving.first[0]));
          // The same payloads; the zero-copy face adds one 8-byte size digest per rank and call.
          const auto& a = exact.second[std::size_t(r)];
          const auto& b = moving.second[std::size_t(r)];
          const std::size_t digest = n > 1 ? 1 : 0;
          CHECK(a.messages_sent == b.messages_sent + digest);
          CHECK(a.bytes_sent == b.bytes_sent + 8 * digest);
          CHECK(a.bytes_received == b.bytes_received + 8 * digest);
        }
      };
      check_same(gq);
      check_same(dense_codec<>{});
      check_same(gradcomp::fp16_codec<>{});
    }
}

TEST_CASE("linear ring over the zero-copy face: empty segments (length below N) travel as bare headers, exact") {
  for (int n : {3, 8})
    for (std::size_t len : {std::size_t(0), std::size_t(1), std::size_t(2), std::size_t(5)}) {
      CAPTURE(n);
      CAPTURE(len);
      const auto x = inputs(n, len, 77 + len);
      std::vector<vec> moving = x, exact = x;
      on_ring(n, [&](int r, inproc_endpoint& ep) {
        dense_codec<> a, b;
        gradcomp::ring_allreduce_linear(ep, a, moving[std::size_t(r)]);
        auto z = ep.zero_copy();
        gradcomp::ring_allreduce_linear(z, b, exact[std::size_t(r)]);
      });
      for (int r = 0; r < n; ++r) CHECK(bit_equal(exact[std::size_t(r)], moving[0]));
    }
}

TEST_CASE("linear ring over the zero-copy face: another length or payload size is a transport_error before any payload") {
  // Runs `codec_of(rank)` on `input_of(rank)` over two ranks' zero-copy faces; both must report the digest mismatch.
  auto check_both_refuse = [](auto codec_of, auto input_of) {
    std::vector<std::string> errors(2);
    run_workers(2, [&](inproc_endpoint& ep) {
      auto z = ep.zero_copy();
      auto c = codec_of(ep.rank());
      vec x = input_of(ep.rank());
      try {
        gradcomp::ring_allreduce_linear(z, c, x);
      } catch (const gradcomp::transport_error& e) {
        errors[std::size_t(ep.rank())] = e.what();
      }
    }, {.recv_timeout = 30s});
    for (const auto& e : errors) CHECK(e.find("disagree on the sizes") != std::string::npos);
  };
  SUBCASE("ranks disagree on the length (dense_codec)") {
    check_both_refuse([](int) { return dense_codec<>{}; }, [](int r) { return vec(r == 1 ? 14 : 12, 1.0f); });
  }
  SUBCASE("GradiVeQ bases of another dimension") {
    const low_rank_layer two(16, 2, 16 * 8, 41), five(16, 5, 16 * 8, 42);
    const auto a = fitted_codec(two, 2), b = fitted_codec(five, 2);
    REQUIRE(a.segment_body_size(0, 16 * 4) != b.segment_body_size(0, 16 * 4));
    check_both_refuse([&](int r) { return r == 0 ? a : b; }, [&](int r) { return two.sample(3 + std::uint64_t(r)); });
  }
}

TEST_CASE("linear ring: segments hold whole slices, empty segments when N > slices, average") {
  const std::size_t K = 8;
  for (int n : {3, 6}) {
    CAPTURE(n);
    const low_rank_layer layer(K, 2, 2 * K + 3, 77);  // 2 slices and a tail for up to 6 ranks
    const auto codec = fitted_codec(layer, static_cast<std::size_t>(n));
    const auto b = codec.segment_bounds(static_cast<std::size_t>(n));
    for (std::size_t j = 0; j + 1 < b.size(); ++j) CHECK(b[j] % K == 0);
    std::vector<vec> x = rank_samples(layer, n, 800);
    vec reference = compressed_domain_sum(codec, x);
    for (float& v : reference) v /= float(n);
    on_ring(n, [&](int r, inproc_endpoint& ep) {
      auto mine = codec;
      gradcomp::ring_allreduce_linear(ep, mine, x[std::size_t(r)], {.average = true});
    });
    for (int r = 0; r < n; ++r) {
      CHECK(bit_equal(x[std::size_t(r)], x[0]));
      CHECK(rel_error(x[std::size_t(r)], reference) < 1e-5);
    }
  }
}

TEST_CASE("linear ring: the own-encode observer sees every segment once (eq. 7 local loss)") {
  const int n = 4;
  const low_rank_layer layer(16, 3, 16 * 9 + 3, 5);
  const auto codec = fitted_codec(layer, n);
  std::vector<vec> x = rank_samples(layer, n, 70);
  std::vector<std::vector<int>> seen(n);
  std::vector<double> loss(n, 0.0), whole(n, 0.0);
  for (int r = 0; r < n; ++r) {
    gradiveq_payload p;
    codec.encode(x[std::size_t(r)], p);
    whole[std::size_t(r)] = codec.local_loss(x[std::size_t(r)], p).loss;
  }
  std::vector<std::size_t> encoded(n);
  on_ring(n, [&](int r, inproc_endpoint& ep) {
    const auto& shared = codec;  // a const codec works: GradiVeQ's encode_segment is const
    const auto st = gradcomp::ring_allreduce_linear(
        ep, shared, x[std::size_t(r)], {.tag_base = 500},
        [&](int j, std::span<const float> local, const gradiveq_payload& own) {
          seen[std::size_t(r)].push_back(j);
          loss[std::size_t(r)] += shared.local_loss(local, own).loss;
          encoded[std::size_t(r)] += shared.encoded_bytes(own);
        });
    CHECK(st.own_encoded_bytes == encoded[std::size_t(r)]);
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    auto s = seen[std::size_t(r)];
    REQUIRE(s.size() == static_cast<std::size_t>(n));
    CHECK(s[0] == r);  // line 3: own segment first
    std::sort(s.begin(), s.end());
    for (int j = 0; j < n; ++j) CHECK(s[std::size_t(j)] == j);
    CHECK(loss[std::size_t(r)] == doctest::Approx(whole[std::size_t(r)]).epsilon(1e-3));
  }
}

TEST_CASE("linear ring: over an emulated link, same bits, and the bytes on the wire are the reported ones") {
  using gradcomp::transport::emulated_link;
  using gradcomp::transport::emulated_network;
  const int n = 3;
  const low_rank_layer layer(16, 3, 16 * 10, 9);
  const auto codec = fitted_codec(layer, n);
  std::vector<vec> a = rank_samples(layer, n, 90), b = a;
  emulated_network net(n, {.bits_per_second = 1e9, .latency = 5us});
  std::vector<std::size_t> sent(n);
  on_ring(n, [&](int r, inproc_endpoint& ep) {
    auto c1 = codec, c2 = codec;
    gradcomp::ring_allreduce_linear(ep, c1, a[std::size_t(r)]);
    emulated_link<inproc_endpoint> link(ep, net);
    sent[std::size_t(r)] = gradcomp::ring_allreduce_linear(link, c2, b[std::size_t(r)]).bytes_sent;
  });
  for (int r = 0; r < n; ++r) {
    CHECK(bit_equal(a[std::size_t(r)], b[std::size_t(r)]));
    CHECK(net.bytes_sent(r) == sent[std::size_t(r)]);
  }
}

// ---------------------------------------------------------------------------
// Errors of the linear form

TEST_CASE("linear ring: bad configuration is a typed error before any message") {
  const low_rank_layer layer(16, 2, 64, 3);
  const auto codec = fitted_codec(layer, 2);
  gradcomp::transport::inproc_fabric f(3);
  auto c = codec;
  vec x(64, 1.0f), wrong(65, 1.0f);
  // summands N = 2 but 3 ranks: eq. 3's mu/N would be wrong.
  CHECK_THROWS_AS(gradcomp::ring_allreduce_linear(f.endpoint(0), c, x), gradcomp::invalid_argument_error);
  c.set_summands(3);
  CHECK_THROWS_AS(gradcomp::ring_allreduce_linear(f.endpoint(0), c, wrong), gradcomp::size_mismatch_error);
  CHECK_THROWS_AS(gradcomp::ring_allreduce_linear(f.endpoint(0), c, x, {.tag_base = -3}),
                  gradcomp::invalid_argument_error);
  linear_compressor<> unfitted(64, gradiveq_options{.slice_size = 16, .summands = 3});
  CHECK_THROWS_AS(gradcomp::ring_allreduce_linear(f.endpoint(0), unfitted, x), gradcomp::state_error);
  CHECK(f.endpoint(1).messages_received() == 0);
}

TEST_CASE("compressed rings: every entry point refuses a tag_base in another piece's range (tags.hpp)") {
  const low_rank_layer layer(16, 2, 64, 3);
  auto gq = fitted_codec(layer, 2);
  gradcomp::transport::inproc_fabric f(2);
  vec x(64, 1.0f);
  dense_codec<> dense;
  gradcomp::two_bit_quantizer<> two_bit(64, gradcomp::two_bit_options::fixed(0.5f));
  std::vector<gradcomp::two_bit_quantizer<>> codecs{two_bit};
  auto& ep = f.endpoint(0);
  for (int bad : {31000, 30000, 16384, 32767, -1}) {
    CAPTURE(bad);
    const ring_options o{.tag_base = bad};
    CHECK_THROWS_AS(gradcomp::ring_allreduce_linear(ep, gq, x, o), gradcomp::invalid_argument_error);
    CHECK_THROWS_AS(gradcomp::ring_allreduce_linear(ep, dense, x, o), gradcomp::invalid_argument_error);
    CHECK_THROWS_AS(gradcomp::ring_allreduce_reencode(ep, codecs, x, o), gradcomp::invalid_argument_error);
    CHECK_THROWS_AS(gradcomp::ring_allgather_decode(ep, two_bit, x, o), gradcomp::invalid_argument_error);
    CHECK_THROWS_AS(gradcomp::ring_allreduce(ep, two_bit, x, o), gradcomp::invalid_argument_error);
    CHECK_THROWS_AS(gradcomp::ring_allreduce(ep, dense, x, o), gradcomp::invalid_argument_error);
  }
  CHECK(ep.messages_sent() == 0);
  CHECK(f.endpoint(1).messages_received() == 0);
  for (float v : x) CHECK(v == 1.0f);  // refused before touching the data
}

TEST_CASE("linear ring: a corrupted or truncated segment is a wire_error / transport_error, not a hang") {
  const int n = 4;
  const low_rank_layer layer(16, 3, 16 * 8, 21);
  const auto codec = fitted_codec(layer, n);
  for (int mode = 0; mode < 4; ++mode)
    for (std::uint64_t which : {0u, 2u, 4u}) {  // reduce-scatter and all-gather sends
      CAPTURE(mode);
      CAPTURE(which);
      const auto t0 = std::chrono::steady_clock::now();
      std::string what;
      bool typed = false;
      try {
        on_ring(n, [&](int r, inproc_endpoint& ep) {
          fault_plan plan(which + 1);
          if (r == 1) {
            if (mode == 0) plan.flip_random_bits(faults::nth_send(which), 1);       // CRC catches it
            if (mode == 1) plan.flip_bits(faults::nth_send(which), {8 * 40 + 3});  // a body bit
            if (mode == 2) plan.truncate(faults::nth_send(which), 20);             // shorter than a header
            if (mode == 3) plan.truncate(faults::nth_send(which), 60);             // a header and part of a body
          }
          fault_injecting<inproc_endpoint> t(ep, plan);
          auto mine = codec;
          vec x = layer.sample(3 + std::uint64_t(r));
          gradcomp::ring_allreduce_linear(t, mine, x);
        });
      } catch (const gradcomp::wire::wire_error& e) {
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

namespace {
// A sender whose first message carries `value` (NaN, Inf) at float `body_float`
// of its payload body under a valid checksum: a buggy or hostile peer the CRC
// does not catch.
template <class T>
class poisoning_sender {
 public:
  poisoning_sender(T& t, std::size_t body_float, float value) : t_(t), at_(body_float), value_(value) {}
  int rank() const { return t_.rank(); }
  int size() const { return t_.size(); }
  auto isend(int peer, int tag, std::vector<std::byte>&& bytes) {
    const std::size_t offset = gradcomp::wire::header_size + 4 * at_;
    if (!done_ && bytes.size() >= offset + 4) {
      std::memcpy(bytes.data() + offset, &value_, 4);
      gradcomp::test_support::reseal(bytes);
      done_ = true;
    }
    return t_.isend(peer, tag, std::move(bytes));
  }
  auto irecv(int peer, int tag) { return t_.irecv(peer, tag); }

 private:
  T& t_;
  std::size_t at_;
  float value_;
  bool done_ = false;
};
static_assert(gradcomp::Transport<poisoning_sender<inproc_endpoint>>);
}  // namespace

TEST_CASE("linear ring: a non-finite value under a valid checksum is a malformed_body wire_error (GradiVeQ, dense)") {
  const int n = 3;
  const low_rank_layer layer(16, 3, 16 * 6, 23);
  const auto gq = fitted_codec(layer, n);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    for (bool dense : {false, true}) {
      CAPTURE(dense);
      std::mutex m;
      std::string what;
      gradcomp::wire::wire_errc code = gradcomp::wire::wire_errc::truncated;
      bool rank1_failed = false;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        on_ring(n, [&](int r, inproc_endpoint& ep) {
          vec x = layer.sample(3 + std::uint64_t(r));
          auto reduce = [&](auto& t) {
            if (dense) {
              dense_codec<> c;
              gradcomp::ring_allreduce_linear(t, c, x);
            } else {
              auto mine = gq;
              gradcomp::ring_allreduce_linear(t, mine, x);
            }
          };
          try {
            if (r == 0) {
              // GradiVeQ body: 32 fixed bytes (8 floats), then the coefficients; dense: floats from byte 0.
              poisoning_sender<inproc_endpoint> t(ep, dense ? 0 : 8, bad);
              reduce(t);
            } else {
              reduce(ep);
            }
          } catch (const gradcomp::wire::wire_error& e) {
            if (r == 1) {
              std::lock_guard<std::mutex> lock(m);
              rank1_failed = true;
              code = e.code();
              what = e.what();
            }
            throw;
          }
        }, 20s);
        FAIL("no error");
      } catch (const gradcomp::error&) {
      }
      CAPTURE(what);
      CHECK(rank1_failed);  // rank 1 receives rank 0's first segment
      CHECK(code == gradcomp::wire::wire_errc::malformed_body);
      CHECK(what.find("non-finite") != std::string::npos);
      CHECK(what.find("from rank 0") != std::string::npos);
      CHECK(std::chrono::steady_clock::now() - t0 < 30s);
    }
}

TEST_CASE("linear ring: the receiver names the bad segment; wire_error comes first") {
  const int n = 3;
  const low_rank_layer layer(16, 3, 16 * 6, 22);
  const auto codec = fitted_codec(layer, n);
  try {
    on_ring(n, [&](int r, inproc_endpoint& ep) {
      fault_plan plan;
      if (r == 0) plan.flip_bits(faults::nth_send(1), {8 * 36});  // 2nd reduce-scatter message, body byte
      fault_injecting<inproc_endpoint> t(ep, plan);
      auto mine = codec;
      vec x = layer.sample(3 + std::uint64_t(r));
      gradcomp::ring_allreduce_linear(t, mine, x);
    });
    FAIL("no error");
  } catch (const gradcomp::wire::wire_error& e) {
    CHECK(e.code() == gradcomp::wire::wire_errc::checksum_mismatch);
    const std::string w = e.what();
    CHECK(w.find("rank 1") != std::string::npos);
    CHECK(w.find("from rank 0") != std::string::npos);
    CHECK(w.find("reduce-scatter step 1") != std::string::npos);
  }
}

namespace {
// A GradiVeQ codec that encodes every segment at the offset of segment 0: a
// peer whose payloads claim the wrong position (same length, valid bytes).
struct misplacing_codec : linear_compressor<> {
  using linear_compressor<>::linear_compressor;
  void encode_segment(std::size_t, std::span<const float> segment, gradiveq_payload& out) const {
    linear_compressor<>::encode_segment(0, segment, out);
  }
};
}  // namespace

TEST_CASE("linear ring: mismatched segment sizes or offsets are typed errors") {
  SUBCASE("ranks disagree on the length (dense)") {
    for (int longer : {0, 1}) {
      CAPTURE(longer);
      bool typed = false;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        on_ring(3, [&](int r, inproc_endpoint& ep) {
          vec x(r == 1 ? (longer ? 14 : 10) : 12, 1.0f);
          dense_codec<> c;
          gradcomp::ring_allreduce_linear(ep, c, x);
        });
      } catch (const gradcomp::size_mismatch_error&) {
        typed = true;
      } catch (const gradcomp::wire::wire_error& e) {
        typed = e.code() == gradcomp::wire::wire_errc::oversized;  // more elements than the segment holds
      }
      CHECK(typed);
      CHECK(std::chrono::steady_clock::now() - t0 < 30s);
    }
  }
  SUBCASE("a payload for another segment (GradiVeQ offset)") {
    const int n = 2;
    const low_rank_layer layer(16, 2, 16 * 4, 31);
    const auto base = fitted_codec(layer, n);
    const auto state = base.save_state();
    try {
      on_ring(n, [&](int r, inproc_endpoint& ep) {
        vec x = layer.sample(3 + std::uint64_t(r));
        if (r == 1) {
          misplacing_codec c(layer.length, gradiveq_options{.slice_size = 16, .lambda = 0.001, .summands = n});
          c.restore_state(state);
          gradcomp::ring_allreduce_linear(ep, c, x);
        } else {
          auto c = base;
          gradcomp::ring_allreduce_linear(ep, c, x);
        }
      });
      FAIL("no error");
    } catch (const gradcomp::size_mismatch_error& e) {
      CHECK(std::string(e.what()).find("offset") != std::string::npos);
    } catch (const gradcomp::transport_error&) {
      FAIL("the offset mismatch should be the first error");
    }
  }
  SUBCASE("another basis (fingerprint)") {
    const int n = 2;
    const low_rank_layer layer(16, 2, 16 * 4, 32), other(16, 2, 16 * 4, 33);
    const auto a = fitted_codec(layer, n), b = fitted_codec(other, n);
    CHECK_THROWS_AS(on_ring(n,
                            [&](int r, inproc_endpoint& ep) {
                              auto c = r == 0 ? a : b;
                              vec x = layer.sample(3 + std::uint64_t(r));
                              gradcomp::ring_allreduce_linear(ep, c, x);
                            }),
                    gradcomp::error);
  }
}

TEST_CASE("linear ring: a killed peer or a dropped message ends in transport_error / timeout_error") {
  const int n = 4;
  const low_rank_layer layer(16, 3, 16 * 8, 23);
  const auto codec = fitted_codec(layer, n);
  for (std::uint64_t k : {0u, 1u, 3u, 5u}) {
    CAPTURE(k);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(on_ring(n,
                            [&](int r, inproc_endpoint& ep) {
                              fault_plan plan;
                              if (r == 2) plan.kill_after_sends(k);
                              fault_injecting<inproc_endpoint> t(ep, plan);
                              auto mine = codec;
                              vec x = layer.sample(3 + std::uint64_t(r));
                              gradcomp::ring_allreduce_linear(t, mine, x);
                            }),
                    gradcomp::transport_error);
    CHECK(std::chrono::steady_clock::now() - t0 < 30s);
  }
  CHECK_THROWS_AS(on_ring(
                      3,
                      [&](int r, inproc_endpoint& ep) {
                        fault_plan plan;
                        if (r == 0) plan.drop(faults::nth_send(2));
                        fault_injecting<inproc_endpoint> t(ep, plan);
                        dense_codec<> c;
                        vec x(30, 1.0f);
                        gradcomp::ring_allreduce_linear(t, c, x);
                      },
                      200ms),
                  gradcomp::timeout_error);
}

// ---------------------------------------------------------------------------
// Baselines for non-linear codecs

namespace {

// Runs both baselines with codecs from `make(rank, segment, length)` and
// checks: identical on every node, close to the true sum, statistics.
// tolerance[form]: bound on the relative L2 error against the true sum, for
// the re-encode form (0) and the all-gather form (1).
template <class Make>
void check_baselines(int n, std::size_t len, Make make, std::array<double, 2> tolerance, std::uint64_t seed) {
  CAPTURE(n);
  CAPTURE(len);
  const auto x = inputs(n, len, seed);
  const vec truth = exact_sum(x);
  for (int form = 0; form < 2; ++form) {
    CAPTURE(form);
    auto y = x;
    std::vector<ring_stats> st(static_cast<std::size_t>(n));
    on_ring(n, [&](int r, inproc_endpoint& ep) {
      auto& mine = y[std::size_t(r)];
      if (form == 0) {
        auto codecs = gradcomp::make_ring_codecs(n, len, [&](int j, std::size_t l) { return make(r, j, l); });
        st[std::size_t(r)] = gradcomp::ring_allreduce_reencode(ep, codecs, mine);
      } else {
        auto c = make(r, -1, len);
        st[std::size_t(r)] = gradcomp::ring_allgather_decode(ep, c, mine);
      }
    });
    for (int r = 0; r < n; ++r) CHECK(bit_equal(y[std::size_t(r)], y[0]));
    CHECK(rel_error(y[0], truth) < tolerance[std::size_t(form)]);
    for (int r = 0; r < n; ++r) {
      const auto& s = st[std::size_t(r)];
      CHECK(s.messages_sent == std::size_t(form == 0 ? 2 * (n - 1) : n - 1));
      CHECK(s.encodes == std::size_t(form == 0 ? n : 1));
      CHECK(s.decodes == std::size_t(form == 0 ? 2 * n - 1 : n));
      CHECK(s.own_encoded_bytes > 0);
    }
  }
}

std::uint64_t seed_of(int rank, int segment) { return 0x51ED ^ (std::uint64_t(rank) << 20) ^ std::uint64_t(segment + 1); }

}  // namespace

TEST_CASE("baselines: QSGD 8-bit, identical on every node and close to the true sum") {
  for (int n : {1, 2, 3, 5, 8})
    for (std::size_t len : {static_cast<std::size_t>(n), std::size_t(257), std::size_t(1001)})
      check_baselines(
          n, len,
          [](int r, int j, std::size_t) {
            return gradcomp::qsgd<>(gradcomp::qsgd_options{.bits = 8, .bucket_size = 64, .seed = seed_of(r, j)});
          },
          {0.08, 0.08}, 11);
}

TEST_CASE("baselines: two-bit with residual and the sparsifier with memory (exact at 100%)") {
  // One two-bit encode (thr = mean|x|) of Gaussian values is ~0.65 off in
  // relative L2 within a call (the residual keeps the rest, see the error
  // feedback test). The all-gather form quantizes each rank's vector once:
  // ~0.65 of the sum. The re-encode form quantizes every partial sum again,
  // so its errors add up along the ring (Fig. 2a's repeated compression):
  // about 0.65 sqrt((N+1)/2).
  for (int n : {2, 4, 7})
    check_baselines(
        n, 301, [](int, int, std::size_t l) { return gradcomp::two_bit_quantizer<>(l, gradcomp::two_bit_options::automatic()); },
        {0.75 * std::sqrt((n + 1) / 2.0), 0.75}, 12);
  // A sparsifier sending 100% is lossless: both forms give the sum up to float rounding.
  for (int n : {2, 3, 6})
    check_baselines(
        n, 257,
        [](int, int, std::size_t l) {
          return gradcomp::sparsifier_with_memory<>(l, gradcomp::sparsifier_options{.ratio_percent = 100.0});
        },
        {1e-5, 1e-5}, 13);
}

TEST_CASE("baselines: error feedback delivers everything over the calls (two-bit, top-10%)") {
  // The same gradient every call: after T calls the sum of the results plus
  // what the residuals still hold equals T times the true sum, so the mean
  // result converges to the true sum (every compression point's residual is
  // re-injected at the same hop next call).
  // Capacity per call must exceed the gradient: two-bit moves at most thr =
  // 0.5 per element and call (gradients of scale 0.05), the sparsifier 10%
  // of the elements.
  const int n = 4;
  const std::size_t len = 400;
  for (int codec_kind = 0; codec_kind < 2; ++codec_kind)
    for (int form = 0; form < 2; ++form) {
      CAPTURE(codec_kind);
      CAPTURE(form);
      const auto x = inputs(n, len, 21, codec_kind == 0 ? 0.05f : 1.0f);
      const vec truth = exact_sum(x);
      const int calls = codec_kind == 0 ? 100 : 300;
      std::vector<std::vector<double>> mean(static_cast<std::size_t>(n), std::vector<double>(len, 0.0));
      double first_error = 0.0;
      std::mutex m;
      on_ring(n, [&](int r, inproc_endpoint& ep) {
        // `make_codec(l)`: this codec kind for l elements, per segment and for the whole vector.
        auto run_calls = [&](auto make_codec) {
          auto codecs = gradcomp::make_ring_codecs(n, len, [&](int, std::size_t l) { return make_codec(l); });
          auto whole = make_codec(len);
          for (int c = 0; c < calls; ++c) {
            vec y = x[std::size_t(r)];
            if (form == 0) gradcomp::ring_allreduce_reencode(ep, codecs, y);
            else gradcomp::ring_allgather_decode(ep, whole, y);
            for (std::size_t i = 0; i < len; ++i) mean[std::size_t(r)][i] += y[i] / calls;
            if (c == 0 && r == 0) {
              std::lock_guard<std::mutex> lock(m);
              first_error = rel_error(y, truth);
            }
          }
        };
        if (codec_kind == 0)
          run_calls([](std::size_t l) { return gradcomp::two_bit_quantizer<>(l, gradcomp::two_bit_options::fixed(0.5f)); });
        else
          run_calls([](std::size_t l) {
            return gradcomp::sparsifier_with_memory<>(l, gradcomp::sparsifier_options{.ratio_percent = 10.0});
          });
      });
      vec mean0(len);
      for (std::size_t i = 0; i < len; ++i) mean0[i] = float(mean[0][i]);
      for (int r = 1; r < n; ++r) CHECK(mean[std::size_t(r)] == mean[0]);
      const double e = rel_error(mean0, truth);
      CAPTURE(first_error);
      CAPTURE(e);
      CHECK(e < 0.25 * first_error);  // the residuals catch up
      CHECK(e < 0.2);
    }
}

TEST_CASE("baselines: a single size-agnostic codec for every segment (QSGD)") {
  const int n = 3;
  const std::size_t len = 500;
  const auto x = inputs(n, len, 31);
  const vec truth = exact_sum(x);
  auto y = x;
  std::vector<std::uint64_t> steps(n);
  on_ring(n, [&](int r, inproc_endpoint& ep) {
    std::vector<gradcomp::qsgd<>> one{gradcomp::qsgd<>({.bits = 8, .bucket_size = 128, .seed = seed_of(r, 0)})};
    gradcomp::ring_allreduce_reencode(ep, one, y[std::size_t(r)]);
    steps[std::size_t(r)] = one[0].step();
  });
  for (int r = 0; r < n; ++r) {
    CHECK(bit_equal(y[std::size_t(r)], y[0]));
    CHECK(steps[std::size_t(r)] == std::uint64_t(n));  // one encode per segment
  }
  CHECK(rel_error(y[0], truth) < 0.08);
  // Neither N nor 1 codecs: a typed error.
  gradcomp::transport::inproc_fabric f(3);
  std::vector<gradcomp::qsgd<>> two(2);
  vec v(10, 1.0f);
  CHECK_THROWS_AS(gradcomp::ring_allreduce_reencode(f.endpoint(0), two, v), gradcomp::invalid_argument_error);
}

TEST_CASE("baselines: the generic ring_allreduce with a non-linear codec is the all-gather form; average") {
  const int n = 4;
  const std::size_t len = 129;
  const auto x = inputs(n, len, 41);
  auto a = x, b = x;
  on_ring(n, [&](int r, inproc_endpoint& ep) {
    gradcomp::qsgd<> c1({.bits = 8, .bucket_size = 32, .seed = seed_of(r, 9)}), c2 = c1;
    gradcomp::ring_allreduce(ep, c1, a[std::size_t(r)], {.average = true});
    gradcomp::ring_allgather_decode(ep, c2, b[std::size_t(r)]);
  });
  for (int r = 0; r < n; ++r) {
    CHECK(bit_equal(a[std::size_t(r)], a[0]));
    for (std::size_t i = 0; i < len; ++i) CHECK(a[std::size_t(r)][i] == b[std::size_t(r)][i] / float(n));
  }
}

TEST_CASE("baselines: corrupted, truncated, oversized and mismatched payloads are typed errors, not hangs") {
  const int n = 3;
  for (int form = 0; form < 2; ++form)
    for (int mode = 0; mode < 3; ++mode) {
      CAPTURE(form);
      CAPTURE(mode);
      const auto t0 = std::chrono::steady_clock::now();
      bool typed = false;
      std::string what;
      try {
        on_ring(n, [&](int r, inproc_endpoint& ep) {
          fault_plan plan(5);
          std::size_t len = 200;
          if (r == 1) {
            if (mode == 0) plan.flip_random_bits(faults::nth_send(0), 3);
            if (mode == 1) plan.truncate(faults::nth_send(1), 40);
            if (mode == 2) len = 230;  // disagrees on the length
          }
          fault_injecting<inproc_endpoint> t(ep, plan);
          vec y = counter_gaussian(len, 3 + std::uint64_t(r));
          if (form == 0) {
            auto codecs = gradcomp::make_ring_codecs(n, len, [&](int j, std::size_t) {
              return gradcomp::qsgd<>({.bits = 4, .bucket_size = 64, .seed = seed_of(r, j)});
            });
            gradcomp::ring_allreduce_reencode(t, codecs, y);
          } else {
            gradcomp::two_bit_quantizer<> c(len);
            gradcomp::ring_allgather_decode(t, c, y);
          }
        });
      } catch (const gradcomp::wire::wire_error& e) {
        typed = true;
        what = e.what();
      } catch (const gradcomp::size_mismatch_error& e) {
        typed = mode == 2;
        what = e.what();
      } catch (const gradcomp::transport_error& e) {
        typed = mode != 2;
        what = e.what();
      }
      CAPTURE(what);
      CHECK(typed);
      CHECK(std::chrono::steady_clock::now() - t0 < 30s);
    }
}

TEST_CASE("baselines: non-finite input is rejected by the encoder (non_finite_error), peers fail fast") {
  const int n = 3;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(on_ring(n,
                          [&](int r, inproc_endpoint& ep) {
                            vec y(60, 1.0f);
                            if (r == 2) y[7] = std::nanf("");
                            gradcomp::qsgd<> c({.seed = seed_of(r, 0)});
                            gradcomp::ring_allgather_decode(ep, c, y);
                          }),
                  gradcomp::non_finite_error);
  CHECK(std::chrono::steady_clock::now() - t0 < 30s);
}
