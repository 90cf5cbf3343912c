#pragma once
/// \file exchange.hpp
/// The gradient exchange of one worker: gradcomp's whole-model exchange
/// (model_exchange with a plan per configuration, exchange.cpp; the DGS
/// sibling, dgs.cpp) behind one small interface the libtorch side calls once
/// per step. No libtorch here (gradcomp stays free of it).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "transport.hpp"

namespace train {

/// What exchange() leaves in the spans.
enum class update_kind {
  gradient,     ///< the aggregated (mean) gradient: written to .grad, then momentum SGD
  model,        ///< the new parameters themselves (asynchronous DGS: the server's values)
};

/// One worker's exchange. exchange() is collective: every worker calls it
/// once per step with its layers in the same order.
class exchanger {
 public:
  virtual ~exchanger() = default;
  virtual update_kind kind() const noexcept { return update_kind::gradient; }
  /// `layers[i]` holds layer i's local gradient (framework layout) on entry
  /// and the aggregate (or the model delta, kind()) on return. `lr` is the
  /// learning rate of this step (DGS folds it into SAMomentum).
  virtual void exchange(std::size_t step, double lr, std::span<const std::span<float>> layers) = 0;
  /// Short name of the current phase for the progress line ("warm-up", "L_t", ...), or "".
  virtual std::string phase() const { return {}; }
  /// True when the codec applies momentum itself (DGC momentum correction):
  /// the optimiser then takes plain SGD steps on the aggregate.
  virtual bool momentum_in_codec() const noexcept { return false; }
  /// Factor on the learning rate of the optimiser (plain SGD at lr / (1 - m)).
  virtual double lr_multiplier() const noexcept { return 1.0; }
  /// False for asynchronous exchanges: no barrier before them, and the
  /// replicas differ until finish().
  virtual bool synchronous() const noexcept { return true; }
  /// Called once after the last step, collectively over the workers' `ctl`.
  /// Returns true if it wrote a final model into `model_out` (DGS: every
  /// worker pulls the server's final model, so the replicas agree again).
  virtual bool finish(counted_transport& ctl, std::span<const std::span<float>> model_out) {
    (void)ctl;
    (void)model_out;
    return false;
  }
  /// One line for the table's note (phase statistics, bases), or "".
  virtual std::string summary() const { return {}; }
  /// Further RESULT ratios (name without the configuration prefix, value in x).
  virtual std::vector<std::pair<std::string, double>> extra_ratios() const { return {}; }
  /// Which layers the codec targets, for the "target ratio" column.
  virtual std::string target_label() const { return "all"; }
  codec_counters counters;
};

/// Why `c` cannot run in this build ("" if it can): a header that has not
/// landed, or an option combination that makes no sense.
std::string config_unavailable(config_id c);

/// The exchange of configuration `c` for the worker behind `data` (counted
/// transport, every byte it moves is a measured byte).
/// Throws gradcomp::invalid_argument_error for invalid codec parameters.
/// `initial` holds the initial parameters, per layer (DGS keeps the model).
std::unique_ptr<exchanger> make_exchanger(config_id c, const run_options& options, counted_transport& data,
                                          std::span<const layer_desc> layers, std::span<const std::vector<float>> initial,
                                          std::size_t total_steps);

/// The DGS worker of `data` (dgs.cpp; make_exchanger calls it).
std::unique_ptr<exchanger> make_dgs_exchanger(counted_transport& data, std::span<const layer_desc> layers,
                                              const run_options& options, std::span<const std::vector<float>> initial);

/// True if configuration `c` needs a parameter-server rank (rank 0, workers 1..N).
bool uses_parameter_server(config_id c) noexcept;

/// The DGS server (rank 0 of `t`, workers are ranks 1..N): serves until every
/// worker has left. Returns a one-line summary of its counters.
std::string run_dgs_server(counted_transport& t, const run_options& options, std::span<const layer_desc> layers,
                           std::span<const std::vector<float>> initial, std::size_t total_steps);

/// The command line's ranges and momentum modes for configuration `c`
/// (config.cpp); throws gradcomp::invalid_argument_error.
void check_option_ranges(config_id c, const run_options& options);

/// Exactly the check make_exchanger does on the options, without a transport,
/// so bad parameters are reported before any training starts.
void validate_codec_options(config_id c, const run_options& options, std::span<const layer_desc> layers);

// ---------------------------------------------------------------------------
// Small collectives over the control transport (not counted as wire bytes).

/// Every rank's `mine`, indexed by rank, passed round the ring.
std::vector<std::vector<std::byte>> allgather_bytes(counted_transport& t, std::vector<std::byte> mine, int tag);

/// Every rank's value of a small vector of doubles.
std::vector<std::vector<double>> allgather_doubles(counted_transport& t, std::span<const double> mine, int tag);

/// Blocks until every rank has called it.
void barrier(counted_transport& t, int tag);

}  // namespace train
