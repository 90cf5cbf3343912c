#pragma once
/// \file gradiveq/schedule.hpp
/// GradiVeQ (seed 002, Sec. 3 and Fig. 6): the warm-up / sampling /
/// compressed iteration schedule and the eq. 7 majority vote that ends a
/// compressed phase early. Part of <gradcomp/gradiveq.hpp>.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/gradiveq/payload.hpp>
#include <gradcomp/gradiveq/saved_options.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

GRADCOMP_ABI_NAMESPACE_BEGIN
/// A node's vote for "the basis is stale": its relative eq. 7 loss exceeds the threshold.
inline bool stale_vote(const local_loss_value& v, double threshold) noexcept { return v.relative() > threshold; }

/// The majority rule of Sec. 3 (L_c): more than half of the `nodes` voted stale.
inline bool majority_stale(std::size_t stale_nodes, std::size_t nodes) noexcept { return 2 * stale_nodes > nodes; }

GRADCOMP_ABI_NAMESPACE_END
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
  /// Beyond the paper: error feedback. A compressed iteration leaves out the
  /// part of each node's gradient outside span(U_d) (eq. 7's numerator); with
  /// this set the whole-model exchange keeps that part per node and the next
  /// sampling iteration sends it with its own gradient (QSGD is unbiased), so
  /// nothing is dropped, only delayed. The payloads keep their size; the
  /// extra work is a vector add per compressed iteration and one decode
  /// (eq. 5) per sampling iteration that follows compressed ones
  /// (exchange/gradiveq_bucket.hpp).
  bool error_feedback = false;
  /// Beyond the paper: from the second cycle on, a cycle's L_t sampling
  /// iterations are spread evenly over its C = L_t + L_c iterations
  /// (iteration p of the cycle, 0-based, samples when
  /// floor((p+1) L_t / C) > floor(p L_t / C); the last one always does) and
  /// the bases are refitted at the cycle's end on those L_t samples. The
  /// first cycle stays L_t then L_c (there is no basis before its fit). The
  /// same iterations sample and compress as without it, so the bytes are
  /// the same; with error_feedback the residual is sent every
  /// C / L_t iterations or so instead of once a cycle. Needs a fixed L_c
  /// (no stale_threshold, no adaptive_cycles).
  bool spread_sampling = false;
  /// Beyond the paper, with error_feedback: a QSGD sampling iteration also
  /// keeps its own rounding, e_{t+1} = (g_t + e_t) - Q(g_t + e_t), which the
  /// next iteration sends (a compressed one its part in span(U_d), eq. 3 of
  /// g + e; the rest at the next sampling iteration), so that nothing the
  /// sampler rounds away is lost either. Bounded only with the max-norm
  /// scale (plan_options::qsgd.norm = qsgd_norm::max) and at least 2 levels
  /// (qsgd_bits 4 or 8): then |e|_inf <= |x|_inf / s for the s levels, so
  /// |e|_inf <= max |g|_inf / (s - 1) for ever; with the l2 scale one
  /// rounding can exceed the vector it rounds and the memory grows
  /// (docs/codecs.md). Needs sampling = qsgd.
  bool sampling_error_feedback = false;
};

/// What the caller must do after an iteration (returned by advance()).
struct gradiveq_step {
  gradiveq_phase next = gradiveq_phase::warmup;  ///< phase of the next iteration
  bool fit_basis = false;    ///< the L_t samples are complete: call fit() on every layer's codec now
  bool ended_early = false;  ///< L_c ended early on the eq. 7 majority vote
};

GRADCOMP_ABI_NAMESPACE_BEGIN
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
    const bool fixed_lc = !opt_.adaptive_cycles && opt_.stale_threshold == std::numeric_limits<double>::infinity();
    if (opt_.spread_sampling && !fixed_lc)
      throw invalid_argument_error(
          "gradiveq_schedule: spread_sampling needs a fixed L_c (no stale_threshold, no adaptive_cycles)");
    if (opt_.sampling_error_feedback && !opt_.error_feedback)
      throw invalid_argument_error("gradiveq_schedule: sampling_error_feedback needs error_feedback");
    if (opt_.sampling_error_feedback && opt_.sampling != sampling_aggregation::qsgd)
      throw invalid_argument_error("gradiveq_schedule: sampling_error_feedback needs QSGD sampling (dense sampling rounds nothing)");
    if (opt_.sampling_error_feedback && opt_.qsgd_bits < 4)
      throw invalid_argument_error(
          "gradiveq_schedule: sampling_error_feedback needs qsgd_bits 4 or 8 (at least 2 levels: with one the fed-back "
          "rounding is not bounded)");
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
  /// Iterations already completed in the current phase (in a spread cycle:
  /// in the current cycle).
  std::size_t phase_position() const noexcept { return position_; }
  /// True from the second cycle on with spread_sampling: phases alternate
  /// within a cycle of L_t + L_c iterations.
  bool spread() const noexcept { return spreads_in(cycle_); }
  /// L_c of the current (or next) compressed phase; below L_c only with adaptive_cycles.
  std::size_t compressed_length() const noexcept { return current_lc_; }
  /// True when sampling iterations should be QSGD-quantized.
  bool sampling_quantized() const noexcept { return opt_.sampling == sampling_aggregation::qsgd; }
  /// This node's eq. 7 vote under the configured threshold.
  bool vote(const local_loss_value& v) const noexcept { return stale_vote(v, opt_.stale_threshold); }

  /// Ends the current iteration without a vote. The step says whether to
  /// fit the bases now (fit_basis): not to be ignored.
  [[nodiscard]] gradiveq_step advance() { return step(false); }

  /// Ends the current iteration; in a compressed iteration `stale_nodes` of
  /// `nodes` voted stale (the same counts on every node). Ignored otherwise.
  [[nodiscard]] gradiveq_step advance(std::size_t stale_nodes, std::size_t nodes) {
    if (nodes == 0 || stale_nodes > nodes)
      throw invalid_argument_error("gradiveq_schedule::advance: need 0 <= stale_nodes <= nodes, nodes >= 1");
    return step(phase_ == gradiveq_phase::compressed && majority_stale(stale_nodes, nodes));
  }

  /// The schedule's counters, in the wire state container (codec id control).
  [[nodiscard]] std::vector<std::byte> save_state() const {
    return wire::serialize_state(wire::codec_id::control, 0, [&](wire::writer& w) {
      detail::write_saved_options(w, [&](auto visit) { for_each_option(visit); });
      w.put<std::uint8_t>(static_cast<std::uint8_t>(phase_));
      w.put<std::uint64_t>(iteration_);
      w.put<std::uint64_t>(cycle_);
      w.put<std::uint64_t>(position_);
      w.put<std::uint64_t>(current_lc_);
      w.put<std::uint64_t>(stale_run_);
    });
  }

  /// Restores a save_state() of an identically configured schedule; a state
  /// saved with another value of an option throws option_mismatch_error
  /// naming it (a state_error). Strong guarantee.
  void restore_state(std::span<const std::byte> bytes) {
    using wire::reader;
    wire::header h;
    reader r = wire::parse_state(bytes, wire::codec_id::control, &h);
    reader::check(h.element_count == 0, "gradiveq_schedule state: element count must be 0");
    detail::expect_saved_options(r, [&](auto visit) { for_each_option(visit); }, "gradiveq_schedule::restore_state");
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
    const bool spread = spreads_in(cycle);
    const std::uint64_t limit = spread                           ? cycle_length()
                                : ph == gradiveq_phase::warmup   ? opt_.warmup_iterations
                                : ph == gradiveq_phase::sampling ? opt_.sampling_iterations
                                                                 : lc;
    reader::check(position < limit, "gradiveq_schedule state: position past its phase");
    reader::check(!spread || spread_phase(position) == ph,
                  "gradiveq_schedule state: phase and cycle position disagree");
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
  bool spreads_in(std::uint64_t cycle) const noexcept { return opt_.spread_sampling && cycle >= 2; }
  std::uint64_t cycle_length() const noexcept {
    return std::uint64_t{opt_.sampling_iterations} + std::uint64_t{opt_.compressed_iterations};
  }
  /// The phase of iteration p of a spread cycle (Bresenham: L_t of C sample).
  gradiveq_phase spread_phase(std::uint64_t p) const noexcept {
    const std::uint64_t c = cycle_length(), t = opt_.sampling_iterations;
    return (p + 1) * t / c > p * t / c ? gradiveq_phase::sampling : gradiveq_phase::compressed;
  }

  gradiveq_step step(bool majority) {
    gradiveq_step s;
    ++iteration_;
    ++position_;
    if (spread()) {  // the cycle ends after its last (sampling) iteration: refit, start the next
      if (position_ >= cycle_length()) {
        s.fit_basis = true;
        ++cycle_;
        position_ = 0;
      }
      phase_ = spread_phase(position_);
      s.next = phase_;
      return s;
    }
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
          if (spread()) phase_ = spread_phase(0);  // the first cycle ended: spread from here on
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

  // The options a saved state must share, in the state's order (visit(name, wire scalar)).
  template <class Visit>
  void for_each_option(Visit&& visit) const {
    visit("warmup_iterations", std::uint64_t{opt_.warmup_iterations});
    visit("sampling_iterations", std::uint64_t{opt_.sampling_iterations});
    visit("compressed_iterations", std::uint64_t{opt_.compressed_iterations});
    visit("sampling", static_cast<std::uint8_t>(opt_.sampling));
    visit("qsgd_bits", std::uint32_t{opt_.qsgd_bits});
    visit("stale_threshold", opt_.stale_threshold);
    visit("patience", std::uint64_t{opt_.patience});
    visit("adaptive_cycles", static_cast<std::uint8_t>(opt_.adaptive_cycles ? 1 : 0));
    visit("min_compressed_iterations", std::uint64_t{opt_.min_compressed_iterations});
    visit("error_feedback", static_cast<std::uint8_t>(opt_.error_feedback ? 1 : 0));
    visit("spread_sampling", static_cast<std::uint8_t>(opt_.spread_sampling ? 1 : 0));
    visit("sampling_error_feedback", static_cast<std::uint8_t>(opt_.sampling_error_feedback ? 1 : 0));
  }

  gradiveq_schedule_options opt_;
  gradiveq_phase phase_ = gradiveq_phase::warmup;
  std::uint64_t iteration_ = 0;
  std::uint64_t cycle_ = 0;
  std::size_t position_ = 0;
  std::size_t current_lc_ = 0;
  std::size_t stale_run_ = 0;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
