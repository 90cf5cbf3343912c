// GradiVeQ's seq kernels (system/generic/gradiveq.hpp, eqs. 3 and 5): one
// fixed summation order per element, whatever the instruction set, the
// row blocking, the thread that calls them or the thread count of a Thrust
// system; and what that buys the ring (Algorithm 1): chunked and
// whole-segment rings give the same bits, so GradiVeQ's segments are cut
// into chunks by default.
#include <doctest/doctest.h>

#include <gradcomp/gradiveq.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/system/gradiveq.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <support/equality.hpp>
#include <support/ring_fixtures.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <thread>
#include <vector>

#if defined(GRADCOMP_HAS_THRUST) && defined(_OPENMP)
#include <omp.h>
#endif

using namespace std::chrono_literals;
using namespace gradcomp::test_support;
namespace ex = gradcomp::execution;
namespace kern = gradcomp::execution::gradiveq_kernel;
using vec = std::vector<float>;

namespace {

// Normal values with some exact zeros of either sign (the sign of a zero
// sum is part of the bits).
vec values(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  vec v = counter_gaussian(n, seed, scale);
  for (std::size_t i = 0; i < n; i += 13) v[i] = (i / 13) % 2 ? 0.0f : -0.0f;
  return v;
}

}  // namespace

TEST_CASE("seq GradiVeQ kernels: every path gives the reference order's bits (odd K, d, slice counts)") {
  for (std::size_t k : {1u, 7u, 8u, 16u, 33u, 64u, 256u, 264u})
    for (std::size_t d : {0u, 1u, 3u, 4u, 5u, 8u, 12u, 13u, 32u})
      for (std::size_t slices : {1u, 3u, 5u, 37u, 67u}) {  // tiles and register blocks of slices, and their rests
        CAPTURE(k);
        CAPTURE(d);
        CAPTURE(slices);
        const vec x = values(slices * k, 1), u = values(k * d, 2, 0.1f), off = values(d, 3), mu = values(k, 4);
        vec y(slices * d, 9.0f), ref(slices * d, 9.0f);
        ex::gradiveq_compress_slices(ex::seq{}, x.data(), slices, k, u.data(), d, off.data(), y.data());
        if (d > 0) kern::compress_rows_scalar(x.data(), 0, slices, k, u.data(), 0, d, off.data(), ref.data());
        CHECK(bit_equal(y, ref));
        // Any cut of the slices (a ring chunk) gives the same bits.
        vec pieces(slices * d, 9.0f);
        for (std::size_t s = 0; s < slices; s += 2)
          kern::compress_rows(x.data(), s, std::min(slices, s + 2), k, u.data(), d, off.data(), pieces.data());
        CHECK(bit_equal(pieces, y));
        for (bool add : {false, true}) {
          CAPTURE(add);
          vec out = values(slices * k, 5), want = out;
          ex::gradiveq_expand_slices(ex::seq{}, y.data(), slices, d, u.data(), k, mu.data(), 0.75f, add, out.data());
          kern::expand_rows_scalar(y.data(), 0, slices, d, u.data(), k, 0, k, mu.data(), 0.75f, add, want.data());
          CHECK(bit_equal(out, want));
        }
      }
}

TEST_CASE("seq GradiVeQ kernels: large outputs (non-temporal stores) and unaligned ones give the same bits") {
  // Every float alignment of the output (the AVX-512 path assembles whole
  // 64-byte lines across result vectors and rows), K with one vector per row
  // and with 16-column blocks, slice counts leaving register-block rests,
  // and runs that start mid-layer (a Thrust work item, a ring chunk).
  for (std::size_t k : {16u, 48u, 256u, 264u}) {
    const std::size_t d = 8, slices = kern::stream_min_elements / k + 3;
    CAPTURE(k);
    REQUIRE(slices * k >= kern::stream_min_elements);
    const vec y = values(slices * d, 31), u = values(k * d, 32, 0.1f), mu = values(k, 33);
    vec want(slices * k);
    kern::expand_rows_scalar(y.data(), 0, slices, d, u.data(), k, 0, k, mu.data(), 2.0f, false, want.data());
    for (std::size_t shift = 0; shift < 17; ++shift) {
      CAPTURE(shift);
      vec buf(slices * k + 40, 7.0f);
      const std::span<float> out(buf.data() + shift, slices * k);
      ex::gradiveq_expand_slices(ex::seq{}, y.data(), slices, d, u.data(), k, mu.data(), 2.0f, false, out.data());
      CHECK(bit_equal(out, want));
      for (std::size_t i = 0; i < shift; ++i) CHECK(buf[i] == 7.0f);  // nothing written outside
      for (std::size_t i = shift + slices * k; i < buf.size(); ++i) CHECK(buf[i] == 7.0f);
      // Two runs of slices, the cut mid-layer: the same bits, each run writes only its own floats.
      vec cut(buf.size(), 7.0f);
      const std::size_t mid = slices / 2 + 1;
      kern::expand_rows(y.data(), 0, mid, d, u.data(), k, mu.data(), 2.0f, false, cut.data() + shift);
      for (std::size_t i = shift + mid * k; i < cut.size(); ++i) REQUIRE(cut[i] == 7.0f);
      kern::expand_rows(y.data(), mid, slices, d, u.data(), k, mu.data(), 2.0f, false, cut.data() + shift);
      CHECK(bit_equal(std::span<const float>(cut.data() + shift, slices * k), want));
      for (std::size_t i = 0; i < shift; ++i) CHECK(cut[i] == 7.0f);
    }
  }
}

// Eqs. 3 and 5 with the kernels reading `narrow` (a copy of u's values)
// against the float kernels reading u: the same bits, every path.
static void check_narrow_basis_bits(std::size_t k, std::size_t d, std::size_t slices, const vec& u,
                             ex::gradiveq_narrow_basis narrow) {
  const vec x = values(slices * k, 43), off = values(d, 44), mu = values(k, 45);
  vec y(slices * d, 9.0f), ref(slices * d, 9.0f);
  ex::gradiveq_compress_slices(ex::seq{}, x.data(), slices, k, u.data(), d, off.data(), y.data(), narrow);
  ex::gradiveq_compress_slices(ex::seq{}, x.data(), slices, k, u.data(), d, off.data(), ref.data());
  CHECK(bit_equal(y, ref));
  for (bool add : {false, true}) {
    CAPTURE(add);
    vec out = values(slices * k, 46), want = out;
    ex::gradiveq_expand_slices(ex::seq{}, y.data(), slices, d, u.data(), k, mu.data(), 0.5f, add, out.data(), narrow);
    ex::gradiveq_expand_slices(ex::seq{}, y.data(), slices, d, u.data(), k, mu.data(), 0.5f, add, want.data());
    CHECK(bit_equal(out, want));
  }
}

TEST_CASE("seq GradiVeQ kernels: a binary16 basis gives the float kernels' bits on the same values") {
  // basis_precision::float16: the kernels read the binary16 copy where the
  // build widens it (AVX-512) and the float one elsewhere; both hold the same
  // values, so every path, packed or not, streamed or not, must agree bit for bit.
  for (std::size_t k : {8u, 16u, 48u, 64u, 264u, 12288u})
    for (std::size_t d : {4u, 8u, 13u, 32u})
      for (std::size_t slices : {1u, 3u, 7u, 300u}) {  // 300 x 32: the packed eq. 3; large k x slices: streamed eq. 5
        if (k * slices > 400000) continue;
        CAPTURE(k);
        CAPTURE(d);
        CAPTURE(slices);
        vec u = values(k * d, 42, 0.1f);
        std::vector<std::uint16_t> uh(u.size());
        for (std::size_t i = 0; i < u.size(); ++i) {
          uh[i] = ex::float_to_half_bits_saturated(u[i]);
          u[i] = ex::half_bits_to_float(uh[i]);
        }
        check_narrow_basis_bits(k, d, slices, u, uh.data());
      }
}

TEST_CASE("seq GradiVeQ kernels: an int8 basis with column scales gives the float kernels' bits on the same values") {
  // basis_precision::int8: AVX2 and AVX-512 builds read the int8 copy and
  // multiply each load by its column's power of two; the float copy holds the
  // same values (q * 2^e exactly), so every path must agree bit for bit with
  // the float kernels, including the tails (d % 8 columns, k % 16 rows) that
  // read the float copy and the packed eq. 3 that packs it. Columns of very
  // different magnitudes: each has its own scale.
  for (std::size_t k : {8u, 16u, 24u, 48u, 64u, 264u, 12288u})
    for (std::size_t d : {4u, 8u, 13u, 32u})
      for (std::size_t slices : {1u, 3u, 7u, 300u}) {
        if (k * slices > 400000) continue;
        CAPTURE(k);
        CAPTURE(d);
        CAPTURE(slices);
        vec u = values(k * d, 42, 0.1f);
        for (std::size_t j = 0; j < d; ++j)
          for (std::size_t i = 0; i < k; ++i) u[j * k + i] *= std::ldexp(1.0f, int(j % 7) * 3 - 9);
        std::vector<std::int8_t> q;
        std::vector<float> scale;
        gradcomp::detail::round_basis_to_int8(u, k, q, scale);
        REQUIRE(scale.size() == d);
        const ex::gradiveq_narrow_basis narrow(q.data(), scale.data());
        check_narrow_basis_bits(k, d, slices, u, narrow);
      }
}

TEST_CASE("gradiveq int8 basis rounding: one power of two per column, 7 bits for the largest value, idempotent") {
  // int8_column_scale: the smallest power of two 2^e with m <= 127 * 2^e.
  for (float m : {1.0f, 0.75f, 127.0f / 128.0f, 0.9961f, 0.5f, 3.0e-3f, 1.0e-30f, 126.9f, 127.0f, 127.5f}) {
    CAPTURE(m);
    const float s = gradcomp::detail::int8_column_scale(m);
    int e = 0;
    CHECK(std::frexp(s, &e) == 0.5f);  // a power of two
    CHECK(m <= 127.0f * s);
    CHECK(m > 127.0f * s / 2.0f);  // the smallest such
  }
  // Columns past the normal range (a restored state may hold them): the scale
  // stops at 2^-126, the smallest normal float, and every value stays exact.
  for (float m : {1.0e-37f, 1.0e-40f, std::numeric_limits<float>::denorm_min()}) {
    CAPTURE(m);
    CHECK(gradcomp::detail::int8_column_scale(m) >= std::numeric_limits<float>::min());
    CHECK(m <= 127.0f * gradcomp::detail::int8_column_scale(m));
  }
  vec tiny = {1.0e-40f, -3.0e-41f, std::numeric_limits<float>::denorm_min(), 0.0f};
  const vec tiny_before = tiny;
  std::vector<std::int8_t> tiny_q;
  std::vector<float> tiny_scale;
  gradcomp::detail::round_basis_to_int8(tiny, 4, tiny_q, tiny_scale);
  CHECK(tiny_scale[0] == std::numeric_limits<float>::min());
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(tiny[i] == float(tiny_q[i]) * tiny_scale[0]);
    CHECK(std::abs(tiny[i] - tiny_before[i]) <= tiny_scale[0] / 2.0f);
  }
  vec u = values(300 * 5, 7, 0.05f);
  u[2 * 300 + 17] = 0.0f;
  for (std::size_t i = 0; i < 300; ++i) u[4 * 300 + i] = 0.0f;  // a zero column keeps scale 1
  const vec before = u;
  std::vector<std::int8_t> q;
  std::vector<float> scale;
  gradcomp::detail::round_basis_to_int8(u, 300, q, scale);
  REQUIRE(q.size() == u.size());
  CHECK(scale[4] == 1.0f);
  for (std::size_t j = 0; j < 4; ++j) {
    CAPTURE(j);
    float m = 0.0f, largest_q = 0.0f;
    for (std::size_t i = 0; i < 300; ++i) {
      const std::size_t at = j * 300 + i;
      m = std::max(m, std::abs(before[at]));
      largest_q = std::max(largest_q, std::abs(float(q[at])));
      CHECK(u[at] == float(q[at]) * scale[j]);                        // the float copy holds q 2^e exactly
      CHECK(std::abs(u[at] - before[at]) <= scale[j] / 2.0f);        // rounded to nearest
    }
    CHECK(largest_q >= 64.0f);
    CHECK(largest_q <= 127.0f);
    CHECK(m <= 127.0f * scale[j]);
  }
  // Rounding the rounded values again changes nothing.
  const vec once = u;
  const auto q_once = q;
  const auto scale_once = scale;
  gradcomp::detail::round_basis_to_int8(u, 300, q, scale);
  CHECK(bit_equal(u, once));
  CHECK(q == q_once);
  CHECK(scale == scale_once);
}

TEST_CASE("seq GradiVeQ kernels: the reference order is the documented one") {
  // eq. 3: 8 lanes over i mod 8, each fused in index order, summed
  // ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), minus the offset.
  // Slice counts around the kernels' groups (4 portable, 2 or 4 per AVX
  // block) and K past one column block (1024) of eq. 5.
  for (std::size_t k : {21u, 64u, 1030u})
    for (std::size_t d : {2u, 5u})
      for (std::size_t slices : {1u, 2u, 3u, 4u, 5u, 7u, 9u}) {
  CAPTURE(k);
  CAPTURE(d);
  CAPTURE(slices);
  const vec x = values(slices * k, 11), u = values(k * d, 12), off = values(d, 13), mu = values(k, 14);
  vec y(slices * d);
  ex::gradiveq_compress_slices(ex::seq{}, x.data(), slices, k, u.data(), d, off.data(), y.data());
  for (std::size_t s = 0; s < slices; ++s)
    for (std::size_t j = 0; j < d; ++j) {
      float lane[8] = {};
      for (std::size_t i = 0; i < k; ++i) lane[i % 8] = kern::madd(x[s * k + i], u[j * k + i], lane[i % 8]);
      const float want = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])) - off[j];
      CHECK(bit_equal(std::span<const float>(&y[s * d + j], 1), std::span<const float>(&want, 1)));
    }
  // eq. 5: sum over j in order from 0, then + scale mu (fused).
  vec out(slices * k);
  ex::gradiveq_expand_slices(ex::seq{}, y.data(), slices, d, u.data(), k, mu.data(), 0.5f, false, out.data());
  for (std::size_t s = 0; s < slices; ++s)
    for (std::size_t c = 0; c < k; ++c) {
      float t = 0.0f;
      for (std::size_t j = 0; j < d; ++j) t = kern::madd(y[s * d + j], u[j * k + c], t);
      const float want = kern::madd(0.5f, mu[c], t);
      CHECK(bit_equal(std::span<const float>(&out[s * k + c], 1), std::span<const float>(&want, 1)));
    }
  // the scalar (portable) kernels alone, as the wheel's baseline build runs them
  vec ys(slices * d), outs(slices * k);
  kern::compress_rows_scalar(x.data(), 0, slices, k, u.data(), 0, d, off.data(), ys.data());
  CHECK(bit_equal(ys, y));
  kern::expand_rows_scalar(y.data(), 0, slices, d, u.data(), k, 0, k, mu.data(), 0.5f, false, outs.data());
  CHECK(bit_equal(outs, out));
      }
}

TEST_CASE("GradiVeQ codec: the same bits on any thread, concurrently (seq runs on the calling thread)") {
  const low_rank_layer layer(64, 4, 64 * 300 + 7, 5);
  const auto codec = fitted_codec(layer, 4);
  const vec g = layer.sample(77);
  gradcomp::gradiveq_payload p;
  codec.encode(g, p);
  vec want(g.size());
  codec.decode(p, want);
  std::vector<gradcomp::gradiveq_payload> ps(4);
  std::vector<vec> got(4, vec(g.size()));
  std::vector<std::thread> workers;
  for (std::size_t w = 0; w < 4; ++w)
    workers.emplace_back([&, w] {
      for (int rep = 0; rep < 3; ++rep) {
        codec.encode(g, ps[w]);
        codec.decode(ps[w], got[w]);
      }
    });
  for (auto& t : workers) t.join();
  for (std::size_t w = 0; w < 4; ++w) {
    CHECK(gradcomp::wire::serialize(ps[w]) == gradcomp::wire::serialize(p));
    CHECK(bit_equal(got[w], want));
  }
}

#if defined(GRADCOMP_HAS_THRUST)
TEST_CASE("GradiVeQ kernels: seq and the Thrust host systems give the same bits, any OpenMP thread count") {
  for (std::size_t k : {7u, 256u})
    for (std::size_t d : {3u, 32u}) {
      CAPTURE(k);
      CAPTURE(d);
      const std::size_t slices = 2000;  // above the host systems' serial cut-off
      const vec x = values(slices * k, 21), u = values(k * d, 22, 0.1f), off = values(d, 23), mu = values(k, 24);
      vec ys(slices * d), yc(slices * d);
      ex::gradiveq_compress_slices(ex::seq{}, x.data(), slices, k, u.data(), d, off.data(), ys.data());
      ex::gradiveq_compress_slices(ex::thrust_cpp{}, x.data(), slices, k, u.data(), d, off.data(), yc.data());
      CHECK(bit_equal(ys, yc));
      vec os(slices * k), oc(slices * k);
      ex::gradiveq_expand_slices(ex::seq{}, ys.data(), slices, d, u.data(), k, mu.data(), 1.0f, false, os.data());
      ex::gradiveq_expand_slices(ex::thrust_cpp{}, ys.data(), slices, d, u.data(), k, mu.data(), 1.0f, false, oc.data());
      CHECK(bit_equal(os, oc));
#if defined(_OPENMP)
      const int before = omp_get_max_threads();
      for (int threads : {1, 2, 3}) {
        CAPTURE(threads);
        omp_set_num_threads(threads);
        vec yo(slices * d), oo(slices * k);
        ex::gradiveq_compress_slices(ex::thrust_omp{}, x.data(), slices, k, u.data(), d, off.data(), yo.data());
        ex::gradiveq_expand_slices(ex::thrust_omp{}, ys.data(), slices, d, u.data(), k, mu.data(), 1.0f, false,
                                   oo.data());
        CHECK(bit_equal(ys, yo));
        CHECK(bit_equal(os, oo));
      }
      omp_set_num_threads(before);
#endif
    }
}
#endif

TEST_CASE("GradiVeQ ring: chunked and whole-segment rings give the same bits; segments are chunked by default") {
  using gradcomp::transport::inproc_endpoint;
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    // Segments above 131,072 elements: the automatic chunk size cuts them.
    const low_rank_layer layer(32, 3, 32 * std::size_t(4400 * n) + 9, 43);
    const auto codec = fitted_codec(layer, std::size_t(n), 6);
    const auto x = rank_samples(layer, n, 9);
    auto run = [&](std::size_t chunk) {
      std::vector<vec> out = x;
      std::vector<gradcomp::ring_stats> st(static_cast<std::size_t>(n));
      gradcomp::ring_options o;
      o.chunk_elements = chunk;
      gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
        const auto r = static_cast<std::size_t>(ep.rank());
        st[r] = gradcomp::ring_allreduce_linear(ep, codec, std::span<float>(out[r]), o);
      }, {.recv_timeout = 60s});
      return std::pair(out, st);
    };
    const auto [whole, ws] = run(gradcomp::ring_whole_segments);
    const auto [automatic, as] = run(0);
    const auto [small, ss] = run(32 * 7);
    for (int r = 0; r < n; ++r) {
      CHECK(bit_equal(whole[std::size_t(r)], whole[0]));
      CHECK(bit_equal(automatic[std::size_t(r)], whole[0]));
      CHECK(bit_equal(small[std::size_t(r)], whole[0]));
    }
    CHECK(ws[0].messages_sent == std::size_t(2 * (n - 1)));
    CHECK(as[0].messages_sent > ws[0].messages_sent);  // the default cuts GradiVeQ's segments
    CHECK(ss[0].messages_sent > as[0].messages_sent);
    CHECK(rel_error(whole[0], exact_sum(x)) < 1e-2);
  }
}
