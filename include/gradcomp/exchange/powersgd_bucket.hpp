#pragma once
/// \file exchange/powersgd_bucket.hpp
/// PowerSGD's two-round exchange of a bucket (Vogels et al. 2019, Algorithm
/// 1; the per-layer algebra is powersgd.hpp).
///
///  - Start period (the first `start_iter` completed steps of the exchange):
///    one float32 sum round of the whole bucket, as a dense bucket.
///  - Afterwards, two sum rounds per step:
///      round 0: the P_w = M_w Q of ALL the bucket's compressed layers, back
///               to back, then the values of the bucket's layers PowerSGD
///               leaves dense (1-D, tiny, or 2 r >= min(rows, cols)), so
///               they cost no collective of their own. When this is the
///               step's first round the bucket layer appends the control
///               block after them (exchange/bucket_layer.hpp).
///      round 1: the Q_w = M_w^T P^ of all the compressed layers, computed
///               in absorb(0) from the summed, orthonormalised P.
///    finish writes, per layer, the SUM over ranks: P^ Q_sum^T for the
///    compressed layers (the sum of every rank's approximation), the summed
///    values for the dense ones; the bucket layer divides by N for a mean.
///
/// Contract (exchange/contract.hpp): the checks and M = G + E happen in
/// prepare (before round 0); absorb and finish depend only on the reduced
/// buffers; the residuals and the warm-start Q change only in finish, so
/// abandon() just drops the step. The digest hashes the agreed state: the
/// phase, every layer's warm-start Q (the summed Q of the last step, the same
/// bits on every rank) and its step count.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/exchange/bucket_codecs.hpp>
#include <gradcomp/exchange/contract.hpp>
#include <gradcomp/exchange/model.hpp>
#include <gradcomp/powersgd.hpp>

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The bucket codec of PowerSGD layers (see the file comment).
template <ExecutionPolicy Policy = execution::seq>
class powersgd_bucket final : public bucket_codec {
 public:
  using bucket_codec::absorb;
  using bucket_codec::contribute;

  /// Throws invalid_argument_error for rank 0.
  powersgd_bucket(const plan& p, const bucket_desc& b) : o_(p.options().powersgd) {
    if (o_.rank == 0) throw invalid_argument_error("exchange: powersgd_options::rank must be >= 1");
    for (std::size_t j = 0; j < b.layers.size(); ++j) {
      const std::size_t layer = b.layers[j];
      const layer_shape& s = p.model()[layer].shape;
      lengths_.push_back(s.size());
      total_ += s.size();
      const powersgd_matrix v = powersgd_view(s);
      if (powersgd_compresses(v, o_)) {
        powersgd_options lo = o_;
        lo.seed = mixed_seed(p.options().seed, o_.seed, 0, layer);  // rank 0 for every rank: the same Q everywhere
        codecs_.emplace_back(powersgd_compressor<Policy>(v.rows, v.cols, lo));
        p_total_ += codecs_.back()->p_length();
        q_total_ += codecs_.back()->q_length();
      } else {
        codecs_.emplace_back(std::nullopt);
        dense_total_ += s.size();
      }
    }
    bytes_.assign(lengths_.size(), 0);
  }

  void begin(const step_context& ctx) override {
    compressed_ = ctx.step >= o_.start_iter && p_total_ > 0;
    in_.clear();
    reduced0_ = {};
    reduced1_ = {};
    std::fill(bytes_.begin(), bytes_.end(), 0);
  }

  void prepare(const step_context&, std::span<const std::span<const float>> in) override {
    in_.assign(in.begin(), in.end());
    if (!compressed_) {
      for (std::size_t j = 0; j < lengths_.size(); ++j) bytes_[j] = 4 * lengths_[j];
      return;
    }
    p_.resize(p_total_);
    std::size_t at = 0;
    for (std::size_t j = 0; j < codecs_.size(); ++j) {
      if (auto& c = codecs_[j]) {
        c->encode_p(in[j], std::span<float>(p_).subspan(at, c->p_length()));  // checks, M = G + E, P_w = M Q
        at += c->p_length();
        bytes_[j] = 4 * (c->p_length() + c->q_length());
      } else {
        bytes_[j] = 4 * lengths_[j];
      }
    }
  }

  std::size_t rounds() const override { return compressed_ ? 2 : 1; }
  round_spec round(std::size_t r) const override {
    if (!compressed_) return {round_op::sum, buffer_element::float32, total_, after_reduce_check::finite};
    return {round_op::sum, buffer_element::float32, r == 0 ? p_total_ + dense_total_ : q_total_,
            after_reduce_check::finite};
  }

  void contribute(std::size_t r, std::span<float> buffer) override {
    if (r == 1) {
      std::memcpy(buffer.data(), q_.data(), q_total_ * sizeof(float));
      return;
    }
    std::size_t at = 0;
    auto put = [&](std::span<const float> x) {
      if (!x.empty()) std::memcpy(buffer.data() + at, x.data(), x.size() * sizeof(float));
      at += x.size();
    };
    if (!compressed_) {
      for (const auto& s : in_) put(s);
      return;
    }
    put(p_);
    for (std::size_t j = 0; j < codecs_.size(); ++j)
      if (!codecs_[j]) put(in_[j]);
  }

  void absorb(std::size_t r, std::span<const float> reduced) override {
    if (r == 1) {
      reduced1_ = reduced;
      return;
    }
    reduced0_ = reduced;
    if (!compressed_) return;
    // P^ = orthonormalise(sum P), Q_w = M_w^T P^: the contribution of round 1.
    q_.resize(q_total_);
    std::size_t pa = 0, qa = 0;
    for (auto& c : codecs_)
      if (c) {
        c->encode_q(reduced.subspan(pa, c->p_length()), std::span<float>(q_).subspan(qa, c->q_length()));
        pa += c->p_length();
        qa += c->q_length();
      }
  }

  void finish(std::span<const std::span<float>> out) override {
    if (!compressed_) {
      std::size_t at = 0;
      for (const auto& s : out) {
        std::memcpy(s.data(), reduced0_.data() + at, s.size() * sizeof(float));
        at += s.size();
      }
      return;
    }
    std::size_t qa = 0, da = p_total_;
    for (std::size_t j = 0; j < codecs_.size(); ++j) {
      if (auto& c = codecs_[j]) {
        c->decode(reduced1_.subspan(qa, c->q_length()), out[j]);  // P^ Q_sum^T; commits E and the warm-start Q
        qa += c->q_length();
      } else {
        std::memcpy(out[j].data(), reduced0_.data() + da, lengths_[j] * sizeof(float));
        da += lengths_[j];
      }
    }
  }

  void abandon() override {
    for (auto& c : codecs_)
      if (c) c->abandon();
  }

  std::uint64_t digest() const override {
    std::uint64_t h = compressed_ ? 2 : 1;
    for (const auto& c : codecs_) {
      if (!c) continue;
      h = h * 0x100000001B3ull ^ c->steps();
      const auto q = c->q();
      std::uint32_t crc = wire::crc32c(0, std::as_bytes(q));
      h = h * 0x100000001B3ull ^ crc;
    }
    return h;
  }

  std::vector<std::byte> save_state() const override {
    std::vector<std::vector<std::byte>> s;
    for (const auto& c : codecs_)
      if (c) s.push_back(c->save_state());
    return detail::pack_blobs(s);
  }
  void restore_state(std::span<const std::byte> bytes) override {
    std::size_t n = 0;
    for (const auto& c : codecs_) n += c ? 1 : 0;
    const auto parts = detail::unpack_blobs(bytes, n, "exchange powersgd bucket state");
    auto copy = codecs_;
    std::size_t k = 0;
    for (auto& c : copy)
      if (c) c->restore_state(parts[k++]);
    codecs_ = std::move(copy);
  }

  std::vector<std::size_t> layer_bytes() const override { return bytes_; }
  /// "powersgd:compressed" (two rounds), "powersgd:start" (the start
  /// period's dense round) or "powersgd:dense" (no layer of the bucket is compressible).
  std::string phase() const override {
    if (compressed_) return "powersgd:compressed";
    return p_total_ > 0 ? "powersgd:start" : "powersgd:dense";
  }

  /// True when this step runs PowerSGD's two rounds (after the start period).
  bool compressed() const noexcept { return compressed_; }
  /// The compressor of layer j of the bucket, or nullptr when PowerSGD leaves it dense.
  const powersgd_compressor<Policy>* compressor(std::size_t j) const {
    const auto& c = codecs_.at(j);
    return c ? &*c : nullptr;
  }

 private:
  powersgd_options o_;
  std::vector<std::optional<powersgd_compressor<Policy>>> codecs_;  // nullopt: a dense layer of the bucket
  std::vector<std::size_t> lengths_;
  std::size_t total_ = 0, p_total_ = 0, q_total_ = 0, dense_total_ = 0;
  bool compressed_ = false;
  std::vector<std::span<const float>> in_;
  std::vector<float> p_, q_;
  std::span<const float> reduced0_, reduced1_;
  std::vector<std::size_t> bytes_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
