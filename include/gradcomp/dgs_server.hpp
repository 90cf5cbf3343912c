#pragma once
/// \file dgs_server.hpp
/// The transport-free cores of the parameter servers (seed 001, DGS, Sec. 4.2),
/// usable on their own and driven over a network by parameter_server.hpp:
///
///  - layer_partition: the layers of a flat model vector (per-layer top-R%);
///  - model_update, apply_model_update: what a server sends a worker, and how
///    the worker applies it to its model;
///  - dgs_server_state: the asynchronous server (model-difference tracking,
///    eqs. 1-6, Algorithm 2) with optional secondary compression;
///  - sync_aggregate: the synchronous server's sum/average of one layer;
///  - ps_uplink: a worker's uplink, one codec per layer fed with lr * gradient
///    (the four rows of seed 001 Table 5 are four codec choices).
///
/// Sign conventions (seed 001 Sec. 4.2.1). Eq. 1: M_{t+1} = M_t - eta grad.
/// A worker pushes g_{k,t}, which already contains eta (Alg. 1 line 6:
/// r <- r + eta grad; Alg. 3 line 6: u <- m u + eta grad), so the server does
/// M <- M - g (Alg. 2 line 3). Eq. 2: theta_t = theta_0 + M_t.
///
/// What is stored. dgs_server_state keeps theta_t = theta_0 + M_t instead of
/// M_t, and for every worker w_k = theta_0 + v_k (the model worker k holds)
/// instead of v_k. Every difference the paper uses is unchanged:
///     G_{k,t+1} = M_{t+1} - v_k = theta_{t+1} - w_k            (eq. 3)
/// and eq. 1 becomes theta <- theta - g, which is what a plain ASGD server
/// computes, so with no sparsification the run is plain ASGD bit for bit. It
/// also lets the server hand a (re)joining worker the model itself.
///
/// Sent values, not sums. Eqs. 4 / 6b say v_k <- v_k + G and eq. 5 says the
/// worker does theta_k <- theta_k + G. In floating point w + (theta - w) need
/// not round to theta, so the server sends, at each selected index i, the
/// value theta_t[i], and both the worker and the server's copy w_k assign it:
/// w_k[i] <- theta_t[i]. In exact arithmetic this is eqs. 4-6b; in floating
/// point it makes eq. 5 exact: with no sparsification every worker holds the
/// server's model bit for bit after each pull. The bytes are those of a
/// sparse G (one index and one float per sent entry). Algorithm 2 line 14
/// writes v <- v - G: a slip, eqs. 4 and 6b are right (v <- v + G).
///
/// Memory (Sec. 5.6.2): the copies w_k are the server's extra memory,
/// N x the model; dgs_server_state::memory() reports it.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/payloads/topk.hpp>  // sparse_selection_count and the top-k kernels
#include <gradcomp/system/generic/parameter_server.hpp>

namespace gradcomp {

// ---------------------------------------------------------------------------
// Layers

GRADCOMP_ABI_NAMESPACE_BEGIN
/// The layers of a flat model vector: layer j is [offset(j), offset(j) + size(j)).
/// Per-layer behaviour (top R% of each layer, Alg. 1 line 7 and Alg. 2 line 6)
/// comes from this partition. Every layer is non-empty and below 2^32 elements
/// (indices on the wire are 32-bit).
class layer_partition {
 public:
  layer_partition() = default;
  /// Layers of the given sizes, in order.
  explicit layer_partition(std::vector<std::size_t> sizes) : sizes_(std::move(sizes)) {
    if (sizes_.empty()) throw invalid_argument_error("layer_partition: at least one layer is needed");
    offsets_.reserve(sizes_.size() + 1);
    offsets_.push_back(0);
    for (std::size_t j = 0; j < sizes_.size(); ++j) {
      if (sizes_[j] == 0) throw invalid_argument_error("layer_partition: layer " + std::to_string(j) + " is empty");
      if (sizes_[j] > std::numeric_limits<std::uint32_t>::max())
        throw invalid_argument_error("layer_partition: layer " + std::to_string(j) + " has 2^32 elements or more");
      offsets_.push_back(offsets_.back() + sizes_[j]);
    }
  }
  /// One layer of n elements.
  static layer_partition single(std::size_t n) { return layer_partition(std::vector<std::size_t>{n}); }

  std::size_t layers() const noexcept { return sizes_.size(); }
  std::size_t size(std::size_t j) const { return sizes_.at(j); }
  std::size_t offset(std::size_t j) const { return offsets_.at(j); }
  /// Elements of the whole model.
  std::size_t total() const noexcept { return offsets_.empty() ? 0 : offsets_.back(); }
  const std::vector<std::size_t>& sizes() const noexcept { return sizes_; }

  /// Layer j of a flat vector of total() elements.
  template <class T>
  std::span<T> layer(std::span<T> flat, std::size_t j) const {
    return flat.subspan(offset(j), size(j));
  }

  /// Throws size_mismatch_error unless `n == total()`.
  void check(const char* where, std::size_t n) const {
    if (n != total()) throw size_mismatch_error(where, total(), n);
  }

  friend bool operator==(const layer_partition& a, const layer_partition& b) noexcept { return a.sizes_ == b.sizes_; }

 private:
  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> offsets_;
};

GRADCOMP_ABI_NAMESPACE_END
// ---------------------------------------------------------------------------
// Model updates (server -> worker)

/// One layer of a model update: assign `values[j]` at `indices[j]` (increasing),
/// or, when `dense`, the whole layer (`values` holds every element, `indices` is empty).
struct layer_update {
  bool dense = false;
  std::vector<std::uint32_t> indices;
  std::vector<float> values;
};

/// What the asynchronous server sends worker k after a push (G_{k,t+1} of
/// eqs. 3 / 6a in "sent values" form, see the file comment), or a dense resync.
struct model_update {
  std::vector<layer_update> layers;
  std::uint64_t timestamp = 0;  ///< server time t of the model the update brings the worker to
  bool resync = false;          ///< a full dense model (join / rejoin)

  /// Entries sent, over all layers.
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  std::size_t entries() const noexcept {
    std::size_t s = 0;
    for (const auto& l : layers) s += l.values.size();
    return s;
  }
};

/// Applies a model update to a worker's model (Alg. 1 line 16 / Alg. 3 line 15,
/// as the assignment theta_k[i] <- theta_t[i] that eq. 5 describes). Everything
/// is checked before the model changes: the layer count, dense sizes, index
/// order and range (size_mismatch_error / invalid_argument_error).
template <ExecutionPolicy Policy = execution::seq>
void apply_model_update(const layer_partition& layers, const model_update& u, std::span<float> model) {
  layers.check("apply_model_update: model", model.size());
  if (u.layers.size() != layers.layers())
    throw size_mismatch_error("apply_model_update: layers of the update", layers.layers(), u.layers.size());
  for (std::size_t j = 0; j < layers.layers(); ++j) {
    const auto& l = u.layers[j];
    const std::size_t n = layers.size(j);
    if (l.dense) {
      if (l.values.size() != n) throw size_mismatch_error("apply_model_update: dense layer", n, l.values.size());
      if (!l.indices.empty()) throw invalid_argument_error("apply_model_update: a dense layer carries indices");
      continue;
    }
    if (l.indices.size() != l.values.size())
      throw size_mismatch_error("apply_model_update: values of a sparse layer", l.indices.size(), l.values.size());
    for (std::size_t i = 0; i < l.indices.size(); ++i) {
      if (l.indices[i] >= n)
        throw invalid_argument_error("apply_model_update: index " + std::to_string(l.indices[i]) + " of layer " +
                                     std::to_string(j) + " is outside [0, " + std::to_string(n) + ")");
      if (i > 0 && l.indices[i] <= l.indices[i - 1])
        throw invalid_argument_error("apply_model_update: indices of layer " + std::to_string(j) +
                                     " are not increasing");
    }
  }
  for (std::size_t j = 0; j < layers.layers(); ++j) {
    const auto& l = u.layers[j];
    auto dst = layers.layer(model, j);
    if (l.dense)
      std::copy(l.values.begin(), l.values.end(), dst.begin());
    else
      ps_assign_at(Policy{}, dst, std::span<const std::uint32_t>(l.indices), std::span<const float>(l.values));
  }
}

// ---------------------------------------------------------------------------
// The asynchronous server's state

/// What the asynchronous server sends back after a push.
enum class ps_downlink : std::uint8_t {
  /// The whole model, dense (classic ASGD, seed 001 Fig. 1; MXNet dist_async:
  /// only worker-to-server traffic is compressed). No per-worker copies.
  dense = 1,
  /// The model difference G = theta - w_k (DGS, eqs. 3-6): only the entries
  /// that changed since worker k's last pull, or with secondary compression the
  /// top R% of |G| per layer. Keeps one model copy per worker.
  model_difference = 2,
};

/// Options of dgs_server_state.
struct dgs_server_options {
  ps_downlink downlink = ps_downlink::model_difference;
  /// Secondary compression (eq. 6a, Alg. 2 lines 5-11): per layer, send only
  /// the top `secondary_ratio` percent of |G|; the rest stays in theta - w_k and
  /// is sent later. 0 turns it off; otherwise in (0, 100].
  double secondary_ratio = 0.0;
};

/// Bytes a parameter server holds (seed 001 Sec. 5.6.2).
struct ps_memory_report {
  std::size_t model_bytes = 0;    ///< theta_t (the model; the paper's M_t)
  std::size_t replica_bytes = 0;  ///< the per-worker w_k (the paper's v_k): N x the model
  std::size_t scratch_bytes = 0;  ///< work buffers (G of one layer, decoded pushes, selections)
  /// The extra memory of model-difference tracking: N x ParameterMemOfModel.
  std::size_t extra_bytes() const noexcept { return replica_bytes; }
  std::size_t total_bytes() const noexcept { return model_bytes + replica_bytes + scratch_bytes; }
};

/// The asynchronous DGS server's state, with no transport: the model theta_t =
/// theta_0 + M_t, one copy w_k = theta_0 + v_k per worker, and the server time t
/// (seed 001 Alg. 2; see the file comment for why theta and w_k are stored).
/// Workers are numbered 0..N-1 and start from theta_0.
///
/// push(k, g) is one iteration of Algorithm 2: theta <- theta - g (eq. 1),
/// G = theta - w_k (eq. 3), optionally sparsified per layer (eq. 6a), sent,
/// and w_k[i] <- theta[i] where sent (eqs. 4, 6b). Everything is checked
/// before anything changes: a bad push leaves the state as it was.
template <ExecutionPolicy Policy = execution::seq>
class dgs_server_state {
 public:
  dgs_server_state(layer_partition layers, std::span<const float> theta0, int workers, dgs_server_options options = {})
      : layers_(std::move(layers)), options_(options) {
    if (layers_.layers() == 0) throw invalid_argument_error("dgs_server_state: the layer partition is empty");
    layers_.check("dgs_server_state: theta_0", theta0.size());
    if (workers < 1) throw invalid_argument_error("dgs_server_state: at least one worker is needed");
    if (options_.downlink != ps_downlink::dense && options_.downlink != ps_downlink::model_difference)
      throw invalid_argument_error("dgs_server_state: unknown downlink mode");
    if (options_.secondary_ratio != 0.0) {
      if (!(options_.secondary_ratio > 0.0 && options_.secondary_ratio <= 100.0))
        throw invalid_argument_error("dgs_server_state: secondary_ratio R must be 0 (off) or in (0, 100] percent");
      if (options_.downlink == ps_downlink::dense)
        throw invalid_argument_error("dgs_server_state: secondary compression needs the model_difference downlink");
    }
    if (auto bad = find_non_finite(Policy{}, theta0); bad != theta0.size())
      throw non_finite_error("dgs_server_state: theta_0", bad);
    workers_ = workers;
    theta_.assign(theta0.begin(), theta0.end());
    if (options_.downlink == ps_downlink::model_difference) {
      replicas_.resize(static_cast<std::size_t>(workers));
      for (auto& w : replicas_) w.assign(theta0.begin(), theta0.end());
    }
  }

  const layer_partition& layers() const noexcept { return layers_; }
  const dgs_server_options& options() const noexcept { return options_; }
  int workers() const noexcept { return workers_; }
  /// Server time t: the number of updates applied (Table 1).
  std::uint64_t timestamp() const noexcept { return t_; }
  /// theta_t = theta_0 + M_t (eq. 2).
  std::span<const float> model() const noexcept { return theta_; }
  /// w_k = theta_0 + v_k: the model worker k holds after its last pull.
  std::span<const float> replica(int k) const {
    check_worker(k, "replica");
    if (replicas_.empty()) throw state_error("dgs_server_state::replica: the dense downlink keeps no per-worker copies");
    return replicas_[static_cast<std::size_t>(k)];
  }

  /// Eq. 1 (Alg. 2 line 3): theta <- theta - g, t <- t + 1. `g` covers the
  /// whole model and already contains the learning rate. Throws
  /// size_mismatch_error / non_finite_error with the state unchanged.
  void apply(std::span<const float> g) {
    layers_.check("dgs_server_state::apply: update", g.size());
    if (auto bad = find_non_finite(Policy{}, g); bad != g.size())
      throw non_finite_error("dgs_server_state::apply: update", bad);
    ps_subtract(Policy{}, std::span<float>(theta_), g);
    ++t_;
  }

  /// Eq. 1 for a sparse g, given per layer as (indices, values) (a dense layer
  /// holds every value): theta[i] -= g[i] where g is given, t <- t + 1. The
  /// same bits as apply() of the dense vector with zeros elsewhere, in O(sent)
  /// for sparse layers. Everything (layer count, sizes, index order and
  /// range, NaN/Inf) is checked first; on error the state is unchanged.
  void apply_sparse(std::span<const layer_update> g) {
    if (g.size() != layers_.layers())
      throw size_mismatch_error("dgs_server_state::apply_sparse: layers", layers_.layers(), g.size());
    for (std::size_t j = 0; j < g.size(); ++j) {
      const auto& l = g[j];
      const std::size_t n = layers_.size(j);
      if (l.dense) {
        if (l.values.size() != n)
          throw size_mismatch_error("dgs_server_state::apply_sparse: dense layer", n, l.values.size());
      } else {
        if (l.indices.size() != l.values.size())
          throw size_mismatch_error("dgs_server_state::apply_sparse: values", l.indices.size(), l.values.size());
        for (std::size_t q = 0; q < l.indices.size(); ++q)
          if (l.indices[q] >= n || (q > 0 && l.indices[q] <= l.indices[q - 1]))
            throw invalid_argument_error("dgs_server_state::apply_sparse: indices of layer " + std::to_string(j) +
                                         " are not increasing and below " + std::to_string(n));
      }
      if (auto bad = find_non_finite(Policy{}, std::span<const float>(l.values)); bad != l.values.size())
        throw non_finite_error("dgs_server_state::apply_sparse: layer " + std::to_string(j),
                               l.dense ? layers_.offset(j) + bad : layers_.offset(j) + l.indices[bad]);
    }
    for (std::size_t j = 0; j < g.size(); ++j) {
      const auto& l = g[j];
      auto th = layers_.layer(std::span<float>(theta_), j);
      if (l.dense) {
        ps_subtract(Policy{}, th, std::span<const float>(l.values));
      } else {
        for (std::size_t q = 0; q < l.indices.size(); ++q) th[l.indices[q]] -= l.values[q];
      }
    }
    ++t_;
  }

  /// Eqs. 3, 6a, 6b (Alg. 2 lines 4-15): what worker k is sent now, and the
  /// server's copy w_k updated accordingly. Without secondary compression it is
  /// every entry where w_k differs from theta (so the worker ends at theta_t,
  /// eq. 5); with it, the top R% of |theta - w_k| per layer (ties: lower index).
  /// With the dense downlink it is the whole model.
  [[nodiscard]] model_update update_for(int k) {
    check_worker(k, "update_for");
    model_update u;
    u.timestamp = t_;
    u.layers.resize(layers_.layers());
    if (options_.downlink == ps_downlink::dense) {
      for (std::size_t j = 0; j < layers_.layers(); ++j) {
        auto src = layers_.layer(std::span<const float>(theta_), j);
        u.layers[j].dense = true;
        u.layers[j].values.assign(src.begin(), src.end());
      }
      return u;
    }
    auto& w = replicas_[static_cast<std::size_t>(k)];
    for (std::size_t j = 0; j < layers_.layers(); ++j) {
      auto th = layers_.layer(std::span<const float>(theta_), j);
      auto wk = layers_.layer(std::span<float>(w), j);
      auto& l = u.layers[j];
      if (options_.secondary_ratio == 0.0) {
        ps_collect_changed(Policy{}, th, std::span<const float>(wk), l.indices);
      } else {
        // k = max(1, ceil(R% n)), the same count as the workers' top-R% (payloads/topk.hpp).
        const std::size_t kk = sparse_selection_count(th.size(), options_.secondary_ratio);
        if (kk >= th.size()) {  // R = 100%: everything that changed
          ps_collect_changed(Policy{}, th, std::span<const float>(wk), l.indices);
        } else {
          // G = theta - w_k (eq. 3), then the exact top R% of |G| (eq. 6a, ties:
          // lower index; the sampled bracket of topk_exact only saves work);
          // entries where w_k already equals theta are dropped (nothing to send).
          diff_.resize(th.size());
          ps_difference(Policy{}, std::span<float>(diff_), th, std::span<const float>(wk));
          topk_exact(Policy{}, std::span<const float>(diff_), kk, l.indices, topk_ws_, 0, t_);
          std::erase_if(l.indices, [&](std::uint32_t i) {
            return std::bit_cast<std::uint32_t>(th[i]) == std::bit_cast<std::uint32_t>(wk[i]);
          });
        }
      }
      l.values.resize(l.indices.size());
      ps_gather(Policy{}, th, std::span<const std::uint32_t>(l.indices), std::span<float>(l.values));
      // Eqs. 4 / 6b: v_k <- v_k + G, i.e. w_k takes theta's value where sent.
      ps_assign_at(Policy{}, wk, std::span<const std::uint32_t>(l.indices), std::span<const float>(l.values));
    }
    return u;
  }

  /// One iteration of Algorithm 2 for worker k: apply(g), then update_for(k).
  [[nodiscard]] model_update push(int k, std::span<const float> g) {
    check_worker(k, "push");
    apply(g);
    return update_for(k);
  }

  /// A dense resync for a worker that (re)joins: the whole model theta_t, and
  /// w_k <- theta_t.
  [[nodiscard]] model_update resync(int k) {
    check_worker(k, "resync");
    model_update u;
    u.timestamp = t_;
    u.resync = true;
    u.layers.resize(layers_.layers());
    for (std::size_t j = 0; j < layers_.layers(); ++j) {
      auto src = layers_.layer(std::span<const float>(theta_), j);
      u.layers[j].dense = true;
      u.layers[j].values.assign(src.begin(), src.end());
    }
    if (!replicas_.empty()) replicas_[static_cast<std::size_t>(k)] = theta_;
    return u;
  }

  /// Entries where worker k's model differs from theta_t: what secondary
  /// compression has delayed, or what others pushed since k's last pull.
  std::size_t pending(int k) const {
    auto w = replica(k);
    std::size_t n = 0;
    for (std::size_t i = 0; i < theta_.size(); ++i)
      n += std::bit_cast<std::uint32_t>(theta_[i]) != std::bit_cast<std::uint32_t>(w[i]);
    return n;
  }

  /// The server's memory: the model, the N copies w_k (Sec. 5.6.2's extra
  /// N x model) and the work buffers, by their allocated capacity.
  ps_memory_report memory() const noexcept {
    ps_memory_report r;
    r.model_bytes = theta_.capacity() * sizeof(float);
    for (const auto& w : replicas_) r.replica_bytes += w.capacity() * sizeof(float);
    r.scratch_bytes = diff_.capacity() * sizeof(float) + topk_ws_.hist.capacity() * sizeof(std::uint32_t) +
                      topk_ws_.sub.capacity() * sizeof(std::uint32_t) +
                      topk_ws_.keys.capacity() * sizeof(std::uint32_t) +
                      topk_ws_.scratch.capacity() * sizeof(std::uint32_t);
    return r;
  }

 private:
  void check_worker(int k, const char* what) const {
    if (k < 0 || k >= workers_)
      throw invalid_argument_error(std::string("dgs_server_state::") + what + ": worker " + std::to_string(k) +
                                   " is outside [0, " + std::to_string(workers_) + ")");
  }

  layer_partition layers_;
  dgs_server_options options_;
  int workers_ = 0;
  std::uint64_t t_ = 0;
  std::vector<float> theta_;
  std::vector<std::vector<float>> replicas_;
  std::vector<float> diff_;
  execution::topk_workspace topk_ws_;
};

// ---------------------------------------------------------------------------
// The synchronous server's aggregation

/// What an aggregating server needs of a codec: its payload type and a const
/// decode (every Codec qualifies; so do decode-only helpers).
template <class D>
concept PayloadDecoder = requires { typename D::payload_type; } &&
                         requires(const D& d, const typename D::payload_type& p, std::span<float> out) {
                           { d.decode(p, out) } -> std::same_as<void>;
                         };

/// Sum, or average, of one layer's payloads from the contributing workers into
/// `out` (the aggregation of a synchronous step, seed 001 eq. 7's sum over k),
/// in the order the payloads are given, so it is deterministic. A linear
/// codec's payloads are summed in the compressed domain and decoded once; a
/// codec with decode_add decodes into the running sum; any other is decoded
/// into `scratch` and added. The average divides the sum by the number of
/// payloads (one rounding). No payloads: `out` is zero.
template <ExecutionPolicy Policy = execution::seq, PayloadDecoder D>
void sync_aggregate(const D& decoder, std::span<const typename D::payload_type* const> payloads,
                    std::span<float> out, bool average, std::vector<float>& scratch) {
  using P = typename D::payload_type;
  if (payloads.empty()) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  for (const auto* p : payloads) {
    if (p == nullptr) throw invalid_argument_error("sync_aggregate: null payload");
    if (p->element_count() != out.size())
      throw size_mismatch_error("sync_aggregate: payload", out.size(), static_cast<std::size_t>(p->element_count()));
  }
  if constexpr (enable_linear_codec<D> && std::copy_constructible<P> &&
                requires(const D& d, P& a, const P& b) { d.accumulate(a, b); }) {
    P acc = *payloads[0];
    for (std::size_t i = 1; i < payloads.size(); ++i) decoder.accumulate(acc, *payloads[i]);
    decoder.decode(acc, out);
  } else if constexpr (requires(const D& d, const P& p, std::span<float> o) { d.decode_add(p, o); }) {
    decoder.decode(*payloads[0], out);
    for (std::size_t i = 1; i < payloads.size(); ++i) decoder.decode_add(*payloads[i], out);
  } else {
    decoder.decode(*payloads[0], out);
    scratch.resize(out.size());
    for (std::size_t i = 1; i < payloads.size(); ++i) {
      decoder.decode(*payloads[i], std::span<float>(scratch));
      add_into(Policy{}, out, std::span<const float>(scratch));
    }
  }
  if (average && payloads.size() > 1) {
    const float n = static_cast<float>(payloads.size());
    for (auto& v : out) v = v / n;
  }
}

// ---------------------------------------------------------------------------
// The worker's uplink

/// A worker's uplink: one codec per layer, fed with lr * gradient. Which codec
/// makes the worker's update rule (seed 001 Table 5): dense_codec is plain
/// ASGD, sparsifier_with_memory is GD-async (Alg. 1, residual), its DGC mode is
/// DGC-async (momentum correction and factor masking), sa_momentum is DGS
/// (Alg. 3, eqs. 14-15); presets/parameter_server_rules.hpp names the four.
///
/// encode() checks the whole scaled gradient for NaN/Inf before any codec
/// runs, so a rejected step changes no layer's state.
template <Codec C, ExecutionPolicy Policy = execution::seq>
class ps_uplink {
 public:
  using codec_type = C;
  using payload_type = typename C::payload_type;

  /// `make(j, size)` builds layer j's codec.
  template <class MakeCodec>
    requires std::invocable<MakeCodec&, std::size_t, std::size_t>
  ps_uplink(layer_partition layers, MakeCodec&& make) : layers_(std::move(layers)) {
    if (layers_.layers() == 0) throw invalid_argument_error("ps_uplink: the layer partition is empty");
    codecs_.reserve(layers_.layers());
    for (std::size_t j = 0; j < layers_.layers(); ++j) codecs_.push_back(make(j, layers_.size(j)));
  }

  const layer_partition& layers() const noexcept { return layers_; }
  C& codec(std::size_t j) { return codecs_.at(j); }
  const C& codec(std::size_t j) const { return codecs_.at(j); }

  /// Encodes lr * gradient, layer by layer, into out[j] (resized to the layer count).
  /// Throws invalid_argument_error for lr not finite and positive,
  /// size_mismatch_error, non_finite_error (the first bad index of the scaled
  /// gradient), all before any codec state changes.
  void encode(std::span<const float> gradient, float lr, std::vector<payload_type>& out) {
    layers_.check("ps_uplink::encode: gradient", gradient.size());
    if (!(std::isfinite(lr) && lr > 0.0f))
      throw invalid_argument_error("ps_uplink::encode: the learning rate must be finite and positive");
    scaled_.resize(gradient.size());
    ps_scale(Policy{}, std::span<float>(scaled_), gradient, lr);
    if (auto bad = find_non_finite(Policy{}, std::span<const float>(scaled_)); bad != scaled_.size())
      throw non_finite_error("ps_uplink::encode: lr * gradient", bad);
    out.resize(layers_.layers());
    for (std::size_t j = 0; j < layers_.layers(); ++j)
      codecs_[j].encode(layers_.layer(std::span<const float>(scaled_), j), out[j]);
  }

 private:
  layer_partition layers_;
  std::vector<C> codecs_;
  std::vector<float> scaled_;
};

}  // namespace gradcomp
