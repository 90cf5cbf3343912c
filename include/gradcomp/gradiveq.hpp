#pragma once
/// \file gradiveq.hpp
/// GradiVeQ (seed 002): the PCA linear compressor, its payload, the eq. 7
/// compression-loss monitor and the warm-up / sampling / compressed schedule.
///
/// A layer gradient of M elements (conv layers in the Fig. 3a order of
/// layout.hpp) is cut into S = floor(M / K) slices of K adjacent elements.
/// Every node computes the same basis U_d (K x d) and whitening vector mu
/// from the same L_t aggregated samples (PCA, eq. 6 picks d), then
///
///     compress    g'_m = U_d^T (g_m - mu / N)      eq. 3, all slices in one product
///     aggregate   g'   = sum_n g'_n                eq. 4, in the compressed domain
///     decompress  g^_m = U_d g'_m + mu             eq. 5
///
/// which makes the codec linear (a LinearCodec). See docs/codecs.md for the
/// payload layout, the options beyond the paper and how a ring driver cuts a
/// layer into segments (Algorithm 1).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

// See system/generic/gradiveq.hpp: a GCC 12 false positive inside Eigen.
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

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/layout.hpp>
#include <gradcomp/system/generic/gradiveq.hpp>
#include <gradcomp/wire.hpp>
#if defined(GRADCOMP_HAS_THRUST)
#include <gradcomp/system/thrust/gradiveq.hpp>
#endif

namespace gradcomp {

// ---------------------------------------------------------------------------
// Errors

/// A payload made with another basis (or another N, K or layer): the nodes'
/// compressors disagree, so summing or decoding would silently be wrong.
class fingerprint_mismatch_error : public state_error {
 public:
  fingerprint_mismatch_error(const std::string& where, std::uint32_t expected, std::uint32_t actual)
      : state_error(where + ": basis fingerprint mismatch (expected " + hex(expected) + ", got " + hex(actual) +
                    "): the nodes' GradiVeQ compressors differ"),
        expected_(expected),
        actual_(actual) {}
  std::uint32_t expected() const noexcept { return expected_; }
  std::uint32_t actual() const noexcept { return actual_; }

 private:
  static std::string hex(std::uint32_t v) {
    static const char* digits = "0123456789abcdef";
    std::string s = "0x00000000";
    for (int i = 0; i < 8; ++i) s[9 - i] = digits[(v >> (4 * i)) & 0xF];
    return s;
  }
  std::uint32_t expected_;
  std::uint32_t actual_;
};

// ---------------------------------------------------------------------------
// Eq. 6

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

// ---------------------------------------------------------------------------
// Options

/// Which samples the basis of a slice group is fitted on.
enum class basis_source : std::uint8_t {
  first_slice = 0,  ///< paper (Sec. 3): the first slice of each group of s slices
  pooled = 1,       ///< beyond the paper: up to `pool_slices` slices spread over the group, one sample each
};

/// How the PCA eigenvectors are computed (both give the same subspace).
enum class pca_solver : std::uint8_t {
  automatic = 0,   ///< Gram when the sample rows R <= K, covariance otherwise
  covariance = 1,  ///< eigen-decomposition of the K x K covariance (the paper's recipe)
  gram = 2,        ///< eigen-decomposition of the R x R Gram matrix of the centred samples
};

/// Parameters of a linear_compressor. Defaults are the paper's recipe.
struct gradiveq_options {
  std::size_t slice_size = 0;     ///< K; 0 = the layer shape's default (W*D*F for conv)
  double lambda = 0.01;           ///< eq. 6 loss threshold, in [0, 1)
  std::size_t reuse_factor = 0;   ///< s: slices sharing one basis; 0 = infinity (one basis per layer)
  std::size_t summands = 1;       ///< N: how many payloads are summed (nodes), eq. 3's mu/N
  std::size_t min_samples = 2;    ///< fit() refuses fewer aggregated samples (at least 2)
  std::size_t max_dimension = 0;  ///< cap on d (0 = none); keeps the ratio K/d at least K/max
  bool allow_tail = true;         ///< M % K != 0: pass the tail through uncompressed (false: reject)
  basis_source source = basis_source::first_slice;
  std::size_t pool_slices = 16;   ///< basis_source::pooled: slices taken per sample and group (0 = all)
  double holdout_fraction = 0.0;  ///< > 0: choose d on the last fraction of the samples, held out of the fit
  pca_solver solver = pca_solver::automatic;
};

// ---------------------------------------------------------------------------
// Payload

/// Payload of linear_compressor: the compressed coefficients of a run of whole
/// slices of a layer (the whole layer, or one ring segment), and the
/// uncompressed tail when the run ends at a layer end that K does not divide.
///
/// Body (little-endian, docs/codecs.md):
///     u32 fingerprint   basis fingerprint of the codec that made it
///     u32 count         payloads summed into this one (1 after encode)
///     u64 slice_size    K
///     u64 offset        first element of the run in the layer (a multiple of K)
///     u64 coefficients  number of coefficient floats (d per slice)
///     f32 coefficient[coefficients]   slice after slice
///     f32 tail[element_count % K]     uncompressed tail
/// element_count (header) is the run's length in elements.
struct gradiveq_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::gradiveq;
  static constexpr std::size_t fixed_body_size = 4 + 4 + 8 + 8 + 8;

  std::uint32_t fingerprint = 0;
  std::uint32_t count = 0;
  std::uint64_t slice_size = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::vector<float> coefficients;
  std::vector<float> tail;

  std::uint64_t element_count() const noexcept { return length; }
  std::size_t body_size() const noexcept { return fixed_body_size + 4 * (coefficients.size() + tail.size()); }
  void write_body(wire::writer& w) const {
    w.put<std::uint32_t>(fingerprint);
    w.put<std::uint32_t>(count);
    w.put<std::uint64_t>(slice_size);
    w.put<std::uint64_t>(offset);
    w.put<std::uint64_t>(coefficients.size());
    w.put_array<float>(coefficients);
    w.put_array<float>(tail);
  }
  /// Validates everything the payload can say about itself; the codec checks
  /// the rest (fingerprint, d per slice, position in its layer) on use.
  static gradiveq_payload read_body(wire::reader& r, const wire::header& h) {
    using wire::reader;
    gradiveq_payload p;
    p.length = h.element_count;
    p.fingerprint = r.get<std::uint32_t>();
    p.count = r.get<std::uint32_t>();
    p.slice_size = r.get<std::uint64_t>();
    p.offset = r.get<std::uint64_t>();
    const std::uint64_t ncoef = r.get<std::uint64_t>();
    reader::check(p.count >= 1, "gradiveq payload: count is 0");
    reader::check(p.slice_size >= 1, "gradiveq payload: slice size is 0");
    reader::check(p.offset % p.slice_size == 0, "gradiveq payload: offset is not on a slice boundary");
    reader::check(p.offset <= std::numeric_limits<std::uint64_t>::max() - p.length,
                  "gradiveq payload: offset + length overflows");
    const std::uint64_t slices = p.length / p.slice_size;
    const std::uint64_t tail = p.length % p.slice_size;
    // d <= K for every slice, so at most slices*K (<= length) coefficients.
    reader::check(ncoef <= slices * p.slice_size, "gradiveq payload: more coefficients than the slices allow");
    reader::check(slices > 0 || ncoef == 0, "gradiveq payload: coefficients without slices");
    const std::uint64_t floats = ncoef + tail;  // both <= length <= parse limit: no overflow
    if (r.remaining() / 4 < floats || r.remaining() % 4 != 0 || r.remaining() / 4 != floats) {
      if (r.remaining() / 4 < floats)
        reader::fail(wire::wire_errc::truncated, "gradiveq payload: body shorter than its counts");
      reader::fail(wire::wire_errc::malformed_body, "gradiveq payload: body longer than its counts");
    }
    p.coefficients = r.get_vector<float>(ncoef);
    p.tail = r.get_vector<float>(tail);
    return p;
  }
};

/// Eq. 7: a node's local compression loss ||g_n - (U_d g'_n + mu/N)||^2 over a
/// run of slices, with the gradient's own energy for a scale-free reading.
struct local_loss_value {
  double loss = 0.0;    ///< eq. 7 (absolute)
  double energy = 0.0;  ///< ||g_n||^2 over the same elements
  /// loss / energy (0 for a zero gradient): comparable with lambda.
  double relative() const noexcept { return energy > 0.0 ? loss / energy : 0.0; }
};

namespace detail {

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

/// Restores orthonormal columns without changing the leading directions
/// (the Q of a QR with positive diagonal, i.e. Gram-Schmidt): two passes of
/// Cholesky QR (V <- V L^-T with V^T V = L L^T), all in matrix products;
/// modified Gram-Schmidt if a Cholesky factor does not exist.
inline void reorthonormalise(Eigen::MatrixXd& v) {
  for (int pass = 0; pass < 2; ++pass) {
    Eigen::MatrixXd w(v.cols(), v.cols());
    w.setZero();
    w.selfadjointView<Eigen::Lower>().rankUpdate(v.transpose());
    Eigen::LLT<Eigen::MatrixXd> llt(w);
    if (llt.info() == Eigen::Success && llt.matrixL().toDenseMatrix().diagonal().minCoeff() > 1e-8) {
      llt.matrixU().solveInPlace<Eigen::OnTheRight>(v);  // v <- v U^-1, U = L^T
      continue;
    }
    for (Eigen::Index j = 0; j < v.cols(); ++j) {
      for (Eigen::Index i = 0; i < j; ++i) v.col(j) -= v.col(i).dot(v.col(j)) * v.col(i);
      const double n = v.col(j).norm();
      if (n > 0) v.col(j) /= n;
    }
  }
}

/// PCA of R sample rows of length K (row-major floats), in double precision:
/// the mean, the covariance spectrum (descending, min(R, K) values, noise
/// below eigen_floor set to 0) and, on demand, the leading eigenvectors.
/// Covariance: C = Xc^T Xc / (R-1), eigenvectors of the K x K matrix.
/// Gram: eigenpairs (s, v) of Xc Xc^T (R x R) give C's eigenpairs
/// (s/(R-1), Xc^T v / sqrt(s)) for the non-zero s: the same subspace for a
/// fraction of the cost when R < K, and only the vectors asked for are formed.
class pca_decomposition {
 public:
  pca_decomposition(const float* rows, std::size_t R, std::size_t K, pca_solver solver) {
    using row_major_f = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const auto r = static_cast<Eigen::Index>(R), k = static_cast<Eigen::Index>(K);
    xc_ = Eigen::Map<const row_major_f>(rows, r, k).cast<double>();
    mean_ = xc_.colwise().mean().transpose();
    xc_.rowwise() -= mean_.transpose();
    const double scale = 1.0 / double(R - 1);
    gram_ = solver == pca_solver::gram || (solver == pca_solver::automatic && R <= K);
    const Eigen::Index n = gram_ ? r : k;
    Eigen::MatrixXd m(n, n);
    m.setZero();
    if (gram_) m.selfadjointView<Eigen::Lower>().rankUpdate(xc_);
    else m.selfadjointView<Eigen::Lower>().rankUpdate(xc_.transpose(), scale);
    es_.compute(m);  // reads the lower triangle only
    if (es_.info() != Eigen::Success) throw state_error("gradiveq: PCA eigen-decomposition did not converge");
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
    const Eigen::Index n = es_.eigenvectors().cols();
    Eigen::MatrixXd v;
    if (gram_) {
      // One product for all columns: Xc^T [v_1 .. v_c] diag(1/sqrt(s_i)).
      Eigen::MatrixXd top = es_.eigenvectors().rightCols(c).rowwise().reverse();
      for (Eigen::Index i = 0; i < c; ++i) top.col(i) /= std::sqrt(es_.eigenvalues()(n - 1 - i));
      v.noalias() = xc_.transpose() * top;
      reorthonormalise(v);
    } else {
      v = es_.eigenvectors().rightCols(c).rowwise().reverse();
    }
    normalise_signs(v);
    return v;
  }

 private:
  Eigen::MatrixXd xc_;  // centred samples, R x K
  Eigen::VectorXd mean_;
  bool gram_ = false;
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es_;
  std::vector<double> spectrum_;
  std::size_t available_ = 0;
};

/// Reads the parameter block of a saved state and compares it byte for byte
/// with the one `write_params(writer&)` writes for this object: a state saved
/// with other parameters is a state_error(`mismatch`).
template <class WriteParams>
void expect_saved_params(wire::reader& r, WriteParams&& write_params, const char* mismatch) {
  std::vector<std::byte> mine;
  mine.reserve(128);  // the parameters fit; also avoids a GCC 12 -Wstringop-overflow false positive
  wire::writer pw(mine);
  write_params(pw);
  const auto theirs = r.get_bytes(mine.size());
  if (!std::equal(mine.begin(), mine.end(), theirs.begin())) throw state_error(mismatch);
}

}  // namespace detail

// ---------------------------------------------------------------------------
// The codec

/// GradiVeQ's PCA linear compressor for one layer (seed 002, eqs. 3-6).
///
/// Life cycle: during the L_t sampling iterations call add_sample() with the
/// layer's *aggregated* gradient (identical on every node); then fit() computes
/// the basis (identically on every node); then encode / accumulate / decode
/// during the L_c compressed iterations. A new cycle adds samples and fits
/// again; the current basis stays usable until the new fit() replaces it.
///
/// Linear: decode(sum of c payloads) = U_d U_d^T (sum g - c mu/N) + c mu/N, so
/// for c = N it is eq. 5 and for c = 1 the local reconstruction of eq. 7.
/// Non-finite policy: encode and add_sample reject NaN/Inf (non_finite_error
/// naming the first bad index) without changing the codec; after a failed
/// encode the output payload is left empty (no coefficients), never half-valid. Tail: when K does not divide the layer length M,
/// the last M % K elements travel uncompressed (summed like dense floats)
/// unless options.allow_tail is false, which makes the constructor throw.
template <ExecutionPolicy Policy = execution::seq>
class linear_compressor {
 public:
  using payload_type = gradiveq_payload;
  using codec_concept = linear_codec_tag;

  /// A layer of `shape` (conv layers flattened as in layout.hpp).
  explicit linear_compressor(const layer_shape& shape, gradiveq_options options = {})
      : linear_compressor(shape.size(), options.slice_size ? options.slice_size : shape.default_slice_size(),
                          options) {}

  /// A layer of `layer_length` elements; slice size options.slice_size, or
  /// min(layer_length, 1024) when it is 0.
  explicit linear_compressor(std::size_t layer_length, gradiveq_options options = {})
      : linear_compressor(layer_length,
                          options.slice_size ? options.slice_size : layer_shape::dense(layer_length).default_slice_size(),
                          options) {}

  // --- geometry ------------------------------------------------------------

  std::size_t layer_length() const noexcept { return length_; }
  std::size_t slice_size() const noexcept { return k_; }
  /// Whole slices S = floor(M / K).
  std::size_t slices() const noexcept { return slices_; }
  /// Elements passed through uncompressed at the end of the layer (M % K).
  std::size_t tail_length() const noexcept { return length_ - slices_ * k_; }
  /// Number of bases (slice groups of s slices; 1 when s = infinity).
  std::size_t groups() const noexcept { return group_span_.size(); }
  const gradiveq_options& options() const noexcept { return opt_; }
  std::size_t summands() const noexcept { return opt_.summands; }

  /// Changes N (eq. 3's mu/N) keeping the basis; the fingerprint changes with it.
  void set_summands(std::size_t n) {
    if (n == 0 || n > std::numeric_limits<std::uint32_t>::max())
      throw invalid_argument_error("gradiveq: summands N must be in [1, 2^32)");
    opt_.summands = n;
    if (fitted_) refresh_derived();
  }

  /// Element offsets cutting the layer into `parts` ring segments on slice
  /// boundaries: parts + 1 non-decreasing values from 0 to M. Segment i holds
  /// slices [floor(i S / parts), floor((i+1) S / parts)) (sizes differ by at
  /// most one slice) and the last segment also holds the tail. A segment may
  /// be empty when parts > S; empty segments encode to empty payloads.
  std::vector<std::size_t> segment_bounds(std::size_t parts) const {
    if (parts == 0) throw invalid_argument_error("gradiveq: segment_bounds needs at least one part");
    std::vector<std::size_t> b(parts + 1);
    for (std::size_t i = 0; i < parts; ++i) b[i] = mul_div(i, slices_, parts) * k_;
    b[parts] = length_;
    return b;
  }

  // --- PCA -------------------------------------------------------------------

  /// Records one aggregated layer gradient (all M elements, identical on every
  /// node) as a PCA sample: the first slice of each group, or pooled slices.
  void add_sample(std::span<const float> aggregated) {
    if (aggregated.size() != length_) throw size_mismatch_error("gradiveq::add_sample", length_, aggregated.size());
    if (auto bad = find_non_finite(Policy{}, aggregated); bad != aggregated.size())
      throw non_finite_error("gradiveq::add_sample", bad);
    for (std::size_t g = 0; g < group_span_.size(); ++g) {
      const auto [first, count] = group_span_[g];
      const std::size_t rows = rows_per_sample(count);
      auto& store = samples_[g];
      for (std::size_t j = 0; j < rows; ++j) {
        const std::size_t slice = first + mul_div(j, count, rows);
        const float* src = aggregated.data() + slice * k_;
        store.insert(store.end(), src, src + k_);
      }
    }
    ++pending_samples_;
    ++samples_seen_;
  }

  /// Samples recorded since the last fit().
  std::size_t pending_samples() const noexcept { return pending_samples_; }

  /// Computes every group's basis from the recorded samples (PCA, eq. 6) and
  /// clears them. Strong guarantee: on any error the codec is unchanged.
  /// Throws state_error with fewer than max(2, min_samples) samples (or, with
  /// a hold-out, fewer than 2 fitting and 1 held-out sample).
  void fit() {
    const std::size_t need = std::max<std::size_t>(2, opt_.min_samples);
    if (pending_samples_ < need)
      throw state_error("gradiveq::fit: " + std::to_string(pending_samples_) + " samples, at least " +
                        std::to_string(need) + " needed for a basis");
    std::size_t held = 0;
    if (opt_.holdout_fraction > 0.0) {
      held = std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(opt_.holdout_fraction * double(pending_samples_))));
      if (pending_samples_ < held + 2)
        throw state_error("gradiveq::fit: hold-out of " + std::to_string(held) + " samples leaves fewer than 2 to fit");
    }
    std::vector<basis_block> blocks(group_span_.size());
    for (std::size_t g = 0; g < group_span_.size(); ++g)
      blocks[g] = fit_group(group_span_[g], samples_[g], rows_per_sample(group_span_[g].second), held);
    blocks_ = std::move(blocks);
    fitted_ = true;
    ++fits_;
    for (auto& s : samples_) {
      s.clear();
      s.shrink_to_fit();
    }
    pending_samples_ = 0;
    refresh_derived();
  }

  /// True once fit() has produced a basis.
  bool has_basis() const noexcept { return fitted_; }
  /// Completed fits (PCA refreshes).
  std::uint64_t fits() const noexcept { return fits_; }
  /// d of group g (eq. 6).
  std::size_t dimension(std::size_t g = 0) const { return block(g).dimension; }
  /// U_d of group g: K x d, column-major.
  std::span<const float> basis(std::size_t g = 0) const { return block(g).basis; }
  /// Whitening vector mu of group g (mean of the aggregated samples), K values.
  std::span<const float> mean(std::size_t g = 0) const { return block(g).mean; }
  /// Covariance eigenvalues of group g's fitting samples, descending (min(R, K) values).
  std::span<const double> spectrum(std::size_t g = 0) const { return block(g).spectrum; }
  /// With holdout_fraction > 0: the fraction of the held-out samples' centred
  /// energy that the chosen directions of the fitting-only basis miss, an
  /// estimate of the loss on unseen gradients (above lambda when no d meets
  /// it). NaN without a hold-out.
  double heldout_loss(std::size_t g = 0) const { return block(g).heldout_loss; }
  /// Basis fingerprint carried by every payload: CRC-32C of (M, K, s, N, and
  /// each group's d, mu and U_d bytes). 0 before the first fit.
  std::uint32_t fingerprint() const noexcept { return fingerprint_; }
  /// Coefficients of the whole layer (sum over slices of their group's d).
  std::size_t coefficient_count() const noexcept { return fitted_ ? coef_prefix_.back() : 0; }
  /// Layer elements over transmitted floats (coefficients + tail): K/d without a tail.
  double compression_ratio() const noexcept {
    const std::size_t sent = coefficient_count() + tail_length();
    return sent ? double(length_) / double(sent) : 0.0;
  }

  // --- Codec -----------------------------------------------------------------

  /// Eq. 3 over the whole layer.
  void encode(std::span<const float> gradient, payload_type& out) const {
    if (gradient.size() != length_) throw size_mismatch_error("gradiveq::encode", length_, gradient.size());
    encode_segment(0, gradient, out);
  }

  /// Eq. 3 over the run of the layer starting at element `offset` (a multiple
  /// of K): `segment` covers whole slices, plus the tail when it ends at the
  /// layer end. Typically one ring segment, see segment_bounds().
  void encode_segment(std::size_t offset, std::span<const float> segment, payload_type& out) const {
    require_fitted("gradiveq::encode");
    const auto run = locate(offset, segment.size(), "gradiveq::encode_segment");
    const auto tail_in = segment.subspan(run.slices * k_);
    if (auto bad = find_non_finite(Policy{}, tail_in); bad != tail_in.size())
      throw non_finite_error("gradiveq::encode", run.slices * k_ + bad);
    out.fingerprint = fingerprint_;
    out.count = 1;
    out.slice_size = k_;
    out.offset = offset;
    out.length = segment.size();
    out.coefficients.resize(coef_prefix_[run.first + run.slices] - coef_prefix_[run.first]);
    for_each_group_piece(run, [&](const basis_block& b, std::size_t first, std::size_t n) {
      gradiveq_compress_slices(Policy{}, segment.data() + (first - run.first) * k_, n, k_, b.basis.data(),
                               b.dimension, b.offset.data(),
                               out.coefficients.data() + (coef_prefix_[first] - coef_prefix_[run.first]));
    });
    // Fused non-finite check: a NaN or Inf in a slice makes its coefficients
    // non-finite (x * u is NaN or Inf for every finite u), so only the
    // d/K-sized output is scanned, and the input only when it fails.
    if (find_non_finite(Policy{}, std::span<const float>(out.coefficients)) != out.coefficients.size()) {
      out.coefficients.clear();
      const auto body = segment.first(run.slices * k_);
      if (auto bad = find_non_finite(Policy{}, body); bad != body.size()) throw non_finite_error("gradiveq::encode", bad);
      throw invalid_argument_error("gradiveq::encode: finite gradient overflowed the float range when compressed");
    }
    out.tail.assign(tail_in.begin(), tail_in.end());
  }

  /// Eq. 4: into += from, in the compressed domain. Both must come from this
  /// basis (fingerprint_mismatch_error) and cover the same run (size_mismatch_error).
  void accumulate(payload_type& into, const payload_type& from) const {
    require_fitted("gradiveq::accumulate");
    check_payload(into, "gradiveq::accumulate");
    check_payload(from, "gradiveq::accumulate");
    if (into.offset != from.offset)
      throw size_mismatch_error("gradiveq::accumulate: segment offset", static_cast<std::size_t>(into.offset),
                                static_cast<std::size_t>(from.offset));
    if (into.length != from.length)
      throw size_mismatch_error("gradiveq::accumulate: segment length", static_cast<std::size_t>(into.length),
                                static_cast<std::size_t>(from.length));
    if (into.count > std::numeric_limits<std::uint32_t>::max() - from.count)
      throw state_error("gradiveq::accumulate: summand count overflows 32 bits");
    add_into(Policy{}, std::span<float>(into.coefficients), std::span<const float>(from.coefficients));
    add_into(Policy{}, std::span<float>(into.tail), std::span<const float>(from.tail));
    into.count += from.count;
  }

  /// Eq. 5 (out = U_d g' + mu for a payload summed over the N nodes; in
  /// general + count * mu / N). `out` is the payload's run: the whole layer
  /// for a whole-layer payload, the segment for a segment payload.
  void decode(const payload_type& p, std::span<float> out) const { expand(p, out, false, "gradiveq::decode"); }

  /// out += decode(p).
  void decode_add(const payload_type& p, std::span<float> out) const { expand(p, out, true, "gradiveq::decode_add"); }

  std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }

  /// Eq. 7 for this node: ||g_n - (U_d g'_n + mu/N)||^2 where `own` is the
  /// payload encode produced from `local` (count 1). Computed without a
  /// decode as ||g_n - mu/N||^2 - ||g'_n||^2 (U_d has orthonormal columns);
  /// the tail travels exactly and adds no loss.
  local_loss_value local_loss(std::span<const float> local, const payload_type& own) const {
    require_fitted("gradiveq::local_loss");
    check_payload(own, "gradiveq::local_loss");
    if (own.count != 1) throw invalid_argument_error("gradiveq::local_loss: needs this node's own payload (count 1)");
    if (local.size() != own.length)
      throw size_mismatch_error("gradiveq::local_loss", static_cast<std::size_t>(own.length), local.size());
    const auto run = locate(static_cast<std::size_t>(own.offset), local.size(), "gradiveq::local_loss");
    local_loss_value v;
    const double inv_n = 1.0 / double(opt_.summands);
    for_each_group_piece(run, [&](const basis_block& b, std::size_t first, std::size_t n) {
      for (std::size_t m = 0; m < n; ++m) {
        const float* g = local.data() + (first - run.first + m) * k_;
        double centred = 0.0;
        for (std::size_t i = 0; i < k_; ++i) {
          const double x = double(g[i]) - double(b.mean[i]) * inv_n;
          centred += x * x;
        }
        const float* c = own.coefficients.data() + (coef_prefix_[first + m] - coef_prefix_[run.first]);
        double coded = 0.0;
        for (std::size_t j = 0; j < b.dimension; ++j) coded += double(c[j]) * double(c[j]);
        v.loss += std::max(0.0, centred - coded);
      }
    });
    for (float x : local) v.energy += double(x) * double(x);
    return v;
  }

  // --- StatefulCodec -----------------------------------------------------------

  /// Parameters, counters, bases and the samples recorded so far.
  std::vector<std::byte> save_state() const {
    return wire::serialize_state(wire::codec_id::gradiveq, length_, [&](wire::writer& w) {
      write_params(w);
      w.put<std::uint64_t>(fits_);
      w.put<std::uint64_t>(samples_seen_);
      w.put<std::uint64_t>(pending_samples_);
      w.put<std::uint8_t>(fitted_ ? 1 : 0);
      if (fitted_)
        for (const auto& b : blocks_) {
          w.put<std::uint64_t>(b.dimension);
          w.put<std::uint64_t>(b.spectrum.size());
          w.put<double>(b.heldout_loss);
          w.put_array<double>(b.spectrum);
          w.put_array<float>(b.mean);
          w.put_array<float>(b.basis);
        }
      for (const auto& s : samples_) w.put_array<float>(s);
    });
  }

  /// Restores a save_state() of a codec configured identically (state_error
  /// otherwise); the restored codec continues bit for bit. Strong guarantee.
  void restore_state(std::span<const std::byte> bytes) {
    using wire::reader;
    wire::header h;
    reader r = wire::parse_state(bytes, wire::codec_id::gradiveq, &h);
    if (h.element_count != length_) throw state_error("gradiveq::restore_state: state is for a layer of another length");
    detail::expect_saved_params(r, [&](wire::writer& w) { write_params(w); },
                                "gradiveq::restore_state: state was saved by a codec with other parameters");
    const std::uint64_t fits = r.get<std::uint64_t>();
    const std::uint64_t seen = r.get<std::uint64_t>();
    const std::uint64_t pending = r.get<std::uint64_t>();
    const std::uint8_t fitted = r.get<std::uint8_t>();
    reader::check(fitted <= 1, "gradiveq state: bad fitted flag");
    reader::check(pending <= seen, "gradiveq state: more pending samples than seen");
    reader::check(fitted == 0 || fits >= 1, "gradiveq state: fitted without a fit");
    std::vector<basis_block> blocks;
    if (fitted) {
      blocks.resize(group_span_.size());
      for (std::size_t g = 0; g < group_span_.size(); ++g) {
        auto& b = blocks[g];
        b.first = group_span_[g].first;
        b.count = group_span_[g].second;
        const std::uint64_t d = r.get<std::uint64_t>();
        const std::uint64_t ns = r.get<std::uint64_t>();
        reader::check(d >= 1 && d <= k_, "gradiveq state: dimension outside [1, K]");
        reader::check(ns <= k_, "gradiveq state: spectrum longer than K");
        reader::check(opt_.max_dimension == 0 || d <= opt_.max_dimension, "gradiveq state: dimension above the cap");
        b.dimension = static_cast<std::size_t>(d);
        b.heldout_loss = r.get<double>();
        reader::check(opt_.holdout_fraction > 0.0 ? (b.heldout_loss >= 0.0 && b.heldout_loss <= 1.0)
                                                  : std::isnan(b.heldout_loss),
                      "gradiveq state: bad held-out loss");
        b.spectrum = r.get_vector<double>(ns);
        b.mean = r.get_vector<float>(k_);
        if (d > r.remaining() / 4 / k_) reader::fail(wire::wire_errc::truncated, "gradiveq state: basis");
        b.basis = r.get_vector<float>(d * k_);
        for (double s : b.spectrum) reader::check(std::isfinite(s) && s >= 0.0, "gradiveq state: bad eigenvalue");
        reader::check(std::is_sorted(b.spectrum.rbegin(), b.spectrum.rend()), "gradiveq state: spectrum not sorted");
        for (float x : b.mean) reader::check(std::isfinite(x), "gradiveq state: non-finite mean");
        for (float x : b.basis) reader::check(std::isfinite(x), "gradiveq state: non-finite basis");
      }
    }
    std::vector<std::vector<float>> samples(group_span_.size());
    for (std::size_t g = 0; g < group_span_.size(); ++g) {
      const std::size_t row_floats = rows_per_sample(group_span_[g].second) * k_;
      if (row_floats != 0 && pending > r.remaining() / 4 / row_floats)
        reader::fail(wire::wire_errc::truncated, "gradiveq state: samples");
      samples[g] = r.get_vector<float>(pending * row_floats);
      for (float x : samples[g]) reader::check(std::isfinite(x), "gradiveq state: non-finite sample");
    }
    r.expect_end();
    blocks_ = std::move(blocks);
    samples_ = std::move(samples);
    fitted_ = fitted != 0;
    fits_ = fits;
    samples_seen_ = seen;
    pending_samples_ = static_cast<std::size_t>(pending);
    if (fitted_) refresh_derived();
    else {
      fingerprint_ = 0;
      coef_prefix_.assign(1, 0);
    }
  }

 private:
  struct basis_block {
    std::size_t first = 0, count = 0;  // slices [first, first + count)
    std::size_t dimension = 0;         // d
    std::vector<float> basis;          // U_d, K x d column-major
    std::vector<float> mean;           // mu, K
    std::vector<double> spectrum;      // descending covariance eigenvalues
    double heldout_loss = std::numeric_limits<double>::quiet_NaN();  // hold-out option only
    std::vector<float> mu_u;           // U_d^T mu, d (derived)
    std::vector<float> offset;         // U_d^T mu / N, d (derived)
  };
  struct run_t {
    std::size_t first = 0, slices = 0;
  };

  linear_compressor(std::size_t length, std::size_t k, const gradiveq_options& o) : opt_(o), length_(length), k_(k) {
    if (length_ == 0) throw invalid_argument_error("gradiveq: a layer of 0 elements");
    if (k_ == 0) throw invalid_argument_error("gradiveq: slice size K must be positive (layer of 0 elements?)");
    if (k_ > std::numeric_limits<std::uint32_t>::max()) throw invalid_argument_error("gradiveq: slice size K above 2^32");
    if (!(opt_.lambda >= 0.0 && opt_.lambda < 1.0))
      throw invalid_argument_error("gradiveq: lambda must be in [0, 1), got " + std::to_string(opt_.lambda));
    if (opt_.summands == 0 || opt_.summands > std::numeric_limits<std::uint32_t>::max())
      throw invalid_argument_error("gradiveq: summands N must be in [1, 2^32)");
    if (!(opt_.holdout_fraction >= 0.0 && opt_.holdout_fraction < 1.0))
      throw invalid_argument_error("gradiveq: holdout_fraction must be in [0, 1)");
    if (opt_.source != basis_source::first_slice && opt_.source != basis_source::pooled)
      throw invalid_argument_error("gradiveq: unknown basis_source");
    if (opt_.solver != pca_solver::automatic && opt_.solver != pca_solver::covariance && opt_.solver != pca_solver::gram)
      throw invalid_argument_error("gradiveq: unknown pca_solver");
    opt_.slice_size = k_;
    slices_ = length_ / k_;
    if (!opt_.allow_tail && slices_ * k_ != length_)
      throw invalid_argument_error("gradiveq: slice size " + std::to_string(k_) + " does not divide the layer length " +
                                   std::to_string(length_) + " (allow_tail = false)");
    const std::size_t s = opt_.reuse_factor == 0 ? std::max<std::size_t>(slices_, 1) : opt_.reuse_factor;
    for (std::size_t first = 0; first < slices_; first += s)
      group_span_.emplace_back(first, std::min(s, slices_ - first));
    slice_group_.resize(slices_);
    for (std::size_t g = 0; g < group_span_.size(); ++g)
      for (std::size_t m = 0; m < group_span_[g].second; ++m) slice_group_[group_span_[g].first + m] = g;
    samples_.resize(group_span_.size());
    coef_prefix_.assign(1, 0);
  }

  // floor(a * b / c) without overflow for the sizes used here.
  static std::size_t mul_div(std::size_t a, std::size_t b, std::size_t c) noexcept {
    __extension__ typedef unsigned __int128 u128;
    return static_cast<std::size_t>((static_cast<u128>(a) * b) / c);
  }

  std::size_t rows_per_sample(std::size_t group_slices) const noexcept {
    if (opt_.source == basis_source::first_slice) return 1;
    return opt_.pool_slices == 0 ? group_slices : std::min(group_slices, opt_.pool_slices);
  }

  const basis_block& block(std::size_t g) const {
    require_fitted("gradiveq: basis access");
    if (g >= blocks_.size()) throw invalid_argument_error("gradiveq: group index out of range");
    return blocks_[g];
  }

  void require_fitted(const char* where) const {
    if (!fitted_) throw state_error(std::string(where) + ": no basis yet (add L_t samples and call fit() first)");
  }

  basis_block fit_group(std::pair<std::size_t, std::size_t> span, const std::vector<float>& rows,
                        std::size_t rows_per, std::size_t held) const {
    basis_block b;
    b.first = span.first;
    b.count = span.second;
    const std::size_t R = pending_samples_ * rows_per;
    std::size_t d = 0;
    bool use_all = false;
    if (held > 0) {
      // d from held-out samples (the latest ones, the closest to the
      // compressed iterations that follow): fit on the others and take the
      // fewest leading directions keeping 1 - lambda of the held-out energy.
      // When no d does, the samples cannot meet lambda: use every direction
      // the full fit supports (eq. 6 on the fitting data would stop short).
      const std::size_t train_rows = (pending_samples_ - held) * rows_per;
      const detail::pca_decomposition train(rows.data(), train_rows, k_, opt_.solver);
      using row_major_f = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      Eigen::MatrixXd hc = Eigen::Map<const row_major_f>(rows.data() + train_rows * k_,
                                                         static_cast<Eigen::Index>(R - train_rows),
                                                         static_cast<Eigen::Index>(k_))
                               .cast<double>();
      hc.rowwise() -= train.mean().transpose();
      const double total = hc.squaredNorm();
      const Eigen::MatrixXd proj = hc * train.vectors(train.available());  // held rows x available
      const Eigen::VectorXd per_dir = proj.colwise().squaredNorm().transpose();
      double captured = 0.0;
      use_all = true;
      for (Eigen::Index j = 0; j < per_dir.size() && use_all; ++j) {
        captured += per_dir(j);
        if (captured >= (1.0 - opt_.lambda) * total) {
          d = static_cast<std::size_t>(j + 1);
          use_all = false;
        }
      }
      if (use_all && total <= 0.0) {
        d = 1;  // nothing to capture
        use_all = false;
      }
      b.heldout_loss = total > 0.0 ? std::max(0.0, 1.0 - captured / total) : 0.0;
    }
    const detail::pca_decomposition pca(rows.data(), R, k_, opt_.solver);
    const std::size_t available = pca.available();
    if (held == 0) d = select_dimension(pca.spectrum(), opt_.lambda);
    if (use_all) d = available;
    d = std::min(d, available);
    if (opt_.max_dimension) d = std::min(d, opt_.max_dimension);
    b.spectrum = pca.spectrum();
    b.mean.resize(k_);
    for (std::size_t i = 0; i < k_; ++i) b.mean[i] = static_cast<float>(pca.mean()(static_cast<Eigen::Index>(i)));
    if (d == 0) {
      // All samples identical (zero variance): keep one direction, e_0, so
      // the code stays well formed; decode then returns mu plus that coordinate.
      d = 1;
      b.basis.assign(k_, 0.0f);
      b.basis[0] = 1.0f;
    } else {
      const Eigen::MatrixXd v = pca.vectors(d);
      b.basis.resize(k_ * d);
      Eigen::Map<Eigen::MatrixXf>(b.basis.data(), static_cast<Eigen::Index>(k_), static_cast<Eigen::Index>(d)) =
          v.cast<float>();
    }
    b.dimension = d;
    return b;
  }

  // Everything derived from the blocks and N: U^T mu, the eq. 3 offsets,
  // coefficient offsets per slice, the fingerprint.
  void refresh_derived() {
    for (auto& b : blocks_) {
      b.mu_u.assign(b.dimension, 0.0f);
      b.offset.assign(b.dimension, 0.0f);
      for (std::size_t j = 0; j < b.dimension; ++j) {
        double acc = 0.0;
        for (std::size_t i = 0; i < k_; ++i) acc += double(b.mean[i]) * double(b.basis[j * k_ + i]);
        b.mu_u[j] = static_cast<float>(acc);
        b.offset[j] = static_cast<float>(acc / double(opt_.summands));
      }
    }
    coef_prefix_.assign(slices_ + 1, 0);
    for (std::size_t m = 0; m < slices_; ++m) coef_prefix_[m + 1] = coef_prefix_[m] + blocks_[slice_group_[m]].dimension;
    std::vector<std::byte> bytes;
    wire::writer w(bytes);
    w.put<std::uint64_t>(length_);
    w.put<std::uint64_t>(k_);
    w.put<std::uint64_t>(opt_.reuse_factor);
    w.put<std::uint64_t>(opt_.summands);
    w.put<std::uint64_t>(blocks_.size());
    std::uint32_t crc = wire::crc32c(0, bytes);
    for (const auto& b : blocks_) {
      bytes.clear();
      w.put<std::uint64_t>(b.dimension);
      w.put_array<float>(b.mean);
      w.put_array<float>(b.basis);
      crc = wire::crc32c(crc, bytes);
    }
    fingerprint_ = crc == 0 ? 1u : crc;  // 0 means "no basis"
  }

  void write_params(wire::writer& w) const {
    w.put<std::uint64_t>(length_);
    w.put<std::uint64_t>(k_);
    w.put<double>(opt_.lambda);
    w.put<std::uint64_t>(opt_.reuse_factor);
    w.put<std::uint64_t>(opt_.summands);
    w.put<std::uint64_t>(opt_.min_samples);
    w.put<std::uint64_t>(opt_.max_dimension);
    w.put<std::uint8_t>(opt_.allow_tail ? 1 : 0);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(opt_.source));
    w.put<std::uint64_t>(opt_.pool_slices);
    w.put<double>(opt_.holdout_fraction);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(opt_.solver));
  }

  // Validates a run [offset, offset + n) of the layer for encoding/decoding.
  run_t locate(std::size_t offset, std::size_t n, const char* where) const {
    if (offset > length_ || n > length_ - offset)
      throw size_mismatch_error(std::string(where) + ": run past the layer end", length_ - std::min(offset, length_), n);
    if (offset % k_ != 0)
      throw invalid_argument_error(std::string(where) + ": offset " + std::to_string(offset) +
                                   " is not on a slice boundary (K = " + std::to_string(k_) + ")");
    run_t run;
    run.first = offset / k_;
    const bool to_end = offset + n == length_;
    const std::size_t whole = to_end ? std::min(n / k_, slices_ - run.first) : n / k_;
    if (!to_end && n % k_ != 0)
      throw invalid_argument_error(std::string(where) + ": a run that does not end at the layer end must hold whole "
                                   "slices (length " + std::to_string(n) + ", K = " + std::to_string(k_) + ")");
    run.slices = whole;
    return run;
  }

  // Checks a payload against this codec: basis, K, position, sizes.
  void check_payload(const payload_type& p, const char* where) const {
    if (p.fingerprint != fingerprint_) throw fingerprint_mismatch_error(where, fingerprint_, p.fingerprint);
    if (p.count == 0) throw invalid_argument_error(std::string(where) + ": payload was never encoded (count 0)");
    if (p.slice_size != k_)
      throw size_mismatch_error(std::string(where) + ": slice size", k_, static_cast<std::size_t>(p.slice_size));
    if (p.offset > length_ || p.length > length_ - p.offset)
      throw size_mismatch_error(std::string(where) + ": payload run past the layer end", length_,
                                static_cast<std::size_t>(p.offset + p.length));
    const auto run = locate(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.length), where);
    const std::size_t coef = coef_prefix_[run.first + run.slices] - coef_prefix_[run.first];
    if (p.coefficients.size() != coef)
      throw size_mismatch_error(std::string(where) + ": coefficients", coef, p.coefficients.size());
    const std::size_t tail = static_cast<std::size_t>(p.length) - run.slices * k_;
    if (p.tail.size() != tail) throw size_mismatch_error(std::string(where) + ": tail", tail, p.tail.size());
  }

  template <class F>
  void for_each_group_piece(const run_t& run, F&& f) const {
    std::size_t m = run.first;
    const std::size_t end = run.first + run.slices;
    while (m < end) {
      const auto& b = blocks_[slice_group_[m]];
      const std::size_t stop = std::min(end, b.first + b.count);
      f(b, m, stop - m);
      m = stop;
    }
  }

  void expand(const payload_type& p, std::span<float> out, bool add, const char* where) const {
    require_fitted(where);
    check_payload(p, where);
    if (out.size() != p.length) throw size_mismatch_error(where, static_cast<std::size_t>(p.length), out.size());
    const auto run = locate(static_cast<std::size_t>(p.offset), out.size(), where);
    const float scale = static_cast<float>(double(p.count) / double(opt_.summands));
    for_each_group_piece(run, [&](const basis_block& b, std::size_t first, std::size_t n) {
      gradiveq_expand_slices(Policy{}, p.coefficients.data() + (coef_prefix_[first] - coef_prefix_[run.first]), n,
                             b.dimension, b.basis.data(), k_, b.mean.data(), scale, add,
                             out.data() + (first - run.first) * k_);
    });
    auto tail_out = out.subspan(run.slices * k_);
    if (add) add_into(Policy{}, tail_out, std::span<const float>(p.tail));
    else std::copy(p.tail.begin(), p.tail.end(), tail_out.begin());
  }

  gradiveq_options opt_;
  std::size_t length_ = 0, k_ = 0, slices_ = 0;
  std::vector<std::pair<std::size_t, std::size_t>> group_span_;  // (first slice, slices) per group
  std::vector<std::size_t> slice_group_;
  std::vector<std::vector<float>> samples_;  // per group: pending sample rows, K floats each
  std::size_t pending_samples_ = 0;
  std::uint64_t samples_seen_ = 0;
  std::uint64_t fits_ = 0;
  bool fitted_ = false;
  std::vector<basis_block> blocks_;
  std::vector<std::size_t> coef_prefix_;  // coefficient index of slice m
  std::uint32_t fingerprint_ = 0;
};

// ---------------------------------------------------------------------------
// Eq. 7 monitor inputs and the schedule

/// A node's vote for "the basis is stale": its relative eq. 7 loss exceeds the threshold.
inline bool stale_vote(const local_loss_value& v, double threshold) noexcept { return v.relative() > threshold; }

/// The majority rule of Sec. 3 (L_c): more than half of the `nodes` voted stale.
inline bool majority_stale(std::size_t stale_nodes, std::size_t nodes) noexcept { return 2 * stale_nodes > nodes; }

/// The phase an iteration of GradiVeQ training is in (Sec. 3, Fig. 6).
enum class gradiveq_phase : std::uint8_t {
  warmup = 0,      ///< uncompressed aggregation, no sampling (stabilises the model)
  sampling = 1,    ///< aggregated uncompressed or QSGD-quantized; each aggregate is a PCA sample
  compressed = 2,  ///< GradiVeQ-compressed aggregation (Algorithm 1)
};

/// How the sampling iterations aggregate (the schedule only reports it; the
/// driver does the quantization, e.g. with qsgd.hpp).
enum class sampling_aggregation : std::uint8_t {
  qsgd = 0,          ///< paper (Sec. 4): QSGD-quantized, 4 bits by default
  uncompressed = 1,  ///< plain dense aggregation
};

/// Parameters of gradiveq_schedule. Defaults are the paper's (Sec. 4).
struct gradiveq_schedule_options {
  std::size_t warmup_iterations = 2500;     ///< uncompressed iterations before the first sampling
  std::size_t sampling_iterations = 100;    ///< L_t (at least 2: a covariance needs 2 samples)
  std::size_t compressed_iterations = 400;  ///< L_c (at least 1)
  sampling_aggregation sampling = sampling_aggregation::qsgd;
  unsigned qsgd_bits = 4;                   ///< bits per QSGD level on sampling iterations
  /// Relative eq. 7 loss above which a node votes stale (stale_vote). The
  /// default, infinity, never votes: fixed L_c as in the paper's experiments.
  double stale_threshold = std::numeric_limits<double>::infinity();
  std::size_t patience = 1;  ///< consecutive majority-stale compressed iterations that end L_c early
  /// Beyond the paper: after L_c ends early at j iterations the next cycle's
  /// L_c is max(min_compressed_iterations, j) (never above L_c); a full cycle
  /// doubles it back towards compressed_iterations.
  bool adaptive_cycles = false;
  std::size_t min_compressed_iterations = 25;
};

/// What the caller must do after an iteration (returned by advance()).
struct gradiveq_step {
  gradiveq_phase next = gradiveq_phase::warmup;  ///< phase of the next iteration
  bool fit_basis = false;    ///< the L_t samples are complete: call fit() on every layer's codec now
  bool ended_early = false;  ///< L_c ended early on the eq. 7 majority vote
};

/// The GradiVeQ iteration schedule (Sec. 3, Fig. 6): warm-up, then cycles of
/// L_t sampling iterations and L_c compressed iterations, L_c possibly ended
/// early when a majority of nodes see a large eq. 7 loss. A state machine
/// only: it says which phase an iteration is in; every node runs its own copy
/// and feeds it the same vote counts, so all stay in step.
///
///     for each iteration:
///       switch (sched.phase()) { warmup: dense all-reduce;
///                                sampling: QSGD/dense all-reduce, codec.add_sample(aggregate);
///                                compressed: GradiVeQ ring, votes = sum over nodes of stale_vote(...) }
///       if (sched.advance(votes, N).fit_basis) codec.fit();
class gradiveq_schedule {
 public:
  explicit gradiveq_schedule(gradiveq_schedule_options o = {}) : opt_(o) {
    if (opt_.sampling_iterations < 2)
      throw invalid_argument_error("gradiveq_schedule: L_t (sampling_iterations) must be at least 2");
    if (opt_.compressed_iterations < 1)
      throw invalid_argument_error("gradiveq_schedule: L_c (compressed_iterations) must be at least 1");
    if (opt_.patience < 1) throw invalid_argument_error("gradiveq_schedule: patience must be at least 1");
    if (opt_.min_compressed_iterations < 1)
      throw invalid_argument_error("gradiveq_schedule: min_compressed_iterations must be at least 1");
    if (std::isnan(opt_.stale_threshold) || opt_.stale_threshold < 0.0)
      throw invalid_argument_error("gradiveq_schedule: stale_threshold must be >= 0");
    if (opt_.qsgd_bits < 1 || opt_.qsgd_bits > 16)
      throw invalid_argument_error("gradiveq_schedule: qsgd_bits must be in [1, 16]");
    current_lc_ = opt_.compressed_iterations;
    if (opt_.warmup_iterations == 0) enter(gradiveq_phase::sampling);
  }

  const gradiveq_schedule_options& options() const noexcept { return opt_; }
  /// Phase of the current iteration.
  gradiveq_phase phase() const noexcept { return phase_; }
  /// Iterations completed (the current iteration's index).
  std::uint64_t iteration() const noexcept { return iteration_; }
  /// Sampling/compressed cycles started (0 during warm-up, 1 in the first cycle).
  std::uint64_t cycle() const noexcept { return cycle_; }
  /// Iterations already completed in the current phase.
  std::size_t phase_position() const noexcept { return position_; }
  /// L_c of the current (or next) compressed phase; below L_c only with adaptive_cycles.
  std::size_t compressed_length() const noexcept { return current_lc_; }
  /// True when sampling iterations should be QSGD-quantized.
  bool sampling_quantized() const noexcept { return opt_.sampling == sampling_aggregation::qsgd; }
  /// This node's eq. 7 vote under the configured threshold.
  bool vote(const local_loss_value& v) const noexcept { return stale_vote(v, opt_.stale_threshold); }

  /// Ends the current iteration without a vote.
  gradiveq_step advance() { return step(false); }

  /// Ends the current iteration; in a compressed iteration `stale_nodes` of
  /// `nodes` voted stale (the same counts on every node). Ignored otherwise.
  gradiveq_step advance(std::size_t stale_nodes, std::size_t nodes) {
    if (nodes == 0 || stale_nodes > nodes)
      throw invalid_argument_error("gradiveq_schedule::advance: need 0 <= stale_nodes <= nodes, nodes >= 1");
    return step(phase_ == gradiveq_phase::compressed && majority_stale(stale_nodes, nodes));
  }

  /// The schedule's counters, in the wire state container (codec id control).
  std::vector<std::byte> save_state() const {
    return wire::serialize_state(wire::codec_id::control, 0, [&](wire::writer& w) {
      write_params(w);
      w.put<std::uint8_t>(static_cast<std::uint8_t>(phase_));
      w.put<std::uint64_t>(iteration_);
      w.put<std::uint64_t>(cycle_);
      w.put<std::uint64_t>(position_);
      w.put<std::uint64_t>(current_lc_);
      w.put<std::uint64_t>(stale_run_);
    });
  }

  /// Restores a save_state() of an identically configured schedule.
  void restore_state(std::span<const std::byte> bytes) {
    using wire::reader;
    wire::header h;
    reader r = wire::parse_state(bytes, wire::codec_id::control, &h);
    reader::check(h.element_count == 0, "gradiveq_schedule state: element count must be 0");
    detail::expect_saved_params(r, [&](wire::writer& w) { write_params(w); },
                                "gradiveq_schedule::restore_state: state was saved with other options");
    const auto phase = r.get<std::uint8_t>();
    const auto iteration = r.get<std::uint64_t>();
    const auto cycle = r.get<std::uint64_t>();
    const auto position = r.get<std::uint64_t>();
    const auto lc = r.get<std::uint64_t>();
    const auto stale = r.get<std::uint64_t>();
    r.expect_end();
    reader::check(phase <= 2, "gradiveq_schedule state: bad phase");
    reader::check(lc >= floor_lc() && lc <= opt_.compressed_iterations,
                  "gradiveq_schedule state: L_c out of range");
    const auto ph = static_cast<gradiveq_phase>(phase);
    const std::uint64_t limit = ph == gradiveq_phase::warmup     ? opt_.warmup_iterations
                                : ph == gradiveq_phase::sampling ? opt_.sampling_iterations
                                                                 : lc;
    reader::check(position < limit, "gradiveq_schedule state: position past its phase");
    reader::check(stale < opt_.patience, "gradiveq_schedule state: stale run too long");
    reader::check((ph == gradiveq_phase::warmup) == (cycle == 0), "gradiveq_schedule state: cycle and phase disagree");
    reader::check(iteration >= position, "gradiveq_schedule state: iteration before its phase");
    phase_ = ph;
    iteration_ = iteration;
    cycle_ = cycle;
    position_ = static_cast<std::size_t>(position);
    current_lc_ = static_cast<std::size_t>(lc);
    stale_run_ = static_cast<std::size_t>(stale);
  }

 private:
  gradiveq_step step(bool majority) {
    gradiveq_step s;
    ++iteration_;
    ++position_;
    switch (phase_) {
      case gradiveq_phase::warmup:
        if (position_ >= opt_.warmup_iterations) enter(gradiveq_phase::sampling);
        break;
      case gradiveq_phase::sampling:
        if (position_ >= opt_.sampling_iterations) {
          enter(gradiveq_phase::compressed);
          s.fit_basis = true;
        }
        break;
      case gradiveq_phase::compressed: {
        stale_run_ = majority ? stale_run_ + 1 : 0;
        const bool early = stale_run_ >= opt_.patience && position_ < current_lc_;
        if (early || position_ >= current_lc_) {
          if (opt_.adaptive_cycles)
            current_lc_ = early ? std::max(floor_lc(), position_)
                                : std::min(opt_.compressed_iterations, 2 * current_lc_);
          s.ended_early = early;
          enter(gradiveq_phase::sampling);
        }
        break;
      }
    }
    s.next = phase_;
    return s;
  }

  std::size_t floor_lc() const noexcept { return std::min(opt_.min_compressed_iterations, opt_.compressed_iterations); }

  void enter(gradiveq_phase p) {
    if (p == gradiveq_phase::sampling) ++cycle_;
    phase_ = p;
    position_ = 0;
    stale_run_ = 0;
  }

  void write_params(wire::writer& w) const {
    w.put<std::uint64_t>(opt_.warmup_iterations);
    w.put<std::uint64_t>(opt_.sampling_iterations);
    w.put<std::uint64_t>(opt_.compressed_iterations);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(opt_.sampling));
    w.put<std::uint32_t>(opt_.qsgd_bits);
    w.put<double>(opt_.stale_threshold);
    w.put<std::uint64_t>(opt_.patience);
    w.put<std::uint8_t>(opt_.adaptive_cycles ? 1 : 0);
    w.put<std::uint64_t>(opt_.min_compressed_iterations);
  }

  gradiveq_schedule_options opt_;
  gradiveq_phase phase_ = gradiveq_phase::warmup;
  std::uint64_t iteration_ = 0;
  std::uint64_t cycle_ = 0;
  std::size_t position_ = 0;
  std::size_t current_lc_ = 0;
  std::size_t stale_run_ = 0;
};

}  // namespace gradcomp
