// Top-k selection kernels (system/{generic,simd}/topk.hpp): exact selection
// against a full sort, tie rule, every radix level, sampled selection, and
// simd == seq.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gradcomp/payloads/topk.hpp>  // the selection count and the topk kernels of every configured backend

#include <support/random_vectors.hpp>
#include <support/topk_reference.hpp>

namespace {

using namespace gradcomp;
using execution::topk_workspace;

using test_support::is_exact_top;
using test_support::reference_topk;  // the k largest |x|, lower index first among ties (full sort)

// n draws of Normal(0, scale) from a fresh std::mt19937(seed).
std::vector<float> gaussian(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  return test_support::mt_normal(seed, n, scale);
}

template <class Policy>
std::vector<std::uint32_t> exact(Policy p, const std::vector<float>& x, std::size_t k, std::uint64_t seed = 0) {
  topk_workspace ws;
  std::vector<std::uint32_t> out;
  execution::topk_exact(p, std::span<const float>(x), k, out, ws, seed, seed + 1);
  return out;
}

template <class Policy>
std::vector<std::uint32_t> radix(Policy p, const std::vector<float>& x, std::size_t k) {
  topk_workspace ws;
  std::vector<std::uint32_t> out;
  execution::topk_radix(p, std::span<const float>(x), k, out, ws);
  return out;
}

using test_support::sample_positions;  // the positions the sampled threshold reads for (n, k, seed, stream)

template <class Policy>
std::vector<std::uint32_t> sampled(Policy p, const std::vector<float>& x, std::size_t k, std::uint64_t seed,
                                   std::uint64_t stream) {
  topk_workspace ws;
  std::vector<std::uint32_t> out;
  const std::size_t got = execution::topk_sampled(p, std::span<const float>(x), k, seed, stream, out, ws);
  REQUIRE(got == out.size());
  return out;
}

void check_exact_both(const std::vector<float>& x, std::size_t k) {
  const auto want = reference_topk(x, k);
  CHECK(exact(execution::seq{}, x, k) == want);
  CHECK(exact(execution::simd{}, x, k, 3) == want);
  CHECK(radix(execution::seq{}, x, k) == want);
  CHECK(radix(execution::simd{}, x, k) == want);
}

}  // namespace

TEST_CASE("the O(n) top-k validator agrees with the full sort") {
  std::mt19937 gen(1);
  std::uniform_int_distribution<int> pick(-4, 4);
  std::vector<float> x(300);
  for (auto& v : x) v = float(pick(gen));
  for (std::size_t k : {1u, 20u, 100u, 299u}) {
    auto r = reference_topk(x, k);
    CHECK(is_exact_top(x, r));
    auto shifted = r;
    shifted.back() = static_cast<std::uint32_t>(
        std::find_if(x.begin(), x.end(), [&](float v) { return std::fabs(v) < std::fabs(x[r.back()]); }) - x.begin());
    std::sort(shifted.begin(), shifted.end());
    CHECK_FALSE(is_exact_top(x, shifted));
  }
  // Tie rule: swapping a tied selected index for a later unselected one fails.
  std::vector<float> ties(10, 1.0f);
  CHECK(is_exact_top(ties, {0, 1, 2}));
  CHECK_FALSE(is_exact_top(ties, {0, 1, 3}));
}

TEST_CASE("topk_key orders magnitudes") {
  const float vals[] = {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), 1e-30f, -0.5f, 1.0f, -3.0f,
                        std::numeric_limits<float>::max()};
  for (float a : vals)
    for (float b : vals) CHECK((execution::topk_key(a) < execution::topk_key(b)) == (std::fabs(a) < std::fabs(b)));
  CHECK(execution::topk_key(-0.0f) == 0u);
}

TEST_CASE("exact top-k equals the k largest magnitudes of a full sort") {
  for (std::size_t n : {1u, 2u, 7u, 15u, 16u, 17u, 33u, 100u, 1000u, 4099u, 100000u}) {
    const auto x = gaussian(n, static_cast<std::uint32_t>(n));
    for (std::size_t k : {std::size_t{1}, std::size_t{2}, n / 100 + 1, n / 10 + 1, n / 2 + 1, n - 1, n, n + 5}) {
      if (k == 0) continue;
      CAPTURE(n);
      CAPTURE(k);
      check_exact_both(x, k);
    }
  }
}

TEST_CASE("exact top-k tie rule: lower index wins among equal magnitudes") {
  // Values from a tiny set (many ties, both signs, zeros): the boundary
  // magnitude is shared by many entries.
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> pick(-3, 3);
  std::vector<float> x(5000);
  for (auto& v : x) v = 0.25f * float(pick(gen));
  for (std::size_t k : {1u, 10u, 700u, 1500u, 2500u, 4000u, 4999u}) {
    CAPTURE(k);
    check_exact_both(x, k);
  }
  // All zeros (an unused embedding row): the first k indices.
  std::vector<float> zeros(3000, 0.0f);
  zeros[17] = -0.0f;
  const auto z = exact(execution::simd{}, zeros, 40);
  REQUIRE(z.size() == 40);
  for (std::uint32_t j = 0; j < 40; ++j) CHECK(z[j] == j);
  check_exact_both(zeros, 40);
}

TEST_CASE("exact top-k through every radix level (one huge bin)") {
  // 300000 values within 512 ulps of 1.0: they share the top 22 key bits, so
  // levels 0 and 1 each leave a bin larger than the collect limit and the
  // threshold is resolved at level 2 with the final collecting pass.
  std::mt19937 gen(11);
  std::uniform_int_distribution<std::uint32_t> ulp(0, 511);
  std::vector<float> x(300000);
  for (auto& v : x) v = std::bit_cast<float>(std::bit_cast<std::uint32_t>(1.0f) + ulp(gen)) * (gen() & 1 ? 1.f : -1.f);
  for (std::size_t k : {1u, 5u, 1000u, 100000u}) {
    CAPTURE(k);
    check_exact_both(x, k);
  }
  // Level-1 exit: values spread over the low 20 bits of one level-0 bin.
  std::uniform_int_distribution<std::uint32_t> wide(0, (1u << 20) - 1);
  for (auto& v : x) v = std::bit_cast<float>(std::bit_cast<std::uint32_t>(1.0f) + wide(gen));
  for (std::size_t k : {3u, 2000u}) {
    CAPTURE(k);
    check_exact_both(x, k);
  }
}

TEST_CASE("exact top-k on extreme magnitudes") {
  std::vector<float> x = gaussian(2000, 3);
  x[5] = std::numeric_limits<float>::max();
  x[6] = -std::numeric_limits<float>::max();
  x[7] = std::numeric_limits<float>::denorm_min();
  x[8] = -std::numeric_limits<float>::min();
  x[9] = 0.0f;
  for (std::size_t k : {1u, 2u, 3u, 1995u, 1999u}) check_exact_both(x, k);
}

TEST_CASE("topk_select_keys finds the k-th largest key and the count above it") {
  std::mt19937 gen(5);
  for (std::size_t n : {1u, 3u, 100u, 5000u}) {
    std::vector<std::uint32_t> keys(n);
    for (auto& k : keys) k = gen() & 0x7FFFFFFFu & (gen() & 1 ? 0x7FFFFFFFu : 0x7F0000FFu);
    for (std::size_t k : {std::size_t{1}, n / 3 + 1, n}) {
      auto sorted = keys;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      auto work = keys;
      std::vector<std::uint32_t> scratch;
      const auto th = execution::topk_select_keys(execution::seq{}, std::span<std::uint32_t>(work), k, scratch);
      CHECK(th.key == sorted[k - 1]);
      CHECK(th.greater == static_cast<std::size_t>(std::count_if(keys.begin(), keys.end(),
                                                                  [&](std::uint32_t v) { return v > th.key; })));
    }
  }
}

TEST_CASE("sampled top-k: the selection is the exact top of its size, near k") {
  const std::size_t n = 200000;
  for (double ratio : {1.0, 0.1}) {
    const std::size_t k = sparse_selection_count(n, ratio);
    std::size_t total = 0;
    const int runs = 6;
    for (int run = 0; run < runs; ++run) {
      const auto x = gaussian(n, 100 + run, run % 2 ? 1e-3f : 1.0f);
      const auto s = sampled(execution::seq{}, x, k, 42, run);
      CAPTURE(ratio);
      CAPTURE(run);
      REQUIRE(s.size() <= k);
      CHECK(is_exact_top(x, s));
      CHECK(s == sampled(execution::simd{}, x, k, 42, run));
      total += s.size();
    }
    // The threshold sits ~3 standard deviations below the k-th magnitude, so
    // nearly every run selects exactly k; require 95% on average.
    CHECK(double(total) >= 0.95 * double(k) * runs);
  }
}

TEST_CASE("sampled top-k is deterministic and falls back to exact where sampling cannot help") {
  const auto x = gaussian(200000, 9);
  const std::size_t k = 200;
  CHECK(sampled(execution::seq{}, x, k, 1, 2) == sampled(execution::seq{}, x, k, 1, 2));
  // A small layer (sample would be most of it): exact.
  const auto small = gaussian(3000, 10);
  CHECK(sampled(execution::simd{}, small, 30, 1, 0) == reference_topk(small, 30));
  // Mostly zeros: the sampled threshold is 0, exact selection takes over.
  std::vector<float> sparse(200000, 0.0f);
  for (std::size_t i = 0; i < 50; ++i) sparse[i * 3001] = float(i + 1);
  const auto s = sampled(execution::simd{}, sparse, 1000, 3, 4);
  CHECK(s == reference_topk(sparse, 1000));
  // k >= n selects everything.
  CHECK(sampled(execution::seq{}, small, small.size(), 1, 0).size() == small.size());
}

TEST_CASE("sample plan: rank above the expected hits, sample much smaller than n") {
  const auto p = execution::topk_plan_sample(10000000, 10000);
  CHECK_FALSE(p.use_exact);
  CHECK(p.samples * 2 <= 10000000);
  const double mu = double(p.samples) * 10000 / 1e7;
  CHECK(double(p.rank) > mu);
  CHECK(p.rank <= p.samples);
  CHECK(execution::topk_plan_sample(1000, 10).use_exact);
  CHECK(execution::topk_plan_sample(1000, 1000).use_exact);
  CHECK(execution::topk_plan_sample(1000, 0).use_exact);
}

TEST_CASE("exact top-k when the sampled bracket misses: radix fallback") {
  // Put a large value at every sampled position: the sampled threshold is
  // that value, and fewer than k entries reach it (s < k), so topk_exact must
  // fall back to the radix select; topk_sampled returns the s entries.
  const std::size_t n = 1000000, k = sparse_selection_count(n, 1.0);
  auto x = gaussian(n, 12);
  const auto pos = sample_positions(n, k, 8, 9);
  REQUIRE(pos.size() < k);
  for (auto i : pos) x[i] = 10.0f;
  for (auto policy_is_simd : {false, true}) {
    topk_workspace ws;
    std::vector<std::uint32_t> out;
    if (policy_is_simd)
      execution::topk_exact(execution::simd{}, std::span<const float>(x), k, out, ws, 8, 9);
    else
      execution::topk_exact(execution::seq{}, std::span<const float>(x), k, out, ws, 8, 9);
    CHECK(out.size() == k);
    CHECK(is_exact_top(x, out));
  }
  const auto s = sampled(execution::simd{}, x, k, 8, 9);
  CHECK(s.size() == pos.size());
  CHECK(is_exact_top(x, s));
  CHECK(s == sampled(execution::seq{}, x, k, 8, 9));
}

TEST_CASE("sample positions are stratified and reproducible") {
  const auto rng = execution::topk_detail::sample_stream(5, 6);
  const std::size_t n = 1000003, s = 4099;
  std::size_t prev = 0;
  for (std::size_t j = 0; j < s; ++j) {
    const std::size_t i = execution::topk_detail::sample_position(n, s, j, rng);
    CHECK(i >= std::uint64_t(j) * n / s);
    CHECK(i < std::uint64_t(j + 1) * n / s);
    if (j > 0) CHECK(i > prev);
    prev = i;
    CHECK(i == execution::topk_detail::sample_position(n, s, j, execution::topk_detail::sample_stream(5, 6)));
  }
  // The chunked, division-free generator draws the same positions from any start.
  for (std::size_t j0 : {0u, 1u, 255u, 4000u}) {
    std::vector<std::size_t> pos(s - j0);
    execution::topk_detail::sample_positions(n, s, j0, pos.size(), rng, pos.data());
    for (std::size_t t = 0; t < pos.size(); ++t)
      REQUIRE(pos[t] == execution::topk_detail::sample_position(n, s, j0 + t, rng));
  }
}

TEST_CASE("topk_scale_unselected scales exactly the complement") {
  const auto x = gaussian(1000, 30);
  const std::vector<std::uint32_t> keep = {0, 1, 17, 18, 500, 998};
  auto a = x, b = x;
  execution::topk_scale_unselected(execution::seq{}, std::span<float>(a), std::span<const std::uint32_t>(keep), 3.0f);
  execution::topk_scale_unselected(execution::simd{}, std::span<float>(b), std::span<const std::uint32_t>(keep), 3.0f);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const bool kept = std::find(keep.begin(), keep.end(), i) != keep.end();
    CHECK(a[i] == (kept ? x[i] : x[i] * 3.0f));
  }
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST_CASE("collect kernels: simd equals seq, including scaling of the rest") {
  const auto x = gaussian(10007, 21);
  for (std::uint32_t t : {0u, execution::topk_key(0.5f), execution::topk_key(2.0f), execution::topk_key(10.0f)}) {
    std::vector<std::uint32_t> a, b;
    execution::topk_collect_ge(execution::seq{}, std::span<const float>(x), t, a);
    execution::topk_collect_ge(execution::simd{}, std::span<const float>(x), t, b);
    CHECK(a == b);
    auto xa = x, xb = x;
    a.clear();
    b.clear();
    execution::topk_collect_ge_scale_rest(execution::seq{}, std::span<float>(xa), t, 1.25f, a);
    execution::topk_collect_ge_scale_rest(execution::simd{}, std::span<float>(xb), t, 1.25f, b);
    CHECK(a == b);
    CHECK(std::memcmp(xa.data(), xb.data(), xa.size() * sizeof(float)) == 0);
    for (std::size_t need : {0u, 1u, 3u}) {
      a.clear();
      b.clear();
      execution::topk_collect_final(execution::seq{}, std::span<const float>(x), t, need, a);
      execution::topk_collect_final(execution::simd{}, std::span<const float>(x), t, need, b);
      CHECK(a == b);
    }
  }
}
