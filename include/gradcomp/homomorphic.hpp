#pragma once
/// \file homomorphic.hpp
/// homomorphic_quantizer: an agreed-scale stochastic integer quantizer whose
/// codes sum as integers (the idea of THC, NSDI 2024, and Global-QSGD, ECAI
/// 2025): every worker quantizes against the same scale, so the sum of the
/// codes is the code of the sum and a LinearCodec's compressed-domain sum is
/// an integer addition, on any schedule, with an error that does not grow
/// with the hops. docs/codecs.md ("Homomorphic integer quantizer").
///
/// Per step, for a vector x of n values cut into blocks of B (512) values:
///  1. scales: s_b = max_{i in b} |x_i| on each worker (after checking every
///     value finite), then S_b = max over the N workers (a max round: the
///     agreed scale; n / B float32 values on the wire);
///  2. codes: with M = floor((2^b - 1) / N) levels per worker (lane width b,
///     b >= ceil(log2 N) + 2, so M >= 3), u_i = (x_i / S_b + 1) M / 2 in
///     [0, M] is rounded stochastically and unbiasedly, up with probability
///     frac(u_i): E[q_i] = u_i, no clipping (|x_i| <= S_b by construction);
///  3. lanes: q_i in offset binary (q_i >= 0), b bits each, floor(32 / b)
///     lanes per 32-bit word, element i in lane i mod L of word i / L; the N
///     workers' words add as uint32 (any all-reduce of int32 words, any
///     order) and no lane carries into the next: the sum of a lane is at
///     most N M <= 2^b - 1;
///  4. decode once: sum_k x_k,i ~ (2 S_b / M) Q_i - N S_b with Q_i the summed lane.
///
/// Error: unbiased; per worker and element |q_i - u_i| < 1, so the decoded
/// sum is within 2 S_b N / M of the exact sum (worst case), with variance at
/// most N (S_b / M)^2 (independent rounding per worker); the integer sum is
/// exact, so the result does not depend on the schedule or the number of hops.
///
/// The draws of one step come from counter_rng(seed).stream(step) at the
/// element's index in the vector, shifted by k / N on worker k
/// (homomorphic_options::worker) and taken modulo 1: every worker's rounding
/// is unbiased, and with one seed on every worker the N draws of an element
/// are evenly spread over [0, 1) (stratified), so the rounding errors of the
/// sum partly cancel instead of adding up as independent noise. The step
/// advances once per set_agreed_scales.

#include <algorithm>
#include <bit>
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

namespace gradcomp {

/// Wire codec id of homomorphic_payload.
inline constexpr wire::codec_id homomorphic_wire_codec = wire::codec_id::homomorphic;

/// The least lane width with headroom for n summands: ceil(log2 n) + 2.
constexpr unsigned homomorphic_min_bits(std::size_t n) noexcept {
  unsigned b = 0;
  while ((std::size_t{1} << b) < n) ++b;
  return b + 2;
}
/// Lanes per 32-bit word of width b: floor(32 / b).
constexpr unsigned homomorphic_lanes(unsigned bits) noexcept { return 32u / bits; }
/// Levels per summand M = floor((2^b - 1) / n) (0 when n == 0).
constexpr std::uint32_t homomorphic_levels(unsigned bits, std::size_t n) noexcept {
  return n == 0 ? 0u : static_cast<std::uint32_t>(((std::uint64_t{1} << bits) - 1u) / n);
}
/// 32-bit words holding n lanes of width b.
constexpr std::uint64_t homomorphic_word_count(std::uint64_t n, unsigned bits) noexcept {
  const unsigned l = homomorphic_lanes(bits);
  return n / l + (n % l != 0);
}

/// True when every lane of `words` holding one of n elements is at most
/// `limit`, and every other bit (the lanes past n, the bits above the last
/// lane of a word) is zero. (A template only so each instruction-set
/// configuration has its own copy: abi.hpp.)
template <class AbiMarker = execution::abi_marker>
bool homomorphic_lanes_valid(std::span<const std::uint32_t> words, std::uint64_t n, unsigned bits,
                             std::uint64_t limit) noexcept {
  const unsigned lanes = homomorphic_lanes(bits);
  const std::uint32_t mask = bits >= 32 ? 0xFFFFFFFFu : (1u << bits) - 1u;
  const std::uint32_t used = lanes * bits >= 32 ? 0xFFFFFFFFu : (1u << (lanes * bits)) - 1u;
  bool ok = true;
  for (std::size_t w = 0; w < words.size(); ++w) {
    const std::uint32_t word = words[w];
    ok &= (word & ~used) == 0;
    for (unsigned k = 0; k < lanes; ++k) ok &= ((word >> (k * bits)) & mask) <= limit;
  }
  // Lanes past n: zero.
  if (!words.empty() && n % lanes != 0) {
    const std::uint32_t last = words.back();
    for (unsigned k = static_cast<unsigned>(n % lanes); k < lanes; ++k) ok &= ((last >> (k * bits)) & mask) == 0;
  }
  return ok;
}

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN
/// The codes of m values x[j] of one block (scale s, inv = M / (2 s), top = M)
/// whose vector indices are lo + j (+ 2^32 hi), lo + m not wrapping: u = (x +
/// s) inv in [0, M] (the clamp only guards float rounding: |x| <= s), q =
/// floor(u) + [v < frac(u)] with v the shared draw of the index shifted by
/// `shift` modulo 1 (at u = M, frac(u) = 0: q <= M). Branch-free: vectorised
/// (kept out of line: GCC 12 does not vectorise it once inlined into the encoder).
#if defined(__GNUC__) || defined(__clang__)
__attribute__((noinline))
#endif
inline void homomorphic_codes(const float* x, std::uint32_t* q, std::size_t m, float s, float inv, float top,
                              std::uint32_t lo, std::uint32_t hi, std::uint32_t key_lo, std::uint32_t key_hi,
                              float shift) noexcept {
  for (std::size_t j = 0; j < m; ++j) {
    float u = (x[j] + s) * inv;
    u = u < 0.0f ? 0.0f : u;
    u = u > top ? top : u;
    const std::int32_t fl = static_cast<std::int32_t>(u);
    const std::uint32_t r =
        counter_stream::bits32_lanes<std::uint32_t>(lo + static_cast<std::uint32_t>(j), hi, key_lo, key_hi);
    float v = static_cast<float>(r >> 8) * 0x1p-24f + shift;  // uniform_float of the index, shifted
    v -= v >= 1.0f ? 1.0f : 0.0f;
    q[j] = static_cast<std::uint32_t>(fl) + (v < u - static_cast<float>(fl) ? 1u : 0u);
  }
}
GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

/// Payload of homomorphic_quantizer: the codes of `count` consecutive
/// elements starting at element `offset` of the codec's vector (a multiple of
/// the block size), summed over `summands` workers. Body (wire codec 10),
/// little-endian:
///     u8 bits (2..16), u8 reserved (0), u16 reserved (0), u32 levels M,
///     u32 block_size, u32 summands, u64 offset,
///     u32 words[ceil(count / floor(32 / bits))]
/// read_body checks summands * M <= 2^bits - 1 and every lane (at most
/// summands * M; zero past count and above the last lane).
struct homomorphic_payload {
  static constexpr wire::codec_id wire_codec = homomorphic_wire_codec;
  std::uint64_t count = 0;
  std::uint64_t offset = 0;
  std::uint8_t bits = 4;
  std::uint32_t levels = 3;
  std::uint32_t block_size = 512;
  std::uint32_t summands = 1;
  std::vector<std::uint32_t> words;

  std::uint64_t element_count() const noexcept { return count; }
  std::size_t body_size() const noexcept { return header_bytes + words.size() * sizeof(std::uint32_t); }
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void write_body(wire::writer& w) const {
    w.put<std::uint8_t>(bits);
    w.put<std::uint8_t>(0);
    w.put<std::uint16_t>(0);
    w.put<std::uint32_t>(levels);
    w.put<std::uint32_t>(block_size);
    w.put<std::uint32_t>(summands);
    w.put<std::uint64_t>(offset);
    w.put_array<std::uint32_t>(words);
  }
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static homomorphic_payload read_body(wire::reader& r, const wire::header& h) {
    using wire::reader;
    homomorphic_payload p;
    p.count = h.element_count;
    if (h.body_length < header_bytes) reader::fail(wire::wire_errc::malformed_body, "homomorphic body shorter than its fields");
    p.bits = r.get<std::uint8_t>();
    reader::check(p.bits >= 2 && p.bits <= 16, "homomorphic: bits outside [2, 16]");
    reader::check(r.get<std::uint8_t>() == 0 && r.get<std::uint16_t>() == 0, "homomorphic: reserved bytes are not zero");
    p.levels = r.get<std::uint32_t>();
    p.block_size = r.get<std::uint32_t>();
    p.summands = r.get<std::uint32_t>();
    p.offset = r.get<std::uint64_t>();
    reader::check(p.levels >= 1 && p.block_size >= 1 && p.summands >= 1, "homomorphic: levels, block size or summands is 0");
    reader::check(std::uint64_t(p.summands) * p.levels <= (std::uint64_t{1} << p.bits) - 1,
                  "homomorphic: summands x levels exceeds the lane");
    reader::check(p.offset % p.block_size == 0, "homomorphic: offset is not on a block boundary");
    const std::uint64_t nw = homomorphic_word_count(p.count, p.bits);
    if (h.body_length != header_bytes + 4 * nw)
      reader::fail(wire::wire_errc::malformed_body, "homomorphic body of " + std::to_string(h.body_length) +
                                                        " bytes does not hold " + std::to_string(p.count) + " lanes of " +
                                                        std::to_string(p.bits) + " bits");
    p.words = r.get_vector<std::uint32_t>(nw);
    if (!homomorphic_lanes_valid(p.words, p.count, p.bits, std::uint64_t(p.summands) * p.levels))
      reader::fail(wire::wire_errc::malformed_body, "homomorphic: a lane exceeds summands x levels, or stray bits");
    return p;
  }

 private:
  static constexpr std::size_t header_bytes = 1 + 1 + 2 + 4 + 4 + 4 + 8;
};

/// Configuration of homomorphic_quantizer.
struct homomorphic_options {
  /// Lane width b in [2, 16]; 0: the least with headroom for the summands,
  /// ceil(log2 N) + 2 (4 bits for N = 3 or 4). A width below that is refused.
  unsigned bits = 0;
  std::size_t block_size = 512;  ///< values per agreed scale
  /// Seed of the rounding draws: the SAME on every worker (the draws are then
  /// stratified across the workers, see `worker`); different seeds give
  /// independent draws (still unbiased, noisier sums).
  std::uint64_t seed = 0;
  /// This worker's index k in [0, N): element i rounds up when
  /// frac(V_i + k / N) < frac(u_i), V_i the shared uniform draw of element i.
  /// Each worker's draw is uniform (unbiased rounding); across the workers
  /// the draws are evenly spread, so their rounding errors partly cancel.
  std::size_t worker = 0;
};

/// The agreed-scale integer quantizer (see the file comment): a LinearCodec
/// (accumulate = word addition) and an agreed-scale codec: local_scales, a
/// max over the workers, set_agreed_scales, then encode / encode_segment
/// against the agreed scales. Also a SegmentedCodec: ring segments end on
/// block boundaries. Stateful: the step counter (save_state / restore_state).
template <ExecutionPolicy Policy = execution::seq>
class homomorphic_quantizer {
 public:
  using payload_type = homomorphic_payload;
  using codec_concept = linear_codec_tag;

  explicit homomorphic_quantizer(homomorphic_options options = {}, std::size_t summands = 1) : opt_(options) {
    if (opt_.block_size < 1 || opt_.block_size > 0xFFFFFFFFu)
      throw invalid_argument_error("homomorphic_quantizer: block_size must be in [1, 2^32 - 1]");
    set_summands(summands);
  }

  /// Sets N, the number of workers whose codes are summed (GradiVeQ-style:
  /// the ring checks it). Resolves the width (options.bits or the least with
  /// headroom) and M; invalid_argument_error when the width cannot hold N.
  void set_summands(std::size_t n) {
    if (n < 1 || n > (std::size_t{1} << 14))
      throw invalid_argument_error("homomorphic_quantizer: summands must be in [1, 16384], got " + std::to_string(n));
    const unsigned need = homomorphic_min_bits(n);
    const unsigned b = opt_.bits == 0 ? need : opt_.bits;
    if (b < need || b > 16)
      throw invalid_argument_error("homomorphic_quantizer: " + std::to_string(b) + "-bit lanes for " + std::to_string(n) +
                                   " summands (need " + std::to_string(need) + " to 16 bits: b >= log2 N + 2)");
    summands_ = n;
    bits_ = b;
    levels_ = homomorphic_levels(b, n);
  }
  std::size_t summands() const noexcept { return summands_; }
  /// Lane width b and levels per summand M.
  unsigned bits() const noexcept { return bits_; }
  std::uint32_t levels() const noexcept { return levels_; }
  const homomorphic_options& options() const noexcept { return opt_; }

  /// Scales of a vector of n values: ceil(n / block_size).
  std::size_t scale_count(std::size_t n) const noexcept { return n / opt_.block_size + (n % opt_.block_size != 0); }
  /// Bytes of the scales on the wire (float32 each): the max round's share of the codec's bytes.
  std::size_t scale_bytes(std::size_t n) const noexcept { return 4 * scale_count(n); }

  /// out[b] = max |x_i| over block b (the local scales). Throws
  /// non_finite_error for a NaN / Inf (the first bad index), before anything
  /// is sent.
  void local_scales(std::span<const float> x, std::span<float> out) const {
    if (out.size() != scale_count(x.size())) throw size_mismatch_error("homomorphic_quantizer::local_scales", scale_count(x.size()), out.size());
    if (const auto bad = find_non_finite(Policy{}, x); bad != x.size()) throw non_finite_error("homomorphic_quantizer::local_scales", bad);
    for (std::size_t b = 0; b < out.size(); ++b) {
      const std::size_t lo = b * opt_.block_size, hi = std::min(x.size(), lo + opt_.block_size);
      float m = 0.0f;
      for (std::size_t i = lo; i < hi; ++i) m = std::max(m, std::fabs(x[i]));
      out[b] = m;
    }
  }

  /// Sets the agreed scales (the max over the workers of local_scales) of a
  /// vector of `length` values, and advances the rounding step. Every scale
  /// must be finite and >= 0 (invalid_argument_error).
  void set_agreed_scales(std::span<const float> scales, std::size_t length) {
    if (scales.size() != scale_count(length))
      throw size_mismatch_error("homomorphic_quantizer::set_agreed_scales", scale_count(length), scales.size());
    for (const float s : scales)
      if (!(s >= 0.0f && s <= 3.4028234e38f))
        throw invalid_argument_error("homomorphic_quantizer::set_agreed_scales: a scale is not finite and >= 0");
    scales_.assign(scales.begin(), scales.end());
    length_ = length;
    ++step_;
  }
  /// The agreed scales and the length they cover.
  std::span<const float> agreed_scales() const noexcept { return scales_; }
  std::size_t length() const noexcept { return length_; }

  /// parts + 1 offsets from 0 to length() on block boundaries (ring segments).
  std::vector<std::size_t> segment_bounds(std::size_t parts) const {
    const std::size_t blocks = scale_count(length_);
    std::vector<std::size_t> b(parts + 1);
    for (std::size_t j = 0; j <= parts; ++j) b[j] = std::min(length_, (blocks * j / std::max<std::size_t>(parts, 1)) * opt_.block_size);
    b.back() = length_;
    return b;
  }

  /// Codes of x, the values [offset, offset + x.size()) of the vector whose
  /// scales were agreed (offset on a block boundary). state_error without
  /// agreed scales; size_mismatch_error outside them.
  void encode_segment(std::size_t offset, std::span<const float> x, payload_type& out) const {
    check_range(offset, x.size(), "encode");
    out.count = x.size();
    out.offset = offset;
    out.bits = static_cast<std::uint8_t>(bits_);
    out.levels = levels_;
    out.block_size = static_cast<std::uint32_t>(opt_.block_size);
    out.summands = 1;
    const unsigned lanes = homomorphic_lanes(bits_);
    out.words.assign(static_cast<std::size_t>(homomorphic_word_count(x.size(), bits_)), 0u);
    const auto stream = detail::counter_rng(opt_.seed).stream(step_);
    const float half_m = 0.5f * float(levels_), top = float(levels_);
    const float shift = float(opt_.worker % summands_) / float(summands_);
    // Codes a block at a time (branch-free, so the compiler vectorises it),
    // then packed a word at a time.
    std::uint32_t q[256];
    std::size_t i = 0;
    while (i < x.size()) {
      const std::size_t block = (offset + i) / opt_.block_size;
      const std::size_t block_end = std::min(x.size(), (block + 1) * opt_.block_size - offset);
      const float s = scales_[block];
      const float inv = s > 0.0f ? half_m / s : 0.0f;
      const std::size_t m = std::min<std::size_t>(block_end - i, 256);
      const std::uint64_t first = offset + i;
      if (static_cast<std::uint32_t>(first) <= 0xFFFFFFFFu - 256u)
        detail::homomorphic_codes(x.data() + i, q, m, s, inv, top, static_cast<std::uint32_t>(first),
                                  static_cast<std::uint32_t>(first >> 32), stream.key_lo(), stream.key_hi(), shift);
      else  // the low half of the index wraps inside this chunk: element by element
        for (std::size_t j = 0; j < m; ++j)
          detail::homomorphic_codes(x.data() + i + j, q + j, 1, s, inv, top, static_cast<std::uint32_t>(first + j),
                                    static_cast<std::uint32_t>((first + j) >> 32), stream.key_lo(), stream.key_hi(), shift);
      std::size_t w = i / lanes;
      unsigned k = static_cast<unsigned>(i % lanes);
      for (std::size_t j = 0; j < m; ++j) {
        out.words[w] |= q[j] << (k * bits_);
        if (++k == lanes) {
          k = 0;
          ++w;
        }
      }
      i += m;
    }
  }
  /// encode_segment(0, x, out).
  void encode(std::span<const float> x, payload_type& out) { encode_segment(0, x, out); }

  /// out[i] = (2 S / M) Q_i - summands S: the sum over the payload's summands
  /// of the decoded values (eq. 4 of the file comment).
  void decode(const payload_type& p, std::span<float> out) const { decode_impl(p, out, false); }
  /// out += the decoded sum.
  void decode_add(const payload_type& p, std::span<float> out) const { decode_impl(p, out, true); }

  /// into += from as 32-bit words: the lanes add (no carry while the summands
  /// fit: invalid_argument_error otherwise, or for payloads of other segments or widths).
  void accumulate(payload_type& into, const payload_type& from) const {
    if (into.count != from.count || into.offset != from.offset || into.bits != from.bits || into.levels != from.levels ||
        into.block_size != from.block_size || into.words.size() != from.words.size())
      throw invalid_argument_error("homomorphic_quantizer::accumulate: payloads of another segment, width or levels");
    const std::uint64_t s = std::uint64_t(into.summands) + from.summands;
    if (s * into.levels > (std::uint64_t{1} << into.bits) - 1)
      throw invalid_argument_error("homomorphic_quantizer::accumulate: " + std::to_string(s) +
                                   " summands overflow the lanes");
    into.summands = static_cast<std::uint32_t>(s);
    for (std::size_t w = 0; w < into.words.size(); ++w) into.words[w] += from.words[w];
  }

  /// Exact serialized bytes of the codes: 32 header + 28 + 4 per word (the
  /// scales travel in the max round: scale_bytes).
  [[nodiscard]] std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }

  /// Options, summands and the step counter.
  [[nodiscard]] std::vector<std::byte> save_state() const {
    return wire::serialize_state(homomorphic_wire_codec, 0, [&](wire::writer& w) {
      w.put<std::uint32_t>(opt_.bits);
      w.put<std::uint64_t>(opt_.block_size);
      w.put<std::uint64_t>(opt_.seed);
      w.put<std::uint64_t>(opt_.worker);
      w.put<std::uint64_t>(summands_);
      w.put<std::uint64_t>(step_);
    });
  }
  /// Restores save_state of a codec with the same options and summands
  /// (option_mismatch_error naming the option otherwise; wire_error for bad bytes).
  void restore_state(std::span<const std::byte> bytes) {
    wire::header h;
    wire::reader r = wire::parse_state(bytes, homomorphic_wire_codec, &h);
    const auto b = r.get<std::uint32_t>();
    const auto bs = r.get<std::uint64_t>();
    const auto seed = r.get<std::uint64_t>();
    const auto worker = r.get<std::uint64_t>();
    const auto n = r.get<std::uint64_t>();
    const auto step = r.get<std::uint64_t>();
    r.expect_end();
    const char* who = "homomorphic_quantizer::restore_state";
    if (b != opt_.bits) throw option_mismatch_error(who, "bits");
    if (bs != opt_.block_size) throw option_mismatch_error(who, "block_size");
    if (seed != opt_.seed) throw option_mismatch_error(who, "seed");
    if (worker != opt_.worker) throw option_mismatch_error(who, "worker");
    if (n != summands_) throw option_mismatch_error(who, "summands");
    step_ = step;
  }
  /// Steps (agreed scale sets) so far: the next codes draw from stream(step()).
  std::uint64_t step() const noexcept { return step_; }

 private:
  void check_range(std::size_t offset, std::size_t n, const char* what) const {
    if (scales_.empty() && length_ == 0 && n > 0)
      throw state_error(std::string("homomorphic_quantizer::") + what + ": no agreed scales (set_agreed_scales first)");
    if (offset % opt_.block_size != 0 || offset > length_ || n > length_ - offset)
      throw size_mismatch_error(std::string("homomorphic_quantizer::") + what + ": segment outside the agreed scales",
                                length_, offset + n);
  }
  void decode_impl(const payload_type& p, std::span<float> out, bool add) const {
    if (out.size() != p.count) throw size_mismatch_error("homomorphic_quantizer::decode: output", p.count, out.size());
    check_range(static_cast<std::size_t>(p.offset), out.size(), "decode");
    if (p.block_size != opt_.block_size || p.bits < 2 || p.bits > 16 || p.levels < 1 ||
        p.words.size() != homomorphic_word_count(p.count, p.bits))
      throw invalid_argument_error("homomorphic_quantizer::decode: payload fields disagree with the codec");
    const unsigned lanes = homomorphic_lanes(p.bits), bits = p.bits;
    const std::uint32_t mask = (1u << bits) - 1u;
    const std::size_t offset = static_cast<std::size_t>(p.offset);
    std::size_t i = 0, w = 0;
    unsigned k = 0;
    for (std::size_t b0 = offset; i < out.size(); b0 += opt_.block_size) {
      const float s = scales_[b0 / opt_.block_size];
      const float step = 2.0f * s / float(p.levels), base = float(p.summands) * s;
      const std::size_t end = std::min(out.size(), b0 + opt_.block_size - offset);
      for (; i < end; ++i) {
        const std::uint32_t q = (p.words[w] >> (k * bits)) & mask;
        if (++k == lanes) {
          k = 0;
          ++w;
        }
        const float v = float(q) * step - base;
        out[i] = add ? out[i] + v : v;
      }
    }
  }

  homomorphic_options opt_;
  std::size_t summands_ = 1;
  unsigned bits_ = 2;
  std::uint32_t levels_ = 3;
  std::vector<float> scales_;
  std::size_t length_ = 0;
  std::uint64_t step_ = 0;
};

// The concepts homomorphic_quantizer claims: linear (codes add as words),
// stateful (the step), decodes into a running sum.
static_assert(LinearCodec<homomorphic_quantizer<>> && AgreedScaleCodec<homomorphic_quantizer<>> &&
              StatefulCodec<homomorphic_quantizer<>> && DecodeAddCodec<homomorphic_quantizer<>>);

}  // namespace gradcomp
