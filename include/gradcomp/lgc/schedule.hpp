#pragma once
/// \file lgc/schedule.hpp
/// The three phases of LGC (seed 004, Section V-B), the options of its
/// protocol forms, the layer layout and the byte accounting.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/lgc/architecture.hpp>
#include <gradcomp/lgc/trainer.hpp>
#include <gradcomp/lgc/windows.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/tags.hpp>

namespace gradcomp {

/// The three phases of Section V-B.
enum class lgc_phase : std::uint8_t {
  full = 0,          ///< eq. 14: uncompressed gradients
  topk_training = 1, ///< eq. 15: top-k updates while the autoencoder trains online
  compressed = 2,    ///< eq. 16: reconstructed aggregates from the trained autoencoder
};

/// Lengths of the phases (Section VI-A: about 200 full iterations, then 300
/// training iterations for classification, 200 for segmentation).
struct lgc_schedule {
  std::uint64_t full_iterations = 200;
  std::uint64_t training_iterations = 300;

  /// The phase of iteration `step`.
  [[nodiscard]] lgc_phase phase(std::uint64_t step) const noexcept {
    if (step < full_iterations) return lgc_phase::full;
    if (step - full_iterations < training_iterations) return lgc_phase::topk_training;
    return lgc_phase::compressed;
  }
  /// The first compressed step (weights are distributed at its start).
  [[nodiscard]] std::uint64_t first_compressed() const noexcept { return full_iterations + training_iterations; }
};

/// Tags the LGC forms use from their tag_base: tag_base .. tag_base + 19
/// (index set, training vectors, weights, the ring all-reduce's pair, the
/// parameter-server messages; the rest reserved).
inline constexpr int lgc_tag_width = 20;
static_assert(lgc_tag_width <= tags::lgc.count, "LGC's tags must fit its range in tags.hpp");

/// Options of the LGC protocol (both forms).
struct lgc_options {
  double alpha_percent = 0.1;        ///< top-k: alpha% of each compressed layer (Section V-A; 0.1%)
  double innovation_percent = 10.0;  ///< parameter server: top 10% of each layer's top-k values (Alg. 1)
  float momentum = 0.9f;             ///< DGC momentum correction in [0, 1); 0 = plain accumulation (Algs. 1-2)
  bool first_layer_dense = true;     ///< Section VI-A: the first layer is sent uncompressed
  bool last_layer_topk_only = true;  ///< Section VI-A: the last layer gets top-k without the autoencoder
  /// Beyond the paper (ring form): in the compressed phase each node decodes
  /// its own code and adds the reconstruction error back to its accumulator,
  /// as the unsent entries are kept, so the autoencoder's error is delayed
  /// rather than lost (error feedback). Costs one extra decode per step.
  bool feedback_reconstruction_error = false;
  /// Beyond the paper (ring form), the aggregate's error instead: every node
  /// adds x_k - D(average code) to its accumulator at the index set, so the
  /// nodes' additions sum to the aggregate's reconstruction error
  /// sum_k x_k - N D(average code) (no extra decode, nothing lost in total).
  bool feedback_aggregate_error = false;
  /// With either feedback: feed the error back only on steps
  /// whose relative reconstruction error ||x - D(E(x))||^2 / ||x||^2 of the
  /// node's own top-k vector is at most this (the autoencoder tracks its
  /// inputs); +inf: every compressed step.
  float feedback_max_error = std::numeric_limits<float>::infinity();
  /// Beyond the paper (ring form): 0 keeps the paper's frozen autoencoder in
  /// phase 3. P > 0: the trainer rank keeps training it in phase 3 on its own
  /// top-k vector of each step (no bytes), and every P compressed steps the
  /// retrained weights ride the index-set round to every rank, which code
  /// with them from that step on (each broadcast counted as payload).
  std::uint64_t retrain_period = 0;
  std::size_t window = 1024;         ///< autoencoder window (multiple of 2^depth)
  lgc_architecture architecture{};
  lgc_schedule schedule{};
  lgc_optimizer optimizer = lgc_optimizer::sgd;
  float learning_rate = 1e-3f;       ///< Section VI-A: SGD, lr 0.001, batch 1
  float lambda1 = 1.0f, lambda2 = 0.5f;  ///< eq. 7 (Section VI-G: lambda2 = 0.5)
  int deflate_level = 6;             ///< zlib level of the index sets
  std::uint64_t seed = 0;            ///< weights, leader election, the training's common node
  int trainer_rank = 0;              ///< ring: the node that trains the autoencoder
  int common_worker = 0;             ///< parameter server: the worker that sends the common code
  /// The forms use tags tag_base .. tag_base + 19 (lgc_tag_width); the default
  /// is LGC's range of the registry (tags.hpp), validate() refuses a base
  /// whose tags reach another piece's range.
  int tag_base = tags::lgc.first;

  /// The defaults above (a constructor template for a symbol per
  /// instruction set, as lgc_architecture's).
  template <class AbiMarker = execution::abi_marker>
  lgc_options() {}

  /// Throws invalid_argument_error on an option outside its domain, or a
  /// tag_base whose tags leave [0, 32767] or reach another piece's range.
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void validate() const {
    if (!(alpha_percent > 0.0 && alpha_percent <= 100.0))
      throw invalid_argument_error("lgc: alpha must be in (0, 100] percent");
    if (!(innovation_percent > 0.0 && innovation_percent <= 100.0))
      throw invalid_argument_error("lgc: innovation percent must be in (0, 100]");
    if (!(momentum >= 0.0f && momentum < 1.0f)) throw invalid_argument_error("lgc: momentum must be in [0, 1)");
    if (!(learning_rate > 0.0f) || !std::isfinite(learning_rate))
      throw invalid_argument_error("lgc: learning rate must be finite and > 0");
    if (!(lambda1 >= 0.0f && lambda2 >= 0.0f) || !std::isfinite(lambda1) || !std::isfinite(lambda2))
      throw invalid_argument_error("lgc: lambdas must be finite and >= 0");
    if (!(feedback_max_error >= 0.0f)) throw invalid_argument_error("lgc: feedback_max_error must be >= 0");
    if (deflate_level < -1 || deflate_level > 9) throw invalid_argument_error("lgc: DEFLATE level must be in [-1, 9]");
    tags::check_tag_base(tags::lgc, tag_base, lgc_tag_width, "lgc_options");
    architecture.validate();
    if (window == 0 || window % architecture.reduction() != 0)
      throw invalid_argument_error("lgc: the window must be a positive multiple of 2^depth = " +
                                   std::to_string(architecture.reduction()));
  }
};

/// The role of a layer (Section VI-A).
enum class lgc_layer_role : std::uint8_t {
  dense = 0,        ///< sent uncompressed (the first layer)
  autoencoder = 1,  ///< top-k values through the autoencoder
  topk = 2,         ///< top-k values sent as they are (the last layer)
};

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Which layers are dense, autoencoded or top-k only, their top-k counts and
/// where each layer's values sit in the autoencoder's input vector.
struct lgc_layout {
  std::vector<std::size_t> sizes;
  std::vector<lgc_layer_role> roles;
  std::vector<std::size_t> k;             ///< top-k count per layer (0 for dense layers)
  std::vector<std::size_t> value_offset;  ///< autoencoder layers: offset of the layer's values in the mu-vector
  std::vector<std::size_t> space_offset;  ///< autoencoder layers: offset of the layer in the concatenated layer space
  std::size_t mu = 0;             ///< values through the autoencoder per iteration
  std::size_t space = 0;          ///< elements of the autoencoder layers (their concatenated index space)
  std::size_t dense_values = 0;   ///< elements of the dense layers
  std::size_t topk_values = 0;    ///< values of the top-k-only layers
  std::size_t total = 0;          ///< all elements

  lgc_layout() = default;
  /// Throws invalid_argument_error on an empty model, an empty layer, no
  /// autoencoder layer, or fewer autoencoder values than one window.
  lgc_layout(std::vector<std::size_t> layer_sizes, const lgc_options& o) : sizes(std::move(layer_sizes)) {
    o.validate();
    if (sizes.empty()) throw invalid_argument_error("lgc: no layers");
    const std::size_t n = sizes.size();
    roles.assign(n, lgc_layer_role::autoencoder);
    if (o.first_layer_dense) roles[0] = lgc_layer_role::dense;
    if (o.last_layer_topk_only && n > 1) roles[n - 1] = lgc_layer_role::topk;
    k.assign(n, 0);
    value_offset.assign(n, 0);
    space_offset.assign(n, 0);
    for (std::size_t l = 0; l < n; ++l) {
      if (sizes[l] == 0) throw invalid_argument_error("lgc: layer " + std::to_string(l) + " is empty");
      if (sizes[l] > sparse_max_elements) throw invalid_argument_error("lgc: layers are limited to 2^32-1 elements");
      total += sizes[l];
      switch (roles[l]) {
        case lgc_layer_role::dense: dense_values += sizes[l]; break;
        case lgc_layer_role::topk:
          k[l] = sparse_selection_count(sizes[l], o.alpha_percent);
          topk_values += k[l];
          break;
        case lgc_layer_role::autoencoder:
          k[l] = sparse_selection_count(sizes[l], o.alpha_percent);
          value_offset[l] = mu;
          space_offset[l] = space;
          mu += k[l];
          space += sizes[l];
          break;
      }
    }
    if (space > sparse_max_elements) throw invalid_argument_error("lgc: autoencoder layers above 2^32-1 elements in total");
    if (mu == 0) throw invalid_argument_error("lgc: no layer goes through the autoencoder");
    if (mu < o.window)
      throw invalid_argument_error("lgc: the autoencoder input (" + std::to_string(mu) +
                                   " top-k values per iteration) is shorter than one window (" +
                                   std::to_string(o.window) + "); use a smaller window");
  }
  /// Windows of the autoencoder input (ceil(mu / window)).
  [[nodiscard]] std::size_t windows(std::size_t window) const noexcept { return detail::lgc_window_count(mu, window); }
};

GRADCOMP_ABI_NAMESPACE_END
/// Bytes of one node (or one run) for the compression-ratio accounting.
///  - original_bytes: the float32 gradient the node would send uncompressed (4 n per iteration);
///  - payload_bytes: wire::serialized_size of every payload the node produced,
///    each counted once: the paper's CR = size(original) / size(compressed)
///    (Section VI-A), indices and (once) weights included;
///  - wire_bytes: the bytes the node handed to its transport (ring
///    forwarding of the all-reduce, one copy per receiver of a broadcast).
struct lgc_traffic {
  std::uint64_t original_bytes = 0;
  std::uint64_t payload_bytes = 0;
  std::uint64_t wire_bytes = 0;

  /// The paper's CR: original_bytes / payload_bytes (0 before any payload).
  [[nodiscard]] double compression_ratio() const noexcept {
    return payload_bytes ? double(original_bytes) / double(payload_bytes) : 0.0;
  }
  lgc_traffic& operator+=(const lgc_traffic& o) noexcept {
    original_bytes += o.original_bytes;
    payload_bytes += o.payload_bytes;
    wire_bytes += o.wire_bytes;
    return *this;
  }
};

}  // namespace gradcomp
