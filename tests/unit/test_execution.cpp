// execution.hpp: dispatch by overload on the policy, generic fallback,
// interception by a user policy, and seq == simd for the shared kernels.
#include <doctest/doctest.h>

#include <gradcomp/dense.hpp>
#include <gradcomp/execution.hpp>

#include <support/error_checks.hpp>
#include <support/random_vectors.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <type_traits>

namespace counting {

// A test-only policy: derives from simd, so anything it does not override
// falls back to the simd (or generic) kernel.
struct counting_policy : gradcomp::execution::simd {};

inline int add_into_calls = 0;

// Found by argument-dependent lookup in this namespace: it wins over the
// library's overloads because it is the exact match.
inline void add_into(counting_policy, std::span<float> acc, std::span<const float> x) noexcept {
  ++add_into_calls;
  gradcomp::execution::add_into(gradcomp::execution::seq{}, acc, x);
}

}  // namespace counting

namespace {

struct fallback_only_policy : gradcomp::execution::seq {};

// n draws of Normal(0, 1) from a fresh std::mt19937(seed).
std::vector<float> random_floats(std::size_t n, unsigned seed) { return gradcomp::test_support::mt_normal(seed, n); }

}  // namespace

TEST_CASE("a user policy intercepts a kernel through a codec") {
  using gradcomp::dense_codec;
  dense_codec<counting::counting_policy> codec;
  gradcomp::dense_payload a, b;
  codec.encode(std::vector<float>{1, 2, 3}, a);
  codec.encode(std::vector<float>{10, 20, 30}, b);
  counting::add_into_calls = 0;
  codec.accumulate(a, b);
  CHECK(counting::add_into_calls == 1);
  CHECK(a.values == std::vector<float>{11, 22, 33});
  // find_non_finite is not overridden: it falls back to the simd/generic kernel.
  CHECK_THROWS_AS(codec.encode(std::vector<float>{1, NAN}, a), gradcomp::non_finite_error);
}

TEST_CASE("a policy with no kernels of its own falls back to the generic ones") {
  gradcomp::dense_codec<fallback_only_policy> codec;
  gradcomp::dense_payload a, b;
  codec.encode(std::vector<float>{1, 2}, a);
  codec.encode(std::vector<float>{3, 4}, b);
  codec.accumulate(a, b);
  CHECK(a.values == std::vector<float>{4, 6});
}

TEST_CASE("simd kernels equal seq kernels bit for bit") {
  using namespace gradcomp::execution;
  for (std::size_t n : {0u, 1u, 3u, 8u, 15u, 16u, 17u, 1000u, 4099u}) {
    auto acc_seq = random_floats(n, 1);
    auto acc_simd = acc_seq;
    const auto x = random_floats(n, 2);
    add_into(seq{}, std::span<float>(acc_seq), std::span<const float>(x));
    add_into(simd{}, std::span<float>(acc_simd), std::span<const float>(x));
    CHECK(acc_seq == acc_simd);
  }
}

TEST_CASE("find_non_finite finds the first NaN or infinity under every policy") {
  using namespace gradcomp::execution;
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  for (std::size_t n : {1u, 7u, 16u, 1025u, 5000u}) {
    auto x = random_floats(n, 3);
    CHECK(find_non_finite(seq{}, x) == n);
    CHECK(find_non_finite(simd{}, x) == n);
    for (float bad : bad_values) {
      for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
        auto y = x;
        y[at] = bad;
        if (at + 1 < n) y[n - 1] = bad;  // a later bad value must not hide the first
        CHECK(find_non_finite(seq{}, y) == at);
        CHECK(find_non_finite(simd{}, y) == at);
      }
    }
  }
  // Largest finite values and denormals are finite.
  std::vector<float> edge = {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                             std::numeric_limits<float>::denorm_min(), 0.0f, -0.0f};
  CHECK(find_non_finite(seq{}, edge) == edge.size());
  CHECK(find_non_finite(simd{}, edge) == edge.size());
}

TEST_CASE("simd_available reflects the build") {
#if defined(GRADCOMP_HAS_XSIMD)
  CHECK(gradcomp::execution::simd_available);
#else
  CHECK_FALSE(gradcomp::execution::simd_available);
#endif
}

TEST_CASE("the ABI tag names this translation unit's configuration") {
  const std::string tag = gradcomp::execution::abi_tag;
  CHECK(tag.rfind("abi_v", 0) == 0);
  CHECK((tag.find("_xsimd") != std::string::npos) == gradcomp::execution::simd_available);
#if defined(__AVX2__)
  CHECK(tag.find("_avx2") != std::string::npos);
#else
  CHECK(tag.find("_avx2") == std::string::npos);
#endif
#if defined(__FMA__)
  CHECK(tag.find("_fma") != std::string::npos);
#else
  CHECK(tag.find("_fma") == std::string::npos);
#endif
  // The policy tags are in the inline namespace: the same types by both names.
  CHECK(std::is_same_v<gradcomp::execution::seq, gradcomp::execution::GRADCOMP_ABI_TAG::seq>);
  CHECK(std::is_same_v<gradcomp::execution::simd, gradcomp::execution::GRADCOMP_ABI_TAG::simd>);
}

TEST_CASE("dense_codec rejects bad input with typed errors") {
  gradcomp::dense_codec<> codec;
  gradcomp::dense_payload p, q;
  codec.encode(std::vector<float>{1, 2, 3}, p);
  std::vector<float> out(2);
  CHECK_THROWS_AS(codec.decode(p, out), gradcomp::size_mismatch_error);
  CHECK_THROWS_AS(codec.decode_add(p, out), gradcomp::size_mismatch_error);
  codec.encode(std::vector<float>{1, 2}, q);
  CHECK_THROWS_AS(codec.accumulate(p, q), gradcomp::size_mismatch_error);
  const std::vector<float> with_inf{1, 2, INFINITY, 4};
  CHECK(gradcomp::test_support::non_finite_index_of([&] { codec.encode(with_inf, p); }) == 2);
  CHECK(p.values == std::vector<float>{1, 2, 3});  // untouched on rejection
  CHECK(codec.encoded_bytes(p) == gradcomp::wire::header_size + 12);
}
