#pragma once
/// \file common.hpp
/// What the pieces of examples/train share: the configurations, the options,
/// the layer list handed to the exchange, and the measured results. No libtorch.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <gradcomp/layout.hpp>

namespace train {

/// The configurations the program trains, in the order they run.
enum class config_id {
  msgd_single, baseline, gradiveq, gradiveq_plus, qsgd4, two_bit, topk, dgs, lgc,
  powersgd, powersgd4, fp16, bf16, homomorphic, lgc_ps
};
inline constexpr std::array<config_id, 15> all_configs = {
    config_id::msgd_single, config_id::baseline, config_id::gradiveq, config_id::gradiveq_plus, config_id::qsgd4,
    config_id::two_bit,     config_id::topk,     config_id::dgs,      config_id::lgc,           config_id::powersgd,
    config_id::powersgd4,   config_id::fp16,     config_id::bf16,     config_id::homomorphic,   config_id::lgc_ps};

std::string_view config_name(config_id c) noexcept;
std::string_view config_description(config_id c) noexcept;
std::optional<config_id> parse_config(std::string_view name) noexcept;

/// How an error-feedback codec (residual / accumulation) meets momentum:
///  - optimizer: momentum SGD on the aggregate (momentum on top of the residual);
///  - dgc / local: momentum correction before the codec (DGC, Lin et al.):
///    each worker compresses its velocity u <- m u + g, plain SGD on the aggregate;
///  - plain: no momentum at all, plain SGD at lr / (1 - m), the step size
///    momentum SGD reaches in the steady state (the residual already
///    averages gradients over time).
enum class momentum_mode { optimizer, correction, plain };
std::optional<momentum_mode> parse_momentum_mode(std::string_view s) noexcept;

/// Every option of a run (command line: main.cpp).
struct run_options {
  // Data and model.
  std::string data_dir;
  std::size_t train_samples = 0;  ///< training subset (0: all 60000)
  std::size_t eval_samples = 0;   ///< test images of the intermediate evaluations (0: all 10000)
  int width = 1;                  ///< channel multiplier of the model (--model wide: 4, 1.24M parameters)
  // Training.
  int workers = 4;
  std::size_t batch = 32;         ///< per worker; the global batch is workers * batch
  double epochs = 3;
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 5e-4;
  std::uint64_t seed = 1;
  int torch_threads = 0;          ///< per worker; 0: max(1, cores / workers)
  int evals_per_epoch = 2;
  std::size_t check_every = 50;   ///< replica checksum period in steps
  std::size_t log_every = 20;
  // GradiVeQ (seed 002, Sec. 4): warm-up, L_t sampling, L_c compressed, lambda.
  std::size_t gradiveq_warmup = 100;
  std::size_t gradiveq_lt = 25;
  std::size_t gradiveq_lc = 100;
  double gradiveq_lambda = 0.01;
  std::size_t gradiveq_plus_pool = 16;  ///< gradiveq_plus: slices pooled per sample (0: first slice)
  std::size_t gradiveq_plus_lt = 38;    ///< gradiveq_plus: L_t sampling steps per cycle (--full: 150)
  double gradiveq_plus_holdout = 0.0;   ///< gradiveq_plus: fraction of samples held out to choose d
  double gradiveq_plus_stale = 0.0;     ///< gradiveq_plus: eq. 7 stale threshold (0: fixed L_c)
  // QSGD (4 bits = 15 levels + sign, bucket size).
  int qsgd_bits = 4;
  std::size_t qsgd_bucket = 512;
  // Two-bit quantizer (seed 003): threshold, or automatic mode when <= 0.
  double two_bit_threshold = 0;
  double two_bit_scale = 1.0;     ///< automatic mode: thr = scale * mean |r + g|
  std::string two_bit_momentum = "plain";  ///< optimizer | local | plain (see momentum_mode)
  // Sparsifier with memory: percent of each layer kept.
  double topk_percent = 1.0;
  std::string topk_momentum = "plain";     ///< optimizer | dgc | plain
  // DGS (seed 001): sparsity in percent, SAMomentum momentum, secondary compression.
  double dgs_sparsity = 99.0;
  double dgs_momentum = 0.7;
  bool dgs_secondary = true;
  // LGC (seed 004): top-k percent and phase lengths.
  /// 0: the configuration's default, lgc 1% and lgc_ps 0.8% (its innovations cost more bytes per step:
  /// 0.8% keeps phase 3 above 100x, docs/results.md); the paper: 0.1 (81 values per step on this model).
  double lgc_topk_percent = 0.0;
  std::size_t lgc_phase1 = 100;  ///< dense warm-up steps
  std::size_t lgc_phase2 = 100;  ///< top-k steps while the autoencoder trains
  std::string lgc_momentum = "plain";  ///< dgc (the paper) | plain | phased
  bool lgc_feedback = false;  ///< LGC: feed the autoencoder's reconstruction error back (beyond the paper)
  std::string lgc_optimizer = "adam";  ///< LGC: the autoencoder's optimiser, sgd (the paper: lr 1e-3) or adam
  double lgc_ae_lr = 1e-3;            ///< LGC: the autoencoder's learning rate
  bool lgc_feedback_aggregate = false;  ///< LGC ring: feed the aggregate's reconstruction error back instead
  double lgc_feedback_max_error = 1e30;  ///< LGC: ... only on steps with a relative error at most this
  std::size_t lgc_retrain_period = 0;    ///< LGC ring: retrain in phase 3, broadcast every this many steps (0: frozen)
  // PowerSGD (Vogels et al. 2019): uncompressed start period in percent of the run's steps.
  double powersgd_start_percent = 5.0;
  std::size_t powersgd_min_elements = 144;  ///< smaller matrices dense (144: the 16x9 stem is compressed)
  // Homomorphic quantizer: lane width (0: from N) and values per agreed scale.
  unsigned homomorphic_bits = 0;
  std::size_t homomorphic_block = 512;
};

/// One gradient tensor of the model, as the exchange sees it.
struct layer_desc {
  std::string name;
  gradcomp::layer_shape shape;  ///< conv: [F, D, H, W] framework layout; dense otherwise
  int dims = 1;                 ///< tensor rank: 4 conv weight, 2 linear weight, 1 bias / norm
};

/// A point of a training curve.
struct curve_point {
  std::size_t step = 0;
  double epoch = 0;
  double train_loss = 0;          ///< mean over the workers since the previous point
  double test_accuracy = 0;       ///< percent
  std::size_t test_samples = 0;
  double cumulative_bytes = 0;    ///< bytes sent per worker on the wire since the start
  double wall_seconds = 0;
};

/// Byte accounting of the codecs, summed over the steps of one worker.
struct codec_counters {
  std::uint64_t raw_bytes = 0;             ///< float32 size of every gradient element exchanged
  std::uint64_t encoded_bytes = 0;         ///< payload bytes the encoders produced for them
  std::uint64_t target_raw_bytes = 0;      ///< the same, restricted to the layers the codec targets
  std::uint64_t target_encoded_bytes = 0;
  std::uint64_t received_bytes = 0;        ///< parameter-server replies received (downlink)
  codec_counters& operator+=(const codec_counters& d) noexcept {
    raw_bytes += d.raw_bytes;
    encoded_bytes += d.encoded_bytes;
    target_raw_bytes += d.target_raw_bytes;
    target_encoded_bytes += d.target_encoded_bytes;
    received_bytes += d.received_bytes;
    return *this;
  }
  double ratio() const noexcept { return encoded_bytes ? double(raw_bytes) / double(encoded_bytes) : 0.0; }
  double target_ratio() const noexcept {
    return target_encoded_bytes ? double(target_raw_bytes) / double(target_encoded_bytes) : 0.0;
  }
};

/// The measured outcome of one configuration.
struct run_result {
  config_id config = config_id::baseline;
  int workers = 1;
  std::size_t steps = 0;
  std::size_t global_batch = 0;
  double final_accuracy = 0;       ///< percent, full test set
  double wire_bytes_per_step = 0;  ///< bytes sent per worker per step (mean over workers)
  double recv_bytes_per_step = 0;  ///< downlink of a parameter server per worker per step
  codec_counters counters;         ///< worker 0
  std::string target_label;        ///< which layers "target" means ("conv", "all", ...)
  double aggregation_ms = 0;       ///< mean per step, worker 0
  double compute_ms = 0;           ///< forward + backward per step, worker 0
  double wall_seconds = 0;
  std::vector<curve_point> curve;
  std::string note;
  /// Further RESULT lines of the configuration: name (without the config
  /// prefix) and value in x (LGC: phase3_ratio).
  std::vector<std::pair<std::string, double>> extra_ratios;
};

}  // namespace train
