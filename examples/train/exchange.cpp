// The synchronous configurations (see exchange.hpp): a plan of gradcomp's whole-model
// exchange (gradcomp/model_exchange.hpp) per configuration, and what is the demo's own
// around it: its momentum modes, byte columns and progress notes. DGS: dgs.cpp.
#include "exchange.hpp"
#include "plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/model_exchange.hpp>
#include <gradcomp/exchange/lgc_bucket.hpp>

namespace train {

namespace gx = gradcomp::exchange;

namespace {

/// A synchronous configuration: one model_exchange step per training step.
/// Momentum modes of the error-feedback codecs (common.hpp): `pre` folds the
/// gradient of a compressed layer into a local velocity before the exchange
/// (two-bit "local"), `post` gives the dense layers that velocity after it
/// (the optimiser has no momentum then), `lr_mult` is plain SGD at lr / (1 - m).
class sync_exchanger final : public exchanger {
 public:
  sync_exchanger(counted_transport& t, gx::plan plan, config_id c, const run_options& o)
      : ex_(t, std::move(plan), {.on_failure = gx::failure_policy::throw_error}), config_(c) {
    const auto mode = parse_momentum_mode(c == config_id::two_bit ? o.two_bit_momentum : o.topk_momentum);
    if (c == config_id::two_bit || c == config_id::topk) {
      if (mode == momentum_mode::plain) lr_mult_ = 1.0 / (1.0 - o.momentum);
      if (mode == momentum_mode::correction) post_ = pre_ = float(o.momentum);
      if (c == config_id::topk) pre_ = 0.0f;  // top-k's DGC momentum is the codec's own
    }
    if ((c == config_id::lgc || c == config_id::lgc_ps) && layout().options().lgc.momentum == 0.0f)
      lr_mult_ = 1.0 / (1.0 - o.momentum);
    if (lgc_any() && o.lgc_momentum == "phased") phased_momentum_ = float(o.momentum);
    velocity_.resize(layout().model().size());
  }
  bool momentum_in_codec() const noexcept override { return post_ > 0.0f || lr_mult_ != 1.0 || lgc_any(); }
  double lr_multiplier() const noexcept override {
    return phased_momentum_ > 0.0f && last_lgc_phase_ == gradcomp::lgc_phase::full ? 1.0 : lr_mult_;
  }
  std::vector<std::pair<std::string, double>> extra_ratios() const override {
    if (!lgc_any()) return {};
    return {{"phase3_ratio", compressed_.target_ratio()}};
  }
  std::string target_label() const override {
    if (config_ == config_id::baseline) return "all";
    if (lgc_any()) return "conv+fc";
    return layout().uses_gradiveq() ? "conv" : "weights";
  }

  void exchange(std::size_t, double, std::span<const std::span<float>> layers) override {
    const bool was_compressed = gq() && ex_.buckets().schedule().phase() == gradcomp::gradiveq_phase::compressed;
    const std::size_t position = gq() ? ex_.buckets().schedule().phase_position() : 0;
    const std::size_t lc = gq() ? ex_.buckets().schedule().compressed_length() : 0;
    fold(layers, pre_, false);
    const auto lgc_phase = lgc_any() ? lgc_view().next_phase : gradcomp::lgc_phase::full;
    const gx::step_stats& st = ex_.step(layers);
    fold(layers, post_, true);
    last_lgc_phase_ = lgc_phase;
    if (phased_momentum_ > 0.0f && lgc_phase == gradcomp::lgc_phase::full)  // momentum SGD on the dense aggregate
      for (std::size_t i = 0; i < layers.size(); ++i) {
        auto& u = velocity_[i];
        u.resize(layers[i].size(), 0.0f);
        for (std::size_t e = 0; e < u.size(); ++e) layers[i][e] = u[e] = phased_momentum_ * u[e] + layers[i][e];
      }
    if (lgc_any()) {  // LGC's own accounting (the paper's CR): dense layer float32, the rest its payloads
      const auto v = lgc_view();
      const auto& tr = *v.traffic;
      const std::size_t dense = 4 * v.layout->dense_values, header = gradcomp::wire::header_size;
      const codec_counters step{tr.original_bytes, tr.payload_bytes, tr.original_bytes - dense,
                                tr.payload_bytes - dense - header, 0};
      counters += step;
      if (lgc_phase == gradcomp::lgc_phase::compressed) {
        compressed_ += step;
        ++compressed_steps_;
      }
      return;
    }
    for (std::size_t b = 0; b < layout().buckets().size(); ++b)
      for (std::size_t i : layout().buckets()[b].layers) {
        const std::size_t raw = 4 * layout().model()[i].shape.size(), sent = st.layer_bytes[i];
        const bool target = config_ == config_id::baseline || layout().kind(i) != gx::codec_kind::dense;
        counters += {raw, sent, target ? raw : 0, target ? sent : 0, 0};
        if (st.bucket_phase[b] == "gradiveq:compressed" || st.bucket_phase[b] == "powersgd:compressed")
          compressed_ += {raw, sent, raw, sent, 0};
      }
    if (std::find(st.bucket_phase.begin(), st.bucket_phase.end(), "powersgd:compressed") != st.bucket_phase.end())
      ++powersgd_steps_;
    ++steps_;
    if (was_compressed) {
      ++compressed_steps_;
      relative_loss_sum_ += ex_.buckets().gradiveq_loss().relative();
      if (ex_.buckets().schedule().phase() != gradcomp::gradiveq_phase::compressed && position + 1 < lc) ++early_ends_;
    }
  }

  std::string phase() const override {
    if (lgc_any()) {
      const auto v = lgc_view();
      char b[128];
      switch (v.next_phase) {
        case gradcomp::lgc_phase::full: return "LGC phase 1 (dense)";
        case gradcomp::lgc_phase::topk_training:
          std::snprintf(b, sizeof b, "LGC phase 2 (top-k, autoencoder training, loss %.4g)", double(v.loss));
          return b;
        case gradcomp::lgc_phase::compressed:
          std::snprintf(b, sizeof b, "LGC phase 3 (compressed, own relative error %.3g, fed back on %llu steps",
                        double(v.rel_error), (unsigned long long)v.feedback_steps);
          if (v.options->retrain_period == 0) return std::string(b) + ")";
          return b + (", retraining loss " + std::to_string(v.loss) + ", " + std::to_string(v.broadcasts) + " broadcasts)");
      }
    }
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
    if (lgc_any()) {
      const auto v = lgc_view();
      char b[600];
      std::snprintf(b, sizeof b,
                    "window %zu, %zu top-k values per step through the autoencoder (top-k %.3g%%); compressed layers "
                    "in phase 3: %.1fx over %zu steps (paper CR incl. indices, scales, headers and %llu weight "
                    "broadcasts, retrain period %llu); autoencoder training steps %llu (rejected %llu), last loss %.4g; "
                    "error feedback on %llu steps",
                    v.options->window, v.layout->mu, v.options->alpha_percent, compressed_.target_ratio(),
                    compressed_steps_, (unsigned long long)v.broadcasts, (unsigned long long)v.options->retrain_period,
                    (unsigned long long)v.training_steps, (unsigned long long)v.rejected, double(v.loss),
                    (unsigned long long)v.feedback_steps);
      return b;
    }
    if (powersgd_steps_ > 0)
      return "weight ratio in the compressed steps " + ratio(compressed_.ratio()) + " over " +
             std::to_string(powersgd_steps_) + " of " + std::to_string(steps_) + " steps (rank " +
             std::to_string(layout().options().powersgd.rank) + ", dense start " +
             std::to_string(layout().options().powersgd.start_iter) + " steps)";
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
  const gx::lgc_ring_bucket<policy>* lgc() const {
    return dynamic_cast<const gx::lgc_ring_bucket<policy>*>(&ex_.buckets().bucket(0));
  }
  const gx::lgc_ps_bucket<policy>* lgc_ps() const {
    return dynamic_cast<const gx::lgc_ps_bucket<policy>*>(&ex_.buckets().bucket(0));
  }
  bool lgc_any() const { return config_ == config_id::lgc || config_ == config_id::lgc_ps; }
  /// What the demo reads from either LGC bucket.
  struct lgc_state {
    gradcomp::lgc_phase next_phase;
    const gradcomp::lgc_traffic* traffic;
    const gradcomp::lgc_layout* layout;
    const gradcomp::lgc_options* options;
    std::uint64_t training_steps, rejected, broadcasts, feedback_steps;
    float loss, rel_error;
  };
  lgc_state lgc_view() const {
    if (const auto* r = lgc())
      return {r->next_phase(), &r->last_traffic(), &r->layout(), &r->options(), r->training_steps(),
              r->rejected_training_steps(), r->weight_broadcasts(), r->feedback_steps(), r->last_training_loss(),
              r->last_relative_error()};
    const auto* p = lgc_ps();
    return {p->next_phase(), &p->last_traffic(), &p->layout(), &p->options(), p->training_steps(),
            p->rejected_training_steps(), std::uint64_t(p->steps() > p->options().schedule.first_compressed()), 0,
            p->last_training_loss(), 0.0f};
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
  float phased_momentum_ = 0.0f;  // LGC "phased": momentum SGD in phase 1, plain SGD at lr / (1 - m) after it
  gradcomp::lgc_phase last_lgc_phase_ = gradcomp::lgc_phase::full;
  double lr_mult_ = 1.0;
  std::vector<std::vector<float>> velocity_;
  codec_counters compressed_;  // the GradiVeQ (PowerSGD) compressed iterations alone
  std::size_t compressed_steps_ = 0, early_ends_ = 0, powersgd_steps_ = 0, steps_ = 0;
  double relative_loss_sum_ = 0;
};

/// One worker: nothing to exchange.
class single_exchanger final : public exchanger {
 public:
  void exchange(std::size_t, double, std::span<const std::span<float>>) override {}
  std::string target_label() const override { return "none"; }
};

}  // namespace

bool uses_parameter_server(config_id c) noexcept { return c == config_id::dgs; }

void validate_codec_options(config_id c, const run_options& o, std::span<const layer_desc> layers) {
  using gradcomp::invalid_argument_error;
  const std::string who(config_name(c));
  if (auto why = config_unavailable(c); !why.empty()) throw invalid_argument_error(who + ": " + why);
  check_option_ranges(c, o);
  try {  // the codecs' own checks: build the plan and one rank's codecs
    if (c != config_id::msgd_single && c != config_id::dgs)
      gx::bucket_layer<policy> check(plan_for(c, o, layers, 0), 0, std::max(1, o.workers));
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
    case config_id::dgs: return make_dgs_exchanger(data, layers, o, initial);
    default: return std::make_unique<sync_exchanger>(data, plan_for(c, o, layers, total_steps), c, o);
  }
}

}  // namespace train
