#pragma once
/// \file exchange/model.hpp
/// The model description (layers in order, names, shapes), the plan (a codec
/// per layer from explicit choices and simple rules) and the buckets (small
/// layers of one codec fused up to a byte size). docs/exchange.md.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/homomorphic.hpp>
#include <gradcomp/layout.hpp>
#include <gradcomp/powersgd.hpp>
#include <gradcomp/lgc/schedule.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/two_bit.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// One layer of the model: its name, its gradient's shape, and the rank of
/// its tensor (1 for biases and norm weights; 0 when unknown).
struct layer_desc {
  std::string name;
  layer_shape shape;
  std::size_t tensor_rank = 0;
};

/// The layers of a model, in the order the framework hands their gradients.
class model_description {
 public:
  /// Appends a layer; names must be unique and non-empty, lengths positive.
  model_description& add(std::string name, layer_shape shape, std::size_t tensor_rank = 0) {
    if (name.empty()) throw invalid_argument_error("model_description::add: a layer needs a name");
    if (shape.size() == 0) throw invalid_argument_error("model_description::add: layer '" + name + "' is empty");
    for (const auto& l : layers_)
      if (l.name == name) throw invalid_argument_error("model_description::add: duplicate layer name '" + name + "'");
    layers_.push_back({std::move(name), shape, tensor_rank});
    return *this;
  }
  /// A conv weight [F, D, H, W] (GradiVeQ flattens it, Fig. 3a).
  model_description& add_conv(std::string name, std::size_t f, std::size_t d, std::size_t h, std::size_t w) {
    return add(std::move(name), layer_shape::conv(f, d, h, w), 4);
  }
  /// A 2-D weight [rows, cols] (a linear layer's [out_features, in_features]):
  /// dense for every codec but PowerSGD, which views it as a rows x cols matrix.
  model_description& add_matrix(std::string name, std::size_t rows, std::size_t cols) {
    return add(std::move(name), layer_shape::matrix(rows, cols), 2);
  }
  /// A tensor of n elements in framework order (`tensor_rank` 1 for a bias or norm weight).
  model_description& add_dense(std::string name, std::size_t n, std::size_t tensor_rank = 2) {
    return add(std::move(name), layer_shape::dense(n), tensor_rank);
  }
  const std::vector<layer_desc>& layers() const noexcept { return layers_; }
  std::size_t size() const noexcept { return layers_.size(); }
  const layer_desc& operator[](std::size_t i) const { return layers_.at(i); }

 private:
  std::vector<layer_desc> layers_;
};

/// The codecs a plan can give a layer.
enum class codec_kind : std::uint8_t {
  dense = 0,     ///< uncompressed float32, summed (one sum round)
  gradiveq = 1,  ///< GradiVeQ with its schedule (seed 002): dense / QSGD / compressed rounds
  two_bit = 2,   ///< two-bit quantizer with residual (seed 003): all-gather round
  qsgd = 3,      ///< QSGD (4 bits by default): all-gather round
  top_k = 4,     ///< top-R% sparsifier with memory (DGS Alg. 1, DGC option): all-gather round
  custom = 5,    ///< a bucket codec made by plan_options::custom_factory (any BucketCodec)
  fp16 = 6,      ///< IEEE binary16 (half.hpp): one sum round of a float16 buffer
  bf16 = 7,      ///< bfloat16 (half.hpp): one sum round of a bfloat16 buffer
  homomorphic = 8,  ///< agreed-scale integer quantizer (homomorphic.hpp): a max round, then a sum of int32 words
  powersgd = 9,  ///< rank-r PowerSGD (Vogels et al. 2019): a sum round of the P's, then one of the Q's
  lgc_ring = 10,  ///< LGC's ring form (seed 004, Alg. 2): full / top-k + training / code rounds; one bucket
  lgc_ps = 11,    ///< LGC's parameter-server form (seed 004, Alg. 1), the server's work on every rank; one bucket
};

/// True for the LGC kinds (their layers form one bucket, made by plan_options::lgc_factory).
constexpr bool is_lgc(codec_kind k) noexcept { return k == codec_kind::lgc_ring || k == codec_kind::lgc_ps; }

/// A readable name of a codec kind.
inline const char* to_string(codec_kind k) noexcept {
  switch (k) {
    case codec_kind::dense: return "dense";
    case codec_kind::gradiveq: return "gradiveq";
    case codec_kind::two_bit: return "two_bit";
    case codec_kind::qsgd: return "qsgd";
    case codec_kind::top_k: return "top_k";
    case codec_kind::custom: return "custom";
    case codec_kind::fp16: return "fp16";
    case codec_kind::bf16: return "bf16";
    case codec_kind::homomorphic: return "homomorphic";
    case codec_kind::powersgd: return "powersgd";
    case codec_kind::lgc_ring: return "lgc_ring";
    case codec_kind::lgc_ps: return "lgc_ps";
  }
  return "unknown";
}

/// How the plan chooses a layer's codec: an explicit choice by name wins;
/// then conv layers get `conv`; layers with fewer than `small_below`
/// elements or of tensor rank 1 get `small`; every other layer `fallback`.
struct plan_rules {
  std::vector<std::pair<std::string, codec_kind>> explicit_choices;
  codec_kind conv = codec_kind::gradiveq;
  codec_kind small = codec_kind::dense;
  std::size_t small_below = 4096;
  codec_kind fallback = codec_kind::dense;
};

/// One bucket: layers of one codec, in model order.
struct bucket_desc {
  codec_kind kind = codec_kind::dense;
  std::vector<std::size_t> layers;  ///< indices into the model
  std::size_t elements = 0;         ///< sum of the layers' lengths
};

class bucket_codec;
class plan;

/// Makes the bucket codec of a `codec_kind::custom` bucket on one rank (a
/// codec of another piece, a user's): (plan, bucket, rank, ranks). Wrap a
/// BucketCodec with bucket_codec_model (exchange/bucket_codecs.hpp).
using custom_bucket_factory =
    std::function<std::unique_ptr<bucket_codec>(const plan&, const bucket_desc&, int rank, int ranks)>;

/// Everything a plan fixes: rules, bucket size and every codec's options.
struct plan_options {
  plan_rules rules;
  /// Layers of one codec are fused into buckets of at most this many bytes
  /// of float32 gradient (a larger layer is a bucket of its own).
  std::size_t bucket_bytes = std::size_t{4} << 20;
  /// GradiVeQ's options; `summands` is set to the number of ranks.
  gradiveq_options gradiveq;
  /// The GradiVeQ schedule shared by every GradiVeQ layer (one vote per rank).
  gradiveq_schedule_options gradiveq_schedule;
  qsgd_options qsgd;  ///< seed mixed with rank and layer; also GradiVeQ's L_t sampler (bits from its schedule)
  two_bit_options two_bit = two_bit_options::automatic();
  sparsifier_options top_k;                            ///< seed mixed with rank and layer
  homomorphic_options homomorphic;                     ///< lane width (0: from N), block size; seed mixed with the layer (shared by the ranks), worker = rank
  /// PowerSGD's options (rank, start period, dense rule); its seed is mixed
  /// with the layer only, never the rank: every rank draws the same Q.
  powersgd_options powersgd;
  std::uint64_t seed = 0;                              ///< mixed into every rounding stream
  /// The exchange returns the mean over ranks (true) or the sum.
  bool average = true;
  /// The codec of `codec_kind::custom` layers, and its name (part of the
  /// plan's fingerprint: give another name to another custom codec or option).
  custom_bucket_factory custom_factory;
  std::string custom_name;
  /// LGC's options (seed 004; lgc/schedule.hpp). Its layers form one bucket
  /// whatever bucket_bytes says: the first layer of that bucket (when
  /// `lgc.first_layer_dense`) and, with `lgc_rank1_dense`, its layers of tensor
  /// rank 1 are concatenated into LGC's dense layer; the last other layer is
  /// top-k only (when `lgc.last_layer_topk_only`); the rest go through the
  /// autoencoder. exchange/lgc_bucket.hpp.
  lgc_options lgc;
  bool lgc_rank1_dense = true;
  /// Makes the LGC bucket: set it to exchange::lgc_bucket_factory<Policy>()
  /// (exchange/lgc_bucket.hpp; LGC needs zlib: link gradcomp::lgc), so that
  /// plans without LGC never need zlib.
  custom_bucket_factory lgc_factory;
};


/// The codec of every layer and the buckets. Identical on every rank for the
/// same model and options; fingerprint() hashes all of it (checkpoints).
class plan {
 public:
  plan(model_description model, plan_options options) : model_(std::move(model)), opt_(std::move(options)) {
    if (model_.size() == 0) throw invalid_argument_error("exchange::plan: the model has no layers");
    if (opt_.bucket_bytes < sizeof(float)) throw invalid_argument_error("exchange::plan: bucket_bytes must be >= 4");
    for (const auto& choice : opt_.rules.explicit_choices) {
      const std::string& name = choice.first;  // not a structured binding: clang 14 cannot capture one
      const bool known = std::any_of(model_.layers().begin(), model_.layers().end(),
                                     [&](const layer_desc& l) { return l.name == name; });
      if (!known) throw layout_error("exchange::plan: explicit choice for unknown layer '" + name + "'");
    }
    kinds_.reserve(model_.size());
    for (const auto& l : model_.layers()) kinds_.push_back(choose(l));
    if (std::find(kinds_.begin(), kinds_.end(), codec_kind::custom) != kinds_.end() && !opt_.custom_factory)
      throw invalid_argument_error("exchange::plan: custom layers need plan_options::custom_factory");
    if (std::any_of(kinds_.begin(), kinds_.end(), is_lgc) && !opt_.lgc_factory)
      throw invalid_argument_error(
          "exchange::plan: LGC layers need plan_options::lgc_factory = exchange::lgc_bucket_factory<Policy>() "
          "(exchange/lgc_bucket.hpp)");
    // GradiVeQ's schedule options are checked here, where the plan is made, not at the first step.
    if (uses_gradiveq()) {
      (void)gradiveq_schedule(opt_.gradiveq_schedule);
      // The sampler's rounding fed back stays bounded only under the max-norm scale (schedule.hpp).
      if (opt_.gradiveq_schedule.sampling_error_feedback && opt_.qsgd.norm != execution::qsgd_norm::max)
        throw invalid_argument_error(
            "exchange::plan: gradiveq sampling_error_feedback needs the max-norm QSGD sampler (qsgd.norm = max): "
            "with the l2 norm one rounding can exceed the vector it rounds and the fed-back memory grows");
    }
    make_buckets();
    fingerprint_ = compute_fingerprint();
  }

  const model_description& model() const noexcept { return model_; }
  const plan_options& options() const noexcept { return opt_; }
  /// Codec of layer i.
  codec_kind kind(std::size_t i) const { return kinds_.at(i); }
  const std::vector<bucket_desc>& buckets() const noexcept { return buckets_; }
  /// CRC-32C of the layers, the codec choices, the buckets and the options.
  std::uint32_t fingerprint() const noexcept { return fingerprint_; }
  /// True when some layer uses GradiVeQ (the plan then runs its schedule).
  bool uses_gradiveq() const noexcept {
    return std::find(kinds_.begin(), kinds_.end(), codec_kind::gradiveq) != kinds_.end();
  }

 private:
  codec_kind choose(const layer_desc& l) const {
    for (const auto& [name, kind] : opt_.rules.explicit_choices)
      if (name == l.name) return kind;
    if (l.shape.kind == layer_kind::conv) return opt_.rules.conv;
    if (l.shape.size() < opt_.rules.small_below || l.tensor_rank == 1) return opt_.rules.small;
    return opt_.rules.fallback;
  }

  // Greedy in model order, one open bucket per codec kind: a layer joins the
  // open bucket of its kind while the bucket stays within bucket_bytes.
  void make_buckets() {
    const std::size_t cap = opt_.bucket_bytes / sizeof(float);
    std::vector<std::ptrdiff_t> open(std::size_t{1} << 8, -1);  // one slot per possible codec_kind value
    for (std::size_t i = 0; i < model_.size(); ++i) {
      const auto k = static_cast<std::size_t>(kinds_[i]);
      const std::size_t n = model_[i].shape.size();
      if (open[k] >= 0 && (is_lgc(kinds_[i]) || buckets_[static_cast<std::size_t>(open[k])].elements + n <= cap)) {
        auto& b = buckets_[static_cast<std::size_t>(open[k])];
        b.layers.push_back(i);
        b.elements += n;
      } else {
        buckets_.push_back({kinds_[i], {i}, n});
        open[k] = static_cast<std::ptrdiff_t>(buckets_.size() - 1);
      }
    }
  }

  std::uint32_t compute_fingerprint() const {
    std::vector<std::byte> bytes;
    wire::writer w(bytes);
    w.put<std::uint64_t>(model_.size());
    for (std::size_t i = 0; i < model_.size(); ++i) {
      const auto& l = model_[i];
      w.put<std::uint64_t>(l.name.size());
      w.put_bytes(std::as_bytes(std::span<const char>(l.name.data(), l.name.size())));
      w.put<std::uint8_t>(static_cast<std::uint8_t>(l.shape.kind));
      for (std::size_t v : {l.shape.filters, l.shape.depth, l.shape.height, l.shape.width, l.shape.length})
        w.put<std::uint64_t>(v);
      w.put<std::uint8_t>(static_cast<std::uint8_t>(kinds_[i]));
    }
    w.put<std::uint64_t>(buckets_.size());
    for (const auto& b : buckets_) {
      w.put<std::uint64_t>(b.layers.size());
      for (auto i : b.layers) w.put<std::uint64_t>(i);
    }
    const auto& g = opt_.gradiveq;
    w.put<std::uint64_t>(g.slice_size);
    w.put<double>(g.lambda);
    w.put<std::uint64_t>(g.reuse_factor);
    w.put<std::uint64_t>(g.min_samples);
    w.put<std::uint8_t>(g.allow_tail ? 1 : 0);
    w.put<std::uint64_t>(g.pool_slices);
    w.put<std::uint64_t>(g.max_dimension);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(g.source));
    w.put<double>(g.holdout_fraction);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(g.solver));
    w.put<std::uint8_t>(static_cast<std::uint8_t>(g.basis_storage));
    const auto& s = opt_.gradiveq_schedule;
    for (std::size_t v : {s.warmup_iterations, s.sampling_iterations, s.compressed_iterations, s.patience,
                          s.min_compressed_iterations})
      w.put<std::uint64_t>(v);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(s.sampling));
    w.put<std::uint32_t>(s.qsgd_bits);
    w.put<double>(s.stale_threshold);
    w.put<std::uint8_t>(s.adaptive_cycles ? 1 : 0);
    w.put<std::uint8_t>(s.error_feedback ? 1 : 0);
    w.put<std::uint8_t>(s.spread_sampling ? 1 : 0);
    w.put<std::uint8_t>(s.sampling_error_feedback ? 1 : 0);
    w.put<std::uint32_t>(opt_.qsgd.bits);
    w.put<std::uint32_t>(opt_.qsgd.levels);
    w.put<std::uint64_t>(opt_.qsgd.bucket_size);
    w.put<std::uint64_t>(opt_.qsgd.seed);
    // The max norm only when chosen, so l2 plans keep their fingerprints.
    if (opt_.qsgd.norm != execution::qsgd_norm::l2) w.put<std::uint8_t>(static_cast<std::uint8_t>(opt_.qsgd.norm));
    w.put<std::uint8_t>(static_cast<std::uint8_t>(opt_.two_bit.mode));
    w.put<float>(opt_.two_bit.threshold);
    w.put<float>(opt_.two_bit.auto_scale);
    w.put<double>(opt_.top_k.ratio_percent);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(opt_.top_k.mode));
    w.put<std::uint64_t>(opt_.top_k.seed);
    w.put<float>(opt_.top_k.scale);
    w.put<std::uint8_t>(opt_.top_k.dgc_momentum ? 1 : 0);
    w.put<float>(opt_.top_k.momentum);
    w.put<std::uint64_t>(opt_.seed);
    w.put<std::uint8_t>(opt_.average ? 1 : 0);
    if (std::find(kinds_.begin(), kinds_.end(), codec_kind::homomorphic) != kinds_.end()) {
      // Only plans that use it hash its options: other plans keep their fingerprints.
      w.put<std::uint32_t>(opt_.homomorphic.bits);
      w.put<std::uint64_t>(opt_.homomorphic.block_size);
      w.put<std::uint64_t>(opt_.homomorphic.seed);
    }
    w.put<std::uint64_t>(opt_.custom_name.size());
    w.put_bytes(std::as_bytes(std::span<const char>(opt_.custom_name.data(), opt_.custom_name.size())));
    // PowerSGD's options only when a layer uses it, so other plans keep their fingerprints.
    if (std::find(kinds_.begin(), kinds_.end(), codec_kind::powersgd) != kinds_.end()) {
      const auto& ps = opt_.powersgd;
      for (std::uint64_t v : {std::uint64_t(ps.rank), std::uint64_t(ps.error_feedback), std::uint64_t(ps.warm_start),
                              ps.seed, std::uint64_t(ps.start_iter), std::uint64_t(ps.min_elements)})
        w.put<std::uint64_t>(v);
    }
    if (std::any_of(kinds_.begin(), kinds_.end(), is_lgc)) {  // plans without LGC keep their fingerprint
      const auto& l = opt_.lgc;
      for (double v : {l.alpha_percent, l.innovation_percent, double(l.momentum), double(l.learning_rate),
                       double(l.lambda1), double(l.lambda2), double(l.architecture.leaky_slope)})
        w.put<double>(v);
      for (std::uint64_t v : {std::uint64_t(l.first_layer_dense), std::uint64_t(l.last_layer_topk_only),
                              std::uint64_t(l.feedback_reconstruction_error), std::uint64_t(l.window),
                              std::uint64_t(l.schedule.full_iterations), std::uint64_t(l.schedule.training_iterations),
                              std::uint64_t(l.optimizer), std::uint64_t(std::int64_t(l.deflate_level)), l.seed,
                              std::uint64_t(l.trainer_rank), std::uint64_t(l.common_worker),
                              std::uint64_t(opt_.lgc_rank1_dense), std::uint64_t(l.architecture.code_channels),
                              std::uint64_t(l.architecture.kernel)})
        w.put<std::uint64_t>(v);
      for (const auto* ch : {&l.architecture.encoder_channels, &l.architecture.decoder_channels}) {
        w.put<std::uint64_t>(ch->size());
        for (auto c : *ch) w.put<std::uint64_t>(c);
      }
      if (l.retrain_period != 0 || l.feedback_max_error != std::numeric_limits<float>::infinity() ||
          l.feedback_aggregate_error) {
        w.put<std::uint64_t>(l.retrain_period + (std::uint64_t(l.feedback_aggregate_error) << 63));  // beyond the
        // paper; absent otherwise (same fingerprints)
        w.put<double>(double(l.feedback_max_error));
      }
    }
    return wire::crc32c(0, bytes);
  }

  model_description model_;
  plan_options opt_;
  std::vector<codec_kind> kinds_;
  std::vector<bucket_desc> buckets_;
  std::uint32_t fingerprint_ = 0;
};

/// A well-mixed 64-bit seed for (plan seed, codec seed, rank, layer): every
/// rank and layer draws its own rounding stream (QSGD, sampled thresholds).
inline std::uint64_t mixed_seed(std::uint64_t plan_seed, std::uint64_t codec_seed, int rank, std::size_t layer) noexcept {
  std::uint64_t x = plan_seed ^ (codec_seed * 0xD6E8FEB86659FD93ull) ^
                    (0x9E3779B97F4A7C15ull * std::uint64_t(rank + 1)) ^ (0xD1B54A32D192ED03ull * (layer + 1));
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
