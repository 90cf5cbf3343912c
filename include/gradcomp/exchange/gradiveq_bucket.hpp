#pragma once
/// \file exchange/gradiveq_bucket.hpp
/// GradiVeQ's whole lifecycle in a bucket (seed 002, Sec. 3 and Fig. 6): the
/// conv flattening of Fig. 3a, warm-up steps summed dense, L_t sampling steps
/// (QSGD-quantized and all-gathered, or summed dense) whose sums become the
/// PCA samples, the fit with summands = N at the end of L_t, L_c compressed
/// steps summed in the compressed domain (eq. 4) and decoded once (eq. 5),
/// and the eq. 7 stale vote, which rides in the step's control block.
/// One gradiveq_schedule is shared by every GradiVeQ bucket of a plan.
///
/// With gradiveq_schedule_options::error_feedback (beyond the paper) each
/// node also keeps, per layer, what its compressed iterations left out:
///     e_{t+1} = (g_t + e_t) - decode(encode(g_t + e_t))   (eq. 3, then eq. 5 with count 1)
/// and a sampling iteration sends g_t + e_t, all of it (e = 0 after it: QSGD
/// is unbiased), so what a basis left out reaches the model at the next
/// sampling iteration and is part of the next fit's samples. Within a run of
/// compressed iterations the basis is fixed and e is orthogonal to it
/// (U_d^T e = 0), so encode(g_t + e_t) = encode(g_t) and, eq. 5 being linear,
///     e = sum of g_t - decode(sum of own payloads)          (eq. 4 with count k)
/// which is what the bucket keeps: the gradients' sum and the payloads' sum,
/// one decode per flush instead of one per step. Warm-up iterations neither
/// add nor keep one. The memory is updated when a step finishes, so an
/// abandoned step leaves it as it was, and it is part of the saved state.
///
/// With sampling_error_feedback as well, a QSGD sampling iteration keeps its
/// own rounding: e_{t+1} = x - Q(x), x = g_t + e_t (the sampler's decode of
/// its own payload). That e is not orthogonal to the basis, so the first
/// compressed iteration after it encodes g_t + e_t (eq. 3), and from then on
/// the residual is orthogonal again and the lazy form above holds, its
/// gradients' sum starting from e. With the max-norm scale and s >= 2 levels
/// |e|_inf <= |x|_inf / s, so the memory stays bounded (schedule.hpp).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/exchange/bucket_codecs.hpp>
#include <gradcomp/exchange/contract.hpp>
#include <gradcomp/exchange/model.hpp>
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/layout.hpp>
#include <gradcomp/qsgd.hpp>

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The GradiVeQ state shared by a plan's GradiVeQ buckets: the schedule and
/// this step's eq. 7 loss summed over every GradiVeQ layer of this rank.
struct gradiveq_lifecycle {
  gradiveq_schedule schedule;
  local_loss_value loss;
};

/// The bucket codec of GradiVeQ layers (see the file comment).
template <ExecutionPolicy Policy = execution::seq>
class gradiveq_bucket final : public bucket_codec {
 public:
  using bucket_codec::absorb;
  using bucket_codec::contribute;
  gradiveq_bucket(const plan& p, const bucket_desc& b, int rank, int ranks, gradiveq_lifecycle& life) : life_(&life) {
    gradiveq_options go = p.options().gradiveq;
    go.summands = static_cast<std::size_t>(ranks);
    options_ = go;
    for (std::size_t j = 0; j < b.layers.size(); ++j) {
      const std::size_t layer = b.layers[j];
      const layer_shape& s = p.model()[layer].shape;
      shapes_.push_back(s);
      codecs_.emplace_back(s, go);
      qsgd_options q = p.options().qsgd;
      q.bits = p.options().gradiveq_schedule.qsgd_bits;
      q.levels = 0;
      q.seed = mixed_seed(p.options().seed, q.seed, rank, 1000000 + layer);
      samplers_.emplace_back(q);
      total_ += s.size();
    }
    flat_.resize(codecs_.size());
    for (std::size_t j = 0; j < codecs_.size(); ++j) flat_[j].resize(shapes_[j].size());
    if (life_->schedule.options().error_feedback) {
      memory_.resize(codecs_.size());
      for (std::size_t j = 0; j < codecs_.size(); ++j) memory_[j].gradients.assign(shapes_[j].size(), 0.0f);
      next_memory_ = memory_;
    }
    payloads_.resize(codecs_.size());
    samples_.resize(codecs_.size());
    bytes_.assign(codecs_.size(), 0);
  }

  void begin(const step_context& ctx) override {
    ranks_ = ctx.ranks;
    phase_ = life_->schedule.phase();
    undo_.clear();
    std::fill(bytes_.begin(), bytes_.end(), 0);
    if (phase_ == gradiveq_phase::compressed) {
      spec_ = {round_op::sum, buffer_element::float32, 0, after_reduce_check::finite};
      for (const auto& c : codecs_) spec_.length += c.coefficient_count() + c.tail_length();
    } else if (quantized_sampling()) {
      spec_ = {round_op::all_gather, buffer_element::float32, 0, after_reduce_check::none};
    } else {
      spec_ = {round_op::sum, buffer_element::float32, total_, after_reduce_check::finite};
    }
  }

  void prepare(const step_context&, std::span<const std::span<const float>> in) override {
    for (std::size_t j = 0; j < codecs_.size(); ++j) flatten_gradiveq(shapes_[j], in[j], flat_[j]);
    if (feeds_back() && phase_ != gradiveq_phase::compressed) send_residual();
    if (phase_ == gradiveq_phase::compressed) {
      for (std::size_t j = 0; j < codecs_.size(); ++j) {
        // eq. 3 of g_t: U_d^T e = 0 (see the file comment), except for a
        // sampler's rounding not yet encoded, which is sent with g_t
        const bool carry = carries_rounding(j);
        if (carry) add_into(Policy{}, std::span<float>(flat_[j]), std::span<const float>(memory_[j].gradients));
        codecs_[j].encode(flat_[j], payloads_[j]);
        if (feeds_back()) hold(j, carry);
        const auto l = codecs_[j].local_loss(flat_[j], payloads_[j]);
        life_->loss.loss += l.loss;
        life_->loss.energy += l.energy;
        bytes_[j] = 4 * (payloads_[j].coefficients.size() + payloads_[j].tail.size());
      }
    } else if (quantized_sampling()) {
      for (auto& s : samplers_) undo_.push_back(s.save_state());
      for (std::size_t j = 0; j < codecs_.size(); ++j) {
        samplers_[j].encode(flat_[j], samples_[j]);
        if (keeps_rounding()) keep_rounding(j);
      }
    } else {
      for (std::size_t j = 0; j < codecs_.size(); ++j) bytes_[j] = 4 * shapes_[j].size();
    }
  }

  std::size_t rounds() const override { return 1; }
  round_spec round(std::size_t) const override { return spec_; }

  void contribute(std::size_t, std::span<float> buffer) override {
    std::size_t at = 0;
    auto put = [&](std::span<const float> x) {
      if (!x.empty()) std::memcpy(buffer.data() + at, x.data(), x.size() * sizeof(float));
      at += x.size();
    };
    for (std::size_t j = 0; j < codecs_.size(); ++j) {
      if (phase_ == gradiveq_phase::compressed) {
        put(payloads_[j].coefficients);
        put(payloads_[j].tail);
      } else {
        put(flat_[j]);
      }
    }
  }
  std::vector<std::byte> contribute(std::size_t) override {
    std::vector<std::vector<std::byte>> parts(codecs_.size());
    for (std::size_t j = 0; j < codecs_.size(); ++j) {
      wire::serialize_into(samples_[j], parts[j]);
      bytes_[j] = parts[j].size();
    }
    return detail::pack_blobs(parts);
  }
  void absorb(std::size_t, std::span<const float> reduced) override { reduced_ = reduced; }
  void absorb(std::size_t, std::span<const std::vector<std::byte>> gathered) override { gathered_ = gathered; }

  void finish(std::span<const std::span<float>> out) override {
    if (feeds_back()) memory_.swap(next_memory_);  // the step is agreed: its memory becomes the state
    if (phase_ == gradiveq_phase::compressed) {
      std::size_t at = 0;
      for (std::size_t j = 0; j < codecs_.size(); ++j) {
        auto& c = codecs_[j];
        gradiveq_payload p;
        p.fingerprint = c.fingerprint();
        p.count = static_cast<std::uint32_t>(ranks_);
        p.slice_size = c.slice_size();
        p.offset = 0;
        p.length = c.layer_length();
        p.coefficients.assign(reduced_.begin() + at, reduced_.begin() + at + c.coefficient_count());
        at += c.coefficient_count();
        p.tail.assign(reduced_.begin() + at, reduced_.begin() + at + c.tail_length());
        at += c.tail_length();
        c.decode(p, flat_[j]);  // eq. 5: U_d (sum g') + mu
        unflatten_gradiveq(shapes_[j], flat_[j], out[j]);
      }
      return;
    }
    if (quantized_sampling()) {
      for (auto& f : flat_) std::fill(f.begin(), f.end(), 0.0f);
      for (std::size_t rank = 0; rank < gathered_.size(); ++rank) {
        const auto parts = detail::unpack_blobs(gathered_[rank], codecs_.size(), "exchange gradiveq sampling");
        for (std::size_t j = 0; j < codecs_.size(); ++j) {
          wire::parse_limits lim;
          lim.max_element_count = shapes_[j].size();
          const auto q = wire::parse<qsgd_payload>(parts[j], lim);
          samplers_[j].decode_add(q, flat_[j]);
        }
      }
    } else {
      std::size_t at = 0;
      for (std::size_t j = 0; j < codecs_.size(); ++j) {
        std::memcpy(flat_[j].data(), reduced_.data() + at, flat_[j].size() * sizeof(float));
        at += flat_[j].size();
      }
    }
    for (std::size_t j = 0; j < codecs_.size(); ++j) {
      if (phase_ == gradiveq_phase::sampling) codecs_[j].add_sample(flat_[j]);  // the sum is the PCA sample
      unflatten_gradiveq(shapes_[j], flat_[j], out[j]);
    }
    undo_.clear();
  }

  void abandon() override {
    for (std::size_t j = 0; j < undo_.size(); ++j) samplers_[j].restore_state(undo_[j]);
    undo_.clear();
  }

  /// Fits every layer's basis (the end of L_t); called on every rank alike,
  /// or on one rank whose fitted_state() the others adopt().
  void fit() {
    form_fit_residuals();
    for (auto& c : codecs_) c.fit();
  }

  /// Every layer's codec state right after fit() (bases, no samples): what
  /// adopt() takes on the ranks that did not fit.
  std::vector<std::byte> fitted_state() const {
    std::vector<std::vector<std::byte>> s;
    for (const auto& c : codecs_) {
      if (c.pending_samples() != 0) throw state_error("exchange gradiveq fitted_state: the layers have not been fitted");
      s.push_back(c.save_state());
    }
    return detail::pack_blobs(s);
  }

  /// Parses another rank's fitted_state() of this step into new codecs,
  /// checked to be the fit this rank would compute now (options and layer
  /// by restore_state; one more fit, the same samples seen, none pending):
  /// state_error otherwise. Nothing changes here (adopt() commits them).
  std::vector<linear_compressor<Policy>> parse_fitted_state(std::span<const std::byte> bytes) const {
    const char* where = "exchange gradiveq adopted bases";
    const auto parts = detail::unpack_blobs(bytes, codecs_.size(), where);
    std::vector<linear_compressor<Policy>> fresh;
    fresh.reserve(codecs_.size());
    for (std::size_t j = 0; j < codecs_.size(); ++j) {
      fresh.emplace_back(shapes_[j], options_);
      fresh.back().restore_state(parts[j]);
      const auto& mine = codecs_[j];
      const auto& got = fresh.back();
      if (!got.has_basis() || got.pending_samples() != 0 || got.fits() != mine.fits() + 1 ||
          got.samples_seen() != mine.samples_seen())
        throw state_error(std::string(where) + ": layer " + std::to_string(j) + " holds fit " + std::to_string(got.fits()) +
                          " of " + std::to_string(got.samples_seen()) + " samples, this rank expects fit " +
                          std::to_string(mine.fits() + 1) + " of " + std::to_string(mine.samples_seen()));
    }
    return fresh;
  }

  /// Instead of fit(): the codecs parse_fitted_state() made from the rank
  /// that fitted (bit for bit what fit() would have made here).
  void adopt(std::vector<linear_compressor<Policy>> fitted) {
    if (fitted.size() != codecs_.size()) throw size_mismatch_error("exchange gradiveq adopt", codecs_.size(), fitted.size());
    form_fit_residuals();
    codecs_ = std::move(fitted);
  }

  /// What fit() costs here, relative (linear_compressor::fit_work).
  double fit_work() const noexcept {
    double w = 0.0;
    for (const auto& c : codecs_) w += c.fit_work();
    return w;
  }

  std::uint64_t digest() const override {
    std::uint64_t h = static_cast<std::uint64_t>(phase_) + 1;
    for (const auto& c : codecs_) h = h * 0x100000001B3ull ^ c.fingerprint();
    return h;
  }

  std::vector<std::byte> save_state() const override {
    std::vector<std::vector<std::byte>> s;
    for (const auto& c : codecs_) s.push_back(c.save_state());
    for (const auto& q : samplers_) s.push_back(q.save_state());
    for (const auto& m : memory_) {  // error feedback: each layer's gradients' sum and payloads' sum
      s.push_back(wire::serialize_state(wire::codec_id::gradiveq, m.gradients.size(),
                                        [&](wire::writer& w) { w.put_array<float>(m.gradients); }));
      s.push_back(m.payload.count == 0 ? std::vector<std::byte>{} : wire::serialize(m.payload));
    }
    return detail::pack_blobs(s);
  }
  void restore_state(std::span<const std::byte> bytes) override {
    const std::size_t n = codecs_.size();
    const char* where = "exchange gradiveq bucket state";
    const auto parts = detail::unpack_blobs(bytes, 2 * n + 2 * memory_.size(), where);
    auto codecs = codecs_;
    auto samplers = samplers_;
    auto memory = memory_;
    for (std::size_t j = 0; j < n; ++j) {
      codecs[j].restore_state(parts[j]);
      samplers[j].restore_state(parts[n + j]);
    }
    for (std::size_t j = 0; j < memory.size(); ++j) {
      wire::header h;
      wire::reader r = wire::parse_state(parts[2 * n + 2 * j], wire::codec_id::gradiveq, &h);
      if (h.element_count != memory[j].gradients.size()) throw layout_error(std::string(where) + ": another layout");
      r.get_array<float>(memory[j].gradients);
      r.expect_end();
      const auto held = parts[2 * n + 2 * j + 1];
      memory[j].payload = {};
      if (held.empty()) continue;
      wire::parse_limits lim;
      lim.max_element_count = memory[j].gradients.size();
      memory[j].payload = wire::parse<gradiveq_payload>(held, lim);
      if (memory[j].payload.count == 0 || memory[j].payload.fingerprint != codecs[j].fingerprint())
        throw state_error(std::string(where) + ": an error-feedback payload of another basis");
    }
    codecs_ = std::move(codecs);
    samplers_ = std::move(samplers);
    memory_ = std::move(memory);  // next_memory_ keeps its sizes; prepare() writes all of it
  }
  std::vector<std::size_t> layer_bytes() const override { return bytes_; }
  std::string phase() const override {
    switch (phase_) {
      case gradiveq_phase::warmup: return "gradiveq:warmup";
      case gradiveq_phase::sampling: return quantized_sampling() ? "gradiveq:sampling-qsgd" : "gradiveq:sampling";
      case gradiveq_phase::compressed: return "gradiveq:compressed";
    }
    return "gradiveq";
  }
  /// The compressor of layer j of the bucket (basis, d, ratio).
  const linear_compressor<Policy>& compressor(std::size_t j) const { return codecs_.at(j); }

 private:
  /// Error feedback per layer: what the compressed steps since the last
  /// sampling step left out is gradients - decode(payload) (count 0: none).
  struct feedback_memory {
    std::vector<float> gradients;
    gradiveq_payload payload;
  };

  bool quantized_sampling() const noexcept {
    return phase_ == gradiveq_phase::sampling && life_->schedule.sampling_quantized();
  }

  /// Before a new basis: a residual still held against the old one is formed
  /// (the schedules fit right after a sampling step, which sent it: none is,
  /// or only that step's rounding, which the next compressed step encodes).
  void form_fit_residuals() {
    for (std::size_t j = 0; j < memory_.size(); ++j) {
      form_residual(memory_[j], j, memory_[j].gradients);
      memory_[j].payload = {};
    }
  }

  /// Error feedback is on and this step sends or keeps a residual.
  bool feeds_back() const noexcept { return !memory_.empty() && phase_ != gradiveq_phase::warmup; }

  /// e = m.gradients - decode(m.payload) into `out` (which may be m.gradients).
  void form_residual(const feedback_memory& m, std::size_t j, std::vector<float>& out) {
    if (m.payload.count == 0) {
      if (&out != &m.gradients) out = m.gradients;
      return;
    }
    scratch_.resize(out.size());
    codecs_[j].decode(m.payload, scratch_);  // eq. 5 with count k: U_d (sum of c) + k mu / N
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = m.gradients[i] - scratch_[i];
  }

  /// A sampling step: g_t + e_t is sent, and the next memory is empty.
  void send_residual() {
    for (std::size_t j = 0; j < flat_.size(); ++j) {
      auto& next = next_memory_[j];
      form_residual(memory_[j], j, next.gradients);
      float* g = flat_[j].data();
      for (std::size_t i = 0; i < flat_[j].size(); ++i) g[i] += next.gradients[i];
      std::fill(next.gradients.begin(), next.gradients.end(), 0.0f);
      next.payload = {};
    }
  }

  /// A sampler's rounding is fed back too (sampling_error_feedback).
  bool keeps_rounding() const noexcept { return !memory_.empty() && life_->schedule.options().sampling_error_feedback; }

  /// This compressed step is the first since a sampling step that kept its
  /// rounding in layer j's memory (no payload held yet): it encodes g_t + e_t.
  bool carries_rounding(std::size_t j) const noexcept { return keeps_rounding() && memory_[j].payload.count == 0; }

  /// A QSGD sampling step sent Q(x), x = g_t + e_t (flat_): the next memory is x - Q(x).
  void keep_rounding(std::size_t j) {
    auto& next = next_memory_[j].gradients;
    scratch_.resize(flat_[j].size());
    samplers_[j].decode(samples_[j], scratch_);
    const float* x = flat_[j].data();
    for (std::size_t i = 0; i < next.size(); ++i) next[i] = x[i] - scratch_[i];
  }

  /// A compressed step: the next memory holds g_t and this node's payload
  /// too (`carried`: flat_ already holds g_t + the memory's gradients).
  void hold(std::size_t j, bool carried) {
    const auto& m = memory_[j];
    auto& next = next_memory_[j];
    const float* held = m.gradients.data();
    const float* g = flat_[j].data();
    float* sum = next.gradients.data();
    if (carried) std::memcpy(sum, g, flat_[j].size() * sizeof(float));
    else
      for (std::size_t i = 0; i < flat_[j].size(); ++i) sum[i] = held[i] + g[i];
    next.payload = payloads_[j];
    if (m.payload.count != 0) codecs_[j].accumulate(next.payload, m.payload);  // eq. 4
  }

  gradiveq_lifecycle* life_;
  std::vector<layer_shape> shapes_;
  gradiveq_options options_;  // every layer's (summands = N)
  std::vector<linear_compressor<Policy>> codecs_;
  std::vector<qsgd<Policy>> samplers_;
  std::size_t total_ = 0;
  int ranks_ = 1;
  gradiveq_phase phase_ = gradiveq_phase::warmup;
  round_spec spec_;
  std::vector<std::vector<float>> flat_;
  std::vector<gradiveq_payload> payloads_;
  std::vector<qsgd_payload> samples_;
  std::vector<std::vector<std::byte>> undo_;
  std::span<const float> reduced_;
  std::span<const std::vector<std::byte>> gathered_;
  std::vector<std::size_t> bytes_;
  std::vector<feedback_memory> memory_;       // empty without error feedback
  std::vector<feedback_memory> next_memory_;  // this step's, committed in finish()
  std::vector<float> scratch_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
