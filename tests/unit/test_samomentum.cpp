// sa_momentum (DGS Alg. 3, eqs. 14-16): reference recurrence, eq. 16 on every
// send, R = 100% == dense momentum, sampled density, simd == seq, state
// save/restore, bad inputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gradcomp/samomentum.hpp>

#include <support/error_checks.hpp>
#include <support/equality.hpp>
#include <support/random_vectors.hpp>
#include <support/topk_reference.hpp>

namespace {

using namespace gradcomp;

static_assert(Codec<sa_momentum<>>);
static_assert(DecodeAddCodec<sa_momentum<>>);
static_assert(StatefulCodec<sa_momentum<execution::simd>>);
static_assert(std::is_same_v<sa_momentum<>::payload_type, sparsifier_with_memory<>::payload_type>);

using test_support::is_exact_top;
using test_support::reference_topk;  // the k largest |x|, lower index first among ties (full sort)

// n draws of Normal(0, scale) from gen.
std::vector<float> normal(std::mt19937& gen, std::size_t n, float scale = 1.0f) {
  return test_support::mt_normal(gen, n, scale);
}
using test_support::bit_equal;

/// m*u + eta*g rounded as the codec rounds it (two products, one sum). The
/// volatiles keep the compiler from fusing a product and the sum into an FMA
/// (GCC contracts across statements by default in C++).
float velocity_step(float m, float u, float eta, float g) {
  volatile float mu = m * u;
  volatile float eg = eta * g;
  return mu + eg;
}

sa_momentum_options make_options(double ratio, float m, float eta, threshold_mode mode = threshold_mode::exact) {
  sa_momentum_options o;
  o.ratio_percent = ratio;
  o.momentum = m;
  o.learning_rate = eta;
  o.mode = mode;
  o.seed = 17;
  return o;
}

}  // namespace

TEST_CASE("exact mode follows Alg. 3: u = m u + eta g, send top-k of |u|, unsent u *= 1/m") {
  const std::size_t n = 4001;
  const float m = 0.7f, eta = 0.05f;
  sa_momentum<execution::simd> codec(n, make_options(1.0, m, eta));
  const std::size_t k = codec.selection_size();
  std::mt19937 gen(1);
  std::vector<float> u(n, 0.0f);
  sparse_coo_payload p;
  for (int t = 0; t < 20; ++t) {
    const auto g = normal(gen, n);
    for (std::size_t i = 0; i < n; ++i) u[i] = velocity_step(m, u[i], eta, g[i]);
    codec.encode(g, p);
    const auto sent = reference_topk(u, k);
    REQUIRE(p.indices == sent);
    CHECK(codec.last_selected() == k);
    std::vector<char> is_sent(n, 0);
    for (std::size_t j = 0; j < k; ++j) {
      CHECK(p.values[j] == u[sent[j]]);  // g = u where mask (eq. 14b); u is kept
      is_sent[sent[j]] = 1;
    }
    for (std::size_t i = 0; i < n; ++i)
      if (!is_sent[i]) u[i] = u[i] * (1.0f / m);  // eq. 15, second case
    REQUIRE(bit_equal(u, codec.velocity()));
  }
}

TEST_CASE("exact mode when the sampled bracket misses: radix fallback, rest rescaled") {
  const std::size_t n = 200000;
  const float m = 0.7f, eta = 0.5f;
  auto o = make_options(5.0, m, eta);
  const std::size_t k = sparse_selection_count(n, o.ratio_percent);
  const auto pos = test_support::sample_positions(n, k, o.seed, 0);
  REQUIRE(pos.size() < k);
  std::mt19937 gen(8);
  auto g = normal(gen, n);
  for (auto i : pos) g[i] = 40.0f;
  std::vector<float> u(n);
  for (std::size_t i = 0; i < n; ++i) u[i] = velocity_step(m, 0.0f, eta, g[i]);
  const auto want = reference_topk(u, k);
  std::vector<char> sent(n, 0);
  for (auto i : want) sent[i] = 1;
  for (std::size_t i = 0; i < n; ++i)
    if (!sent[i]) u[i] = u[i] * (1.0f / m);
  sa_momentum<execution::seq> a(n, o);
  sa_momentum<execution::simd> b(n, o);
  sparse_coo_payload pa, pb;
  a.encode(g, pa);
  b.encode(g, pb);
  CHECK(pa.indices == want);
  CHECK(pb.indices == want);
  CHECK(bit_equal(u, a.velocity()));
  CHECK(bit_equal(u, b.velocity()));
}

TEST_CASE("eq. 16: a coordinate sent at c and next at c+T sends m*u_c + eta*(sum of the T gradients)") {
  // Every send of every coordinate over many steps is checked: u_c is its
  // velocity after its previous send (0 before the first one), and the T
  // gradients are those of steps c+1 .. c+T.
  for (auto mode : {threshold_mode::exact, threshold_mode::sampled}) {
    const std::size_t n = 3000;
    const float m = 0.7f, eta = 0.1f;
    sa_momentum<execution::simd> codec(n, make_options(2.0, m, eta, mode));
    std::mt19937 gen(2);
    std::vector<double> u_c(n, 0.0), grad_sum(n, 0.0), grad_abs(n, 0.0);
    std::vector<int> interval(n, 0);
    sparse_coo_payload p;
    std::size_t checked = 0, long_intervals = 0;
    double worst = 0.0;
    for (int t = 0; t < 60; ++t) {
      auto g = normal(gen, n);
      for (std::size_t i = 0; i < n; ++i) g[i] *= 1.0f + float(i % 7);  // uneven scales: uneven intervals
      for (std::size_t i = 0; i < n; ++i) {
        grad_sum[i] += g[i];
        grad_abs[i] += std::fabs(g[i]);
        ++interval[i];
      }
      codec.encode(g, p);
      for (std::size_t j = 0; j < p.nnz(); ++j) {
        const std::uint32_t i = p.indices[j];
        const double expected = double(m) * u_c[i] + double(eta) * grad_sum[i];  // eq. 16
        const double scale = std::fabs(double(m) * u_c[i]) + double(eta) * grad_abs[i];
        // Each step rounds a product, a sum and the 1/m rescale: a few ulps per step.
        worst = std::max(worst, std::fabs(double(p.values[j]) - expected) / (scale * 4e-7 * (interval[i] + 1)));
        ++checked;
        if (interval[i] >= 3) ++long_intervals;
        u_c[i] = p.values[j];  // the sent value is the velocity kept (not rescaled)
        CHECK(codec.velocity()[i] == p.values[j]);
        grad_sum[i] = grad_abs[i] = 0.0;
        interval[i] = 0;
      }
    }
    CAPTURE(int(mode));
    CHECK(checked > 3000);
    CHECK(long_intervals > 500);  // the property is exercised with T > 1, not only T = 1
    CHECK(worst <= 1.0);
  }
}

TEST_CASE("eq. 16 on a hand-made schedule: unsent for T-1 steps, sent at step T") {
  // Coordinate 0 is sent at step 0, stays below coordinate j's value at steps
  // 1..T-1 (coordinate j = t carries a huge gradient), and is sent at step T.
  const std::size_t n = 100;  // R = 1%: k = 1
  const float m = 0.5f, eta = 0.25f;  // powers of two: every operation is exact
  sa_momentum<> codec(n, make_options(1.0, m, eta));
  sparse_coo_payload p;
  const int T = 5;
  std::vector<float> g(n, 0.0f);
  g[0] = 8.0f;
  codec.encode(g, p);
  REQUIRE(p.indices == std::vector<std::uint32_t>{0});
  const float u_c = p.values[0];
  CHECK(u_c == eta * 8.0f);
  float sum = 0.0f;
  for (int t = 1; t < T; ++t) {
    std::fill(g.begin(), g.end(), 0.0f);
    g[0] = 1.0f;
    g[t] = 1000.0f;
    sum += g[0];
    codec.encode(g, p);
    REQUIRE(p.indices == std::vector<std::uint32_t>{std::uint32_t(t)});
  }
  std::fill(g.begin(), g.end(), 0.0f);
  g[0] = 4096.0f;
  sum += g[0];
  codec.encode(g, p);
  REQUIRE(p.indices == std::vector<std::uint32_t>{0});
  CHECK(p.values[0] == m * u_c + eta * sum);
}

TEST_CASE("R = 100% equals dense momentum SGD's velocity (eq. 8)") {
  const std::size_t n = 1003;
  const float m = 0.9f, eta = 0.01f;
  sa_momentum<execution::seq> a(n, make_options(100.0, m, eta));
  sa_momentum<execution::simd> b(n, make_options(100.0, m, eta, threshold_mode::sampled));
  std::mt19937 gen(3);
  std::vector<float> u(n, 0.0f), decoded(n);
  sparse_coo_payload pa, pb;
  for (int t = 0; t < 25; ++t) {
    const auto g = normal(gen, n);
    for (std::size_t i = 0; i < n; ++i) u[i] = velocity_step(m, u[i], eta, g[i]);
    a.encode(g, pa);
    b.encode(g, pb);
    CHECK(pa.nnz() == n);
    a.decode(pa, decoded);
    CHECK(bit_equal(u, decoded));
    CHECK(bit_equal(u, a.velocity()));
    CHECK(bit_equal(u, b.velocity()));
  }
}

TEST_CASE("sampled mode: density near R, selection is the exact top of its size") {
  const std::size_t n = 200000;
  const float m = 0.7f, eta = 0.1f;
  for (double ratio : {1.0, 0.1}) {
    sa_momentum<execution::simd> codec(n, make_options(ratio, m, eta, threshold_mode::sampled));
    const std::size_t k = codec.selection_size();
    std::mt19937 gen(4);
    std::vector<float> u(n, 0.0f);
    sparse_coo_payload p;
    double density = 0.0;
    const int steps = 6;
    for (int t = 0; t < steps; ++t) {
      const auto g = normal(gen, n);
      for (std::size_t i = 0; i < n; ++i) u[i] = velocity_step(m, u[i], eta, g[i]);
      codec.encode(g, p);
      REQUIRE(p.nnz() <= k);
      CHECK(is_exact_top(u, p.indices));
      std::vector<char> sent(n, 0);
      for (auto i : p.indices) sent[i] = 1;
      for (std::size_t i = 0; i < n; ++i)
        if (!sent[i]) u[i] = u[i] * (1.0f / m);
      CHECK(bit_equal(u, codec.velocity()));
      density += codec.last_density();
    }
    CAPTURE(ratio);
    CHECK(density / steps >= 0.95 * ratio / 100.0);
  }
}

TEST_CASE("simd kernels equal seq kernels bit for bit") {
  for (auto mode : {threshold_mode::exact, threshold_mode::sampled}) {
    for (double ratio : {0.1, 1.0, 10.0}) {
      const std::size_t n = 200003;
      sa_momentum<execution::seq> a(n, make_options(ratio, 0.45f, 0.3f, mode));
      sa_momentum<execution::simd> b(n, make_options(ratio, 0.45f, 0.3f, mode));
      std::mt19937 gen(5);
      sparse_coo_payload pa, pb;
      for (int t = 0; t < 4; ++t) {
        const auto g = normal(gen, n, 1e-3f);
        a.encode(g, pa);
        b.encode(g, pb);
        CHECK(pa.indices == pb.indices);
        CHECK(bit_equal(pa.values, pb.values));
        CHECK(bit_equal(a.velocity(), b.velocity()));
      }
    }
  }
}

TEST_CASE("ties and all-zero gradients: lower index first, rescaling of the rest") {
  const std::size_t n = 1000;
  sa_momentum<execution::simd> codec(n, make_options(1.0, 0.5f, 1.0f));
  std::vector<float> g(n, 0.0f);
  sparse_coo_payload p;
  codec.encode(g, p);
  std::vector<std::uint32_t> first10(10);
  std::iota(first10.begin(), first10.end(), 0u);
  CHECK(p.indices == first10);
  std::fill(g.begin(), g.end(), 1.0f);
  codec.encode(g, p);  // u = 0.5*0 + 1 everywhere: all tie, the first 10 again
  CHECK(p.indices == first10);
  // Unsent coordinates were rescaled by 1/m = 2.
  CHECK(codec.velocity()[500] == 2.0f);
  CHECK(codec.velocity()[0] == 1.0f);
}

TEST_CASE("state save/restore resumes bit-exactly, learning rate included") {
  for (auto mode : {threshold_mode::exact, threshold_mode::sampled}) {
    const std::size_t n = 150001;
    sa_momentum<execution::simd> a(n, make_options(0.5, 0.7f, 0.1f, mode));
    std::mt19937 gen(6);
    sparse_coo_payload pa, pb;
    for (int t = 0; t < 3; ++t) a.encode(normal(gen, n), pa);
    a.set_learning_rate(0.05f);
    sa_momentum<execution::seq> b(n, make_options(0.5, 0.7f, 0.1f, mode));
    b.restore_state(a.save_state());
    CHECK(b.options().learning_rate == 0.05f);
    // Another configuration cannot take this state.
    CHECK_THROWS_AS(sa_momentum<>(n, make_options(1.0, 0.7f, 0.1f, mode)).restore_state(a.save_state()), state_error);
    CHECK_THROWS_AS(sa_momentum<>(n, make_options(0.5, 0.6f, 0.1f, mode)).restore_state(a.save_state()), state_error);
    for (int t = 0; t < 3; ++t) {
      const auto g = normal(gen, n);
      a.encode(g, pa);
      b.encode(g, pb);
      CHECK(pa.indices == pb.indices);
      CHECK(bit_equal(pa.values, pb.values));
    }
    CHECK(bit_equal(a.velocity(), b.velocity()));
    CHECK(a.steps() == b.steps());
  }
}

TEST_CASE("payload goes through wire and decodes") {
  const std::size_t n = 5000;
  sa_momentum<> codec(n, make_options(1.0, 0.7f, 1.0f));
  std::mt19937 gen(7);
  sparse_coo_payload p;
  codec.encode(normal(gen, n), p);
  const auto bytes = wire::serialize(p);
  CHECK(bytes.size() == codec.encoded_bytes(p));
  const auto q = wire::parse<sparse_coo_payload>(bytes);
  std::vector<float> a(n), b(n, 1.0f);
  codec.decode(q, a);
  codec.decode_add(q, b);
  for (std::size_t j = 0; j < p.nnz(); ++j) {
    CHECK(a[p.indices[j]] == p.values[j]);
    CHECK(b[p.indices[j]] == 1.0f + p.values[j]);
  }
  CHECK(std::count(a.begin(), a.end(), 0.0f) == static_cast<long>(n - p.nnz()));
}

TEST_CASE("bad parameters and inputs") {
  for (double r : {0.0, -2.0, 100.01, std::numeric_limits<double>::quiet_NaN()})
    CHECK_THROWS_AS(sa_momentum<>(10, make_options(r, 0.7f, 0.1f)), invalid_argument_error);
  for (float m : {0.0f, 1.0f, 1.2f, -0.3f, std::numeric_limits<float>::quiet_NaN()})
    CHECK_THROWS_AS(sa_momentum<>(10, make_options(1.0, m, 0.1f)), invalid_argument_error);
  for (float eta : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    CHECK_THROWS_AS(sa_momentum<>(10, make_options(1.0, 0.7f, eta)), invalid_argument_error);
  auto bad_mode = make_options(1.0, 0.7f, 0.1f);
  bad_mode.mode = static_cast<threshold_mode>(3);
  CHECK_THROWS_AS(sa_momentum<>(10, bad_mode), invalid_argument_error);
  CHECK_THROWS_AS(sa_momentum<>(std::size_t{1} << 33), invalid_argument_error);

  sa_momentum<execution::simd> codec(64, make_options(10.0, 0.7f, 0.1f));
  sparse_coo_payload p;
  std::vector<float> g(65, 0.0f);
  CHECK_THROWS_AS(codec.encode(g, p), size_mismatch_error);
  CHECK_THROWS_AS(codec.set_learning_rate(0.0f), invalid_argument_error);
  g.assign(64, 0.25f);
  codec.encode(g, p);
  const std::vector<float> before(codec.velocity().begin(), codec.velocity().end());
  g[40] = std::numeric_limits<float>::quiet_NaN();
  CHECK(gradcomp::test_support::non_finite_index_of([&] { codec.encode(g, p); }) == 40);
  CHECK(bit_equal(before, codec.velocity()));
  CHECK(codec.steps() == 1);
  std::vector<float> out(63);
  CHECK_THROWS_AS(codec.decode(p, out), size_mismatch_error);

  // States of another size or another sparse codec.
  sa_momentum<> other(65);
  CHECK_THROWS_AS(other.restore_state(codec.save_state()), size_mismatch_error);
  sparsifier_with_memory<> sparsifier(64);
  CHECK_THROWS_AS(codec.restore_state(sparsifier.save_state()), state_error);
  auto truncated = codec.save_state();
  truncated.pop_back();
  CHECK_THROWS_AS(codec.restore_state(truncated), wire::wire_error);
  CHECK(bit_equal(before, codec.velocity()));
}

TEST_CASE("restore_state with other options throws option_mismatch_error naming the option, and changes nothing") {
  const std::size_t n = 300;
  const auto o = make_options(1.0, 0.7f, 0.1f, threshold_mode::exact);
  sa_momentum<> a(n, o);
  std::mt19937 gen(9);
  sparse_coo_payload p;
  a.encode(normal(gen, n), p);
  const auto state = a.save_state();
  const std::vector<std::pair<const char*, sa_momentum_options>> cases = {
      {"ratio_percent", make_options(2.0, 0.7f, 0.1f, threshold_mode::exact)},
      {"momentum", make_options(1.0, 0.6f, 0.1f, threshold_mode::exact)},
      {"mode", make_options(1.0, 0.7f, 0.1f, threshold_mode::sampled)},
      {"seed", [&] { auto x = o; x.seed = o.seed + 1; return x; }()},
  };
  for (const auto& [name, other] : cases) {
    CAPTURE(name);
    sa_momentum<> b(n, other);
    b.encode(normal(gen, n), p);
    const std::vector<float> before(b.velocity().begin(), b.velocity().end());
    try {
      b.restore_state(state);
      FAIL("restored a state saved with another " << name);
    } catch (const option_mismatch_error& e) {
      CHECK(e.option() == name);
    }
    CHECK(bit_equal(b.velocity(), before));
    CHECK(b.steps() == 1);
  }
  // eta is a schedule value: taken from the state.
  sa_momentum<> c(n, make_options(1.0, 0.7f, 0.5f, threshold_mode::exact));
  CHECK_NOTHROW(c.restore_state(state));
  CHECK(c.options().learning_rate == 0.1f);
}
