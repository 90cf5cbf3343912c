// The gradient exchange of each configuration (see exchange.hpp): a plan of
// gradcomp's whole-model exchange (gradcomp/model_exchange.hpp) per
// configuration, and what is the demo's own around it: its momentum modes and
// its byte columns.
#include "exchange.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/model_exchange.hpp>
#include <gradcomp/protocols/lgc.hpp>
#include <gradcomp/parameter_server.hpp>
#include <gradcomp/presets/parameter_server_rules.hpp>
#include <gradcomp/samomentum.hpp>

namespace train {

using policy = gradcomp::execution::simd;  // falls back to seq without xsimd
namespace gx = gradcomp::exchange;

namespace {

bool is_conv(const layer_desc& l) { return l.shape.kind == gradcomp::layer_kind::conv; }

gradcomp::two_bit_options two_bit_config(const run_options& o) {
  return o.two_bit_threshold > 0 ? gradcomp::two_bit_options::fixed(float(o.two_bit_threshold))
                                 : gradcomp::two_bit_options::automatic(float(o.two_bit_scale));
}

/// The plan of a synchronous configuration: which codec each layer gets (the
/// weight tensors, or the conv weights, compressed; 1-D tensors dense) and
/// every codec's options from the command line.
gx::plan plan_for(config_id c, const run_options& o, std::span<const layer_desc> layers) {
  gx::model_description model;
  for (const auto& l : layers) model.add(l.name, l.shape, std::size_t(l.dims));
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
      p.two_bit = two_bit_config(o);
      break;
    case config_id::topk:
      weights(gx::codec_kind::top_k);
      p.top_k.ratio_percent = o.topk_percent;
      p.top_k.mode = gradcomp::threshold_mode::exact;
      p.top_k.scale = 1.0f;  // residual in gradient units; the optimiser applies lr
      p.top_k.dgc_momentum = parse_momentum_mode(o.topk_momentum) == momentum_mode::correction;
      p.top_k.momentum = float(o.momentum);
      break;
    default: weights(gx::codec_kind::dense); break;  // baseline
  }
  return gx::plan(std::move(model), std::move(p));
}

/// A synchronous configuration: one model_exchange step per training step.
/// Momentum modes of the error-feedback codecs (common.hpp): `pre` folds the
/// gradient of a compressed layer into a local velocity before the exchange
/// (two-bit "local"), `post` gives the dense layers that velocity after it
/// (the optimiser has no momentum then), `lr_mult` is plain SGD at lr / (1 - m).
class sync_exchanger final : public exchanger {
 public:
  sync_exchanger(counted_transport& t, gx::plan plan, config_id c, const run_options& o)
      : ex_(t, std::move(plan), {.on_failure = gx::failure_policy::throw_error}), config_(c) {
    const float m = float(o.momentum);
    const auto mode = parse_momentum_mode(c == config_id::two_bit ? o.two_bit_momentum : o.topk_momentum);
    if (c == config_id::two_bit || c == config_id::topk) {
      if (mode == momentum_mode::plain) lr_mult_ = 1.0 / (1.0 - o.momentum);
      if (mode == momentum_mode::correction) post_ = m;
      if (mode == momentum_mode::correction && c == config_id::two_bit) pre_ = m;
    }
    velocity_.resize(layout().model().size());
  }
  bool momentum_in_codec() const noexcept override { return post_ > 0.0f || lr_mult_ != 1.0; }
  double lr_multiplier() const noexcept override { return lr_mult_; }
  std::string target_label() const override {
    if (config_ == config_id::baseline) return "all";
    return layout().uses_gradiveq() ? "conv" : "weights";
  }

  void exchange(std::size_t, double, std::span<const std::span<float>> layers) override {
    const bool was_compressed = gq() && ex_.buckets().schedule().phase() == gradcomp::gradiveq_phase::compressed;
    const std::size_t position = gq() ? ex_.buckets().schedule().phase_position() : 0;
    const std::size_t lc = gq() ? ex_.buckets().schedule().compressed_length() : 0;
    fold(layers, pre_, false);
    const gx::step_stats& st = ex_.step(layers);
    fold(layers, post_, true);
    for (std::size_t b = 0; b < layout().buckets().size(); ++b)
      for (std::size_t i : layout().buckets()[b].layers) {
        const std::size_t n = layout().model()[i].shape.size();
        const bool target = config_ == config_id::baseline || layout().kind(i) != gx::codec_kind::dense;
        count(counters, n, st.layer_bytes[i], target);
        if (st.bucket_phase[b] == "gradiveq:compressed") count(compressed_, n, st.layer_bytes[i], true);
      }
    if (was_compressed) {
      ++compressed_steps_;
      relative_loss_sum_ += ex_.buckets().gradiveq_loss().relative();
      const auto& s = ex_.buckets().schedule();
      if (s.phase() != gradcomp::gradiveq_phase::compressed && position + 1 < lc)
        ++early_ends_;
    }
  }

  std::string phase() const override {
    if (!gq()) return {};
    const auto& s = ex_.buckets().schedule();
    switch (s.phase()) {
      case gradcomp::gradiveq_phase::warmup: return "GradiVeQ warm-up";
      case gradcomp::gradiveq_phase::sampling: return "GradiVeQ L_t sampling, cycle " + std::to_string(s.cycle());
      case gradcomp::gradiveq_phase::compressed:
        return "GradiVeQ L_c compressed, cycle " + std::to_string(s.cycle()) + ", conv ratio " + ratio(conv_ratio());
    }
    return {};
  }

  std::string summary() const override {
    if (!gq()) return {};
    const auto& s = ex_.buckets().schedule();
    std::string out = "conv ratio in the L_c iterations " + ratio(compressed_.ratio()) + " over " +
                      std::to_string(compressed_steps_) + " of " + std::to_string(s.iteration()) +
                      " steps; d per conv layer:";
    std::uint64_t fits = 0;
    for_each_compressor([&](const auto& c) {
      out += " " + (c.has_basis() ? std::to_string(c.dimension()) : std::string("-")) + "/" + std::to_string(c.slice_size());
      fits = c.fits();
    });
    out += "; fits " + std::to_string(fits);
    if (std::isfinite(s.options().stale_threshold)) out += "; L_c ended early " + std::to_string(early_ends_) + "x";
    out += s.sampling_quantized() ? "; L_t iterations QSGD 4-bit" : "; L_t iterations uncompressed";
    char b[96];
    std::snprintf(b, sizeof b, "; mean eq. 7 relative local loss in L_c %.3f",
                  compressed_steps_ ? relative_loss_sum_ / double(compressed_steps_) : 0.0);
    return compressed_steps_ ? out + b : out;
  }

 private:
  const gx::plan& layout() const noexcept { return ex_.layout(); }
  bool gq() const noexcept { return layout().uses_gradiveq(); }

  static void count(codec_counters& c, std::size_t elements, std::size_t encoded, bool target) {
    c.raw_bytes += 4 * elements;
    c.encoded_bytes += encoded;
    if (target) {
      c.target_raw_bytes += 4 * elements;
      c.target_encoded_bytes += encoded;
    }
  }
  static std::string ratio(double r) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1fx", r);
    return b;
  }

  /// u <- m u + g on the dense (`dense` true) or the compressed layers; g <- u.
  void fold(std::span<const std::span<float>> layers, float m, bool dense) {
    if (m <= 0.0f) return;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      if ((layout().kind(i) == gx::codec_kind::dense) != dense) continue;
      auto& u = velocity_[i];
      u.resize(layers[i].size(), 0.0f);
      for (std::size_t e = 0; e < u.size(); ++e) layers[i][e] = u[e] = m * u[e] + layers[i][e];
    }
  }

  template <class Fn>
  void for_each_compressor(Fn&& fn) const {
    for (std::size_t b = 0; b < layout().buckets().size(); ++b)
      if (const auto* g = dynamic_cast<const gx::gradiveq_bucket<policy>*>(&ex_.buckets().bucket(b)))
        for (std::size_t j = 0; j < layout().buckets()[b].layers.size(); ++j) fn(g->compressor(j));
  }
  /// Layer elements over transmitted floats of the conv layers with the current bases.
  double conv_ratio() const {
    std::size_t elements = 0, sent = 0;
    for_each_compressor([&](const auto& c) {
      elements += c.layer_length();
      sent += c.coefficient_count() + c.tail_length();
    });
    return sent ? double(elements) / double(sent) : 0.0;
  }

  gx::model_exchange<counted_transport, policy> ex_;
  config_id config_;
  float pre_ = 0.0f, post_ = 0.0f;
  double lr_mult_ = 1.0;
  std::vector<std::vector<float>> velocity_;
  codec_counters compressed_;  // the GradiVeQ compressed iterations alone
  std::size_t compressed_steps_ = 0, early_ends_ = 0;
  double relative_loss_sum_ = 0;
};

/// One worker: nothing to exchange.
class single_exchanger final : public exchanger {
 public:
  void exchange(std::size_t, double, std::span<const std::span<float>>) override {}
  std::string target_label() const override { return "none"; }
};

// --- DGS ---------------------------------------------------------------------

using dgs_codec = gradcomp::sa_momentum<policy>;

gradcomp::layer_partition partition_of(std::span<const layer_desc> layers) {
  std::vector<std::size_t> sizes;
  for (const auto& l : layers) sizes.push_back(l.shape.size());
  return gradcomp::layer_partition(std::move(sizes));
}

gradcomp::dgs_rule<policy> dgs_config(const run_options& o) {
  gradcomp::dgs_rule<policy> r;
  r.ratio_percent = 100.0 - o.dgs_sparsity;
  r.momentum = float(o.dgs_momentum);
  r.mode = gradcomp::threshold_mode::exact;
  r.seed = o.seed;
  return r;
}

/// A worker of the asynchronous DGS parameter server (seed 001, Alg. 3 at
/// the worker): SAMomentum sparsifies m*u + lr*(grad + wd*w) per layer to the
/// top (100 - sparsity)% and pushes it; the reply (the model difference,
/// secondarily compressed) is written into the worker's model, which
/// exchange() hands back as the new parameters.
///
/// Learning rate: an asynchronous push moves the model by one worker's
/// local-batch step, and SAMomentum's m differs from SGD's, so the pushed
/// rate is lr * (1 - m_dgs) / (1 - m_sgd) / N: the same step size per image
/// as the synchronous runs (N pushes of one local batch each = one global batch).
class dgs_exchanger final : public exchanger {
 public:
  dgs_exchanger(counted_transport& t, std::span<const layer_desc> layers, const run_options& o,
                std::span<const std::vector<float>> initial)
      : t_(t),
        worker_(partition_of(layers), dgs_config(o)),
        scale_((1.0 - o.dgs_momentum) / (1.0 - o.momentum) / double(t.size() - 1)),
        weight_decay_(o.weight_decay) {
    for (const auto& v : initial) model_.insert(model_.end(), v.begin(), v.end());
    grad_.resize(model_.size());
  }
  update_kind kind() const noexcept override { return update_kind::model; }
  bool synchronous() const noexcept override { return false; }
  std::string target_label() const override { return "all"; }

  void exchange(std::size_t, double lr, std::span<const std::span<float>> layers) override {
    std::size_t at = 0;
    for (auto layer : layers)
      for (float g : layer) {
        grad_[at] = g + float(weight_decay_) * model_[at];
        ++at;
      }
    const auto up = worker_.stats().bytes_up, down = worker_.stats().bytes_down;
    const auto reply = worker_.step(t_, grad_, float(lr * scale_), model_);
    if (reply.status == gradcomp::ps_pull_status::rejected)
      throw gradcomp::state_error("dgs: the server rejected a push (reason " + std::to_string(int(reply.reason)) + ")");
    counters.raw_bytes += 4 * model_.size();
    counters.target_raw_bytes += 4 * model_.size();
    counters.encoded_bytes += worker_.stats().bytes_up - up;
    counters.target_encoded_bytes += worker_.stats().bytes_up - up;
    counters.received_bytes += worker_.stats().bytes_down - down;
    entries_received_ += reply.entries;
    ++pushes_;
    write_model(layers);
  }

  bool finish(counted_transport& ctl, std::span<const std::span<float>> model_out) override {
    // Every push is served before anyone pulls the final model.
    barrier(ctl, 120);
    worker_.join(t_, model_);
    worker_.leave(t_);
    write_model(model_out);
    return true;
  }

  std::string summary() const override {
    char b[200];
    std::snprintf(b, sizeof b,
                  "worker 0: %.1f model entries received per pull (of %zu); replicas differ while training and "
                  "pull the server's final model at the end",
                  pushes_ ? double(entries_received_) / double(pushes_) : 0.0, model_.size());
    return b;
  }

 private:
  void write_model(std::span<const std::span<float>> layers) const {
    std::size_t at = 0;
    for (auto layer : layers) {
      std::copy(model_.begin() + std::ptrdiff_t(at), model_.begin() + std::ptrdiff_t(at + layer.size()), layer.begin());
      at += layer.size();
    }
  }
  counted_transport& t_;
  gradcomp::async_ps_worker<dgs_codec, policy> worker_;
  std::vector<float> model_, grad_;
  double scale_;
  double weight_decay_;
  std::uint64_t entries_received_ = 0, pushes_ = 0;
};


// --- LGC ---------------------------------------------------------------------

/// LGC options for this model (seed 004, Sec. V-VI): alpha = 0.1% top-k with
/// DGC momentum correction, three phases, the autoencoder window shrunk to
/// the top-k vector of this small model (a multiple of 2^depth = 16).
gradcomp::lgc_options lgc_config(const run_options& o, std::size_t autoencoder_values) {
  gradcomp::lgc_options l;
  l.alpha_percent = o.lgc_topk_percent;
  l.momentum = parse_momentum_mode(o.lgc_momentum) == momentum_mode::plain ? 0.0f : float(o.momentum);
  l.schedule.full_iterations = o.lgc_phase1;
  l.schedule.training_iterations = o.lgc_phase2;
  l.seed = o.seed;
  l.feedback_reconstruction_error = o.lgc_feedback;
  const std::size_t r = l.architecture.reduction();
  l.window = std::clamp<std::size_t>(autoencoder_values / r * r, r, 1024);
  return l;
}

/// The LGC grouping of this model: layer 0 (sent dense, "the first layer")
/// gathers the stem conv and every 1-D tensor (norm parameters, biases), the
/// conv weights go through the autoencoder, and the classifier weight is the
/// top-k-only "last layer" (Section VI-A).
struct lgc_groups {
  std::vector<std::size_t> dense;    // model layers in group 0
  std::vector<std::size_t> coded;    // model layers 1..C (autoencoder)
  std::size_t last = 0;              // the classifier weight (top-k only)
  std::vector<std::size_t> sizes;    // the LGC layer sizes
};

lgc_groups lgc_grouping(std::span<const layer_desc> layers) {
  lgc_groups g;
  bool stem_seen = false, have_last = false;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (is_conv(layers[i]) && stem_seen) g.coded.push_back(i);
    else if (is_conv(layers[i])) {
      g.dense.push_back(i);
      stem_seen = true;
    } else if (layers[i].dims == 2) {
      g.last = i;
      have_last = true;
    } else {
      g.dense.push_back(i);
    }
  }
  if (!have_last || g.coded.empty()) throw gradcomp::invalid_argument_error("lgc: the model needs conv layers and a linear layer");
  std::size_t dense_n = 0;
  for (auto i : g.dense) dense_n += layers[i].shape.size();
  g.sizes.push_back(dense_n);
  for (auto i : g.coded) g.sizes.push_back(layers[i].shape.size());
  g.sizes.push_back(layers[g.last].shape.size());
  return g;
}

std::size_t lgc_autoencoder_values(std::span<const layer_desc> layers, const run_options& o) {
  const auto g = lgc_grouping(layers);
  std::size_t mu = 0;
  for (auto i : g.coded) mu += gradcomp::sparse_selection_count(layers[i].shape.size(), o.lgc_topk_percent);
  return mu;
}

/// The LGC ring form (seed 004, Sec. IV-B, Algorithm 2) through
/// gradcomp::lgc_ring_node: phase 1 dense, phase 2 top-k while rank 0 trains
/// the autoencoder online, phase 3 the codes of the top-k values averaged
/// with a ring all-reduce and decoded once. The aggregate is momentum
/// corrected (DGC), so the optimiser takes plain SGD steps.
class lgc_exchanger final : public exchanger {
 public:
  lgc_exchanger(counted_transport& t, std::span<const layer_desc> layers, const run_options& o, std::size_t)
      : t_(t),
        sgd_momentum_(o.momentum),
        groups_(lgc_grouping(layers)),
        node_(t.rank(), t.size(), groups_.sizes, lgc_config(o, lgc_autoencoder_values(layers, o))) {
    dense_.resize(groups_.sizes[0]);
  }
  /// The node's aggregate is momentum corrected (DGC), or, with momentum 0,
  /// applied with plain SGD at lr / (1 - m).
  bool momentum_in_codec() const noexcept override { return true; }
  double lr_multiplier() const noexcept override {
    return node_.options().momentum > 0.0f ? 1.0 : 1.0 / (1.0 - sgd_momentum_);
  }
  std::string target_label() const override { return "conv+fc"; }

  void exchange(std::size_t, double, std::span<const std::span<float>> layers) override {
    std::size_t at = 0;
    for (auto i : groups_.dense) {
      std::copy(layers[i].begin(), layers[i].end(), dense_.begin() + std::ptrdiff_t(at));
      at += layers[i].size();
    }
    std::vector<std::span<float>> spans;
    spans.push_back(dense_);
    for (auto i : groups_.coded) spans.push_back(layers[i]);
    spans.push_back(layers[groups_.last]);
    const auto phase = node_.phase();
    node_.step(t_, spans);
    at = 0;
    for (auto i : groups_.dense) {
      std::copy(dense_.begin() + std::ptrdiff_t(at), dense_.begin() + std::ptrdiff_t(at + layers[i].size()), layers[i].begin());
      at += layers[i].size();
    }
    // Byte accounting: the node's payload bytes; the dense group is the
    // non-target part (its float32 bytes, plus the one header in phase 1).
    const auto& tr = node_.last_traffic();
    const std::size_t dense_bytes = 4 * dense_.size();
    counters.raw_bytes += tr.original_bytes;
    counters.encoded_bytes += tr.payload_bytes;
    counters.target_raw_bytes += tr.original_bytes - dense_bytes;
    counters.target_encoded_bytes += tr.payload_bytes - dense_bytes - gradcomp::wire::header_size;
    if (phase == gradcomp::lgc_phase::compressed) {
      compressed_.raw_bytes += tr.original_bytes - dense_bytes;
      compressed_.encoded_bytes += tr.payload_bytes - dense_bytes - gradcomp::wire::header_size;
    }
  }

  std::string phase() const override {
    switch (node_.phase()) {
      case gradcomp::lgc_phase::full: return "LGC phase 1 (dense)";
      case gradcomp::lgc_phase::topk_training: {
        char b[96];
        std::snprintf(b, sizeof b, "LGC phase 2 (top-k, autoencoder training, loss %.4g)", double(node_.last_training_loss()));
        return b;
      }
      case gradcomp::lgc_phase::compressed: return "LGC phase 3 (compressed)";
    }
    return {};
  }

  std::string summary() const override {
    char b[300];
    std::snprintf(b, sizeof b,
                  "window %zu, %zu top-k values per step through the autoencoder; compressed layers in phase 3: %.1fx "
                  "(paper CR incl. indices and weights); autoencoder training steps %llu (rejected %llu), last loss %.4g",
                  node_.options().window, node_.layout().mu,
                  compressed_.encoded_bytes ? double(compressed_.raw_bytes) / double(compressed_.encoded_bytes) : 0.0,
                  (unsigned long long)node_.training_steps(), (unsigned long long)node_.rejected_training_steps(),
                  double(node_.last_training_loss()));
    return b;
  }

 private:
  counted_transport& t_;
  double sgd_momentum_;
  lgc_groups groups_;
  gradcomp::lgc_ring_node<policy> node_;
  std::vector<float> dense_;
  codec_counters compressed_;
};
}  // namespace

bool uses_parameter_server(config_id c) noexcept { return c == config_id::dgs; }

std::string run_dgs_server(counted_transport& t, const run_options& o, std::span<const layer_desc> layers,
                           std::span<const std::vector<float>> initial, std::size_t total_steps) {
  const int workers = t.size() - 1;
  std::vector<float> theta0;
  for (const auto& v : initial) theta0.insert(theta0.end(), v.begin(), v.end());
  gradcomp::async_ps_options opt;
  opt.downlink = gradcomp::ps_downlink::model_difference;
  opt.secondary_ratio = o.dgs_secondary ? 100.0 - o.dgs_sparsity : 0.0;
  // Deterministic mode: pushes served round-robin (worker 0, 1, ..., N-1, 0, ...),
  // so the run depends on the seed only; each gradient is still computed on a
  // model N-1 updates stale, as in a free-running run of equally fast workers.
  opt.schedule.reserve(std::size_t(workers) * total_steps);
  for (std::size_t s = 0; s < total_steps; ++s)
    for (int k = 0; k < workers; ++k) opt.schedule.push_back(k);
  gradcomp::async_ps_server<dgs_codec, policy> server(partition_of(layers), theta0, workers, dgs_config(o), opt);
  const auto& st = server.serve(t);
  std::uint64_t up = 0, down = 0;
  for (auto b : st.bytes_up) up += b;
  for (auto b : st.bytes_down) down += b;
  char b[300];
  std::snprintf(b, sizeof b, "server: %llu pushes, %llu rejected, %llu resyncs; %.1f KiB up and %.1f KiB down per push%s%s",
                (unsigned long long)st.pushes, (unsigned long long)st.rejected, (unsigned long long)st.resyncs,
                st.pushes ? double(up) / double(st.pushes) / 1024.0 : 0.0,
                st.pushes ? double(down) / double(st.pushes) / 1024.0 : 0.0, st.last_error.empty() ? "" : "; ",
                st.last_error.c_str());
  return b;
}

void validate_codec_options(config_id c, const run_options& o, std::span<const layer_desc> layers) {
  using gradcomp::invalid_argument_error;
  const std::string who(config_name(c));
  if (!parse_momentum_mode(o.two_bit_momentum) || !parse_momentum_mode(o.topk_momentum) ||
      !parse_momentum_mode(o.lgc_momentum))
    throw invalid_argument_error("momentum modes are optimizer, dgc (or local) and plain");
  if (parse_momentum_mode(o.lgc_momentum) == momentum_mode::optimizer)
    throw invalid_argument_error("lgc: --lgc-momentum is dgc or plain (the node returns a corrected update)");
  if (auto why = config_unavailable(c); !why.empty()) throw invalid_argument_error(who + ": " + why);
  if (c == config_id::two_bit && !std::isfinite(o.two_bit_threshold))
    throw invalid_argument_error("two_bit: threshold must be finite");
  if (c == config_id::qsgd4 && o.qsgd_bits != 2 && o.qsgd_bits != 4 && o.qsgd_bits != 8)
    throw invalid_argument_error("qsgd4: --qsgd-bits must be 2, 4 or 8, got " + std::to_string(o.qsgd_bits));
  if (c == config_id::topk && !(o.topk_percent > 0 && o.topk_percent <= 100))
    throw invalid_argument_error("topk: --topk-percent must be in (0, 100], got " + std::to_string(o.topk_percent));
  if (c == config_id::lgc && !(o.lgc_topk_percent > 0 && o.lgc_topk_percent <= 100))
    throw invalid_argument_error("lgc: --lgc-topk-percent must be in (0, 100]");
  if (c == config_id::dgs && !(o.dgs_sparsity >= 0 && o.dgs_sparsity < 100))
    throw invalid_argument_error("dgs: --dgs-sparsity must be in [0, 100), got " + std::to_string(o.dgs_sparsity));
  if (c == config_id::dgs && !(o.dgs_momentum > 0 && o.dgs_momentum < 1))
    throw invalid_argument_error("dgs: --dgs-momentum must be in (0, 1), got " + std::to_string(o.dgs_momentum));
  try {  // the codecs' own checks: build the plan and one rank's codecs
    if (c == config_id::dgs) dgs_config(o)(0, 1);
    else if (c == config_id::lgc) {
      const auto g = lgc_grouping(layers);
      gradcomp::lgc_layout check(g.sizes, lgc_config(o, lgc_autoencoder_values(layers, o)));
    } else if (c != config_id::msgd_single) {
      gx::bucket_layer<policy> check(plan_for(c, o, layers), 0, std::max(1, o.workers));
    }
  } catch (const gradcomp::error& e) {
    throw invalid_argument_error(who + ": " + e.what());
  }
}

std::unique_ptr<exchanger> make_exchanger(config_id c, const run_options& o, counted_transport& data,
                                          std::span<const layer_desc> layers, std::span<const std::vector<float>> initial,
                                          std::size_t total_steps) {
  validate_codec_options(c, o, layers);
  switch (c) {
    case config_id::msgd_single: return std::make_unique<single_exchanger>();
    case config_id::dgs: return std::make_unique<dgs_exchanger>(data, layers, o, initial);
    case config_id::lgc: return std::make_unique<lgc_exchanger>(data, layers, o, total_steps);
    default: return std::make_unique<sync_exchanger>(data, plan_for(c, o, layers), c, o);
  }
}

}  // namespace train
