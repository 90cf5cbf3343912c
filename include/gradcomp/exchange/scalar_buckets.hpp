#pragma once
/// \file exchange/scalar_buckets.hpp
/// The bucket codecs of the scalar codecs that sum in their own domain:
/// fp16 and bf16 (half.hpp: one sum round of a float16 / bfloat16 summable
/// buffer) and the homomorphic integer quantizer (homomorphic.hpp: a max
/// round of the per-block scales, then a sum round of int32 words).

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

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
