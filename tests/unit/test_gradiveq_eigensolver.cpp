// gradiveq/eigensolver.hpp: leading eigenvectors by inverse iteration on the
// tridiagonal form, checked against Eigen's full SelfAdjointEigenSolver.
#include <doctest/doctest.h>

#include <gradcomp/gradiveq.hpp>

#include <Eigen/Dense>

#include <cmath>
#include <cstdint>
#include <vector>

using namespace gradcomp;

namespace {

// A reproducible normal deviate stream (splitmix64 and Box-Muller).
struct normal_stream {
  std::uint64_t state;
  double uniform() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double(z >> 11) + 0.5) * 0x1.0p-53;
  }
  double operator()() { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); }
};

Eigen::MatrixXd random_orthogonal(Eigen::Index n, std::uint64_t seed) {
  normal_stream g{seed};
  const Eigen::MatrixXd a = Eigen::MatrixXd::NullaryExpr(n, n, [&] { return g(); });
  return Eigen::HouseholderQR<Eigen::MatrixXd>(a).householderQ();
}

// Q diag(values) Q^T for a random orthogonal Q.
Eigen::MatrixXd with_spectrum(const Eigen::VectorXd& values, std::uint64_t seed) {
  const Eigen::MatrixXd q = random_orthogonal(values.size(), seed);
  return q * values.asDiagonal() * q.transpose();
}

// Checks leading_vectors(c) of a solver built expecting c vectors: Eigen's
// eigenvalues exactly, residuals and orthonormality to rounding, and, where
// the c-th and (c+1)-th eigenvalues are apart, Eigen's own invariant subspace.
void check_leading(const Eigen::MatrixXd& a, Eigen::Index c) {
  CAPTURE(a.rows());
  CAPTURE(c);
  const Eigen::Index n = a.rows();
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> reference(a);
  const detail::leading_eigensolver solver(a, c);
  CHECK(solver.eigenvalues() == reference.eigenvalues());  // the same QR on the same T
  const Eigen::MatrixXd v = solver.leading_vectors(c);
  REQUIRE(v.rows() == n);
  REQUIRE(v.cols() == c);
  const double scale = std::max(a.cwiseAbs().maxCoeff(), 1e-300);
  for (Eigen::Index j = 0; j < c; ++j) {
    const double lambda = reference.eigenvalues()(n - 1 - j);
    CHECK(((a / scale) * v.col(j) - (lambda / scale) * v.col(j)).norm() < 1e-12);  // scaled first: 1e200 squared overflows
  }
  CHECK((v.transpose() * v - Eigen::MatrixXd::Identity(c, c)).cwiseAbs().maxCoeff() < 1e-12);
  const Eigen::VectorXd& s = reference.eigenvalues();
  if (c < n && s(n - c) - s(n - c - 1) > 1e-6 * scale) {
    const Eigen::MatrixXd ref = reference.eigenvectors().rightCols(c);
    const Eigen::JacobiSVD<Eigen::MatrixXd> cosines(ref.transpose() * v);
    CHECK(cosines.singularValues().minCoeff() > 1.0 - 1e-10);
  }
}

}  // namespace

TEST_CASE("leading_eigensolver: a Gram matrix of decaying gradients, the demo's widest layer's shape") {
  // R = 300 samples of K = 2000 mixing 400 hidden directions with weights
  // 1 / (1 + h): one cluster (eigenvalues within 1e-3 of the largest) holds most of the tail.
  normal_stream g{7};
  const Eigen::Index R = 300, K = 2000, H = 400;
  const Eigen::MatrixXd dirs = Eigen::MatrixXd::NullaryExpr(H, K, [&] { return g(); });
  Eigen::MatrixXd x(R, K);
  for (Eigen::Index r = 0; r < R; ++r) {
    Eigen::VectorXd w(H);
    for (Eigen::Index h = 0; h < H; ++h) w(h) = g() / double(1 + h);
    x.row(r) = (dirs.transpose() * w).transpose();
  }
  x.rowwise() -= x.colwise().mean();
  const Eigen::MatrixXd gram = x * x.transpose();  // rank R - 1 after centring
  for (Eigen::Index c : {1, 16, 64, 100}) check_leading(gram, c);
}

TEST_CASE("leading_eigensolver: eigenvalues over 12 decades, repeated, zero, and a tridiagonal input") {
  const Eigen::Index n = 120;
  Eigen::VectorXd graded(n);
  for (Eigen::Index i = 0; i < n; ++i) graded(i) = std::pow(10.0, -12.0 * double(i) / double(n - 1));
  check_leading(with_spectrum(graded, 1), 40);
  // Multiplicities: 10 x 5, 20 x 1, the rest 0. A cut inside a repeated
  // eigenvalue leaves the vectors free within it; residuals and
  // orthonormality still hold.
  Eigen::VectorXd repeated(n);
  for (Eigen::Index i = 0; i < n; ++i) repeated(i) = i < 10 ? 5.0 : (i < 30 ? 1.0 : 0.0);
  const Eigen::MatrixXd rep = with_spectrum(repeated, 2);
  for (Eigen::Index c : {10, 25, 30, 40}) check_leading(rep, c);
  // Already diagonal (a zero off-diagonal: T splits), the identity, zero, rank one.
  check_leading(Eigen::MatrixXd(Eigen::VectorXd::LinSpaced(n, 1.0, 2.0).asDiagonal()), 30);
  check_leading(Eigen::MatrixXd::Identity(n, n), 20);
  check_leading(Eigen::MatrixXd::Zero(n, n), 3);
  check_leading(Eigen::MatrixXd::Ones(n, n), 2);
  // Wilkinson's W21+: pairs of eigenvalues equal to 15 digits.
  Eigen::MatrixXd w = Eigen::MatrixXd::Zero(21, 21);
  for (Eigen::Index i = 0; i < 21; ++i) {
    w(i, i) = std::abs(10.0 - double(i));
    if (i > 0) w(i, i - 1) = w(i - 1, i) = 1.0;
  }
  check_leading(w, 7);
  check_leading(Eigen::MatrixXd::Constant(1, 1, 3.0), 1);
  // Huge and tiny scales: no over- or underflow.
  check_leading(with_spectrum(graded * 1e200, 3), 10);
  check_leading(with_spectrum(graded * 1e-200, 4), 10);
}

TEST_CASE("leading_eigensolver: the full solver (any number expected) and inverse iteration agree") {
  const Eigen::Index n = 60;
  Eigen::VectorXd values(n);
  for (Eigen::Index i = 0; i < n; ++i) values(i) = 1.0 / double(1 + i);
  const Eigen::MatrixXd a = with_spectrum(values, 5);
  const detail::leading_eigensolver all(a), few(a, 10);
  CHECK(all.eigenvalues() == few.eigenvalues());
  const Eigen::MatrixXd va = all.leading_vectors(10), vf = few.leading_vectors(10);
  for (Eigen::Index j = 0; j < 10; ++j) CHECK(std::abs(va.col(j).dot(vf.col(j))) > 1.0 - 1e-12);
  check_leading(a, 30);  // half the vectors: inverse iteration (the full solver only for 0 or all n expected)
  check_leading(a, n - 1);  // all but one
  // A flat tail: 40 equal eigenvalues after 20 distinct ones, asked past the
  // cut into the cluster (its vectors orthogonalised against each other).
  Eigen::VectorXd flat(n);
  for (Eigen::Index i = 0; i < n; ++i) flat(i) = i < 20 ? 10.0 + double(i) : 1.0;
  check_leading(with_spectrum(flat, 9), 45);
  check_leading(with_spectrum(flat, 9), n - 1);
}

TEST_CASE("pca_decomposition: a cap's vectors by inverse iteration span what the full solver's do") {
  // The same samples through both paths (expected_vectors 0 and the cap):
  // the same spectrum bit for bit, so eq. 6 picks the same d, and bases
  // that agree to rounding after the sign normalisation.
  normal_stream g{11};
  const std::size_t R = 90, K = 400;
  std::vector<float> rows(R * K);
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t k = 0; k < K; ++k) rows[r * K + k] = float(g() * std::exp(-double(k % 50) / 8.0));
  for (pca_solver solver : {pca_solver::gram, pca_solver::covariance}) {
    CAPTURE(int(solver));
    const detail::pca_decomposition full(rows.data(), R, K, solver), capped(rows.data(), R, K, solver, 16);
    CHECK(full.spectrum() == capped.spectrum());
    const Eigen::MatrixXd a = full.vectors(16), b = capped.vectors(16);
    CHECK((a - b).cwiseAbs().maxCoeff() < 1e-8);
  }
}

TEST_CASE("pca_decomposition: single-precision products fit the double fit's subspace to about 1e-6") {
  // What basis_precision::float16 fits with: the Gram (or covariance) and
  // the vectors' products in float. Its spectrum is the double one's within
  // 1e-5 of the largest value, its vectors orthonormal within 1e-5, and the
  // leading directions it keeps those of the double fit (a projector
  // difference far below a binary16 basis' own rounding of 2^-11). R < K
  // takes the Gram route, R > K the covariance route.
  normal_stream g{23};
  for (std::size_t R : {std::size_t(120), std::size_t(700)}) {
    const std::size_t K = 384;
    CAPTURE(R);
    std::vector<float> rows(R * K);
    for (std::size_t r = 0; r < R; ++r)
      for (std::size_t k = 0; k < K; ++k) rows[r * K + k] = float(g() * std::exp(-double(k % 64) / 10.0) + 0.1);
    const detail::pca_decomposition exact(rows.data(), R, K, pca_solver::automatic);
    const detail::pca_decomposition single(rows.data(), R, K, pca_solver::automatic, 0,
                                           detail::pca_precision::single_precision);
    REQUIRE(single.spectrum().size() == exact.spectrum().size());
    const double top = exact.spectrum()[0];
    for (std::size_t i = 0; i < exact.spectrum().size(); ++i)
      CHECK(std::abs(single.spectrum()[i] - exact.spectrum()[i]) <= 1e-5 * top);
    CHECK((single.mean() - exact.mean()).cwiseAbs().maxCoeff() <= 1e-6 * exact.mean().cwiseAbs().maxCoeff());
    const Eigen::Index d = 24;  // the directions above the flat noise floor of the % 64 profile
    const Eigen::MatrixXd a = exact.vectors(d), b = single.vectors(d);
    CHECK((b.transpose() * b - Eigen::MatrixXd::Identity(d, d)).cwiseAbs().maxCoeff() < 1e-5);
    CHECK((a * a.transpose() - b * b.transpose()).cwiseAbs().maxCoeff() < 1e-5);
  }
}
