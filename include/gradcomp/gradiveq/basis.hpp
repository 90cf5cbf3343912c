#pragma once
/// \file gradiveq/basis.hpp
/// GradiVeQ (seed 002): the options of linear_compressor and its bases, one
/// per group of s slices: fitting one (PCA and eq. 6), the values derived
/// from it (eq. 3's U_d^T mu / N), the basis fingerprint, and a basis in a
/// saved state. Part of <gradcomp/gradiveq.hpp>.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/gradiveq/pca.hpp>
#include <gradcomp/system/generic/gradiveq/portable.hpp>
#include <gradcomp/system/generic/half.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

/// Which samples the basis of a slice group is fitted on.
enum class basis_source : std::uint8_t {
  first_slice = 0,  ///< paper (Sec. 3): the first slice of each group of s slices
  pooled = 1,       ///< beyond the paper: up to `pool_slices` slices spread over the group, one sample each
};

/// How a fitted basis is stored for eqs. 3 and 5.
enum class basis_precision : std::uint8_t {
  float32 = 0,  ///< the fitted float values (the paper)
  /// Beyond the paper: each value rounded to IEEE binary16 (to nearest, ties
  /// to even) once, after the fit. Every rank rounds the same basis the same
  /// way, so the codec stays linear and the fingerprint covers the rounded
  /// values; AVX-512 builds then read 2 bytes per basis value in eqs. 3 and 5
  /// instead of 4 (the products are memory-bound: the basis is K x d, the
  /// input and output K per slice) and give the bits of the float kernels on
  /// the rounded values, which every other backend reads. The rounding moves
  /// each value by at most 2^-11 of itself (entries below 2^-14, binary16's
  /// subnormals, by at most 2^-25), so U_d's columns stay orthonormal to
  /// about 1e-3 and eq. 5 reconstructs the coded part within about that
  /// fraction. The fit's large products run in float
  /// (pca_precision::single_precision, about 2.5x faster): their errors,
  /// about 1e-6, are far below that rounding.
  float16 = 1,
  /// Beyond the paper: each column u_j rounded once, after the fit, to int8
  /// values times one power of two 2^e_j, the smallest with
  /// max_i |u_j[i]| <= 127 * 2^e_j (so the largest value keeps 7 bits and
  /// every value moves by at most 2^(e_j - 1), under 1/128 of the column's
  /// largest). Every product of an int8 and a power of two is a float, so,
  /// as with float16, the codec stays linear, the fingerprint covers the
  /// rounded values, and AVX2 and AVX-512 builds read 1 byte per basis value
  /// (a quarter of float32's traffic; one power of two per column of K
  /// values) with the float kernels' bits; every other backend reads the
  /// float values. The rounding is far coarser than binary16's: for a unit
  /// column of K values it adds noise of about 0.3 / sqrt(K) of the largest
  /// value per entry (about 1% of the column's norm at K = 12,288), so U_d's
  /// columns stay orthonormal to about 1e-2 and eq. 5 reconstructs the
  /// coded part within about that fraction, well inside what eq. 6's lambda
  /// leaves out. Fitted in single precision, as float16.
  int8 = 2,
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
  basis_precision basis_storage = basis_precision::float32;  ///< float16: half the basis bytes (see basis_precision)
};

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The basis of one group of slices [first, first + count).
struct gradiveq_basis_block {
  std::size_t first = 0, count = 0;  // slices [first, first + count)
  std::size_t dimension = 0;         // d
  std::vector<float> basis;          // U_d, K x d column-major
  std::vector<std::uint16_t> basis_f16;  // U_d as binary16 (basis_precision::float16; derived), else empty
  std::vector<std::int8_t> basis_i8;     // U_d as int8 (basis_precision::int8; derived), else empty
  std::vector<float> basis_i8_scale;     // column j's power of two (int8; derived), d values
  std::vector<float> mean;           // mu, K
  std::vector<double> spectrum;      // descending covariance eigenvalues
  double heldout_loss = std::numeric_limits<double>::quiet_NaN();  // hold-out option only
  std::vector<float> mu_u;           // U_d^T mu, d (derived)
  std::vector<float> offset;         // U_d^T mu / N, d (derived)

  /// The narrow copy the kernels read (gradiveq_compress_slices), or none.
  execution::gradiveq_narrow_basis narrow() const noexcept {
    if (!basis_i8.empty()) return {basis_i8.data(), basis_i8_scale.data()};
    return {basis_f16.empty() ? nullptr : basis_f16.data()};
  }
};

/// Fits the basis of the group of slices `span` (first slice, slices) from
/// `rows`: `samples` aggregated samples of `rows_per` rows of K floats each,
/// the last `held` samples held out to choose d (options.holdout_fraction),
/// else d by eq. 6 on the spectrum; capped by options.max_dimension.
/// A binary16 or int8 basis is fitted with single-precision products (their
/// rounding, 2^-11 of each value or coarser, is far beyond their 1e-6); a
/// float32 one in double.
inline pca_precision fit_precision(const gradiveq_options& opt) noexcept {
  return opt.basis_storage == basis_precision::float32 ? pca_precision::double_precision
                                                       : pca_precision::single_precision;
}

inline gradiveq_basis_block fit_gradiveq_basis(std::pair<std::size_t, std::size_t> span, const std::vector<float>& rows,
                                               std::size_t samples, std::size_t rows_per, std::size_t held,
                                               std::size_t k, const gradiveq_options& opt) {
  gradiveq_basis_block b;
  b.first = span.first;
  b.count = span.second;
  const std::size_t R = samples * rows_per;
  std::size_t d = 0;
  bool use_all = false;
  if (held > 0) {
    // d from held-out samples (the latest ones, the closest to the
    // compressed iterations that follow): fit on the others and take the
    // fewest leading directions keeping 1 - lambda of the held-out energy.
    // When no d does, the samples cannot meet lambda: use every direction
    // the full fit supports (eq. 6 on the fitting data would stop short).
    const std::size_t train_rows = (samples - held) * rows_per;
    const pca_decomposition train(rows.data(), train_rows, k, opt.solver, 0, fit_precision(opt));
    using row_major_f = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::MatrixXd hc = Eigen::Map<const row_major_f>(rows.data() + train_rows * k,
                                                       static_cast<Eigen::Index>(R - train_rows),
                                                       static_cast<Eigen::Index>(k))
                             .cast<double>();
    hc.rowwise() -= train.mean().transpose();
    const double total = hc.squaredNorm();
    const Eigen::MatrixXd proj = hc * train.vectors(train.available());  // held rows x available
    const Eigen::VectorXd per_dir = proj.colwise().squaredNorm().transpose();
    double captured = 0.0;
    use_all = true;
    for (Eigen::Index j = 0; j < per_dir.size() && use_all; ++j) {
      captured += per_dir(j);
      if (captured >= (1.0 - opt.lambda) * total) {
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
  // With a cap and no hold-out, d <= cap: only that many vectors are formed.
  const pca_decomposition pca(rows.data(), R, k, opt.solver, held == 0 ? opt.max_dimension : 0,
                              fit_precision(opt));
  const std::size_t available = pca.available();
  if (held == 0) d = select_dimension(pca.spectrum(), opt.lambda);
  if (use_all) d = available;
  d = std::min(d, available);
  if (opt.max_dimension) d = std::min(d, opt.max_dimension);
  b.spectrum = pca.spectrum();
  b.mean.resize(k);
  for (std::size_t i = 0; i < k; ++i) b.mean[i] = static_cast<float>(pca.mean()(static_cast<Eigen::Index>(i)));
  if (d == 0) {
    // All samples identical (zero variance): keep one direction, e_0, so
    // the code stays well formed; decode then returns mu plus that coordinate.
    d = 1;
    b.basis.assign(k, 0.0f);
    b.basis[0] = 1.0f;
  } else {
    const Eigen::MatrixXd v = pca.vectors(d);
    b.basis.resize(k * d);
    Eigen::Map<Eigen::MatrixXf>(b.basis.data(), static_cast<Eigen::Index>(k), static_cast<Eigen::Index>(d)) =
        v.cast<float>();
  }
  b.dimension = d;
  return b;
}

/// The power of two 2^e of a column whose largest |value| is m > 0: the
/// smallest with m <= 127 * 2^e (basis_precision::int8). With m = f 2^E,
/// f in [0.5, 1): 127 * 2^(E-8) < 0.5 * 2^E <= m, so e is E - 7 or E - 6;
/// the comparison is exact (127 * 2^(E-7) is a float). Never below 2^-126,
/// the smallest normal float: a column that small (not a fitted one, whose
/// columns are unit vectors, but a restored state may hold one) keeps that
/// scale, so every q 2^e stays exact and the division never meets a zero.
inline float int8_column_scale(float m) noexcept {
  int e = 0;
  (void)std::frexp(m, &e);
  const int chosen = m <= std::ldexp(127.0f, e - 7) ? e - 7 : e - 6;
  return std::ldexp(1.0f, std::max(chosen, std::numeric_limits<float>::min_exponent - 1));
}

/// Rounds the K x d basis u (column-major) to int8 values times one power of
/// two per column, in place, keeping the int8 values and the scales beside
/// it. Idempotent: the largest rounded value is q 2^e with q in [64, 127],
/// whose scale is 2^e again, and every other value is a multiple of 2^e.
inline void round_basis_to_int8(std::vector<float>& u, std::size_t k, std::vector<std::int8_t>& q,
                                std::vector<float>& scales) {
  const std::size_t d = k ? u.size() / k : 0;
  q.resize(u.size());
  scales.resize(d);
  for (std::size_t j = 0; j < d; ++j) {
    float* col = u.data() + j * k;
    float m = 0.0f;
    for (std::size_t i = 0; i < k; ++i) m = std::max(m, std::abs(col[i]));
    // A zero column (never fitted: columns are unit vectors) keeps scale 1.
    const float scale = m > 0.0f ? int8_column_scale(m) : 1.0f;
    scales[j] = scale;
    for (std::size_t i = 0; i < k; ++i) {
      const float r = std::nearbyint(col[i] / scale);  // a power of two: exact division; ties to even
      q[j * k + i] = static_cast<std::int8_t>(r);      // |r| <= 127 by the choice of scale
      col[i] = r * scale;
    }
  }
}

/// basis_precision::float16: rounds U_d to binary16 values in place and keeps
/// their bits beside it; int8: rounds it to int8 values times a power of two
/// per column and keeps those; float32: drops any copy. Idempotent (a
/// rounded value rounds to itself), so a restored state derives the same basis.
inline void store_gradiveq_basis(gradiveq_basis_block& b, std::size_t k, basis_precision precision) {
  // The copies another storage would keep go (a refit or a restore may follow another storage's).
  auto release = [](auto& copy) { std::remove_reference_t<decltype(copy)>().swap(copy); };
  if (precision != basis_precision::int8) {
    release(b.basis_i8);
    release(b.basis_i8_scale);
  }
  if (precision != basis_precision::float16) release(b.basis_f16);
  if (precision == basis_precision::int8) round_basis_to_int8(b.basis, k, b.basis_i8, b.basis_i8_scale);
  if (precision == basis_precision::float16) {
    // |u| <= 1 for an orthonormal basis: no saturation happens. The bulk
    // (branch-free, vectorised) forms of the scalar conversions, same bits.
    b.basis_f16.resize(b.basis.size());
    execution::floats_to_half_portable(b.basis, b.basis_f16);
    execution::half_to_floats_portable(b.basis_f16, b.basis);
  }
}

/// The values derived from a basis and N: U_d^T mu and eq. 3's offsets U_d^T mu / N.
inline void derive_gradiveq_offsets(gradiveq_basis_block& b, std::size_t k, std::size_t summands) {
  b.mu_u.assign(b.dimension, 0.0f);
  b.offset.assign(b.dimension, 0.0f);
  for (std::size_t j = 0; j < b.dimension; ++j) {
    double acc = 0.0;
    for (std::size_t i = 0; i < k; ++i) acc += double(b.mean[i]) * double(b.basis[j * k + i]);
    b.mu_u[j] = static_cast<float>(acc);
    b.offset[j] = static_cast<float>(acc / double(summands));
  }
}

/// The basis fingerprint: CRC-32C of (M, K, s, N, and each group's d, mu and
/// U_d bytes), never 0 (0 means "no basis").
inline std::uint32_t gradiveq_fingerprint(std::size_t length, std::size_t k, std::size_t reuse_factor,
                                          std::size_t summands, const std::vector<gradiveq_basis_block>& blocks) {
  std::vector<std::byte> bytes;
  wire::writer w(bytes);
  w.put<std::uint64_t>(length);
  w.put<std::uint64_t>(k);
  w.put<std::uint64_t>(reuse_factor);
  w.put<std::uint64_t>(summands);
  w.put<std::uint64_t>(blocks.size());
  std::uint32_t crc = wire::crc32c(0, bytes);
  for (const auto& b : blocks) {
    bytes.clear();
    w.put<std::uint64_t>(b.dimension);
    w.put_array<float>(b.mean);
    w.put_array<float>(b.basis);
    crc = wire::crc32c(crc, bytes);
  }
  return crc == 0 ? 1u : crc;
}

/// Writes a basis into a saved state.
inline void write_gradiveq_basis(wire::writer& w, const gradiveq_basis_block& b) {
  w.put<std::uint64_t>(b.dimension);
  w.put<std::uint64_t>(b.spectrum.size());
  w.put<double>(b.heldout_loss);
  w.put_array<double>(b.spectrum);
  w.put_array<float>(b.mean);
  w.put_array<float>(b.basis);
}

/// Reads a basis write_gradiveq_basis wrote into `b` (whose first and count
/// are set), checking it against K and the options (wire::wire_error otherwise).
inline void read_gradiveq_basis(wire::reader& r, gradiveq_basis_block& b, std::size_t k, const gradiveq_options& opt) {
  using wire::reader;
  const std::uint64_t d = r.get<std::uint64_t>();
  const std::uint64_t ns = r.get<std::uint64_t>();
  reader::check(d >= 1 && d <= k, "gradiveq state: dimension outside [1, K]");
  reader::check(ns <= k, "gradiveq state: spectrum longer than K");
  reader::check(opt.max_dimension == 0 || d <= opt.max_dimension, "gradiveq state: dimension above the cap");
  b.dimension = static_cast<std::size_t>(d);
  b.heldout_loss = r.get<double>();
  reader::check(opt.holdout_fraction > 0.0 ? (b.heldout_loss >= 0.0 && b.heldout_loss <= 1.0)
                                           : std::isnan(b.heldout_loss),
                "gradiveq state: bad held-out loss");
  b.spectrum = r.get_vector<double>(ns);
  b.mean = r.get_vector<float>(k);
  if (d > r.remaining() / 4 / k) reader::fail(wire::wire_errc::truncated, "gradiveq state: basis");
  b.basis = r.get_vector<float>(d * k);
  for (double s : b.spectrum) reader::check(std::isfinite(s) && s >= 0.0, "gradiveq state: bad eigenvalue");
  reader::check(std::is_sorted(b.spectrum.rbegin(), b.spectrum.rend()), "gradiveq state: spectrum not sorted");
  for (float x : b.mean) reader::check(std::isfinite(x), "gradiveq state: non-finite mean");
  for (float x : b.basis) reader::check(std::isfinite(x), "gradiveq state: non-finite basis");
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

}  // namespace gradcomp
