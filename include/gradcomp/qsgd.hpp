#pragma once
/// \file qsgd.hpp
/// qsgd: the QSGD stochastic quantizer (Alistarh, Grubic, Li, Tomioka,
/// Vojnovic, "QSGD: Communication-efficient SGD via gradient quantization and
/// encoding", NIPS 2017; reference [24] of seed 002, which uses 4-bit QSGD on
/// its L_t iterations). docs/codecs.md describes the format and properties.
///
/// Per bucket v of `bucket_size` consecutive elements and s levels
/// (QSGD eq. 3.1, Q_s(v_i) = ||v||_2 * sgn(v_i) * xi_i(v, s)):
///     a_i = |v_i| * s / ||v||_2 in [0, s], l = floor(a_i)
///     level_i = l + 1 with probability a_i - l, else l     (so E[level_i] = a_i)
///     decoded_i = sgn(v_i) * level_i * ||v||_2 / s
/// hence E[decoded] = v (unbiased) and, QSGD Lemma 3.1,
///     E ||decoded - v||^2 <= min(n / s^2, sqrt(n) / s) ||v||^2   (n = bucket size).
/// qsgd_options::norm = qsgd_norm::max scales by max_i |v_i| instead of
/// ||v||_2: the same rounding, still unbiased, a spacing never wider, so
///     E ||decoded - v||^2 <= n max_i |v_i|^2 / (4 s^2)
/// (at 4 bits, buckets of 512 of a Gaussian vector: about 1/50 of the l2
/// scale's variance; docs/codecs.md). Same bytes, same decoder.
///
/// Each code is b = 2, 4 or 8 bits: sign + level, so s <= 2^(b-1) - 1
/// (1, 7 or 127 levels at most). The random draw of element i at step t is
/// counter_rng(seed).stream(t).uniform_float(i): results depend on
/// (seed, step, data) only, never on threads or SIMD width. Give every worker
/// (and ideally every layer) its own seed, or their rounding noise is correlated.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/random.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/wire.hpp>

#include <gradcomp/system/qsgd.hpp>

namespace gradcomp {

/// Largest number of levels a b-bit code holds (sign + level).
constexpr unsigned qsgd_max_levels(unsigned bits) noexcept { return (1u << (bits - 1)) - 1u; }

/// Payload of qsgd. Body (wire codec 3), little-endian:
///     u8 bits (2, 4 or 8), u8 norm (0: l2, 1: max), u16 levels s, u32 bucket_size,
///     f32 norms[ceil(n / bucket_size)]          (finite, >= 0: each bucket's scale)
///     u32 words[qsgd_word_count(n, bits)]        (layout: system/generic/qsgd.hpp)
/// read_body rejects levels above s, a sign on level 0 and codes past n.
struct qsgd_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::qsgd;

  std::uint64_t count = 0;            ///< decoded length n
  std::uint8_t bits = 4;              ///< code width
  std::uint16_t levels = 7;           ///< s
  std::uint32_t bucket_size = 512;    ///< elements per norm
  std::vector<float> norms;           ///< scale of each bucket (its L2 or max norm)
  std::vector<std::uint32_t> words;   ///< packed codes
  execution::qsgd_norm norm = execution::qsgd_norm::l2;  ///< which norm `norms` hold (informative: decoding ignores it)

  std::uint64_t element_count() const noexcept { return count; }
  std::size_t body_size() const noexcept {
    return header_bytes + norms.size() * sizeof(float) + words.size() * sizeof(std::uint32_t);
  }

  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void write_body(wire::writer& w) const {
    w.put<std::uint8_t>(bits);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(norm));
    w.put<std::uint16_t>(levels);
    w.put<std::uint32_t>(bucket_size);
    w.put_array<float>(norms);
    w.put_array<std::uint32_t>(words);
  }

  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static qsgd_payload read_body(wire::reader& r, const wire::header& h) {
    using wire::reader;
    qsgd_payload p;
    p.count = h.element_count;
    if (h.body_length < header_bytes) reader::fail(wire::wire_errc::malformed_body, "qsgd body shorter than its fields");
    p.bits = r.get<std::uint8_t>();
    reader::check(p.bits == 2 || p.bits == 4 || p.bits == 8, "qsgd: bits must be 2, 4 or 8");
    const auto norm_kind = r.get<std::uint8_t>();
    reader::check(norm_kind <= 1, "qsgd: norm kind is neither 0 (l2) nor 1 (max)");
    p.norm = static_cast<execution::qsgd_norm>(norm_kind);
    p.levels = r.get<std::uint16_t>();
    reader::check(p.levels >= 1 && p.levels <= qsgd_max_levels(p.bits), "qsgd: levels outside [1, 2^(bits-1) - 1]");
    p.bucket_size = r.get<std::uint32_t>();
    reader::check(p.bucket_size >= 1, "qsgd: bucket size is 0");
    const std::uint64_t nb = bucket_count(p.count, p.bucket_size);
    const std::uint64_t nw = execution::qsgd_word_count(p.count, p.bits);
    // count <= 2^34 (parse limits): no overflow.
    if (h.body_length != header_bytes + 4 * nb + 4 * nw)
      reader::fail(wire::wire_errc::malformed_body,
                   "qsgd body of " + std::to_string(h.body_length) + " bytes does not hold " + std::to_string(p.count) +
                       " codes of " + std::to_string(p.bits) + " bits in buckets of " + std::to_string(p.bucket_size));
    p.norms = r.get_vector<float>(nb);
    for (const float v : p.norms) reader::check(std::isfinite(v) && v >= 0.0f, "qsgd: norm not finite and >= 0");
    p.words = r.get_vector<std::uint32_t>(nw);
    if (!codes_valid(p.words, p.count, p.bits, p.levels))
      reader::fail(wire::wire_errc::malformed_body, "qsgd: a code exceeds the levels, is a negative zero or lies past n");
    return p;
  }

  /// Buckets of n elements.
  static constexpr std::uint64_t bucket_count(std::uint64_t n, std::uint64_t bucket_size) noexcept {
    return n / bucket_size + (n % bucket_size != 0);
  }

  /// True when every code has level <= levels and no sign on level 0, and
  /// every code slot past element n-1 is zero.
  /// (A template only so each instruction-set configuration has its own copy:
  /// abi.hpp.)
  template <class AbiMarker = execution::abi_marker>
  static bool codes_valid(std::span<const std::uint32_t> words, std::uint64_t n, unsigned bits,
                          unsigned levels) noexcept {
    const unsigned rows = 32 / bits;
    const std::uint32_t level_mask = (1u << (bits - 1)) - 1u, sign = 1u << (bits - 1);
    // Whole words, all fields at once (SWAR): with L the level bits of every
    // field, L + (2^(b-1) - 1 - s) carries into a field's sign position iff
    // its level exceeds s, and L + (2^(b-1) - 1) iff its level is non-zero;
    // neither carry leaves its field.
    std::uint32_t low = 0, excess = 0;
    for (unsigned k = 0; k < rows; ++k) {
      low |= level_mask << (bits * k);
      excess |= (level_mask - levels) << (bits * k);
    }
    const std::uint32_t signs = low << 1 & ~low;  // the top bit of every field
    const std::uint64_t block = execution::qsgd_lanes * rows;
    const std::uint64_t full_words = execution::qsgd_lanes * (n / block);
    std::uint32_t bad = 0;
    for (std::size_t w = 0; w < full_words && w < words.size(); ++w) {
      const std::uint32_t word = words[w], l = word & low;
      bad |= ((l + excess) & signs) | (word & signs & ~((l + low) & signs));
    }
    if (bad != 0) return false;
    const std::uint64_t m = n % block;  // elements of the last, partial block
    for (std::size_t w = static_cast<std::size_t>(full_words); w < words.size(); ++w) {
      const std::uint64_t lane = w - full_words;
      for (unsigned k = 0; k < rows; ++k) {
        const std::uint32_t code = (words[w] >> (bits * k)) & (level_mask | sign);
        if (execution::qsgd_lanes * k + lane >= m) {
          if (code != 0) return false;
        } else if ((code & level_mask) > levels || code == sign) {
          return false;
        }
      }
    }
    return true;
  }

 private:
  static constexpr std::size_t header_bytes = 1 + 1 + 2 + 4;
};

/// Configuration of qsgd.
struct qsgd_options {
  unsigned bits = 4;               ///< code width: 2, 4 or 8
  unsigned levels = 0;             ///< s in [1, 2^(bits-1) - 1]; 0 means the maximum (1, 7, 127)
  std::size_t bucket_size = 512;   ///< elements per norm, in [1, 2^32 - 1]
  std::uint64_t seed = 0;          ///< seed of the rounding draws (make it differ per worker)
  execution::qsgd_norm norm = execution::qsgd_norm::l2;  ///< bucket scale: ||v||_2 (eq. 3.1) or max |v_i|
};


/// QSGD (seed 002 ref. [24], eq. 3.1 and Lemma 3.1 of the QSGD paper): one
/// instance per layer. Encode is stateless apart from its step counter, which
/// selects the random stream; save_state/restore_state carry it. Not linear:
/// payloads are aggregated by decode_add (docs/codecs.md).
///
/// Non-finite policy: encode rejects a NaN/Inf with non_finite_error naming
/// the first bad index (the step counter is unchanged, `out` is unspecified);
/// a bucket whose L2 norm overflows float (entries near FLT_MAX), or with the
/// max norm a bucket whose max |x| is 2^127 or more (its top level could
/// decode past FLT_MAX), is rejected with invalid_argument_error the same way.
template <ExecutionPolicy Policy = execution::seq>
class qsgd {
 public:
  using payload_type = qsgd_payload;

  explicit qsgd(qsgd_options options = {}) : options_(validated(options)) {}

  /// Quantizes `gradient` with the draws of step `step()`, then advances the step.
  void encode(std::span<const float> gradient, payload_type& out) {
    const std::size_t n = gradient.size();
    out.count = n;
    out.bits = static_cast<std::uint8_t>(options_.bits);
    out.levels = static_cast<std::uint16_t>(options_.levels);
    out.bucket_size = static_cast<std::uint32_t>(options_.bucket_size);
    out.norm = options_.norm;
    out.norms.resize(static_cast<std::size_t>(qsgd_payload::bucket_count(n, options_.bucket_size)));
    out.words.resize(static_cast<std::size_t>(execution::qsgd_word_count(n, options_.bits)));
    const auto res = qsgd_quantize(Policy{}, gradient, params(detail::counter_rng(options_.seed).stream(step_).key()),
                                   std::span<float>(out.norms), std::span<std::uint32_t>(out.words));
    if (res.first_non_finite != execution::qsgd_quantize_result::npos)
      throw non_finite_error("qsgd::encode", res.first_non_finite);
    if (res.overflow_bucket != execution::qsgd_quantize_result::npos)
      throw invalid_argument_error(std::string("qsgd::encode: the ") +
                                   (options_.norm == execution::qsgd_norm::max ? "max norm (>= 2^127)" : "L2 norm") +
                                   " of bucket " + std::to_string(res.overflow_bucket) + " overflows float");
    ++step_;
  }

  /// out = decoded payload. Throws size_mismatch_error if out.size() != p.count
  /// and invalid_argument_error for an inconsistent payload.
  void decode(const payload_type& p, std::span<float> out) const {
    const auto pp = checked(p, out.size(), "qsgd::decode");
    qsgd_dequantize(Policy{}, std::span<const std::uint32_t>(p.words), std::span<const float>(p.norms), pp, out);
  }

  /// out += decoded payload (decode-and-sum aggregation). The payload's own
  /// bits, levels and bucket size are used, so any qsgd instance decodes it.
  void decode_add(const payload_type& p, std::span<float> out) const {
    const auto pp = checked(p, out.size(), "qsgd::decode_add");
    qsgd_dequantize_add(Policy{}, std::span<const std::uint32_t>(p.words), std::span<const float>(p.norms), pp, out);
  }

  /// Exact serialized bytes: 32 header + 8 + 4 per bucket + 4 per word.
  [[nodiscard]] std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }

  /// Saves options and step counter: version 1 (the bytes of the versions
  /// before the norm option, so they can read it) for the l2 norm, version 2
  /// (a norm byte more) for the max norm.
  [[nodiscard]] std::vector<std::byte> save_state() const {
    const bool l2 = options_.norm == execution::qsgd_norm::l2;
    return wire::serialize_state(wire::codec_id::qsgd, 0, [&](wire::writer& w) {
      w.put<std::uint8_t>(l2 ? 1 : state_version);
      w.put<std::uint8_t>(static_cast<std::uint8_t>(options_.bits));
      w.put<std::uint16_t>(static_cast<std::uint16_t>(options_.levels));
      w.put<std::uint32_t>(static_cast<std::uint32_t>(options_.bucket_size));
      w.put<std::uint64_t>(options_.seed);
      w.put<std::uint64_t>(step_);
      if (!l2) w.put<std::uint8_t>(static_cast<std::uint8_t>(options_.norm));
    });
  }

  /// Restores the step counter saved by save_state of a qsgd with the same
  /// options; the codec then draws exactly what the saved one would have.
  /// Throws wire_error for bad bytes and option_mismatch_error naming the
  /// option ("bits", "levels", "bucket_size", "seed", "norm") saved with
  /// another value; the codec is then unchanged. A version-1 state (l2, and
  /// every state saved before the norm option) restores as the l2 norm.
  void restore_state(std::span<const std::byte> bytes) {
    wire::header h;
    wire::reader r = wire::parse_state(bytes, wire::codec_id::qsgd, &h);
    wire::reader::check(h.element_count == 0, "qsgd state: element count must be 0");
    const auto version = r.get<std::uint8_t>();
    wire::reader::check(version == 1 || version == state_version, "qsgd state: unknown version");
    wire::reader::check(h.body_length == (version == 1 ? state_bytes_v1 : state_bytes), "qsgd state: wrong length");
    qsgd_options o;
    o.bits = r.get<std::uint8_t>();
    o.levels = r.get<std::uint16_t>();
    o.bucket_size = r.get<std::uint32_t>();
    o.seed = r.get<std::uint64_t>();
    const std::uint64_t step = r.get<std::uint64_t>();
    std::uint8_t norm_kind = 0;
    if (version >= 2) norm_kind = r.get<std::uint8_t>();
    r.expect_end();
    wire::reader::check(norm_kind <= 1, "qsgd state: norm kind is neither 0 (l2) nor 1 (max)");
    wire::reader::check(options_valid(o) && o.levels != 0, "qsgd state: invalid bits, levels or bucket size");
    if (o.bits != options_.bits) throw option_mismatch_error("qsgd::restore_state", "bits");
    if (o.levels != options_.levels) throw option_mismatch_error("qsgd::restore_state", "levels");
    if (o.bucket_size != options_.bucket_size) throw option_mismatch_error("qsgd::restore_state", "bucket_size");
    if (o.seed != options_.seed) throw option_mismatch_error("qsgd::restore_state", "seed");
    if (static_cast<execution::qsgd_norm>(norm_kind) != options_.norm)
      throw option_mismatch_error("qsgd::restore_state", "norm");
    step_ = step;
  }

  /// The options, with levels resolved (never 0).
  [[nodiscard]] const qsgd_options& options() const noexcept { return options_; }
  /// Step whose random stream the next encode uses.
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  /// Sets the step (e.g. to the training iteration) without other changes.
  void set_step(std::uint64_t step) noexcept { step_ = step; }

 private:
  static constexpr std::uint8_t state_version = 2;
  static constexpr std::size_t state_bytes_v1 = 1 + 1 + 2 + 4 + 8 + 8;
  static constexpr std::size_t state_bytes = state_bytes_v1 + 1;  // + the norm kind

  static bool options_valid(const qsgd_options& o) noexcept {
    if (!(o.bits == 2 || o.bits == 4 || o.bits == 8)) return false;
    if (o.levels > qsgd_max_levels(o.bits)) return false;
    if (o.norm != execution::qsgd_norm::l2 && o.norm != execution::qsgd_norm::max) return false;
    return o.bucket_size >= 1 && o.bucket_size <= 0xFFFFFFFFu;
  }
  static qsgd_options validated(qsgd_options o) {
    if (!(o.bits == 2 || o.bits == 4 || o.bits == 8))
      throw invalid_argument_error("qsgd: bits must be 2, 4 or 8, got " + std::to_string(o.bits));
    if (o.levels == 0) o.levels = qsgd_max_levels(o.bits);
    if (o.levels > qsgd_max_levels(o.bits))
      throw invalid_argument_error("qsgd: " + std::to_string(o.bits) + "-bit codes hold at most " +
                                   std::to_string(qsgd_max_levels(o.bits)) + " levels, got " +
                                   std::to_string(o.levels));
    if (o.bucket_size < 1 || o.bucket_size > 0xFFFFFFFFu)
      throw invalid_argument_error("qsgd: bucket_size must be in [1, 2^32 - 1], got " +
                                   std::to_string(o.bucket_size));
    if (o.norm != execution::qsgd_norm::l2 && o.norm != execution::qsgd_norm::max)
      throw invalid_argument_error("qsgd: norm must be l2 or max, got " + std::to_string(static_cast<unsigned>(o.norm)));
    return o;
  }

  execution::qsgd_params params(std::uint64_t key) const noexcept {
    return {options_.bits, options_.levels, options_.bucket_size, key, options_.norm};
  }

  static execution::qsgd_params checked(const payload_type& p, std::size_t out_size, const char* where) {
    const bool shape_ok = (p.bits == 2 || p.bits == 4 || p.bits == 8) && p.levels >= 1 &&
                          p.levels <= qsgd_max_levels(p.bits) && p.bucket_size >= 1 &&
                          p.norms.size() == qsgd_payload::bucket_count(p.count, p.bucket_size) &&
                          p.words.size() == execution::qsgd_word_count(p.count, p.bits);
    if (!shape_ok)
      throw invalid_argument_error(std::string(where) + ": payload fields disagree (bits, levels, buckets, words)");
    if (out_size != p.count) throw size_mismatch_error(std::string(where) + ": output", p.count, out_size);
    return {p.bits, p.levels, p.bucket_size, 0};
  }

  qsgd_options options_;
  std::uint64_t step_ = 0;
};

// The concepts qsgd claims: a stateful codec (the step counter) that decodes
// into a running sum; not linear.
static_assert(Codec<qsgd<>> && DecodeAddCodec<qsgd<>> && StatefulCodec<qsgd<>> && !LinearCodec<qsgd<>>);
static_assert(StatefulCodec<qsgd<execution::simd>>);

}  // namespace gradcomp
