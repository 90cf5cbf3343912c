// powersgd_compressor: the per-layer algebra of rank-r PowerSGD (Vogels et
// al. 2019): exact reconstruction of a rank-r matrix, orthonormality of P^,
// error feedback conservation, several ranks summed by hand, determinism,
// state save/restore, the matrix view and the typed errors.
#include <doctest/doctest.h>

#include <gradcomp/powersgd.hpp>

#include <support/equality.hpp>
#include <support/error_checks.hpp>
#include <support/random_vectors.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using namespace gradcomp;
using test_support::bit_equal;
using test_support::normal_floats;

namespace {

/// A rows x cols matrix (row-major) of rank `r`: sum_k a_k b_k^T.
std::vector<float> low_rank(std::size_t rows, std::size_t cols, std::size_t r, std::uint64_t seed) {
  const auto a = normal_floats(rows * r, seed);
  const auto b = normal_floats(cols * r, seed + 1000);
  std::vector<float> m(rows * cols, 0.0f);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) {
      double s = 0.0;
      for (std::size_t k = 0; k < r; ++k) s += double(a[k * rows + i]) * double(b[k * cols + j]);
      m[i * cols + j] = float(s);
    }
  return m;
}

double max_abs(std::span<const float> x) {
  double m = 0.0;
  for (float v : x) m = std::max(m, std::abs(double(v)));
  return m;
}

double max_diff(std::span<const float> a, std::span<const float> b) {
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

/// One step of a single rank (the sums are its own P and Q): out = P^ Q_w^T.
template <class C>
void local_step(C& c, std::span<const float> g, std::span<float> out) {
  std::vector<float> p(c.p_length()), q(c.q_length());
  c.encode_p(g, p);
  c.encode_q(p, q);
  c.decode(q, out);
}

/// One step of N ranks summed by hand; out[w] is what rank w gets (the sum).
void ranks_step(std::vector<powersgd_compressor<>>& cs, const std::vector<std::vector<float>>& g,
                std::vector<std::vector<float>>& out) {
  const std::size_t n = cs.size();
  std::vector<std::vector<float>> p(n, std::vector<float>(cs[0].p_length()));
  std::vector<std::vector<float>> q(n, std::vector<float>(cs[0].q_length()));
  std::vector<float> psum(cs[0].p_length(), 0.0f), qsum(cs[0].q_length(), 0.0f);
  for (std::size_t w = 0; w < n; ++w) {
    cs[w].encode_p(g[w], p[w]);
    for (std::size_t i = 0; i < psum.size(); ++i) psum[i] += p[w][i];
  }
  for (std::size_t w = 0; w < n; ++w) {
    cs[w].encode_q(psum, q[w]);
    for (std::size_t i = 0; i < qsum.size(); ++i) qsum[i] += q[w][i];
  }
  out.assign(n, std::vector<float>(cs[0].size()));
  for (std::size_t w = 0; w < n; ++w) cs[w].decode(qsum, out[w]);
}

}  // namespace

TEST_CASE("powersgd: the matrix view of conv and 2-D layers, and the dense rule") {
  const auto v = powersgd_view(layer_shape::conv(64, 32, 3, 3));
  CHECK(v.rows == 64);
  CHECK(v.cols == 32 * 9);  // C_out x (C_in kH kW), PyTorch's view
  const auto m = powersgd_view(layer_shape::matrix(10, 784));
  CHECK(m.rows == 10);
  CHECK(m.cols == 784);
  CHECK(powersgd_view(layer_shape::dense(500)).rows == 0);  // 1-D: no view
  const auto lin = layer_shape::matrix(10, 784);
  CHECK(lin.kind == layer_kind::dense);  // every other codec sees a dense layer in framework order
  CHECK(lin.size() == 7840);
  CHECK_THROWS_AS(layer_shape::matrix(0, 5), invalid_argument_error);
  CHECK_THROWS_AS(layer_shape::matrix(std::size_t(1) << 40, std::size_t(1) << 40), invalid_argument_error);
  powersgd_options o;
  o.rank = 2;
  o.min_elements = 1024;
  CHECK(powersgd_compresses(v, o));
  CHECK_FALSE(powersgd_compresses({4, 1000}, o));   // 2 r >= min(rows, cols)
  CHECK(powersgd_compresses({5, 1000}, o));
  CHECK_FALSE(powersgd_compresses({16, 32}, o));    // 512 < min_elements
  CHECK_FALSE(powersgd_compresses({1, 5000}, o));   // a row vector
  CHECK_FALSE(powersgd_compresses({}, o));
}

TEST_CASE("powersgd: orthonormalisation gives orthonormal columns, deterministically") {
  const std::size_t rows = 300, r = 4;
  auto a = normal_floats(rows * r, 7);
  // Make column 2 nearly a copy of column 0: the second pass must still give orthogonality.
  for (std::size_t i = 0; i < rows; ++i) a[2 * rows + i] = a[i] * 3.0f + 1e-4f * a[rows + i];
  auto b = a;
  powersgd_orthonormalize(a, rows, r);
  powersgd_orthonormalize(b, rows, r);
  CHECK(bit_equal(a, b));
  for (std::size_t j = 0; j < r; ++j)
    for (std::size_t k = 0; k < r; ++k) {
      double d = 0.0;
      for (std::size_t i = 0; i < rows; ++i) d += double(a[j * rows + i]) * double(a[k * rows + i]);
      CHECK(std::abs(d - (j == k ? 1.0 : 0.0)) < 1e-5);
    }
  // A zero column stays zero (a zero gradient), the others are still normalised.
  std::vector<float> z(rows * 2, 0.0f);
  for (std::size_t i = 0; i < rows; ++i) z[i] = float(i % 7) - 3.0f;
  powersgd_orthonormalize(z, rows, 2);
  CHECK(max_abs(std::span<const float>(z).subspan(rows)) == 0.0);
  CHECK_THROWS_AS(powersgd_orthonormalize(z, rows, 3), size_mismatch_error);
}

TEST_CASE("powersgd: a rank-r matrix is reconstructed exactly after a warm-started step or two") {
  for (std::size_t r : {1u, 2u, 4u}) {
    CAPTURE(r);
    const std::size_t rows = 40, cols = 72;
    const auto m = low_rank(rows, cols, r, 11 + r);
    powersgd_options o;
    o.rank = r;
    o.seed = 5;
    powersgd_compressor<> c(rows, cols, o);
    std::vector<float> out(m.size());
    for (int step = 0; step < 3; ++step) {
      local_step(c, m, out);
      // P^ spans the column space of M once B^T Q is invertible (any random Q).
      CHECK(max_diff(out, m) <= 1e-4 * max_abs(m));
    }
    // Orthonormal P^ of this step.
    const auto p = c.p_hat();
    for (std::size_t j = 0; j < r; ++j) {
      double d = 0.0;
      for (std::size_t i = 0; i < rows; ++i) d += double(p[j * rows + i]) * double(p[j * rows + i]);
      CHECK(std::abs(d - 1.0) < 1e-5);
    }
    CHECK(max_abs(c.residual()) <= 1e-4 * max_abs(m));
    CHECK(c.steps() == 3);
  }
}

TEST_CASE("powersgd: error feedback conserves M = approximation + new residual, on each of 3 ranks") {
  const std::size_t rows = 24, cols = 60, n = 3;
  powersgd_options o;
  o.rank = 2;
  o.seed = 9;
  std::vector<powersgd_compressor<>> cs(n, powersgd_compressor<>(rows, cols, o));
  for (int step = 0; step < 4; ++step) {
    std::vector<std::vector<float>> g(n), mw(n), out;
    std::vector<double> total(rows * cols, 0.0);
    for (std::size_t w = 0; w < n; ++w) {
      g[w] = normal_floats(rows * cols, 100 * step + w);
      mw[w] = g[w];
      for (std::size_t i = 0; i < g[w].size(); ++i) {
        mw[w][i] += cs[w].residual()[i];  // M_w = G_w + E_w
        total[i] += mw[w][i];
      }
    }
    ranks_step(cs, g, out);
    for (std::size_t w = 1; w < n; ++w) CHECK(bit_equal(out[w], out[0]));  // every rank the same sum
    double worst_local = 0.0, worst_sum = 0.0;
    for (std::size_t w = 0; w < n; ++w) {
      // Local: M_w == P^ Q_w^T + E_w.
      const auto p = cs[w].p_hat();
      const auto q = cs[w].q_local();
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
          double approx = 0.0;
          for (std::size_t k = 0; k < o.rank; ++k) approx += double(p[k * rows + i]) * double(q[k * cols + j]);
          worst_local = std::max(worst_local, std::abs(mw[w][i * cols + j] - approx - cs[w].residual()[i * cols + j]));
        }
    }
    // Global: sum_w M_w == output (the sum of the approximations) + sum_w E_w.
    for (std::size_t i = 0; i < total.size(); ++i) {
      double e = 0.0;
      for (std::size_t w = 0; w < n; ++w) e += cs[w].residual()[i];
      worst_sum = std::max(worst_sum, std::abs(total[i] - out[0][i] - e));
    }
    CHECK(worst_local < 1e-5 * 8);
    CHECK(worst_sum < 1e-4 * 8);
  }
}

TEST_CASE("powersgd: several ranks with low-rank gradients get their sum") {
  const std::size_t rows = 32, cols = 90, n = 4;
  powersgd_options o;
  o.rank = 2;
  std::vector<powersgd_compressor<>> cs(n, powersgd_compressor<>(rows, cols, o));
  // Every rank's gradient lies in the same rank-2 column space.
  const auto a = normal_floats(rows * 2, 3);
  std::vector<std::vector<float>> out;
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> g(n, std::vector<float>(rows * cols));
    std::vector<float> sum(rows * cols, 0.0f);
    for (std::size_t w = 0; w < n; ++w) {
      const auto b = normal_floats(cols * 2, 50 + 10 * step + w);
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
          g[w][i * cols + j] = a[i] * b[j] + a[rows + i] * b[cols + j];
          sum[i * cols + j] += g[w][i * cols + j];
        }
    }
    ranks_step(cs, g, out);
    CHECK(max_diff(out[0], sum) <= 1e-4 * max_abs(sum));
  }
}

TEST_CASE("powersgd: two instances with the same input give the same bits") {
  powersgd_options o;
  o.rank = 3;
  o.seed = 77;
  powersgd_compressor<> a(48, 50, o), b(48, 50, o);
  std::vector<float> oa(48 * 50), ob(48 * 50);
  for (int step = 0; step < 4; ++step) {
    const auto g = normal_floats(48 * 50, 1000 + step);
    local_step(a, g, oa);
    local_step(b, g, ob);
    CHECK(bit_equal(oa, ob));
    CHECK(bit_equal(a.residual(), b.residual()));
    CHECK(bit_equal(a.q(), b.q()));
  }
  // Another seed draws another Q, hence another approximation of a full-rank gradient.
  o.seed = 78;
  powersgd_compressor<> c(48, 50, o);
  std::vector<float> oc(48 * 50);
  local_step(c, normal_floats(48 * 50, 5), oc);
  powersgd_compressor<> d(48, 50, powersgd_options{3, true, true, 77});
  local_step(d, normal_floats(48 * 50, 5), ob);
  CHECK_FALSE(bit_equal(oc, ob));
}

TEST_CASE("powersgd: without warm start a fresh Q is drawn each step; without error feedback no residual") {
  powersgd_options o;
  o.warm_start = false;
  o.error_feedback = false;
  powersgd_compressor<> c(20, 30, o);
  CHECK(c.residual().empty());
  std::vector<float> out(600);
  const auto g = normal_floats(600, 1);
  const std::vector<float> q0(c.q().begin(), c.q().end());
  local_step(c, g, out);
  const std::vector<float> first = out;
  local_step(c, g, out);
  CHECK_FALSE(bit_equal(first, out));  // same gradient, another random Q
  CHECK_FALSE(bit_equal(q0, c.q()));
}

TEST_CASE("powersgd: save/restore continues bit for bit") {
  powersgd_options o;
  o.rank = 2;
  o.seed = 3;
  powersgd_compressor<> a(30, 40, o);
  std::vector<float> out(1200), again(1200);
  for (int step = 0; step < 3; ++step) local_step(a, normal_floats(1200, 10 + step), out);
  const auto saved = a.save_state();
  powersgd_compressor<> b(30, 40, o);
  b.restore_state(saved);
  CHECK(b.steps() == 3);
  for (int step = 3; step < 7; ++step) {
    const auto g = normal_floats(1200, 10 + step);
    local_step(a, g, out);
    local_step(b, g, again);
    CHECK(bit_equal(out, again));
  }
  CHECK(bit_equal(a.residual(), b.residual()));
  // Another rank, seed or shape is refused, and the codec is unchanged.
  const auto before = b.save_state();
  powersgd_options other = o;
  other.rank = 3;
  powersgd_compressor<> c(30, 40, other);
  test_support::check_restore_names_option(c, saved, "rank");
  other = o;
  other.seed = 4;
  powersgd_compressor<> d(30, 40, other);
  test_support::check_restore_names_option(d, saved, "seed");
  other = o;
  other.error_feedback = false;
  powersgd_compressor<> e(30, 40, other);
  test_support::check_restore_names_option(e, saved, "error_feedback");
  powersgd_compressor<> f(40, 30, o);
  test_support::check_restore_names_option(f, saved, "rows");
  powersgd_compressor<> g(30, 41, o);
  CHECK_THROWS_AS(g.restore_state(saved), size_mismatch_error);
  // Damaged bytes: a wire error.
  auto bad = saved;
  bad[bad.size() - 3] ^= std::byte{0x40};
  CHECK_THROWS_AS(b.restore_state(bad), wire::wire_error);
  CHECK_THROWS_AS(b.restore_state(std::span<const std::byte>(saved).first(40)), wire::wire_error);
  CHECK(before == b.save_state());
}

TEST_CASE("powersgd: a restored state holding a non-finite value is a wire error") {
  powersgd_compressor<> a(8, 8, powersgd_options{2, true, true, 1, 0, 0});
  auto saved = a.save_state();
  // The residual's last float: make it an infinity and reseal the checksum.
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(saved.data() + saved.size() - 4, &inf, 4);
  const auto crc = wire::crc32c(wire::crc32c(0, std::span<const std::byte>(saved).first(28)),
                                std::span<const std::byte>(saved).subspan(wire::header_size));
  std::memcpy(saved.data() + 28, &crc, 4);
  try {
    a.restore_state(saved);
    FAIL("a non-finite residual was accepted");
  } catch (const wire::wire_error& e) {
    CHECK(e.code() == wire::wire_errc::malformed_body);
    CHECK(std::string(e.what()).find("non-finite") != std::string::npos);
  }
}

TEST_CASE("powersgd: typed errors on bad input, state untouched") {
  powersgd_options o;
  o.rank = 0;
  CHECK_THROWS_AS(powersgd_compressor<>(10, 10, o), invalid_argument_error);
  o.rank = 11;
  CHECK_THROWS_AS(powersgd_compressor<>(10, 20, o), invalid_argument_error);
  o.rank = 10;
  CHECK_NOTHROW(powersgd_compressor<>(10, 20, o));
  CHECK_THROWS_AS(powersgd_compressor<>(0, 20, powersgd_options{}), invalid_argument_error);
  CHECK_THROWS_AS(powersgd_compressor<>(layer_shape::dense(100), powersgd_options{}), invalid_argument_error);
  CHECK(powersgd_compressor<>(layer_shape::conv(8, 4, 3, 3)).cols() == 36);

  powersgd_compressor<> c(10, 12, powersgd_options{});
  std::vector<float> p(c.p_length()), q(c.q_length()), out(c.size());
  auto g = normal_floats(c.size(), 2);
  CHECK_THROWS_AS(c.encode_p(std::span<const float>(g).first(100), p), size_mismatch_error);
  CHECK_THROWS_AS(c.encode_p(g, std::span<float>(p).first(3)), size_mismatch_error);
  g[17] = std::numeric_limits<float>::quiet_NaN();
  CHECK(test_support::non_finite_index_of([&] { c.encode_p(g, p); }) == 17);
  g[17] = 0.5f;
  CHECK_THROWS_AS(c.encode_q(p, q), state_error);  // the failed encode_p began no step
  CHECK_THROWS_AS(c.decode(q, out), state_error);
  c.encode_p(g, p);
  CHECK_THROWS_AS(c.save_state(), state_error);  // inside a step
  auto bad = p;
  bad[0] = std::numeric_limits<float>::infinity();
  CHECK(test_support::non_finite_index_of([&] { c.encode_q(bad, q); }) == 0);
  c.encode_q(p, q);
  CHECK_THROWS_AS(c.decode(std::span<const float>(q).first(5), out), size_mismatch_error);
  c.abandon();  // the step is dropped: residual and Q as before
  CHECK(c.steps() == 0);
  CHECK(max_abs(c.residual()) == 0.0);
  CHECK_NOTHROW(c.save_state());
}
