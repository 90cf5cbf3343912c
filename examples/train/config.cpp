// The configurations of the demo: names, descriptions, parsing (common.hpp,
// exchange.hpp).
#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include <gradcomp/errors.hpp>
#include <gradcomp/exchange/lgc_bucket.hpp>

#include "common.hpp"
#include "exchange.hpp"
#include "plan.hpp"

namespace train {

namespace gx = gradcomp::exchange;

namespace {

/// The model for the exchange. A linear weight (tensor rank 2, main.cpp hands it as
/// layer_shape::matrix) is a rows x cols matrix for PowerSGD (add_matrix) and a plain
/// dense tensor of its length for every other codec.
gx::model_description describe(std::span<const layer_desc> layers, bool matrices) {
  gx::model_description model;
  for (const auto& l : layers) {
    if (l.shape.kind == gradcomp::layer_kind::conv)
      model.add_conv(l.name, l.shape.filters, l.shape.depth, l.shape.height, l.shape.width);
    else if (l.dims == 2 && matrices && l.shape.filters * l.shape.depth == l.shape.size())
      model.add_matrix(l.name, l.shape.filters, l.shape.depth);
    else
      model.add_dense(l.name, l.shape.size(), std::size_t(l.dims));
  }
  return model;
}

/// LGC's top-k share in percent: the option, or the configuration's default when it is 0
/// (lgc 1%; lgc_ps 0.8%, because its per-rank innovations make phase 3 cost more bytes:
/// at 1% its phase-3 ratio on `--full` is 90x, at 0.8% 107x; docs/results.md, issue 24).
double lgc_topk_percent(const run_options& o, config_id c) {
  if (o.lgc_topk_percent > 0) return o.lgc_topk_percent;
  return c == config_id::lgc_ps ? 0.8 : 1.0;
}

}  // namespace


/// The plan of a synchronous configuration: which codec each layer gets (the
/// weight tensors, or the conv weights, compressed; 1-D tensors dense) and
/// every codec's options from the command line.
gx::plan plan_for(config_id c, const run_options& o, std::span<const layer_desc> layers, std::size_t total_steps) {
  const bool powersgd = c == config_id::powersgd || c == config_id::powersgd4;
  const gx::model_description model = describe(layers, powersgd);
  gx::plan_options p;
  p.seed = o.seed;
  p.rules.small_below = 0;  // only tensor rank decides: biases and norm weights dense
  auto weights = [&](gx::codec_kind k) { p.rules.conv = p.rules.fallback = k; };
  p.qsgd.bits = unsigned(o.qsgd_bits);
  p.qsgd.levels = 0;
  p.qsgd.bucket_size = o.qsgd_bucket;
  switch (c) {
    case config_id::gradiveq:
    case config_id::gradiveq_plus: {
      const bool plus = c == config_id::gradiveq_plus;
      p.rules.conv = gx::codec_kind::gradiveq;
      p.gradiveq.lambda = o.gradiveq_lambda;
      auto& s = p.gradiveq_schedule;
      s.warmup_iterations = o.gradiveq_warmup;
      s.sampling_iterations = plus ? o.gradiveq_plus_lt : o.gradiveq_lt;
      s.compressed_iterations = o.gradiveq_lc;
      s.sampling = gradcomp::sampling_aggregation::qsgd;  // Sec. 4: L_t steps QSGD 4-bit
      s.qsgd_bits = 4;
      if (plus && o.gradiveq_plus_pool > 0) {  // beyond the paper, all linear (README)
        p.gradiveq.source = gradcomp::basis_source::pooled;
        p.gradiveq.pool_slices = o.gradiveq_plus_pool;
      }
      if (plus) p.gradiveq.holdout_fraction = o.gradiveq_plus_holdout;
      if (plus && o.gradiveq_plus_stale > 0) {
        s.stale_threshold = o.gradiveq_plus_stale;
        s.patience = 2;
        s.adaptive_cycles = true;
        s.min_compressed_iterations = std::max<std::size_t>(1, o.gradiveq_lc / 4);
      }
      break;
    }
    case config_id::qsgd4: weights(gx::codec_kind::qsgd); break;
    case config_id::two_bit:
      weights(gx::codec_kind::two_bit);
      p.two_bit = o.two_bit_threshold > 0 ? gradcomp::two_bit_options::fixed(float(o.two_bit_threshold))
                                          : gradcomp::two_bit_options::automatic(float(o.two_bit_scale));
      break;
    case config_id::topk:
      weights(gx::codec_kind::top_k);
      p.top_k.ratio_percent = o.topk_percent;
      p.top_k.mode = gradcomp::threshold_mode::exact;
      p.top_k.scale = 1.0f;  // residual in gradient units; the optimiser applies lr
      p.top_k.dgc_momentum = parse_momentum_mode(o.topk_momentum) == momentum_mode::correction;
      p.top_k.momentum = float(o.momentum);
      break;
    case config_id::lgc:  // seed 004 Sec. V-VI: top-k alpha% with DGC momentum, three phases
    case config_id::lgc_ps: {  // the parameter-server form (Sec. IV-A, Alg. 1) in the same plan
      p.rules.conv = p.rules.small = p.rules.fallback =
          c == config_id::lgc ? gx::codec_kind::lgc_ring : gx::codec_kind::lgc_ps;
      p.lgc_factory = gx::lgc_bucket_factory<policy>();
      p.lgc.alpha_percent = lgc_topk_percent(o, c);
      p.lgc.momentum = o.lgc_momentum == "phased" || parse_momentum_mode(o.lgc_momentum) == momentum_mode::plain
                           ? 0.0f
                           : float(o.momentum);
      p.lgc.schedule = {o.lgc_phase1, o.lgc_phase2};
      p.lgc.seed = o.seed;
      p.lgc.feedback_reconstruction_error = o.lgc_feedback;
      p.lgc.feedback_aggregate_error = o.lgc_feedback_aggregate;
      p.lgc.optimizer = o.lgc_optimizer == "adam" ? gradcomp::lgc_optimizer::adam : gradcomp::lgc_optimizer::sgd;
      p.lgc.learning_rate = float(o.lgc_ae_lr);
      if (o.lgc_feedback_max_error < 1e30) p.lgc.feedback_max_error = float(o.lgc_feedback_max_error);
      p.lgc.retrain_period = o.lgc_retrain_period;
      // The autoencoder window: this small model's top-k vector, a multiple of 2^depth, at most 1024.
      const gx::plan probe(model, p);
      const gx::lgc_bucket_grouping g(probe, probe.buckets().front());
      std::size_t mu = 0;
      for (std::size_t j = 0; j < g.coded.size(); ++j)
        mu += gradcomp::sparse_selection_count(g.sizes[g.dense.empty() ? j : j + 1], p.lgc.alpha_percent);
      const std::size_t r = p.lgc.architecture.reduction();
      p.lgc.window = std::clamp<std::size_t>(mu / r * r, r, 1024);
      break;
    }
    case config_id::powersgd:
    case config_id::powersgd4:  // Vogels et al. 2019: rank r, error feedback, warm-started Q
      weights(gx::codec_kind::powersgd);  // conv C_out x (C_in k k), fc out x in; 1-D dense
      p.powersgd.rank = c == config_id::powersgd4 ? 4 : 2;
      p.powersgd.error_feedback = p.powersgd.warm_start = true;
      p.powersgd.seed = o.seed;
      p.powersgd.start_iter = std::size_t(std::llround(double(total_steps) * o.powersgd_start_percent / 100.0));
      p.powersgd.min_elements = o.powersgd_min_elements;
      break;
    case config_id::fp16: weights(gx::codec_kind::fp16); break;
    case config_id::bf16: weights(gx::codec_kind::bf16); break;
    case config_id::homomorphic:
      weights(gx::codec_kind::homomorphic);
      p.homomorphic = {.bits = o.homomorphic_bits, .block_size = o.homomorphic_block, .seed = o.seed};
      break;
    default: weights(gx::codec_kind::dense); break;  // baseline
  }
  return gx::plan(std::move(model), std::move(p));
}


std::string_view config_name(config_id c) noexcept {
  switch (c) {
    case config_id::msgd_single: return "msgd_single";
    case config_id::baseline: return "baseline";
    case config_id::gradiveq: return "gradiveq";
    case config_id::gradiveq_plus: return "gradiveq_plus";
    case config_id::qsgd4: return "qsgd4";
    case config_id::two_bit: return "two_bit";
    case config_id::topk: return "topk";
    case config_id::dgs: return "dgs";
    case config_id::lgc: return "lgc";
    case config_id::lgc_ps: return "lgc_ps";
    case config_id::powersgd: return "powersgd";
    case config_id::powersgd4: return "powersgd4";
    case config_id::fp16: return "fp16";
    case config_id::bf16: return "bf16";
    case config_id::homomorphic: return "homomorphic";
  }
  return "?";
}

std::string_view config_description(config_id c) noexcept {
  switch (c) {
    case config_id::msgd_single: return "one worker, global batch, momentum SGD (seed 001's reference)";
    case config_id::baseline: return "N workers, uncompressed float32 ring all-reduce";
    case config_id::gradiveq: return "GradiVeQ on conv layers, compressed-domain ring, paper recipe (seed 002)";
    case config_id::gradiveq_plus: return "GradiVeQ with the header's best linear improvements";
    case config_id::qsgd4: return "QSGD 4-bit, decode-and-sum";
    case config_id::two_bit: return "two-bit quantizer with residual, automatic threshold (seed 003)";
    case config_id::topk: return "top-R% sparsifier with memory, synchronous (seed 001 Alg. 1)";
    case config_id::dgs: return "DGS: asynchronous parameter server, SAMomentum, 99% sparsity, secondary compression";
    case config_id::lgc: return "LGC ring form: top-k + online autoencoder, averaged codes (seed 004)";
    case config_id::lgc_ps:
      return "LGC parameter-server form: common code + innovations, one decoder per worker (seed 004, Alg. 1)";
    case config_id::powersgd: return "PowerSGD rank 2, error feedback, warm start (Vogels et al. 2019)";
    case config_id::powersgd4: return "PowerSGD rank 4, error feedback, warm start (Vogels et al. 2019)";
    case config_id::fp16: return "IEEE float16 all-reduce (the 16-bit baseline)";
    case config_id::bf16: return "bfloat16 all-reduce";
    case config_id::homomorphic: return "agreed-scale integer quantizer, summed as int32 words";
  }
  return "?";
}

std::optional<momentum_mode> parse_momentum_mode(std::string_view s) noexcept {
  if (s == "optimizer") return momentum_mode::optimizer;
  if (s == "dgc" || s == "local" || s == "correction") return momentum_mode::correction;
  if (s == "plain") return momentum_mode::plain;
  return std::nullopt;
}

std::optional<config_id> parse_config(std::string_view name) noexcept {
  for (auto c : all_configs)
    if (config_name(c) == name) return c;
  return std::nullopt;
}

std::string config_unavailable(config_id c) {
  for (auto k : all_configs)
    if (k == c) return {};  // every configuration builds wherever the demo builds (libtorch, zlib)
  return "unknown configuration";
}

void check_option_ranges(config_id c, const run_options& o) {
  using gradcomp::invalid_argument_error;
  if (!parse_momentum_mode(o.two_bit_momentum) || !parse_momentum_mode(o.topk_momentum) ||
      (!parse_momentum_mode(o.lgc_momentum) && o.lgc_momentum != "phased"))
    throw invalid_argument_error("momentum modes are optimizer, dgc (or local) and plain");
  if (parse_momentum_mode(o.lgc_momentum) == momentum_mode::optimizer)
    throw invalid_argument_error("lgc: --lgc-momentum is dgc, plain or phased (the node returns a corrected update)");
  if (c == config_id::two_bit && !std::isfinite(o.two_bit_threshold))
    throw invalid_argument_error("two_bit: threshold must be finite");
  if (c == config_id::qsgd4 && o.qsgd_bits != 2 && o.qsgd_bits != 4 && o.qsgd_bits != 8)
    throw invalid_argument_error("qsgd4: --qsgd-bits must be 2, 4 or 8, got " + std::to_string(o.qsgd_bits));
  if (c == config_id::topk && !(o.topk_percent > 0 && o.topk_percent <= 100))
    throw invalid_argument_error("topk: --topk-percent must be in (0, 100], got " + std::to_string(o.topk_percent));
  const bool lgc = c == config_id::lgc || c == config_id::lgc_ps;
  if (lgc && !(o.lgc_topk_percent >= 0 && o.lgc_topk_percent <= 100))
    throw invalid_argument_error("lgc: --lgc-topk-percent must be in [0, 100] (0: the configuration's default)");
  if (lgc && o.lgc_optimizer != "sgd" && o.lgc_optimizer != "adam")
    throw invalid_argument_error("lgc: --lgc-optimizer is sgd or adam");
  if (lgc && !(o.lgc_feedback_max_error >= 0))
    throw invalid_argument_error("lgc: --lgc-feedback-max-error must be >= 0");
  if (c == config_id::lgc_ps && (o.lgc_retrain_period > 0 || o.lgc_feedback || o.lgc_feedback_aggregate))
    throw invalid_argument_error(
        "lgc_ps: --lgc-retrain-period and --lgc-feedback(-aggregate) are implemented for the ring form (lgc) only");
  if (c == config_id::dgs && !(o.dgs_sparsity >= 0 && o.dgs_sparsity < 100))
    throw invalid_argument_error("dgs: --dgs-sparsity must be in [0, 100), got " + std::to_string(o.dgs_sparsity));
  if (c == config_id::dgs && !(o.dgs_momentum > 0 && o.dgs_momentum < 1))
    throw invalid_argument_error("dgs: --dgs-momentum must be in (0, 1), got " + std::to_string(o.dgs_momentum));
  if ((c == config_id::powersgd || c == config_id::powersgd4) &&
      !(o.powersgd_start_percent >= 0 && o.powersgd_start_percent <= 100))
    throw invalid_argument_error("powersgd: --powersgd-start-percent must be in [0, 100]");
}

}  // namespace train
