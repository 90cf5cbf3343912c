#pragma once
/// \file gradiveq/pca.hpp
/// GradiVeQ (seed 002): the PCA of the aggregated gradient samples (in double
/// precision, with Eigen) and eq. 6, the choice of the dimension d.
/// Part of <gradcomp/gradiveq.hpp>.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

// GCC 12 reports -Wmaybe-uninitialized inside its AVX-512 intrinsics as
// inlined into Eigen (a false positive, GCC bug 105593, fixed in GCC 13):
// silenced where Eigen is included; user code is unaffected.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Cholesky>
#include <Eigen/Core>
#include <Eigen/Eigenvalues>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <gradcomp/errors.hpp>
#include <gradcomp/gradiveq/eigensolver.hpp>

namespace gradcomp {

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Eq. 6: the smallest d such that the d largest eigenvalues hold at least
/// 1 - lambda of the total, given `eigenvalues` sorted in descending order
/// (negative values, rounding noise of a PSD spectrum, count as 0).
/// Returns 0 only when every eigenvalue is 0. Throws invalid_argument_error
/// for lambda outside [0, 1) or a NaN eigenvalue.
inline std::size_t select_dimension(std::span<const double> eigenvalues, double lambda) {
  if (!(lambda >= 0.0 && lambda < 1.0))
    throw invalid_argument_error("gradiveq: lambda must be in [0, 1), got " + std::to_string(lambda));
  double total = 0.0;
  for (std::size_t i = 0; i < eigenvalues.size(); ++i) {
    if (std::isnan(eigenvalues[i])) throw invalid_argument_error("gradiveq: NaN eigenvalue");
    if (i > 0 && eigenvalues[i] > eigenvalues[i - 1])
      throw invalid_argument_error("gradiveq: eigenvalues must be sorted in descending order");
    total += std::max(eigenvalues[i], 0.0);
  }
  if (!(total > 0.0)) return 0;
  const double target = (1.0 - lambda) * total;
  double captured = 0.0;
  for (std::size_t d = 0; d < eigenvalues.size(); ++d) {
    captured += std::max(eigenvalues[d], 0.0);
    if (captured >= target) return d + 1;
  }
  return eigenvalues.size();  // unreachable in exact arithmetic: captured == total at the end
}

GRADCOMP_ABI_NAMESPACE_END
/// How the PCA eigenvectors are computed (both give the same subspace).
enum class pca_solver : std::uint8_t {
  automatic = 0,   ///< Gram when the sample rows R <= K, covariance otherwise
  covariance = 1,  ///< eigen-decomposition of the K x K covariance (the paper's recipe)
  gram = 2,        ///< eigen-decomposition of the R x R Gram matrix of the centred samples
};

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Eigenvalues below this fraction of the largest are rounding noise of a
/// rank-deficient covariance (float inputs carry ~1e-15 relative energy of
/// noise): they count as 0 in eq. 6 and their vectors are not used.
inline constexpr double eigen_floor = 1e-12;

/// Makes the largest-magnitude entry of each column positive, so the basis
/// does not depend on the sign an eigensolver happens to return.
inline void normalise_signs(Eigen::MatrixXd& v) {
  for (Eigen::Index j = 0; j < v.cols(); ++j) {
    Eigen::Index at = 0;
    v.col(j).cwiseAbs().maxCoeff(&at);
    if (v(at, j) < 0) v.col(j) = -v.col(j);
  }
}

/// One Cholesky QR pass given the Gram matrix w of v's columns (in whatever
/// inner product): v <- v U^-1 with w = U^T U. False, v untouched, when w has
/// no Cholesky factor worth the name (a diagonal entry of L at most 1e-8 in
/// double, 1e-4 in float: about the square root of each type's epsilon).
template <class Matrix>
inline bool cholesky_qr_pass(const std::type_identity_t<Matrix>& w, Matrix& v) {  // w: any expression, v deduces
  using scalar = typename Matrix::Scalar;
  const scalar floor = std::is_same_v<scalar, float> ? scalar(1e-4) : scalar(1e-8);
  Eigen::LLT<Matrix> llt(w);
  if (llt.info() != Eigen::Success || llt.matrixL().toDenseMatrix().diagonal().minCoeff() <= floor) return false;
  llt.matrixU().template solveInPlace<Eigen::OnTheRight>(v);  // v <- v U^-1, U = L^T
  return true;
}

/// Restores orthonormal columns without changing the leading directions
/// (the Q of a QR with positive diagonal, i.e. Gram-Schmidt): two passes of
/// Cholesky QR (V <- V L^-T with V^T V = L L^T), all in matrix products;
/// modified Gram-Schmidt if a Cholesky factor does not exist. With a
/// `tolerance` > 0 a pass is skipped, and v left as it is, once every entry
/// of V^T V is within it of the identity's. Double or single precision
/// (Eigen::MatrixXd or MatrixXf), every product in v's own type.
template <class Matrix>
inline void reorthonormalise(Matrix& v, double tolerance = 0.0) {
  using scalar = typename Matrix::Scalar;
  for (int pass = 0; pass < 2; ++pass) {
    Matrix w(v.cols(), v.cols());
    w.setZero();
    w.template selfadjointView<Eigen::Lower>().rankUpdate(v.transpose());
    // w holds the lower triangle, its upper one is zero as the identity's is
    if (tolerance > 0.0 &&
        double((w - Matrix::Identity(w.rows(), w.cols())).cwiseAbs().maxCoeff()) <= tolerance)
      return;
    if (cholesky_qr_pass(w, v)) continue;
    for (Eigen::Index j = 0; j < v.cols(); ++j) {
      for (Eigen::Index i = 0; i < j; ++i) v.col(j) -= v.col(i).dot(v.col(j)) * v.col(i);
      const scalar n = v.col(j).norm();
      if (n > 0) v.col(j) /= n;
    }
  }
}

/// reorthonormalise() in the inner product <x, y> = x^T G y of a symmetric
/// positive semi-definite G (its lower triangle given): T <- T U^-1 with
/// T^T G T = U^T U, two passes. T^T G T is only as exact as eps times G's
/// condition number over T's columns, so the caller checks G's image (see
/// pca_decomposition::vectors). Returns false when a pass finds no usable
/// Cholesky factor (T then keeps the passes done so far).
inline bool reorthonormalise_in(const Eigen::MatrixXd& g_lower, Eigen::MatrixXd& t) {
  for (int pass = 0; pass < 2; ++pass) {
    const Eigen::MatrixXd gt = g_lower.selfadjointView<Eigen::Lower>() * t;
    if (!cholesky_qr_pass(t.transpose() * gt, t)) return false;
  }
  return true;
}

/// The arithmetic of a pca_decomposition's products.
enum class pca_precision : std::uint8_t {
  double_precision = 0,  ///< every product in double (a float32 basis)
  /// The three large products (the Gram or covariance matrix, Xc^T T and
  /// the V^T V check) in float, about 2.5x faster on AVX-512; the mean, the
  /// eigensolver and the G-inner-product orthonormalisation stay in double.
  /// Its errors, about 1e-6 of the columns, are far below a binary16
  /// basis' rounding (2^-11): what basis_precision::float16 fits with.
  single_precision = 1,
};

/// PCA of R sample rows of length K (row-major floats), in double precision
/// (or with its large products in float, pca_precision::single_precision):
/// the mean, the covariance spectrum (descending, min(R, K) values, noise
/// below eigen_floor set to 0) and, on demand, the leading eigenvectors.
/// Covariance: C = Xc^T Xc / (R-1), eigenvectors of the K x K matrix.
/// Gram: eigenpairs (s, v) of Xc Xc^T (R x R) give C's eigenpairs
/// (s/(R-1), Xc^T v / sqrt(s)) for the non-zero s: the same subspace for a
/// fraction of the cost when R < K, and only the vectors asked for are formed.
class pca_decomposition {
 public:
  /// `expected_vectors`: the most vectors() will be asked for (0: unknown;
  /// a small count lets the eigensolver form only those, leading_eigensolver).
  pca_decomposition(const float* rows, std::size_t R, std::size_t K, pca_solver solver,
                    std::size_t expected_vectors = 0,
                    pca_precision precision = pca_precision::double_precision)
      : single_(precision == pca_precision::single_precision) {
    const auto r = static_cast<Eigen::Index>(R), k = static_cast<Eigen::Index>(K);
    const double scale = 1.0 / double(R - 1);
    gram_ = solver == pca_solver::gram || (solver == pca_solver::automatic && R <= K);
    const Eigen::Index n = gram_ ? r : k;
    Eigen::MatrixXd m(n, n);
    const Eigen::Map<const Eigen::MatrixXf> x(rows, k, r);
    if (single_) {
      // the mean in double, then centred float samples and a float product
      mean_ = Eigen::VectorXd::Zero(k);
      for (Eigen::Index j = 0; j < r; ++j) mean_ += x.col(j).cast<double>();
      mean_ /= double(R);
      xct_f_ = x;
      xct_f_.colwise() -= mean_.cast<float>();
      Eigen::MatrixXf mf(n, n);
      mf.setZero();
      if (gram_) mf.selfadjointView<Eigen::Lower>().rankUpdate(xct_f_.transpose());
      else mf.selfadjointView<Eigen::Lower>().rankUpdate(xct_f_, static_cast<float>(scale));
      m = mf.cast<double>();
    } else {
      // Held transposed (K x R, column-major: the rows' own memory order), so
      // the cast to double streams instead of transposing (12% of the wide
      // layer's Gram setup); the same sums in the same order.
      xct_ = x.cast<double>();
      mean_ = xct_.rowwise().mean();
      xct_.colwise() -= mean_;
      m.setZero();
      if (gram_) m.selfadjointView<Eigen::Lower>().rankUpdate(xct_.transpose());
      else m.selfadjointView<Eigen::Lower>().rankUpdate(xct_, scale);
    }
    es_ = leading_eigensolver(m, static_cast<Eigen::Index>(expected_vectors));  // reads the lower triangle only
    if (gram_) gram_lower_ = std::move(m);  // vectors() orthonormalises against it
    const Eigen::VectorXd& s = es_.eigenvalues();  // ascending
    const double top = std::max(s(n - 1), 0.0);
    const Eigen::Index keep = std::min(r, k);
    spectrum_.assign(static_cast<std::size_t>(keep), 0.0);
    for (Eigen::Index i = 0; i < keep; ++i) {
      const double v = s(n - 1 - i);
      const bool kept = top > 0 && v > eigen_floor * top;
      spectrum_[static_cast<std::size_t>(i)] = kept ? (gram_ ? v * scale : v) : 0.0;
      if (kept) available_ = static_cast<std::size_t>(i + 1);
    }
  }

  const Eigen::VectorXd& mean() const noexcept { return mean_; }
  const std::vector<double>& spectrum() const noexcept { return spectrum_; }
  /// Eigenvectors with a non-zero eigenvalue.
  std::size_t available() const noexcept { return available_; }

  /// The leading `count` (<= available()) orthonormal eigenvectors, K x count,
  /// sign-normalised.
  Eigen::MatrixXd vectors(std::size_t count) const {
    const auto c = static_cast<Eigen::Index>(std::min(count, available_));
    const Eigen::Index n = es_.eigenvalues().size();
    Eigen::MatrixXd v;
    if (gram_) {
      // One product for all columns: Xc^T T, T = [v_1 .. v_c] diag(1/sqrt(s_i)),
      // orthonormal in exact arithmetic. The solver's rounding is removed in
      // the R-dimensional space before the product: (Xc^T T)^T (Xc^T T) =
      // T^T G T with G = Xc Xc^T, so a Cholesky QR of T in the G inner
      // product (T <- T U^-1, T^T G T = U^T U) costs O(R^2 c) instead of the
      // O(K c^2) of two passes over the K x c result. One V^T V then checks
      // the result: K-space passes only where G's spread of eigenvalues left
      // more than 1e-10 (far below float's 6e-8, the basis' precision).
      // R = 450, K = 12288, c = 443: 495 -> about 240 ms.
      Eigen::MatrixXd top = es_.leading_vectors(c);
      for (Eigen::Index i = 0; i < c; ++i) top.col(i) /= std::sqrt(es_.eigenvalues()(n - 1 - i));
      (void)reorthonormalise_in(gram_lower_, top);  // where it cannot, the K-space check below does the work
      if (single_) {
        // float product and check: passes only beyond 1e-5, float's own
        // reach over K-long columns (the basis then rounds to binary16)
        Eigen::MatrixXf vf = xct_f_ * top.cast<float>();
        reorthonormalise(vf, 1e-5);
        v = vf.cast<double>();
      } else {
        v.noalias() = xct_ * top;
        reorthonormalise(v, 1e-10);
      }
    } else {
      v = es_.leading_vectors(c);
    }
    normalise_signs(v);
    return v;
  }

 private:
  bool single_ = false;
  Eigen::MatrixXd xct_;    // centred samples, transposed: K x R (double precision)
  Eigen::MatrixXf xct_f_;  // the same in float (single precision)
  Eigen::VectorXd mean_;
  bool gram_ = false;
  Eigen::MatrixXd gram_lower_;  // Gram: Xc Xc^T, lower triangle
  leading_eigensolver es_;
  std::vector<double> spectrum_;
  std::size_t available_ = 0;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

}  // namespace gradcomp
