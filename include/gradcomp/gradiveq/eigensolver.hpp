#pragma once
/// \file gradiveq/eigensolver.hpp
/// The symmetric eigensolver behind GradiVeQ's PCA (gradiveq/pca.hpp): every
/// eigenvalue, but eigenvectors only for the leading ones a basis keeps.
/// Eigen's SelfAdjointEigenSolver forms all n eigenvectors, and accumulating
/// its QR rotations into them was the largest single cost of a fit (Gram
/// 450 x 450, the demo model's widest layers: 30 ms, of which about 18 ms
/// forming the vectors), while a cap keeps d of them (128 in the DDP hooks'
/// capped variants).
/// Here: Householder tridiagonalisation T = Q^T A Q (Eigen), T's
/// eigenvalues by implicit QR without vectors (Eigen), then the d leading
/// eigenvectors of T by inverse iteration (the method of LAPACK's dstein:
/// shifted tridiagonal LU with partial pivoting, vectors of a cluster of
/// close eigenvalues orthogonalised against each other) and Q applied to
/// those d only. Part of <gradcomp/gradiveq.hpp>.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, see pca.hpp
#endif
#include <Eigen/Core>
#include <Eigen/Eigenvalues>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <gradcomp/errors.hpp>

namespace gradcomp::detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// LU with partial pivoting of the shifted symmetric tridiagonal T - shift I
/// (diagonal a, off-diagonal b), and solves with it: inverse iteration's step.
class shifted_tridiagonal_lu {
 public:
  /// `tiny` replaces a zero pivot (T - shift I is singular to working
  /// precision exactly when shift is an eigenvalue: the point of the method).
  shifted_tridiagonal_lu(const Eigen::VectorXd& a, const Eigen::VectorXd& b, double shift, double tiny) {
    const Eigen::Index n = a.size();
    d_ = a.array() - shift;  // U's diagonal
    du_ = Eigen::VectorXd::Zero(n);   // U's first super-diagonal
    du2_ = Eigen::VectorXd::Zero(n);  // U's second super-diagonal (from row swaps)
    l_ = Eigen::VectorXd::Zero(n);    // L's multipliers
    swap_.assign(static_cast<std::size_t>(n), 0);
    for (Eigen::Index i = 0; i + 1 < n; ++i) du_(i) = b(i);
    for (Eigen::Index i = 0; i + 1 < n; ++i) {
      const double below = b(i);  // row i + 1's entry in column i
      if (std::abs(d_(i)) >= std::abs(below)) {
        if (d_(i) == 0.0) d_(i) = tiny;
        l_(i) = below / d_(i);
        d_(i + 1) -= l_(i) * du_(i);
      } else {  // row i + 1 is the pivot: swap rows i and i + 1
        swap_[static_cast<std::size_t>(i)] = 1;
        l_(i) = d_(i) / below;
        const double next_diag = d_(i + 1);
        d_(i) = below;
        const double up = du_(i);
        du_(i) = next_diag;
        d_(i + 1) = up - l_(i) * next_diag;
        if (i + 2 < n) {
          du2_(i) = du_(i + 1);  // b(i + 1)
          du_(i + 1) = -l_(i) * du_(i + 1);
        }
      }
    }
    for (Eigen::Index i = 0; i < n; ++i)
      if (d_(i) == 0.0) d_(i) = tiny;
  }

  /// U's last diagonal entry (dstein scales its right-hand sides by it).
  double last_pivot() const noexcept { return d_.size() ? d_(d_.size() - 1) : 0.0; }

  /// x <- (T - shift I)^-1 x.
  void solve(Eigen::VectorXd& x) const {
    const Eigen::Index n = d_.size();
    for (Eigen::Index i = 0; i + 1 < n; ++i) {
      if (swap_[static_cast<std::size_t>(i)]) std::swap(x(i), x(i + 1));
      x(i + 1) -= l_(i) * x(i);
    }
    for (Eigen::Index i = n - 1; i >= 0; --i) {
      double s = x(i);
      if (i + 1 < n) s -= du_(i) * x(i + 1);
      if (i + 2 < n) s -= du2_(i) * x(i + 2);
      x(i) = s / d_(i);
    }
  }

 private:
  Eigen::VectorXd d_, du_, du2_, l_;
  std::vector<std::uint8_t> swap_;
};

/// Eigenvalues of a symmetric matrix and eigenvectors of the largest ones
/// (see the file comment).
class leading_eigensolver {
 public:
  /// Decomposes the symmetric `m` (its lower triangle is read), expecting
  /// leading_vectors() for at most `expected_vectors` of them (0: any
  /// number: Eigen's full solver forms all n). Inverse iteration costs O(n)
  /// per vector and iteration plus the orthogonalisation inside clusters of
  /// close eigenvalues (O(n c^2) for a cluster of c), and stays below the
  /// full solver's accumulation of its QR rotations up to c = n - 1. Measured
  /// (session 22, Zen 4, a CI build beside it, n = 450, c vectors against
  /// the full solver's 56-93 ms): Gram matrices of 3000-long samples with a
  /// decaying, a flat (iid) and a 20-direction spectrum, c = 256: 20-30 ms;
  /// c = 440: 28-52 ms; 1000 I plus 1e-9 noise (one cluster of 450): 30 ms
  /// at c = 256, 55 ms at 440, as slow as the full solver only there.
  /// (The earlier crossover at n / 3 rested on 44 + 12 ms measured for 449
  /// vectors against 30 ms.)
  leading_eigensolver() = default;
  explicit leading_eigensolver(const Eigen::MatrixXd& m, Eigen::Index expected_vectors = 0) {
    const Eigen::Index n = m.rows();
    if (expected_vectors <= 0 || expected_vectors >= n) {
      full_.compute(m);  // reads the lower triangle only
      if (full_.info() != Eigen::Success) throw state_error("gradiveq: PCA eigen-decomposition did not converge");
      values_ = full_.eigenvalues();
      has_full_ = true;
      return;
    }
    // Scaled as Eigen's own solver does, so neither tiny nor huge entries
    // over- or underflow in the iterations.
    Eigen::MatrixXd lower = m.triangularView<Eigen::Lower>();
    double scale = n > 0 ? lower.cwiseAbs().maxCoeff() : 0.0;
    if (!(scale > 0.0)) scale = 1.0;
    lower /= scale;
    tri_.compute(lower);
    diag_ = tri_.diagonal();
    sub_ = tri_.subDiagonal();
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> values;
    values.computeFromTridiagonal(diag_, sub_, Eigen::EigenvaluesOnly);
    if (values.info() != Eigen::Success) throw state_error("gradiveq: PCA eigen-decomposition did not converge");
    scaled_values_ = values.eigenvalues();
    values_ = scaled_values_ * scale;
    norm_ = 0.0;
    for (Eigen::Index i = 0; i < n; ++i) {
      double row = std::abs(diag_(i));
      if (i > 0) row += std::abs(sub_(i - 1));
      if (i + 1 < n) row += std::abs(sub_(i));
      norm_ = std::max(norm_, row);
    }
  }

  /// Every eigenvalue, ascending (as Eigen's SelfAdjointEigenSolver).
  const Eigen::VectorXd& eigenvalues() const noexcept { return values_; }

  /// The orthonormal eigenvectors of the `count` largest eigenvalues, n x
  /// count, the largest first.
  Eigen::MatrixXd leading_vectors(Eigen::Index count) const {
    if (has_full_) {
      const Eigen::Index n = full_.eigenvectors().cols();
      return full_.eigenvectors().rightCols(std::min(count, n)).rowwise().reverse();
    }
    const Eigen::Index n = diag_.size();
    count = std::min(count, n);
    Eigen::MatrixXd z(n, count);
    if (count == 0) return z;
    constexpr double eps = std::numeric_limits<double>::epsilon();
    const double norm = norm_ > 0.0 ? norm_ : 1.0;
    const double cluster_gap = 1e-3 * norm;        // dstein's ORTOL
    const double separation = 10.0 * eps * norm;   // dstein's PERTOL: shifts at least this far apart
    const double tiny = eps * norm;                // a zero pivot's stand-in
    const double converged = std::sqrt(0.1 / double(n));  // dstein's DZTOL
    std::uint64_t seed = 0x9E3779B97F4A7C15ull;
    auto random_start = [&seed](Eigen::VectorXd& x) {  // uniform in [-1, 1), the same on every rank
      for (Eigen::Index i = 0; i < x.size(); ++i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;  // Knuth's MMIX LCG
        x(i) = double(static_cast<std::int64_t>(seed >> 11) - (std::int64_t(1) << 52)) / double(std::int64_t(1) << 52);
      }
    };
    double previous_shift = 0.0;
    Eigen::Index cluster_start = 0;
    Eigen::VectorXd x(n);
    for (Eigen::Index j = 0; j < count; ++j) {
      double shift = scaled_values_(n - 1 - j);
      if (j > 0) {
        if (previous_shift - shift > cluster_gap) cluster_start = j;
        shift = std::min(shift, previous_shift - separation);  // equal eigenvalues: distinct shifts
      }
      previous_shift = shift;
      const shifted_tridiagonal_lu lu(diag_, sub_, shift, tiny);
      random_start(x);
      int confirmations = 0;  // dstein: the iterate's norm past DZTOL, then 2 more iterations
      for (int iteration = 0; iteration < 5 && confirmations < 3; ++iteration) {
        // Scaled as dstein does, so one solve grows x to order 1 when the shift is accurate.
        x *= double(n) * norm * std::max(eps, std::abs(lu.last_pivot())) / x.cwiseAbs().maxCoeff();
        lu.solve(x);
        for (Eigen::Index i = cluster_start; i < j; ++i) x -= z.col(i).dot(x) * z.col(i);  // modified Gram-Schmidt
        const double largest = x.cwiseAbs().maxCoeff();
        if (!std::isfinite(largest)) throw state_error("gradiveq: PCA inverse iteration overflowed");
        if (largest == 0.0) {  // the start lay in the cluster's span: start again elsewhere
          random_start(x);
          continue;
        }
        if (largest >= converged) ++confirmations;
      }
      const double length = x.norm();
      if (!(length > 0.0)) throw state_error("gradiveq: PCA inverse iteration found no vector");
      z.col(j) = x / length;
    }
    return tri_.matrixQ() * z;  // back to the original basis
  }

 private:
  bool has_full_ = false;
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> full_;  // any number (0) or all n expected
  Eigen::Tridiagonalization<Eigen::MatrixXd> tri_;       // otherwise: T, Q
  Eigen::VectorXd diag_, sub_, scaled_values_, values_;
  double norm_ = 0.0;  // ||T||_1
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::detail
