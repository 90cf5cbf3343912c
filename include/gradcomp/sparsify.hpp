#pragma once
/// \file sparsify.hpp
/// sparsifier_with_memory: per-layer top-R% sparsification with a residual
/// (DGS Algorithm 1, lines 6-12; Gradient Dropping, Aji & Heafield), with an
/// optional DGC mode (momentum correction and momentum-factor masking, Lin et
/// al.), and sparse_coo_payload, the COO payload it shares with sa_momentum.
///
/// One instance per layer. Each encode:
///   r <- r + eta * g                                  (Alg. 1 line 6)
///   mask <- the k = max(1, ceil(R% * n)) largest |r|   (lines 9-10, ties: lower index)
///   send r where mask, r <- r where not mask          (lines 11-12)
/// so the sum of everything decoded plus the final residual equals eta times
/// the sum of the gradients (up to float rounding of the additions).
///
/// docs/codecs.md describes the payload format, the index encodings, the
/// threshold modes and their tie rules.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/sparse_codec.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/wire.hpp>

#include <gradcomp/system/generic/sparsify.hpp>
#include <gradcomp/system/generic/topk.hpp>
#if defined(GRADCOMP_HAS_XSIMD)
#include <gradcomp/system/simd/sparsify.hpp>
#include <gradcomp/system/simd/topk.hpp>
#endif
#if defined(GRADCOMP_HAS_THRUST)
#include <gradcomp/system/thrust/sparsify.hpp>
#include <gradcomp/system/thrust/topk.hpp>
#endif

namespace gradcomp {

/// How the top-R% threshold is found (system/generic/topk.hpp, axpby_topk).
enum class threshold_mode : std::uint8_t {
  /// Exactly k entries: the k largest magnitudes, lower index first among
  /// equal magnitudes. A stratified sample brackets the threshold so that one
  /// fused pass collects a small candidate set holding the top k, which is
  /// then selected exactly; when the bracket holds fewer than k (rare) the
  /// radix select runs instead. The result never depends on the seed.
  exact = 0,
  /// DGC (Lin et al.): threshold from a stratified random sample, one fused
  /// pass, exact re-selection when more than k qualified; when fewer
  /// qualified they are sent as they are, so at most k entries (the exact
  /// top of their own number); last_density() reports what was achieved.
  sampled = 1,
};

/// Index encodings of sparse_coo_payload (the body's first byte).
enum class index_encoding : std::uint8_t {
  delta_varint = 0,  ///< first index, then differences to the previous index, each a LEB128 varint
  bitmap = 1,        ///< ceil(n/8) bytes, bit i (LSB first within a byte) set when index i is present
};

/// The largest layer the sparse codecs address (indices are 32-bit).
inline constexpr std::uint64_t sparse_max_elements = std::numeric_limits<std::uint32_t>::max();

/// k = max(1, ceil(R/100 * n)), at most n (0 when n == 0): the entries sent
/// per step for R percent (DGS Table 1). R*n/100 is computed in double; a
/// value within 1e-9 (relative) of an integer counts as that integer, so
/// R = 0.1 on n = 1e7 gives 10000, not 10001.
inline std::size_t sparse_selection_count(std::size_t n, double ratio_percent) noexcept {
  if (n == 0) return 0;
  const double q = ratio_percent * double(n) / 100.0;
  const double nearest = std::round(q);
  const double kk = std::abs(q - nearest) <= 1e-9 * std::max(1.0, q) ? nearest : std::ceil(q);
  const std::size_t k = kk < 1.0 ? 1 : (kk >= double(n) ? n : static_cast<std::size_t>(kk));
  return std::min(k, n);
}

/// COO payload of the sparse codecs: `length` (decoded size), strictly
/// increasing `indices` < length and their `values`. The index block is
/// written as delta+varint or as a bitmap, whichever is smaller (ties:
/// delta+varint), unless `forced_encoding` says which. Body layout:
///     u8      index encoding (0 delta+varint, 1 bitmap)
///     varint  nnz, the number of entries (<= length)
///     ...     index block: nnz varints, or ceil(length/8) bitmap bytes
///     f32[nnz] values, little-endian
/// Parsing rejects: unknown encoding, nnz > length, length > 2^32-1, a zero
/// difference (indices not strictly increasing), an index >= length, bitmap
/// bits beyond length, a bitmap whose popcount is not nnz, a truncated varint
/// or block, and non-finite values.
struct sparse_coo_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::sparse_coo;

  std::uint64_t length = 0;                       ///< decoded element count
  std::vector<std::uint32_t> indices;             ///< strictly increasing, < length
  std::vector<float> values;                      ///< one per index
  std::optional<index_encoding> forced_encoding;  ///< write this encoding instead of the smaller one

  std::uint64_t element_count() const noexcept { return length; }
  /// Number of entries sent.
  std::size_t nnz() const noexcept { return indices.size(); }

  /// Bytes of the index block as delta+varint.
  std::size_t delta_varint_index_bytes() const noexcept {
    std::size_t bytes = 0;
    std::uint32_t prev = 0;
    for (std::size_t j = 0; j < indices.size(); ++j) {
      bytes += wire::varint_size(j == 0 ? indices[0] : indices[j] - prev);
      prev = indices[j];
    }
    return bytes;
  }
  /// Bytes of the index block as a bitmap.
  std::size_t bitmap_index_bytes() const noexcept { return static_cast<std::size_t>((length + 7) / 8); }
  /// The encoding write_body uses.
  index_encoding encoding() const noexcept {
    if (forced_encoding) return *forced_encoding;
    return bitmap_index_bytes() < delta_varint_index_bytes() ? index_encoding::bitmap : index_encoding::delta_varint;
  }

  /// Throws invalid_argument_error unless the payload is well formed
  /// (sizes agree, indices strictly increasing and < length <= 2^32-1).
  void validate() const {
    if (indices.size() != values.size())
      throw invalid_argument_error("sparse_coo_payload: " + std::to_string(indices.size()) + " indices but " +
                                   std::to_string(values.size()) + " values");
    if (length > sparse_max_elements) throw invalid_argument_error("sparse_coo_payload: length above 2^32-1");
    for (std::size_t j = 0; j < indices.size(); ++j) {
      if (indices[j] >= length)
        throw invalid_argument_error("sparse_coo_payload: index " + std::to_string(indices[j]) + " >= length " +
                                     std::to_string(length));
      if (j > 0 && indices[j] <= indices[j - 1])
        throw invalid_argument_error("sparse_coo_payload: indices not strictly increasing at entry " +
                                     std::to_string(j));
    }
  }

  std::size_t body_size() const noexcept {
    const std::size_t index_bytes =
        encoding() == index_encoding::bitmap ? bitmap_index_bytes() : delta_varint_index_bytes();
    return 1 + wire::varint_size(indices.size()) + index_bytes + values.size() * sizeof(float);
  }

  void write_body(wire::writer& w) const {
    validate();
    const index_encoding enc = encoding();
    w.put<std::uint8_t>(static_cast<std::uint8_t>(enc));
    w.put_varint(indices.size());
    if (enc == index_encoding::bitmap) {
      std::vector<std::byte> bits(bitmap_index_bytes(), std::byte{0});
      for (std::uint32_t i : indices) bits[i >> 3] |= std::byte(1u << (i & 7u));
      w.put_bytes(bits);
    } else {
      std::uint32_t prev = 0;
      for (std::size_t j = 0; j < indices.size(); ++j) {
        w.put_varint(j == 0 ? indices[0] : indices[j] - prev);
        prev = indices[j];
      }
    }
    w.put_array<float>(values);
  }

  static sparse_coo_payload read_body(wire::reader& r, const wire::header& h) {
    using wire::reader;
    using wire::wire_errc;
    sparse_coo_payload p;
    p.length = h.element_count;
    if (p.length > sparse_max_elements) reader::fail(wire_errc::malformed_body, "sparse_coo: length above 2^32-1");
    const auto enc = r.get<std::uint8_t>();
    if (enc > 1) reader::fail(wire_errc::malformed_body, "sparse_coo: unknown index encoding " + std::to_string(enc));
    const std::uint64_t nnz = r.get_varint();
    if (nnz > p.length)
      reader::fail(wire_errc::malformed_body, "sparse_coo: " + std::to_string(nnz) + " entries for " +
                                                  std::to_string(p.length) + " elements");
    if (enc == static_cast<std::uint8_t>(index_encoding::delta_varint)) {
      // Every entry needs at least one index byte and four value bytes:
      // check before allocating, so a lying count cannot allocate.
      if (nnz > r.remaining() / 5)
        reader::fail(wire_errc::truncated, "sparse_coo: " + std::to_string(nnz) + " entries do not fit the body");
      p.indices.resize(static_cast<std::size_t>(nnz));
      std::uint64_t prev = 0;
      for (std::size_t j = 0; j < p.indices.size(); ++j) {
        const std::uint64_t d = r.get_varint();
        if (j > 0 && d == 0) reader::fail(wire_errc::malformed_body, "sparse_coo: indices not strictly increasing");
        const std::uint64_t base = j == 0 ? 0 : prev;
        if (d >= p.length - base) reader::fail(wire_errc::malformed_body, "sparse_coo: index out of range");
        prev = base + d;
        p.indices[j] = static_cast<std::uint32_t>(prev);
      }
    } else {
      const std::uint64_t bitmap_bytes = (p.length + 7) / 8;
      const auto bits = r.get_bytes(bitmap_bytes);
      if (nnz > r.remaining() / 4)
        reader::fail(wire_errc::truncated, "sparse_coo: " + std::to_string(nnz) + " values do not fit the body");
      if (p.length % 8 != 0 && (std::to_integer<unsigned>(bits.back()) >> (p.length % 8)) != 0)
        reader::fail(wire_errc::malformed_body, "sparse_coo: bitmap bit beyond the element count");
      p.indices.resize(static_cast<std::size_t>(nnz));
      std::size_t m = 0;
      for (std::size_t byte = 0; byte < bits.size(); ++byte) {
        unsigned b = std::to_integer<unsigned>(bits[byte]);
        if (b == 0) continue;
        if (static_cast<std::size_t>(std::popcount(b)) > p.indices.size() - m)
          reader::fail(wire_errc::malformed_body, "sparse_coo: bitmap holds more entries than its count");
        for (; b != 0; b &= b - 1) p.indices[m++] = static_cast<std::uint32_t>(byte * 8 + std::countr_zero(b));
      }
      if (m != p.indices.size())
        reader::fail(wire_errc::malformed_body, "sparse_coo: bitmap holds fewer entries than its count");
    }
    p.values = r.get_vector<float>(nnz);
    for (float v : p.values)
      if (!std::isfinite(v)) reader::fail(wire_errc::malformed_body, "sparse_coo: non-finite value");
    return p;
  }
};

namespace detail {

/// out = decode(p) (Add: out += decode(p)), after checking sizes and the payload.
template <bool Add>
void sparse_scatter(const sparse_coo_payload& p, std::span<float> out, const char* who) {
  if (out.size() != p.length) throw size_mismatch_error(who, static_cast<std::size_t>(p.length), out.size());
  p.validate();
  if constexpr (!Add) std::fill(out.begin(), out.end(), 0.0f);
  float* o = out.data();
  for (std::size_t j = 0; j < p.indices.size(); ++j) {
    if constexpr (Add)
      o[p.indices[j]] += p.values[j];
    else
      o[p.indices[j]] = p.values[j];
  }
}

inline void check_sparse_length(std::size_t n, const char* who) {
  if (n > sparse_max_elements)
    throw invalid_argument_error(std::string(who) + ": layers are limited to 2^32-1 elements (32-bit indices)");
}

}  // namespace detail

/// Options of sparsifier_with_memory.
struct sparsifier_options {
  double ratio_percent = 1.0;                   ///< R: percent of the layer sent per step, in (0, 100]
  threshold_mode mode = threshold_mode::exact;  ///< exact radix select or DGC's sampled threshold
  std::uint64_t seed = 0;                       ///< sampled mode: seed of the sample (stream = step)
  float scale = 1.0f;                           ///< eta of Alg. 1 line 6 (r += eta * g); finite, > 0
  bool dgc_momentum = false;                    ///< DGC momentum correction and momentum-factor masking
  float momentum = 0.9f;                        ///< DGC momentum m in (0, 1); used only with dgc_momentum
};

/// Top-R% sparsifier with residual memory, one instance per layer
/// (DGS Algorithm 1; Gradient Dropping). encode: r += eta*g, send the k
/// largest |r| as COO, keep the rest in r.
///
/// DGC mode (`dgc_momentum`, Lin et al., Deep Gradient Compression): the
/// velocity u and the accumulation v replace r:
///   u <- m*u + eta*g;  v <- v + u;  send the top-k |v|;  zero u and v where sent.
/// (momentum correction: the accumulated velocity is sent; momentum-factor
/// masking: the sent coordinates' velocity is cleared.)
///
/// Non-finite policy: a gradient holding NaN/Inf is rejected with
/// non_finite_error (naming the first bad index) before any state changes.
template <ExecutionPolicy Policy = execution::seq>
class sparsifier_with_memory {
 public:
  using payload_type = sparse_coo_payload;

  /// A sparsifier for a layer of `element_count` floats.
  explicit sparsifier_with_memory(std::size_t element_count, sparsifier_options options = {})
      : n_(element_count), options_(options) {
    validate_options(options_, "sparsifier_with_memory");
    detail::check_sparse_length(n_, "sparsifier_with_memory");
    k_ = sparse_selection_count(n_, options_.ratio_percent);
    residual_.assign(n_, 0.0f);
    if (options_.dgc_momentum) velocity_.assign(n_, 0.0f);
  }

  /// One step of DGS Alg. 1 lines 6-12 on this layer: folds `gradient` into
  /// the residual and writes the selected entries into `out`.
  void encode(std::span<const float> gradient, payload_type& out) {
    if (gradient.size() != n_) throw size_mismatch_error("sparsifier_with_memory::encode", n_, gradient.size());
    if (const auto bad = find_non_finite(Policy{}, gradient); bad != gradient.size())
      throw non_finite_error("sparsifier_with_memory::encode", bad);
    const bool sampled = options_.mode == threshold_mode::sampled;
    std::span<float> r(residual_);
    if (options_.dgc_momentum) {
      std::span<float> u(velocity_);
      axpby_update(Policy{}, u, gradient, options_.momentum, options_.scale);
      last_selected_ = axpby_topk(Policy{}, r, std::span<const float>(u), 1.0f, 1.0f, k_, 1.0f, sampled,
                                  options_.seed, steps_, workspace_, out.indices);
    } else {
      last_selected_ = axpby_topk(Policy{}, r, gradient, 1.0f, options_.scale, k_, 1.0f, sampled, options_.seed,
                                  steps_, workspace_, out.indices);
    }
    out.length = n_;
    out.values.resize(out.indices.size());
    for (std::size_t j = 0; j < out.indices.size(); ++j) {
      const std::uint32_t i = out.indices[j];
      out.values[j] = residual_[i];
      residual_[i] = 0.0f;
    }
    if (options_.dgc_momentum)  // momentum-factor masking
      for (std::uint32_t i : out.indices) velocity_[i] = 0.0f;
    ++steps_;
  }

  /// out = the dense gradient the payload stands for (zeros where not sent).
  void decode(const payload_type& p, std::span<float> out) const {
    detail::sparse_scatter<false>(p, out, "sparsifier_with_memory::decode");
  }
  /// out += decode(p): decode-and-sum aggregation without a buffer.
  void decode_add(const payload_type& p, std::span<float> out) const {
    detail::sparse_scatter<true>(p, out, "sparsifier_with_memory::decode_add");
  }
  /// Exact bytes on the wire: header, flag byte, count, index block, values.
  std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }

  /// Saves residual (DGC: accumulation v and velocity u), step count and options.
  std::vector<std::byte> save_state() const {
    return detail::save_sparse_state(n_, detail::sparse_state_kind::sparsifier, [&](wire::writer& w) {
      w.put<std::uint8_t>(static_cast<std::uint8_t>(options_.mode));
      w.put<std::uint8_t>(options_.dgc_momentum ? 1 : 0);
      w.put<std::uint8_t>(0);
      w.put<double>(options_.ratio_percent);
      w.put<float>(options_.scale);
      w.put<float>(options_.momentum);
      w.put<std::uint64_t>(options_.seed);
      w.put<std::uint64_t>(steps_);
      w.put_array<float>(residual_);
      if (options_.dgc_momentum) w.put_array<float>(velocity_);
    });
  }

  /// Restores a state from save_state(): the codec then continues bit for bit
  /// as the saved one would. The state must come from a codec configured
  /// the same way (R, mode, seed, DGC flag and momentum), else state_error;
  /// eta (set_scale, a schedule value) is taken from the state. Throws
  /// wire_error for malformed bytes, size_mismatch_error for another layer
  /// size, state_error for another codec kind. On error nothing changes.
  void restore_state(std::span<const std::byte> bytes) {
    wire::reader r = detail::open_sparse_state(bytes, n_, detail::sparse_state_kind::sparsifier,
                                               "sparsifier_with_memory::restore_state");
    sparsifier_options o;
    const auto mode = r.get<std::uint8_t>();
    const auto dgc = r.get<std::uint8_t>();
    const auto reserved = r.get<std::uint8_t>();
    wire::reader::check(mode <= 1 && dgc <= 1 && reserved == 0, "sparsifier state: bad mode or flags");
    o.mode = static_cast<threshold_mode>(mode);
    o.dgc_momentum = dgc != 0;
    o.ratio_percent = r.get<double>();
    o.scale = r.get<float>();
    o.momentum = r.get<float>();
    o.seed = r.get<std::uint64_t>();
    const auto steps = r.get<std::uint64_t>();
    detail::validate_saved_options([&] { validate_options(o, "sparsifier state"); });
    auto residual = detail::read_finite_floats(r, n_, "residual");
    std::vector<float> velocity;
    if (o.dgc_momentum) velocity = detail::read_finite_floats(r, n_, "velocity");
    r.expect_end();
    if (o.ratio_percent != options_.ratio_percent || o.mode != options_.mode || o.seed != options_.seed ||
        o.dgc_momentum != options_.dgc_momentum || (o.dgc_momentum && o.momentum != options_.momentum))
      throw state_error("sparsifier_with_memory::restore_state: the state was saved by a codec with other options");
    options_.scale = o.scale;
    steps_ = steps;
    residual_ = std::move(residual);
    velocity_ = std::move(velocity);
    last_selected_ = 0;
  }

  /// Layer size n.
  std::size_t element_count() const noexcept { return n_; }
  /// k, the entries selected per step in exact mode (upper bound in sampled mode).
  std::size_t selection_size() const noexcept { return k_; }
  /// Entries sent by the last encode (sampled mode may send fewer than k).
  std::size_t last_selected() const noexcept { return last_selected_; }
  /// Achieved density of the last encode, last_selected() / n.
  double last_density() const noexcept { return n_ == 0 ? 0.0 : double(last_selected_) / double(n_); }
  /// The residual r (DGC mode: the accumulation v).
  std::span<const float> residual() const noexcept { return residual_; }
  /// DGC mode: the velocity u (empty otherwise).
  std::span<const float> velocity() const noexcept { return velocity_; }
  /// Encodes done so far (the sampled mode's stream number).
  std::uint64_t steps() const noexcept { return steps_; }
  const sparsifier_options& options() const noexcept { return options_; }
  /// Changes eta (e.g. a learning-rate schedule); the residual is kept.
  void set_scale(float eta) {
    detail::check_sparse_positive(eta, "scale (eta)", "sparsifier_with_memory::set_scale");
    options_.scale = eta;
  }

 private:
  static void validate_options(const sparsifier_options& o, const char* who) {
    detail::check_sparse_ratio(o.ratio_percent, who);
    if (o.mode != threshold_mode::exact && o.mode != threshold_mode::sampled)
      throw invalid_argument_error(std::string(who) + ": unknown threshold mode");
    detail::check_sparse_positive(o.scale, "scale (eta)", who);
    if (o.dgc_momentum) detail::check_sparse_momentum(o.momentum, who);
  }

  std::size_t n_;
  sparsifier_options options_;
  std::size_t k_ = 0;
  std::vector<float> residual_;
  std::vector<float> velocity_;
  std::uint64_t steps_ = 0;
  std::size_t last_selected_ = 0;
  execution::topk_workspace workspace_;
};

}  // namespace gradcomp
