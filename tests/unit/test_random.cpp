// Tests of detail/random.hpp: purity, known values, bijections, statistics.
// Every statistical bound is 5-6 standard deviations wide and the seeds are
// fixed, so the tests are deterministic, yet a broken mixer fails them.
#include <doctest/doctest.h>

#include <gradcomp/detail/random.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <thread>
#include <unordered_set>
#include <vector>

#if defined(GRADCOMP_HAS_XSIMD)
#include <xsimd/xsimd.hpp>
#endif

using gradcomp::detail::counter_rng;
using gradcomp::detail::counter_stream;
using gradcomp::detail::mix32;
using gradcomp::detail::mix64;
using gradcomp::detail::mulhi64;

namespace {

// Inverse of lowbias32 (Wellons): proves mix32 is a bijection with these constants.
std::uint32_t unmix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x43021123u;
  x ^= x >> 15 ^ x >> 30;
  x *= 0x1D69E2A5u;
  x ^= x >> 16;
  return x;
}

// Inverse of mix64 (splitmix64's finaliser).
std::uint64_t unmix64(std::uint64_t z) {
  z = z ^ (z >> 31) ^ (z >> 62);
  z *= 0x319642B2D24D8EC3ull;
  z = z ^ (z >> 27) ^ (z >> 54);
  z *= 0x96DE1B173F119089ull;
  z = z ^ (z >> 30) ^ (z >> 60);
  return z;
}

}  // namespace

TEST_CASE("mix64 is splitmix64's finaliser (reference outputs)") {
  // First outputs of splitmix64 seeded with 0 (the reference generator).
  CHECK(mix64(0x9E3779B97F4A7C15ull) == 0xE220A8397B1DCDAFull);
  CHECK(mix64(2 * 0x9E3779B97F4A7C15ull) == 0x6E789E6AA1B965F4ull);
  CHECK(mix64(3 * 0x9E3779B97F4A7C15ull) == 0x06C45D188009454Full);
}

TEST_CASE("mix32 and mix64 are bijections (their inverses undo them)") {
  const counter_stream s = counter_rng(7).stream(0);
  int bad = 0;
  for (std::uint64_t i = 0; i < 100000; ++i) {
    const auto x32 = static_cast<std::uint32_t>(s.bits64(i));
    bad += unmix32(mix32(x32)) != x32;
    const auto x64 = s.bits64(i + 1000000);
    bad += unmix64(mix64(x64)) != x64;
  }
  CHECK(bad == 0);
  CHECK(mix32<std::uint32_t>(0) == 0u);
}

TEST_CASE("draws are pure functions of (seed, stream, index)") {
  const counter_rng a(42), b(42), c(43);
  for (std::uint64_t step : {0ull, 1ull, 99ull, ~0ull}) {
    for (std::uint64_t i : {0ull, 1ull, 12345ull, (1ull << 32) + 5, ~0ull}) {
      CHECK(a.stream(step).bits32(i) == b.stream(step).bits32(i));
      CHECK(a.stream(step).bits64(i) == b.stream(step).bits64(i));
    }
  }
  // A different seed gives a different stream (these particular values differ).
  int same = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) same += a.stream(3).bits32(i) == c.stream(3).bits32(i);
  CHECK(same <= 2);
}

TEST_CASE("filling an array from two threads gives the single-threaded result") {
  const std::size_t n = 200000;
  const counter_stream s = counter_rng(2024).stream(17);
  std::vector<std::uint32_t> serial(n), parallel(n);
  for (std::size_t i = 0; i < n; ++i) serial[i] = s.bits32(i);
  // Two threads, interleaved and reversed visiting orders.
  std::thread t1([&] {
    for (std::size_t i = 0; i < n; i += 2) parallel[i] = s.bits32(i);
  });
  std::thread t2([&] {
    for (std::size_t i = n - 1 - (n % 2 == 0 ? 0 : 1); i < n; i -= 2) parallel[i] = s.bits32(i);
  });
  t1.join();
  t2.join();
  CHECK(serial == parallel);
}

TEST_CASE("the steps of one seed get distinct stream keys") {
  const counter_rng rng(5);
  std::unordered_set<std::uint64_t> keys;
  for (std::uint64_t step = 0; step < 100000; ++step) keys.insert(rng.stream(step).key());
  CHECK(keys.size() == 100000);
  // and nearby seeds do not share keys for the same steps
  const counter_rng other(6);
  for (std::uint64_t step = 0; step < 1000; ++step) CHECK(keys.count(other.stream(step).key()) == 0);
}

TEST_CASE("bits32 within a 2^32 chunk has no repeats; chunks differ") {
  const counter_stream s = counter_rng(9).stream(3);
  std::unordered_set<std::uint32_t> seen;
  for (std::uint64_t i = 0; i < 200000; ++i) seen.insert(s.bits32(i));
  CHECK(seen.size() == 200000);  // a permutation cannot repeat
  int same = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) same += s.bits32(i) == s.bits32(i + (1ull << 32));
  CHECK(same <= 2);
}

TEST_CASE("uniform_float is uniform on [0,1): range, chi-square, moments") {
  const std::size_t n = 1 << 20;
  constexpr int bins = 256;
  for (std::uint64_t seed : {0ull, 1ull, 0xDEADBEEFull}) {
    const counter_stream s = counter_rng(seed).stream(seed * 3 + 1);
    std::array<double, bins> count{};
    double sum = 0, sum2 = 0;
    std::size_t out_of_range = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float u = s.uniform_float(i);
      if (!(u >= 0.0f && u < 1.0f)) {
        ++out_of_range;
        continue;
      }
      count[static_cast<int>(u * bins)] += 1;
      sum += u;
      sum2 += double(u) * u;
    }
    REQUIRE(out_of_range == 0);
    const double expected = double(n) / bins;
    double chi2 = 0;
    for (double c : count) chi2 += (c - expected) * (c - expected) / expected;
    // 255 degrees of freedom: mean 255, sd 22.6.
    CHECK(chi2 < 255 + 6 * 22.6);
    CHECK(chi2 > 255 - 6 * 22.6);
    const double mean = sum / n, var = sum2 / n - mean * mean;
    CHECK(std::abs(mean - 0.5) < 6 * std::sqrt(1.0 / 12 / n));
    CHECK(std::abs(var - 1.0 / 12) < 0.002);
  }
}

TEST_CASE("every output bit is balanced, consecutive draws are uncorrelated") {
  const std::size_t n = 1 << 20;
  const counter_stream s = counter_rng(77).stream(0);
  const counter_stream next_step = counter_rng(77).stream(1);
  std::array<double, 32> ones{};
  double sxy = 0, sx = 0, sxx = 0, cross_step = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t x = s.bits32(i);
    for (int b = 0; b < 32; ++b) ones[b] += (x >> b) & 1u;
    const double u = s.uniform_float(i), v = s.uniform_float(i + 1), w = next_step.uniform_float(i);
    sx += u;
    sxx += u * u;
    sxy += u * v;
    cross_step += u * w;
  }
  const double tol = 6 * 0.5 / std::sqrt(double(n));
  for (int b = 0; b < 32; ++b) CHECK(std::abs(ones[b] / n - 0.5) < tol);
  const double mean = sx / n, var = sxx / n - mean * mean;
  const double corr_next = (sxy / n - mean * mean) / var;
  const double corr_step = (cross_step / n - mean * mean) / var;
  CHECK(std::abs(corr_next) < 6 / std::sqrt(double(n)));
  CHECK(std::abs(corr_step) < 6 / std::sqrt(double(n)));
}

TEST_CASE("flipping one index bit flips about half the output bits (avalanche)") {
  const counter_stream s = counter_rng(1).stream(2);
  for (int bit = 0; bit < 40; ++bit) {
    double flipped = 0;
    const int trials = 4000;
    for (int t = 0; t < trials; ++t) {
      const std::uint64_t i = s.bits64(t) & ((1ull << 40) - 1);
      flipped += __builtin_popcount(s.bits32(i) ^ s.bits32(i ^ (1ull << bit)));
      flipped += __builtin_popcountll(s.bits64(i) ^ s.bits64(i ^ (1ull << bit))) / 2.0;
    }
    // mean of the two halves is 16 bits per draw; sd of the estimate < 0.06
    CHECK(std::abs(flipped / trials / 2 - 16.0) < 0.6);
  }
}

TEST_CASE("uniform_double, below and mulhi64") {
  const counter_stream s = counter_rng(11).stream(4);
  const std::size_t n = 1 << 18;
  double sum = 0;
  std::array<double, 10> count{};
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double u = s.uniform_double(i);
    bad += !(u >= 0.0 && u < 1.0);
    sum += u;
    const auto k = s.below(i, 10);
    bad += k >= 10;
    count[std::min<std::uint64_t>(k, 9)] += 1;
    bad += s.below(i, 1) != 0;
    bad += s.below(i, 0) != 0;
    bad += s.below(i, ~0ull) == ~0ull;
  }
  CHECK(bad == 0);
  CHECK(std::abs(sum / n - 0.5) < 6 * std::sqrt(1.0 / 12 / n));
  double chi2 = 0;
  for (double c : count) chi2 += (c - n / 10.0) * (c - n / 10.0) / (n / 10.0);
  CHECK(chi2 < 9 + 6 * std::sqrt(18.0));

  __extension__ typedef unsigned __int128 u128;
  int wrong = 0;
  for (std::uint64_t i = 0; i < 10000; ++i) {
    const std::uint64_t a = s.bits64(2 * i), b = s.bits64(2 * i + 1);
    wrong += mulhi64(a, b) != static_cast<std::uint64_t>((u128(a) * b) >> 64);
  }
  CHECK(wrong == 0);
  CHECK(mulhi64(~0ull, ~0ull) == ~0ull - 1);
  CHECK(mulhi64(1ull << 63, 4) == 2);
}

static_assert(counter_rng(3).stream(4).bits32(5) == counter_rng(3).stream(4).bits32(5), "usable in constexpr");

#if defined(GRADCOMP_HAS_XSIMD)
TEST_CASE("bits32_lanes on an xsimd batch equals the scalar draws lane by lane") {
  using bu = xsimd::batch<std::uint32_t>;
  constexpr std::size_t w = bu::size;
  const counter_stream s = counter_rng(123).stream(456);
  for (std::uint64_t base : {0ull, 1000ull, (1ull << 32) - 3, (5ull << 32) + 77}) {
    alignas(64) std::uint32_t lo[w], hi[w], got[w];
    for (std::size_t j = 0; j < w; ++j) {
      lo[j] = static_cast<std::uint32_t>(base + j);
      hi[j] = static_cast<std::uint32_t>((base + j) >> 32);
    }
    const bu r = counter_stream::bits32_lanes(bu::load_aligned(lo), bu::load_aligned(hi), s.key_lo(), s.key_hi());
    r.store_aligned(got);
    for (std::size_t j = 0; j < w; ++j) CHECK(got[j] == s.bits32(base + j));
  }
}
#endif

TEST_CASE("the index's high half folds into the key (used by the QSGD simd kernel)") {
  // bits32_lanes(lo, hi, kl, kh) == bits32_lanes(lo, 0, kl, kh ^ hi * 0x9E3779B9):
  // kernels whose batches share one high half compute it once per batch.
  const counter_stream s = counter_rng(8).stream(9);
  int bad = 0;
  for (std::uint64_t t = 0; t < 20000; ++t) {
    const std::uint64_t i = s.bits64(t);
    const auto lo = static_cast<std::uint32_t>(i), hi = static_cast<std::uint32_t>(i >> 32);
    bad += counter_stream::bits32_lanes<std::uint32_t>(lo, hi, s.key_lo(), s.key_hi()) !=
           counter_stream::bits32_lanes<std::uint32_t>(lo, 0u, s.key_lo(), s.key_hi() ^ (hi * 0x9E3779B9u));
    bad += s.bits32(i) != counter_stream::bits32_lanes<std::uint32_t>(lo, hi, s.key_lo(), s.key_hi());
  }
  CHECK(bad == 0);
}
