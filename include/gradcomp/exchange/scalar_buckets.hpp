#pragma once
/// \file exchange/scalar_buckets.hpp
/// The bucket codecs of the scalar codecs that sum in their own domain:
/// fp16 and bf16 (half.hpp: one sum round of a float16 / bfloat16 summable
/// buffer) and the homomorphic integer quantizer (homomorphic.hpp: a max
/// round of the per-block scales, then a sum round of int32 words).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/exchange/bucket_codecs.hpp>
#include <gradcomp/exchange/contract.hpp>
#include <gradcomp/half.hpp>
#include <gradcomp/homomorphic.hpp>
#include <gradcomp/payloads/summable.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// fp16 or bf16 layers (E = float16 or bfloat16): one sum round of the
/// bucket's values rounded to E (to nearest even, saturated at the type's
/// largest value: half.hpp's policy). The sum is the reducer's: gradcomp's
/// ring adds in float32 and rounds once per hop (ring_allreduce_summable); a
/// framework's all-reduce of the 16-bit buffer sums in its own way. A reduced
/// element that is Inf, NaN or saturated fails the step on every rank
/// (after_reduce_check::finite: an overflow).
template <summable_element E>
class half_bucket final : public bucket_codec {
 public:
  using bucket_codec::absorb;
  using bucket_codec::contribute;
  explicit half_bucket(std::vector<std::size_t> lengths) : lengths_(std::move(lengths)) {
    for (auto n : lengths_) total_ += n;
  }
  void begin(const step_context&) override { in_.clear(); }
  void prepare(const step_context&, std::span<const std::span<const float>> in) override {
    in_.assign(in.begin(), in.end());
  }
  std::size_t rounds() const override { return 1; }
  round_spec round(std::size_t) const override { return {round_op::sum, E, total_, after_reduce_check::finite}; }
  void contribute(std::size_t, std::span<float> buffer) override {
    std::size_t at = 0;
    for (const auto& s : in_) {
      if (!s.empty()) std::memcpy(buffer.data() + at, s.data(), s.size() * sizeof(float));
      at += s.size();
    }
    summable::round_cells(E, buffer.first(total_));
  }
  void absorb(std::size_t, std::span<const float> reduced) override { reduced_ = reduced; }
  void finish(std::span<const std::span<float>> out) override {
    std::size_t at = 0;
    for (const auto& s : out) {
      if (!s.empty()) std::memcpy(s.data(), reduced_.data() + at, s.size() * sizeof(float));
      at += s.size();
    }
  }
  void abandon() override {}
  std::vector<std::byte> save_state() const override {
    return wire::serialize_state(half_payload<E>::wire_codec, total_, [](wire::writer&) {});
  }
  void restore_state(std::span<const std::byte> bytes) override {
    wire::header h;
    auto r = wire::parse_state(bytes, half_payload<E>::wire_codec, &h);
    r.expect_end();
    if (h.element_count != total_) throw layout_error(std::string(phase()) + " bucket state: another bucket length");
  }
  std::vector<std::size_t> layer_bytes() const override {
    std::vector<std::size_t> v;
    for (auto n : lengths_) v.push_back(n * summable::wire_bytes(E));
    return v;
  }
  std::string phase() const override { return E == summable_element::float16 ? "fp16" : "bf16"; }

 private:
  std::vector<std::size_t> lengths_;
  std::size_t total_ = 0;
  std::vector<std::span<const float>> in_;
  std::span<const float> reduced_;
};

/// Homomorphic-quantizer layers (homomorphic.hpp), one codec per layer:
/// round 0 is a max of every layer's per-block scales (float32, checked
/// finite), round 1 the sum of every layer's codes as int32 words (lanes
/// checked in absorb: after_reduce_check::lane_range). The rounding step
/// advances with the agreed scales; abandon() restores it. finish() decodes
/// the summed codes once: the SUM over ranks.
template <ExecutionPolicy Policy = execution::seq>
class homomorphic_bucket final : public bucket_codec {
 public:
  using bucket_codec::absorb;
  using bucket_codec::contribute;
  /// `options.seed` is mixed by the caller with the rank and the layer.
  template <class Make>
  homomorphic_bucket(const std::vector<std::size_t>& lengths, int ranks, Make&& options_of) {
    for (std::size_t j = 0; j < lengths.size(); ++j) {
      codecs_.emplace_back(options_of(j), static_cast<std::size_t>(ranks));
      lengths_.push_back(lengths[j]);
      scale_total_ += codecs_.back().scale_count(lengths[j]);
      word_total_ += static_cast<std::size_t>(homomorphic_word_count(lengths[j], codecs_.back().bits()));
    }
    ranks_ = ranks;
    payloads_.resize(codecs_.size());
  }
  void begin(const step_context&) override {
    in_.clear();
    undo_.clear();
  }
  void prepare(const step_context&, std::span<const std::span<const float>> in) override {
    in_.assign(in.begin(), in.end());
    scales_.assign(scale_total_, 0.0f);
    std::size_t at = 0;
    for (std::size_t j = 0; j < codecs_.size(); ++j) {
      const std::size_t k = codecs_[j].scale_count(lengths_[j]);
      codecs_[j].local_scales(in_[j], std::span<float>(scales_).subspan(at, k));  // throws on NaN / Inf
      at += k;
    }
    for (const auto& c : codecs_) undo_.push_back(c.save_state());
  }
  std::size_t rounds() const override { return 2; }
  round_spec round(std::size_t r) const override {
    if (r == 0) return {round_op::max, summable_element::float32, scale_total_, after_reduce_check::finite};
    return {round_op::sum, summable_element::int32_words, word_total_, after_reduce_check::lane_range};
  }
  void contribute(std::size_t r, std::span<float> buffer) override {
    if (r == 0) {
      std::copy(scales_.begin(), scales_.end(), buffer.begin());
      return;
    }
    std::size_t at = 0;
    for (std::size_t j = 0; j < codecs_.size(); ++j) {
      codecs_[j].encode(in_[j], payloads_[j]);
      for (const std::uint32_t w : payloads_[j].words) buffer[at++] = std::bit_cast<float>(w);
    }
  }
  void absorb(std::size_t r, std::span<const float> reduced) override {
    std::size_t at = 0;
    if (r == 0) {
      for (std::size_t j = 0; j < codecs_.size(); ++j) {
        const std::size_t k = codecs_[j].scale_count(lengths_[j]);
        codecs_[j].set_agreed_scales(reduced.subspan(at, k), lengths_[j]);
        at += k;
      }
      return;
    }
    for (std::size_t j = 0; j < codecs_.size(); ++j) {
      auto& p = payloads_[j];
      for (auto& w : p.words) w = std::bit_cast<std::uint32_t>(reduced[at++]);
      p.summands = static_cast<std::uint32_t>(ranks_);
      if (!homomorphic_lanes_valid(p.words, p.count, p.bits, std::uint64_t(p.summands) * p.levels))
        throw invalid_argument_error("homomorphic bucket: a summed lane exceeds N x levels (was the buffer summed as int32 "
                                     "words over exactly N ranks?)");
    }
  }
  void finish(std::span<const std::span<float>> out) override {
    for (std::size_t j = 0; j < codecs_.size(); ++j) codecs_[j].decode(payloads_[j], out[j]);
    undo_.clear();
  }
  void abandon() override {
    for (std::size_t j = 0; j < undo_.size(); ++j) codecs_[j].restore_state(undo_[j]);
    undo_.clear();
  }
  std::uint64_t digest() const override { return codecs_.empty() ? 0 : codecs_.front().step(); }
  std::vector<std::byte> save_state() const override {
    std::vector<std::vector<std::byte>> s;
    for (const auto& c : codecs_) s.push_back(c.save_state());
    return detail::pack_blobs(s);
  }
  void restore_state(std::span<const std::byte> bytes) override {
    const auto parts = detail::unpack_blobs(bytes, codecs_.size(), "exchange homomorphic bucket state");
    auto copy = codecs_;
    for (std::size_t j = 0; j < copy.size(); ++j) copy[j].restore_state(parts[j]);
    codecs_ = std::move(copy);
  }
  /// Per layer: its scales (4 bytes each, the max round) and its words (4 bytes each).
  std::vector<std::size_t> layer_bytes() const override {
    std::vector<std::size_t> v;
    for (std::size_t j = 0; j < codecs_.size(); ++j)
      v.push_back(codecs_[j].scale_bytes(lengths_[j]) + 4 * homomorphic_word_count(lengths_[j], codecs_[j].bits()));
    return v;
  }
  std::string phase() const override { return "homomorphic"; }
  /// The codec of layer j.
  const homomorphic_quantizer<Policy>& codec(std::size_t j) const { return codecs_.at(j); }

 private:
  std::vector<homomorphic_quantizer<Policy>> codecs_;
  std::vector<std::size_t> lengths_;
  std::size_t scale_total_ = 0, word_total_ = 0;
  int ranks_ = 1;
  std::vector<std::span<const float>> in_;
  std::vector<float> scales_;
  std::vector<homomorphic_payload> payloads_;
  std::vector<std::vector<std::byte>> undo_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
