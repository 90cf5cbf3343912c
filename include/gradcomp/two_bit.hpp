#pragma once
/// \file two_bit.hpp
/// two_bit_quantizer: MXNet's 2-bit gradient compression with a residual
/// (seed 003, "Two Bit Quantization"), plus the automatic threshold the MXNet
/// page promises ("Setting the threshold automatically is expected in a future
/// release"). docs/codecs.md describes the format, the threshold rules and why
/// payloads are aggregated by decode-and-sum.
///
/// Per step and per element, with residual r (zero at the start):
///     x = r + g
///     code 11 (decoded +thr) if x >= thr, 10 (decoded -thr) if x <= -thr, 00 (0) otherwise
///     r = x - decoded
/// so sum over steps of decoded + final residual == sum of gradients (up to
/// float rounding): nothing is dropped, small updates are only delayed.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/wire.hpp>

#include <gradcomp/system/two_bit.hpp>

namespace gradcomp {

/// Number of 32-bit words holding n two-bit codes (16 codes per word).
constexpr std::uint64_t two_bit_word_count(std::uint64_t n) noexcept { return n / 16 + (n % 16 != 0); }

/// Payload of two_bit_quantizer: the threshold and 16 two-bit codes per
/// little-endian 32-bit word. Element i is in word i / 16 at bits 2(i % 16)
/// (set for +thr) and 2(i % 16) + 1 (set for +thr and -thr).
///
/// Body (wire codec 2): float32 threshold (finite, > 0), then
/// two_bit_word_count(n) uint32 words. Codes 01 and any code past element n-1
/// in the last word are rejected by read_body.
struct two_bit_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::two_bit;

  std::uint64_t count = 0;           ///< decoded length n
  float threshold = 0.5f;            ///< decoded magnitude of a non-zero code
  std::vector<std::uint32_t> words;  ///< two_bit_word_count(count) words

  std::uint64_t element_count() const noexcept { return count; }
  std::size_t body_size() const noexcept { return sizeof(float) + words.size() * sizeof(std::uint32_t); }

  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void write_body(wire::writer& w) const {
    w.put<float>(threshold);
    w.put_array<std::uint32_t>(words);
  }

  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static two_bit_payload read_body(wire::reader& r, const wire::header& h) {
    const std::uint64_t n = h.element_count;
    const std::uint64_t nwords = two_bit_word_count(n);
    // n <= parse_limits.max_element_count (2^34), so this cannot overflow.
    if (h.body_length != sizeof(float) + nwords * sizeof(std::uint32_t))
      wire::reader::fail(wire::wire_errc::malformed_body,
                         "two_bit body of " + std::to_string(h.body_length) + " bytes does not hold " +
                             std::to_string(n) + " codes (expected " +
                             std::to_string(sizeof(float) + nwords * sizeof(std::uint32_t)) + ")");
    two_bit_payload p;
    p.count = n;
    p.threshold = r.get<float>();
    wire::reader::check(std::isfinite(p.threshold) && p.threshold > 0.0f, "two_bit threshold is not finite and > 0");
    p.words = r.get_vector<std::uint32_t>(nwords);
    if (!codes_valid(p.words, n))
      wire::reader::fail(wire::wire_errc::malformed_body, "two_bit words hold code 01 or codes past the last element");
    return p;
  }

  /// True when no word holds the unused code 01 and every code past element
  /// n-1 is 00.
  /// (A template only so each instruction-set configuration has its own copy:
  /// abi.hpp.)
  template <class AbiMarker = execution::abi_marker>
  static bool codes_valid(std::span<const std::uint32_t> words, std::uint64_t n) noexcept {
    std::uint32_t bad = 0;
    for (const std::uint32_t w : words) bad |= w & ~(w >> 1) & 0x55555555u;  // positive bit without non-zero bit
    if (bad != 0) return false;
    if (n % 16 != 0 && !words.empty()) {
      const std::uint32_t used = (std::uint32_t{1} << (2 * (n % 16))) - 1u;
      if (words.back() & ~used) return false;
    }
    return true;
  }
};

/// How two_bit_quantizer chooses its threshold.
enum class two_bit_threshold_mode : std::uint8_t {
  fixed = 0,      ///< the configured threshold every step (MXNet)
  automatic = 1,  ///< per step and per layer: auto_scale * mean |r + g|
};

/// Configuration of two_bit_quantizer.
struct two_bit_options {
  two_bit_threshold_mode mode = two_bit_threshold_mode::fixed;
  /// Fixed threshold (> 0, finite). 0.5 is MXNet's default; it suits
  /// gradients of magnitude ~0.5 only: choose it for your gradient scale or
  /// use the automatic mode.
  float threshold = 0.5f;
  /// Automatic mode: thr = auto_scale * mean_i |r_i + g_i| of this layer at
  /// this step (> 0, finite). 1.0 sends roughly the 35-45% largest entries.
  /// Keep it <= 1: then max|r + g| >= thr and every step sends something;
  /// above 1 a flat residual can send nothing while the threshold climbs.
  /// docs/codecs.md explains the rule and the default.
  float auto_scale = 1.0f;

  /// A fixed threshold.
  static two_bit_options fixed(float thr) noexcept { return {two_bit_threshold_mode::fixed, thr, 1.0f}; }
  /// The automatic threshold with the given scale.
  static two_bit_options automatic(float scale = 1.0f) noexcept {
    return {two_bit_threshold_mode::automatic, 0.5f, scale};
  }
};

/// MXNet's two-bit quantizer with a per-worker residual (seed 003), one
/// instance per layer. Stateful (the residual); not linear: payloads are
/// aggregated by decoding and summing (decode_add), see docs/codecs.md.
///
/// Non-finite policy: encode rejects a NaN/Inf gradient with
/// non_finite_error naming the first bad index, before touching the residual.
/// It also rejects (invalid_argument_error, residual untouched) a finite
/// gradient with max|g| + max|r| > FLT_MAX, the only way r + g could overflow;
/// the guard is conservative and can only trigger above ~1.7e38.
template <ExecutionPolicy Policy = execution::seq>
class two_bit_quantizer {
 public:
  using payload_type = two_bit_payload;

  /// A quantizer for a layer of `size` elements with a zero residual.
  explicit two_bit_quantizer(std::size_t size, two_bit_options options = {})
      : options_(validated(options)), residual_(size, 0.0f) {}

  /// Quantizes `gradient` into `out` and updates the residual (one step).
  /// `out` is overwritten; its buffer is reused.
  void encode(std::span<const float> gradient, payload_type& out) {
    const std::size_t n = residual_.size();
    if (gradient.size() != n) throw size_mismatch_error("two_bit_quantizer::encode: gradient", n, gradient.size());
    const bool automatic = options_.mode == two_bit_threshold_mode::automatic;
    const auto scan = two_bit_prescan(Policy{}, gradient,
                                      automatic ? std::span<const float>(residual_) : std::span<const float>());
    if (scan.first_non_finite != n) throw non_finite_error("two_bit_quantizer::encode", scan.first_non_finite);
    if (static_cast<double>(scan.max_abs_gradient) + static_cast<double>(max_abs_residual_) >
        static_cast<double>(std::numeric_limits<float>::max()))
      throw invalid_argument_error("two_bit_quantizer::encode: max |gradient| " + format(scan.max_abs_gradient) +
                                   " plus max |residual| " + format(max_abs_residual_) + " could overflow float");
    const float thr = automatic ? auto_threshold(scan.sum_abs_accumulated, n) : options_.threshold;
    out.count = n;
    out.threshold = thr;
    out.words.resize(static_cast<std::size_t>(two_bit_word_count(n)));
    max_abs_residual_ = two_bit_quantize(Policy{}, gradient, std::span<float>(residual_), thr,
                                         std::span<std::uint32_t>(out.words));
    last_threshold_ = thr;
    ++steps_;
  }

  /// out = +thr / -thr / 0 per code. Throws size_mismatch_error if out.size()
  /// != p.count and invalid_argument_error for an inconsistent payload.
  void decode(const payload_type& p, std::span<float> out) const {
    check_payload(p, out.size(), "two_bit_quantizer::decode");
    two_bit_dequantize(Policy{}, std::span<const std::uint32_t>(p.words), p.threshold, out);
  }

  /// out += decode(p): decode-and-sum aggregation of several workers' payloads.
  void decode_add(const payload_type& p, std::span<float> out) const {
    check_payload(p, out.size(), "two_bit_quantizer::decode_add");
    two_bit_dequantize_add(Policy{}, std::span<const std::uint32_t>(p.words), p.threshold, out);
  }

  /// Exact bytes of the serialized payload: 32 header + 4 threshold + 4 per 16 elements.
  [[nodiscard]] std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }

  /// Saves options, step count and residual (wire container, state flag).
  [[nodiscard]] std::vector<std::byte> save_state() const {
    return wire::serialize_state(wire::codec_id::two_bit, residual_.size(), [&](wire::writer& w) {
      w.put<std::uint8_t>(state_version);
      w.put<std::uint8_t>(static_cast<std::uint8_t>(options_.mode));
      w.put<std::uint16_t>(0);
      w.put<float>(options_.threshold);
      w.put<float>(options_.auto_scale);
      w.put<float>(last_threshold_);
      w.put<std::uint64_t>(steps_);
      w.put_array<float>(residual_);
    });
  }

  /// Restores a state saved by save_state of a two_bit_quantizer of the same
  /// size and options: step count and residual are replaced, so the codec
  /// then continues bit for bit. Throws wire_error for bad bytes,
  /// size_mismatch_error for another layer size and option_mismatch_error
  /// naming the option ("mode", "threshold", "auto_scale") saved with another
  /// value; the codec is then unchanged.
  void restore_state(std::span<const std::byte> bytes) {
    wire::header h;
    wire::reader r = wire::parse_state(bytes, wire::codec_id::two_bit, &h);
    const std::uint64_t n = h.element_count;
    if (h.body_length != state_fixed_bytes + n * sizeof(float))
      wire::reader::fail(wire::wire_errc::malformed_body, "two_bit state length does not match its element count");
    wire::reader::check(r.get<std::uint8_t>() == state_version, "two_bit state: unknown state version");
    const auto mode = r.get<std::uint8_t>();
    wire::reader::check(mode <= 1, "two_bit state: unknown threshold mode");
    wire::reader::check(r.get<std::uint16_t>() == 0, "two_bit state: reserved field is not zero");
    two_bit_options o;
    o.mode = static_cast<two_bit_threshold_mode>(mode);
    o.threshold = r.get<float>();
    o.auto_scale = r.get<float>();
    wire::reader::check(options_valid(o), "two_bit state: invalid threshold or scale");
    const float last = r.get<float>();
    wire::reader::check(std::isfinite(last) && last >= 0.0f, "two_bit state: invalid last threshold");
    const auto steps = r.get<std::uint64_t>();
    std::vector<float> residual = r.get_vector<float>(n);
    r.expect_end();
    float rmax = 0.0f;
    for (const float v : residual) {
      wire::reader::check(std::isfinite(v), "two_bit state: non-finite residual");
      rmax = rmax < std::fabs(v) ? std::fabs(v) : rmax;
    }
    if (n != residual_.size())
      throw size_mismatch_error("two_bit_quantizer::restore_state: state", residual_.size(),
                                static_cast<std::size_t>(n));
    if (o.mode != options_.mode) throw option_mismatch_error("two_bit_quantizer::restore_state", "mode");
    if (o.threshold != options_.threshold) throw option_mismatch_error("two_bit_quantizer::restore_state", "threshold");
    if (o.auto_scale != options_.auto_scale)
      throw option_mismatch_error("two_bit_quantizer::restore_state", "auto_scale");
    residual_ = std::move(residual);
    max_abs_residual_ = rmax;
    last_threshold_ = last;
    steps_ = steps;
  }

  /// Zeroes the residual and the step count (options unchanged).
  void reset() noexcept {
    std::fill(residual_.begin(), residual_.end(), 0.0f);
    max_abs_residual_ = 0.0f;
    last_threshold_ = 0.0f;
    steps_ = 0;
  }

  /// Layer size n.
  [[nodiscard]] std::size_t size() const noexcept { return residual_.size(); }
  /// The options given at construction.
  [[nodiscard]] const two_bit_options& options() const noexcept { return options_; }
  /// The residual r carried to the next step.
  [[nodiscard]] std::span<const float> residual() const noexcept { return residual_; }
  /// Threshold of the last encode (0 before the first).
  [[nodiscard]] float last_threshold() const noexcept { return last_threshold_; }
  /// Number of encodes since construction / reset (restored by restore_state).
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }

 private:
  static constexpr std::uint8_t state_version = 1;
  static constexpr std::size_t state_fixed_bytes = 1 + 1 + 2 + 4 + 4 + 4 + 8;

  static bool options_valid(const two_bit_options& o) noexcept {
    const bool mode_ok = o.mode == two_bit_threshold_mode::fixed || o.mode == two_bit_threshold_mode::automatic;
    return mode_ok && std::isfinite(o.threshold) && o.threshold > 0.0f && std::isfinite(o.auto_scale) &&
           o.auto_scale > 0.0f;
  }
  static two_bit_options validated(const two_bit_options& o) {
    if (!(o.mode == two_bit_threshold_mode::fixed || o.mode == two_bit_threshold_mode::automatic))
      throw invalid_argument_error("two_bit_quantizer: unknown threshold mode");
    if (!(std::isfinite(o.threshold) && o.threshold > 0.0f))
      throw invalid_argument_error("two_bit_quantizer: threshold must be finite and > 0, got " +
                                   std::to_string(o.threshold));
    if (!(std::isfinite(o.auto_scale) && o.auto_scale > 0.0f))
      throw invalid_argument_error("two_bit_quantizer: auto_scale must be finite and > 0, got " +
                                   std::to_string(o.auto_scale));
    return o;
  }

  /// thr = auto_scale * mean |r + g|, clamped to [FLT_MIN, FLT_MAX] so it is
  /// always a valid threshold (all-zero input: every code is 00 anyway).
  float auto_threshold(double sum_abs, std::size_t n) const noexcept {
    const double t = n == 0 ? 0.0 : static_cast<double>(options_.auto_scale) * (sum_abs / static_cast<double>(n));
    const double lo = std::numeric_limits<float>::min(), hi = std::numeric_limits<float>::max();
    return static_cast<float>(t < lo ? lo : (t > hi || !(t == t) ? hi : t));
  }

  static std::string format(float v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
    return buf;
  }

  static void check_payload(const payload_type& p, std::size_t out_size, const char* where) {
    if (p.words.size() != two_bit_word_count(p.count))
      throw invalid_argument_error(std::string(where) + ": payload has " + std::to_string(p.words.size()) +
                                   " words for " + std::to_string(p.count) + " elements");
    if (out_size != p.count) throw size_mismatch_error(std::string(where) + ": output", p.count, out_size);
  }

  two_bit_options options_;
  std::vector<float> residual_;
  float max_abs_residual_ = 0.0f;
  float last_threshold_ = 0.0f;
  std::uint64_t steps_ = 0;
};

// The concepts two_bit_quantizer claims: a stateful codec that decodes into a
// running sum; not linear (codes are not summable).
static_assert(Codec<two_bit_quantizer<>> && DecodeAddCodec<two_bit_quantizer<>> &&
              StatefulCodec<two_bit_quantizer<>> && !LinearCodec<two_bit_quantizer<>>);
static_assert(StatefulCodec<two_bit_quantizer<execution::simd>>);

}  // namespace gradcomp
