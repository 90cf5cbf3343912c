#pragma once
/// \file exchange/bucket_codecs.hpp
/// The bucket codecs of the library's codecs: the type-erased base the bucket
/// layer holds, a wrapper for any BucketCodec, the dense bucket (one sum
/// round) and the all-gather bucket of a non-linear codec (two-bit, QSGD,
/// top-k with memory: residuals inside the codecs). GradiVeQ's bucket is in
/// exchange/gradiveq_bucket.hpp.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/exchange/contract.hpp>
#include <gradcomp/exchange/model.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The type-erased bucket codec the bucket layer holds (it meets BucketCodec;
/// `bucket_codec_model<B>` wraps any other type that does). Beyond the
/// concept it reports what each layer put on the wire this step and the name
/// of the step's phase, for the statistics.
class bucket_codec {
 public:
  virtual ~bucket_codec() = default;
  virtual void begin(const step_context& ctx) = 0;
  virtual void prepare(const step_context& ctx, std::span<const std::span<const float>> in) = 0;
  virtual std::size_t rounds() const = 0;
  virtual round_spec round(std::size_t r) const = 0;
  virtual void contribute(std::size_t r, std::span<float>) { unsupported("contribute(sum)", r); }
  virtual std::vector<std::byte> contribute(std::size_t r) {
    unsupported("contribute(all_gather)", r);
    return {};
  }
  virtual void absorb(std::size_t r, std::span<const float>) { unsupported("absorb(sum)", r); }
  virtual void absorb(std::size_t r, std::span<const std::vector<std::byte>>) { unsupported("absorb(all_gather)", r); }
  virtual void finish(std::span<const std::span<float>> out) = 0;
  virtual void abandon() = 0;
  virtual bool vote() const { return false; }
  virtual std::uint64_t digest() const { return 0; }
  virtual std::vector<std::byte> save_state() const = 0;
  virtual void restore_state(std::span<const std::byte> bytes) = 0;
  /// Bytes each layer of the bucket contributed this step (payload or buffer share).
  virtual std::vector<std::size_t> layer_bytes() const = 0;
  /// The phase of this step ("dense", "gradiveq:compressed", ...).
  virtual std::string phase() const = 0;

 private:
  [[noreturn]] static void unsupported(const char* what, std::size_t r) {
    throw state_error("exchange bucket: round " + std::to_string(r) + " does not support " + what);
  }
};

static_assert(BucketCodec<bucket_codec>);

/// Wraps any BucketCodec (a codec of another issue, a user's) for the bucket
/// layer. Layer bytes are reported as one share per layer of the buffer /
/// payload bytes when the wrapped type has no `layer_bytes()`.
template <BucketCodec B>
class bucket_codec_model final : public bucket_codec {
 public:
  explicit bucket_codec_model(B b, std::size_t layers, std::string phase = "custom")
      : b_(std::move(b)), layers_(layers), phase_(std::move(phase)) {}
  void begin(const step_context& c) override { b_.begin(c); }
  void prepare(const step_context& c, std::span<const std::span<const float>> in) override { b_.prepare(c, in); }
  std::size_t rounds() const override { return b_.rounds(); }
  round_spec round(std::size_t r) const override { return b_.round(r); }
  void contribute(std::size_t r, std::span<float> buf) override { b_.contribute(r, buf); }
  std::vector<std::byte> contribute(std::size_t r) override {
    auto p = b_.contribute(r);
    gathered_bytes_ += p.size();
    return p;
  }
  void absorb(std::size_t r, std::span<const float> x) override { b_.absorb(r, x); }
  void absorb(std::size_t r, std::span<const std::vector<std::byte>> g) override { b_.absorb(r, g); }
  void finish(std::span<const std::span<float>> out) override { b_.finish(out); }
  void abandon() override { b_.abandon(); }
  bool vote() const override { return b_.vote(); }
  std::uint64_t digest() const override { return b_.digest(); }
  std::vector<std::byte> save_state() const override { return b_.save_state(); }
  void restore_state(std::span<const std::byte> s) override { b_.restore_state(s); }
  std::vector<std::size_t> layer_bytes() const override {
    if constexpr (requires { b_.layer_bytes(); }) {
      return b_.layer_bytes();
    } else {
      std::size_t total = gathered_bytes_;
      for (std::size_t r = 0; r < b_.rounds(); ++r) {
        const round_spec s = b_.round(r);
        if (s.op != round_op::all_gather) total += s.length * element_bytes(s.element);
      }
      std::vector<std::size_t> v(layers_, layers_ ? total / layers_ : 0);
      if (layers_) v.back() += total - (total / layers_) * layers_;
      return v;
    }
  }
  std::string phase() const override { return phase_; }
  B& get() noexcept { return b_; }

 private:
  B b_;
  std::size_t layers_;
  std::string phase_;
  std::size_t gathered_bytes_ = 0;
};

namespace detail {
/// Total elements of a list of spans.
template <class S>
std::size_t total_elements(std::span<const S> spans) noexcept {
  std::size_t n = 0;
  for (const auto& s : spans) n += s.size();
  return n;
}

/// A list of states (or payloads) as one byte string: u64 count, then u64 length and bytes of each.
inline std::vector<std::byte> pack_blobs(const std::vector<std::vector<std::byte>>& blobs) {
  std::vector<std::byte> out;
  wire::writer w(out);
  w.put<std::uint64_t>(blobs.size());
  for (const auto& b : blobs) {
    w.put<std::uint64_t>(b.size());
    w.put_bytes(b);
  }
  return out;
}

/// The inverse of pack_blobs (views into `bytes`); throws wire_error on
/// malformed bytes or another count of parts.
inline std::vector<std::span<const std::byte>> unpack_blobs(std::span<const std::byte> bytes, std::size_t expected,
                                                            const char* who) {
  auto u64 = [&](std::size_t at) {
    if (bytes.size() < 8 || at > bytes.size() - 8)
      wire::reader::fail(wire::wire_errc::truncated, std::string(who) + ": truncated part list");
    return wire::reader(bytes.subspan(at, 8)).get<std::uint64_t>();
  };
  std::size_t at = 0;
  const auto n = u64(at);
  at += 8;
  if (n != expected)
    wire::reader::fail(wire::wire_errc::malformed_body,
                       std::string(who) + ": " + std::to_string(n) + " parts, expected " + std::to_string(expected));
  std::vector<std::span<const std::byte>> out;
  out.reserve(expected);
  for (std::size_t i = 0; i < expected; ++i) {
    const auto len = u64(at);
    at += 8;
    if (len > bytes.size() - at) wire::reader::fail(wire::wire_errc::truncated, std::string(who) + ": truncated part");
    out.push_back(bytes.subspan(at, static_cast<std::size_t>(len)));
    at += static_cast<std::size_t>(len);
  }
  if (at != bytes.size()) wire::reader::fail(wire::wire_errc::malformed_body, std::string(who) + ": trailing bytes");
  return out;
}
}  // namespace detail

/// Dense layers: one sum round of the bucket's floats, the layers back to back.
class dense_bucket final : public bucket_codec {
 public:
  using bucket_codec::absorb;
  using bucket_codec::contribute;
  explicit dense_bucket(std::vector<std::size_t> lengths) : lengths_(std::move(lengths)) {
    for (auto n : lengths_) total_ += n;
  }
  void begin(const step_context&) override { in_.clear(); }
  void prepare(const step_context&, std::span<const std::span<const float>> in) override {
    in_.assign(in.begin(), in.end());
  }
  std::size_t rounds() const override { return 1; }
  round_spec round(std::size_t) const override { return {round_op::sum, buffer_element::float32, total_, after_reduce_check::finite}; }
  void contribute(std::size_t, std::span<float> buffer) override {
    std::size_t at = 0;
    for (const auto& s : in_) {
      std::memcpy(buffer.data() + at, s.data(), s.size() * sizeof(float));
      at += s.size();
    }
  }
  void absorb(std::size_t, std::span<const float> reduced) override { reduced_ = reduced; }
  void finish(std::span<const std::span<float>> out) override {
    std::size_t at = 0;
    for (const auto& s : out) {
      std::memcpy(s.data(), reduced_.data() + at, s.size() * sizeof(float));
      at += s.size();
    }
  }
  void abandon() override {}
  std::vector<std::byte> save_state() const override {
    return wire::serialize_state(wire::codec_id::dense, total_, [](wire::writer&) {});
  }
  void restore_state(std::span<const std::byte> bytes) override {
    wire::header h;
    auto r = wire::parse_state(bytes, wire::codec_id::dense, &h);
    r.expect_end();
    if (h.element_count != total_) throw layout_error("dense bucket state: another bucket length");
  }
  std::vector<std::size_t> layer_bytes() const override {
    std::vector<std::size_t> v;
    for (auto n : lengths_) v.push_back(n * sizeof(float));
    return v;
  }
  std::string phase() const override { return "dense"; }

 private:
  std::vector<std::size_t> lengths_;
  std::size_t total_ = 0;
  std::vector<std::span<const float>> in_;
  std::span<const float> reduced_;
};

/// A non-linear codec's bucket (two-bit, QSGD, top-k with memory): one
/// all-gather round of every layer's wire payload; every rank decodes the N
/// payloads in rank order (decode_add), so every rank ends with the same sum.
/// `Make(layer_index, length)` builds the codec of one layer.
template <Codec C>
class gather_bucket final : public bucket_codec {
 public:
  using bucket_codec::absorb;
  using bucket_codec::contribute;
  template <class Make>
  gather_bucket(std::string name, const std::vector<std::size_t>& lengths, Make&& make) : name_(std::move(name)) {
    for (std::size_t j = 0; j < lengths.size(); ++j) {
      codecs_.push_back(make(j, lengths[j]));
      lengths_.push_back(lengths[j]);
    }
    payloads_.resize(codecs_.size());
    bytes_.assign(codecs_.size(), 0);
  }
  void begin(const step_context&) override {
    undo_.clear();
    gathered_ = {};
    std::fill(bytes_.begin(), bytes_.end(), 0);
  }
  void prepare(const step_context&, std::span<const std::span<const float>> in) override {
    undo_.reserve(codecs_.size());
    for (auto& c : codecs_) undo_.push_back(c.save_state());
    for (std::size_t j = 0; j < codecs_.size(); ++j) codecs_[j].encode(in[j], payloads_[j]);
  }
  std::size_t rounds() const override { return 1; }
  round_spec round(std::size_t) const override { return {round_op::all_gather, buffer_element::float32, 0, after_reduce_check::none}; }
  std::vector<std::byte> contribute(std::size_t) override {
    std::vector<std::vector<std::byte>> parts(codecs_.size());
    for (std::size_t j = 0; j < codecs_.size(); ++j) {
      wire::serialize_into(payloads_[j], parts[j]);
      bytes_[j] = parts[j].size();
    }
    return detail::pack_blobs(parts);
  }
  void absorb(std::size_t, std::span<const std::vector<std::byte>> gathered) override {
    gathered_ = gathered;
  }
  void finish(std::span<const std::span<float>> out) override {
    for (const auto& s : out) std::fill(s.begin(), s.end(), 0.0f);
    for (std::size_t rank = 0; rank < gathered_.size(); ++rank) {
      const auto parts = detail::unpack_blobs(gathered_[rank], codecs_.size(), "exchange gather bucket");
      for (std::size_t j = 0; j < codecs_.size(); ++j) {
        wire::parse_limits lim;
        lim.max_element_count = lengths_[j];
        const auto p = wire::parse<typename C::payload_type>(parts[j], lim);
        if (p.element_count() != lengths_[j])
          throw size_mismatch_error("exchange gather bucket: payload of rank " + std::to_string(rank), lengths_[j],
                                    static_cast<std::size_t>(p.element_count()));
        codecs_[j].decode_add(p, out[j]);
      }
    }
    undo_.clear();
  }
  void abandon() override {
    for (std::size_t j = 0; j < undo_.size(); ++j) codecs_[j].restore_state(undo_[j]);
    undo_.clear();
  }
  std::vector<std::byte> save_state() const override {
    std::vector<std::vector<std::byte>> s;
    for (const auto& c : codecs_) s.push_back(c.save_state());
    return detail::pack_blobs(s);
  }
  void restore_state(std::span<const std::byte> bytes) override {
    const auto parts = detail::unpack_blobs(bytes, codecs_.size(), "exchange gather bucket state");
    std::vector<C> copy = codecs_;
    for (std::size_t j = 0; j < copy.size(); ++j) copy[j].restore_state(parts[j]);
    codecs_ = std::move(copy);
  }
  std::vector<std::size_t> layer_bytes() const override { return bytes_; }
  std::string phase() const override { return name_; }
  /// The codec of layer j of the bucket (residuals, steps).
  const C& codec(std::size_t j) const { return codecs_.at(j); }

 private:
  std::string name_;
  std::vector<C> codecs_;
  std::vector<std::size_t> lengths_;
  std::vector<typename C::payload_type> payloads_;
  std::vector<std::vector<std::byte>> undo_;
  std::span<const std::vector<std::byte>> gathered_;
  std::vector<std::size_t> bytes_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
