#pragma once
/// \file gradiveq/linear_compressor.hpp
/// GradiVeQ (seed 002): linear_compressor, the PCA linear compressor of one
/// layer (eqs. 3-5, the bases of gradiveq/basis.hpp, the eq. 7 local loss).
/// Part of <gradcomp/gradiveq.hpp>.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/gradiveq/basis.hpp>
#include <gradcomp/gradiveq/payload.hpp>
#include <gradcomp/gradiveq/saved_options.hpp>
#include <gradcomp/layout.hpp>
#include <gradcomp/system/gradiveq.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

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
      blocks[g] = detail::fit_gradiveq_basis(group_span_[g], samples_[g], pending_samples_,
                                             rows_per_sample(group_span_[g].second), held, k_, opt_);
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
  /// Samples recorded since construction (add_sample calls, fitted or not).
  std::uint64_t samples_seen() const noexcept { return samples_seen_; }
  /// A relative estimate of what fit() costs now: per group of R sample rows
  /// of K, the R x R Gram and the K x R x d back-projection (d: the cap, or
  /// R) in multiply-adds, plus 8 R^3 for the eigensolver (measured: R = 450,
  /// d = 256, Zen 4, 34 ms of 44 at K = 768, 189 ms in all at K = 12288; its
  /// tridiagonal steps run far below the products' rate). It balances fits
  /// between ranks that share them (exchange::bucket_layer's defer_fits),
  /// and is the same on every rank (the samples are).
  double fit_work() const noexcept {
    double w = 0.0;
    for (const auto& span : group_span_) {
      const double r = double(pending_samples_) * double(rows_per_sample(span.second));
      const double d = opt_.max_dimension == 0 ? r : std::min(r, double(opt_.max_dimension));
      w += r * double(k_) * (r + d) + 8.0 * r * r * r;
    }
    return w;
  }
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
                               out.coefficients.data() + (coef_prefix_[first] - coef_prefix_[run.first]),
                               b.narrow());
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

  /// Body bytes of the payload encode_segment(offset, a segment of n
  /// elements) produces, known without encoding (the compressed Rabenseifner
  /// posts exact receives with it: ring_segmentation::body_size).
  std::size_t segment_body_size(std::size_t offset, std::size_t n) const {
    require_fitted("gradiveq::segment_body_size");
    const auto run = locate(offset, n, "gradiveq::segment_body_size");
    const std::size_t coefficients = coef_prefix_[run.first + run.slices] - coef_prefix_[run.first];
    return payload_type::fixed_body_size + 4 * (coefficients + (n - run.slices * k_));
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
  [[nodiscard]] std::vector<std::byte> save_state() const {
    return wire::serialize_state(wire::codec_id::gradiveq, length_, [&](wire::writer& w) {
      detail::write_saved_options(w, [&](auto visit) { for_each_option(visit); });
      w.put<std::uint64_t>(fits_);
      w.put<std::uint64_t>(samples_seen_);
      w.put<std::uint64_t>(pending_samples_);
      w.put<std::uint8_t>(fitted_ ? 1 : 0);
      if (fitted_)
        for (const auto& b : blocks_) detail::write_gradiveq_basis(w, b);
      for (const auto& s : samples_) w.put_array<float>(s);
    });
  }

  /// Restores a save_state() of a codec configured identically; the restored
  /// codec continues bit for bit. A state saved with another value of an
  /// option (or another layer length) throws option_mismatch_error naming it
  /// (a state_error); bad bytes a wire::wire_error. Strong guarantee.
  void restore_state(std::span<const std::byte> bytes) {
    using wire::reader;
    wire::header h;
    reader r = wire::parse_state(bytes, wire::codec_id::gradiveq, &h);
    if (h.element_count != length_) throw option_mismatch_error("gradiveq::restore_state", "layer_length");
    detail::expect_saved_options(r, [&](auto visit) { for_each_option(visit); }, "gradiveq::restore_state");
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
        detail::read_gradiveq_basis(r, b, k_, opt_);
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
  using basis_block = detail::gradiveq_basis_block;
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
    if (opt_.basis_storage != basis_precision::float32 && opt_.basis_storage != basis_precision::float16 &&
        opt_.basis_storage != basis_precision::int8)
      throw invalid_argument_error("gradiveq: unknown basis_precision");
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

  // Everything derived from the blocks and N: the stored basis (binary16 or
  // int8 rounding), U^T mu, the eq. 3 offsets, coefficient offsets per slice, the
  // fingerprint.
  void refresh_derived() {
    for (auto& b : blocks_) {
      detail::store_gradiveq_basis(b, k_, opt_.basis_storage);
      detail::derive_gradiveq_offsets(b, k_, opt_.summands);
    }
    coef_prefix_.assign(slices_ + 1, 0);
    for (std::size_t m = 0; m < slices_; ++m) coef_prefix_[m + 1] = coef_prefix_[m] + blocks_[slice_group_[m]].dimension;
    fingerprint_ = detail::gradiveq_fingerprint(length_, k_, opt_.reuse_factor, opt_.summands, blocks_);
  }

  // The options a saved state must share, in the state's order (visit(name, wire scalar)).
  template <class Visit>
  void for_each_option(Visit&& visit) const {
    visit("layer_length", std::uint64_t{length_});
    visit("slice_size", std::uint64_t{k_});
    visit("lambda", opt_.lambda);
    visit("reuse_factor", std::uint64_t{opt_.reuse_factor});
    visit("summands", std::uint64_t{opt_.summands});
    visit("min_samples", std::uint64_t{opt_.min_samples});
    visit("max_dimension", std::uint64_t{opt_.max_dimension});
    visit("allow_tail", static_cast<std::uint8_t>(opt_.allow_tail ? 1 : 0));
    visit("source", static_cast<std::uint8_t>(opt_.source));
    visit("pool_slices", std::uint64_t{opt_.pool_slices});
    visit("holdout_fraction", opt_.holdout_fraction);
    visit("solver", static_cast<std::uint8_t>(opt_.solver));
    visit("basis_storage", static_cast<std::uint8_t>(opt_.basis_storage));
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
                             out.data() + (first - run.first) * k_, b.narrow());
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

static_assert(LinearCodec<linear_compressor<>>, "linear_compressor is a LinearCodec (eq. 4)");
static_assert(DecodeAddCodec<linear_compressor<>>, "linear_compressor decodes into a running sum");
static_assert(StatefulCodec<linear_compressor<>>, "linear_compressor saves and restores its bases");

}  // namespace gradcomp
