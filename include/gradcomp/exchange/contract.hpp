#pragma once
/// \file exchange/contract.hpp
/// The bucket contract of the whole-model exchange (docs/exchange.md): what a
/// bucket codec, a schedule and a framework binding agree on.
///
///  - Rounds. A bucket takes one or more rounds per step, fixed by the plan
///    and the schedule state (the same on every rank). Each round is one
///    collective: a reduction (sum or max) of a summable buffer, or an
///    all-gather of byte payloads. Nothing is sent outside a round.
///  - Summable buffers. The element type (float32, float16, bfloat16, or
///    integer words of packed lanes with headroom: payloads/summable.hpp),
///    the length, and the check applied after the reduction (finite values,
///    lane ranges). Any all-reduce (gradcomp's ring, a framework's) may reduce it.
///  - Flags. The first round of a step carries the control block: one group
///    of slots per rank (failure code, eq. 7 stale vote, state digest). A rank
///    writes only its own slots, so a sum, a max or an all-gather-then-sum of
///    the block names every rank that failed: flags never cost a collective.
///  - Local work that can fail (checks, encodes, residual updates) happens
///    before the first round; later rounds depend only on agreed (reduced)
///    data, so they fail identically on every rank or not at all.

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/payloads/summable.hpp>

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The collective of one round.
enum class round_op : std::uint8_t {
  sum = 0,         ///< element-wise sum of a summable buffer (an all-reduce)
  max = 1,         ///< element-wise max of a summable buffer (agreed scales)
  all_gather = 2,  ///< every rank's byte payload to every rank, in rank order
};

/// Element type of a summable buffer: gradcomp::summable_element
/// (payloads/summable.hpp: float32, float16, bfloat16, int32_words, their
/// wire form, sums and maxima).
using buffer_element = gradcomp::summable_element;

/// Bytes of one element of a summable buffer on the wire (summable::wire_bytes).
constexpr std::size_t element_bytes(buffer_element e) noexcept { return summable::wire_bytes(e); }

/// What is checked after a reduction (by the bucket layer, whoever reduced).
enum class after_reduce_check : std::uint8_t {
  none = 0,
  finite = 1,      ///< every element finite (float types; 16-bit: not saturated at +-max either)
  lane_range = 2,  ///< every packed lane inside its range (integer words; checked by the codec's absorb)
};

/// One round of one bucket: which collective and on what.
struct round_spec {
  round_op op = round_op::sum;
  buffer_element element = buffer_element::float32;  ///< sum/max only
  std::size_t length = 0;                            ///< elements of the buffer (sum/max); 0 for all_gather
  after_reduce_check check = after_reduce_check::finite;
};

/// Why a rank could not take part in a step (the code in its failure slot).
enum class failure_reason : std::uint8_t {
  none = 0,
  non_finite_gradient = 1,  ///< NaN or Inf in a layer's gradient
  codec_error = 2,          ///< an encode threw (state untouched on every rank after the step)
  layout_mismatch = 3,      ///< gradients of the wrong count or length
  requested = 4,            ///< the caller asked this rank to skip (e.g. a loss-scale overflow)
  non_finite_sum = 5,       ///< the reduced buffer holds NaN or Inf (an overflow during the sum)
  state_disagreement = 6,   ///< the ranks' exchange states differ (digest slots disagree)
};

/// A readable name of a failure reason.
inline const char* to_string(failure_reason r) noexcept {
  switch (r) {
    case failure_reason::none: return "none";
    case failure_reason::non_finite_gradient: return "non-finite gradient";
    case failure_reason::codec_error: return "codec error";
    case failure_reason::layout_mismatch: return "layout mismatch";
    case failure_reason::requested: return "skip requested";
    case failure_reason::non_finite_sum: return "non-finite sum";
    case failure_reason::state_disagreement: return "exchange states differ";
  }
  return "unknown";
}

/// One rank's failure as every rank learns it from the control block.
struct rank_failure {
  int rank = -1;
  failure_reason reason = failure_reason::none;
  std::ptrdiff_t layer = -1;  ///< index of the layer that failed, -1 when not tied to a layer
};

/// Thrown identically on every rank when a step fails under the throw policy,
/// or for reasons no policy may skip (ranks whose states disagree, gradients
/// laid out for another model). Names the first failed rank, its reason and layer.
class exchange_failure_error : public error {
 public:
  exchange_failure_error(const std::string& what, std::vector<rank_failure> failures)
      : error(what), failures_(std::move(failures)) {}
  /// Every failed rank, in rank order (non-empty).
  const std::vector<rank_failure>& failures() const noexcept { return failures_; }
  /// The first failed rank.
  int rank() const noexcept { return failures_.empty() ? -1 : failures_.front().rank; }
  failure_reason reason() const noexcept {
    return failures_.empty() ? failure_reason::none : failures_.front().reason;
  }

 private:
  std::vector<rank_failure> failures_;
};

/// The control block carried by the first round of a step: three slots per
/// rank (float32 values; in a 16-bit or int32_words first round each slot is
/// encoded in cells_per_slot cells of that type, see encode / decode). Each slot has one writer (its rank; the others write 0),
/// so its value after a sum, a max or an all-gather-then-sum is exactly what
/// that rank wrote: small integers below 2^24, exact in float32.
struct control_block {
  static constexpr std::size_t slots_per_rank = 3;
  static constexpr std::size_t failure_slot = 0;  ///< reason + 8 * (layer + 1), 0 = fine
  static constexpr std::size_t vote_slot = 1;     ///< 1 = stale (GradiVeQ eq. 7), 0 = not
  static constexpr std::size_t digest_slot = 2;   ///< 1 + (state digest mod 2^20): every rank must agree
  static constexpr std::uint32_t digest_modulus = 1u << 20;

  /// Floats of the block for `ranks` ranks.
  static constexpr std::size_t length(int ranks) noexcept { return slots_per_rank * static_cast<std::size_t>(ranks); }
  /// Encodes a failure as the slot value (layer -1 when none).
  static float failure_value(failure_reason r, std::ptrdiff_t layer) noexcept {
    return r == failure_reason::none ? 0.0f : float(static_cast<int>(r) + 8 * (layer + 1));
  }

  /// Cells one slot takes in a buffer of element `e`, so that the slot's sum
  /// (or max) with zeros stays exact: float32 1 (integers below 2^24 are
  /// exact); float16 and bfloat16 3 (8-bit digits, low first: 0..255 is exact
  /// in both); int32_words 1 (the value as a uint32 word).
  static constexpr std::size_t cells_per_slot(buffer_element e) noexcept {
    return e == buffer_element::float16 || e == buffer_element::bfloat16 ? 3 : 1;
  }
  /// Cells of the block for `ranks` ranks in a buffer of element `e`.
  static constexpr std::size_t cells(buffer_element e, int ranks) noexcept { return cells_per_slot(e) * length(ranks); }

  /// Writes the block (slot values: integers in [0, 2^24)) as cells of `e`.
  static void encode(buffer_element e, std::span<const float> block, std::span<float> out) {
    if (out.size() != block.size() * cells_per_slot(e))
      throw size_mismatch_error("exchange control block: cells", block.size() * cells_per_slot(e), out.size());
    for (std::size_t i = 0; i < block.size(); ++i) {
      const auto v = static_cast<std::uint32_t>(block[i]);
      if (e == buffer_element::float32)
        out[i] = block[i];
      else if (e == buffer_element::int32_words)
        out[i] = std::bit_cast<float>(v);
      else
        for (std::size_t d = 0; d < 3; ++d) out[3 * i + d] = float((v >> (8 * d)) & 0xFFu);
    }
  }
  /// Reads the block back from reduced cells of `e`. Cells that no exact
  /// sum of the encoded slots can give (a digit outside 0..255, a word at or
  /// above 2^24, a non-integer) throw transport_error: the buffer was not
  /// reduced as its element type. The reduced cells are the same on every
  /// rank, so every rank throws alike.
  static void decode(buffer_element e, std::span<const float> in, std::span<float> block) {
    if (in.size() != block.size() * cells_per_slot(e))
      throw size_mismatch_error("exchange control block: cells", block.size() * cells_per_slot(e), in.size());
    auto malformed = [] {
      throw transport_error("exchange: the reduced control block is malformed (was the buffer reduced as its element type?)");
    };
    for (std::size_t i = 0; i < block.size(); ++i) {
      if (e == buffer_element::float32) {
        block[i] = in[i];
      } else if (e == buffer_element::int32_words) {
        const std::uint32_t w = std::bit_cast<std::uint32_t>(in[i]);
        if (w >= (1u << 24)) malformed();
        block[i] = float(w);
      } else {
        std::uint32_t v = 0;
        for (std::size_t d = 0; d < 3; ++d) {
          const float c = in[3 * i + d];
          if (!(c >= 0.0f && c <= 255.0f) || c != float(static_cast<std::uint32_t>(c))) malformed();
          v |= static_cast<std::uint32_t>(c) << (8 * d);
        }
        block[i] = float(v);
      }
    }
  }
};

/// What a bucket codec learns at the start of a step (the same on every rank
/// apart from `rank`).
struct step_context {
  int rank = 0;
  int ranks = 1;
  std::uint64_t step = 0;  ///< steps completed (skipped steps do not count)
};

/// The bucket contract as a concept: a bucket codec holds the codec state of
/// one bucket's layers and runs their lifecycle.
///
///  - begin(ctx): fixes rounds() and round(0) from agreed state only (plan,
///    schedule phase, bases); never fails on local data, so a rank whose
///    prepare then fails still knows the shape of the first round.
///  - prepare(ctx, gradients): all local work that may fail (checks, encodes,
///    residual and momentum updates); gradients are the bucket's layers in
///    plan order. Throws on failure (the bucket layer turns that into a flag).
///  - rounds() and round(r): the rounds of this step (valid after begin;
///    round r + 1 may be described only after round r was absorbed).
///  - contribute(r, buffer) for sum/max rounds: writes this rank's summable
///    buffer (round(r).length elements); contribute(r) for all-gather rounds:
///    this rank's payload bytes.
///  - absorb(r, reduced) / absorb(r, gathered): the round's result (the
///    reduced buffer, or every rank's payload in rank order).
///  - finish(out): writes the SUM over ranks of the bucket's gradients and
///    commits the step's agreed state changes (GradiVeQ's PCA samples).
///    Absorb changes nothing that outlives the step; finish runs only when
///    every round of every bucket succeeded.
///  - abandon(): the step failed after prepare: undo what prepare changed
///    (residuals, step counters), so every rank is back where it started.
///  - vote(): this rank's stale vote for the step (GradiVeQ eq. 7), or false.
///  - digest(): a hash of the agreed state (bases, phase); equal on every rank.
///  - save_state / restore_state: the exact state, as bytes.
template <class B>
concept BucketCodec = requires(B& b, const B& cb, const step_context& ctx, std::span<const std::span<const float>> in,
                               std::size_t r, std::span<float> buffer, std::span<const float> reduced,
                               std::span<const std::vector<std::byte>> gathered,
                               std::span<const std::span<float>> out, std::span<const std::byte> state) {
  { b.begin(ctx) } -> std::same_as<void>;
  { b.prepare(ctx, in) } -> std::same_as<void>;
  { cb.rounds() } -> std::convertible_to<std::size_t>;
  { cb.round(r) } -> std::same_as<round_spec>;
  { b.contribute(r, buffer) } -> std::same_as<void>;
  { b.contribute(r) } -> std::same_as<std::vector<std::byte>>;
  { b.absorb(r, reduced) } -> std::same_as<void>;
  { b.absorb(r, gathered) } -> std::same_as<void>;
  { b.finish(out) } -> std::same_as<void>;
  { b.abandon() } -> std::same_as<void>;
  { cb.vote() } -> std::convertible_to<bool>;
  { cb.digest() } -> std::convertible_to<std::uint64_t>;
  { cb.save_state() } -> std::same_as<std::vector<std::byte>>;
  { b.restore_state(state) } -> std::same_as<void>;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
