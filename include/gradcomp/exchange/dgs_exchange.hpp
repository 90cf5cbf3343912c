#pragma once
/// \file exchange/dgs_exchange.hpp
/// The asynchronous DGS parameter server (seed 001: Algorithm 2 at the server,
/// Algorithm 3 with SAMomentum, eqs. 14-15, at the workers) reachable the way
/// model_exchange is: a worker object with one call per step
/// (`dgs_exchange::step(gradients, lr)`) and a server object with one call
/// (`dgs_server::serve(transport)`), over any of gradcomp's transports, on
/// the drivers async_ps_worker / async_ps_server (parameter_server.hpp) with
/// the dgs_rule preset. The server is rank 0 of the transport, the workers
/// ranks 1..N; they share the model description and the initial model.
///
/// Unlike model_exchange the replicas differ while training (each worker holds
/// the model of its last reply); finish() pulls the server's final model.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/exchange/model.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/parameter_server.hpp>
#include <gradcomp/presets/parameter_server_rules.hpp>
#include <gradcomp/samomentum.hpp>

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Options shared by the DGS workers and server (seed 001).
struct dgs_options {
  double ratio_percent = 1.0;  ///< top R% of each layer pushed (R = 1: 99% sparsity)
  float momentum = 0.7f;       ///< SAMomentum's m (eqs. 14-15)
  threshold_mode mode = threshold_mode::exact;
  std::uint64_t seed = 0;         ///< sampled thresholds (mixed with the layer)
  double secondary_ratio = 0.0;   ///< server: top R% of the model difference sent back (eq. 6a); 0 = dense
  int tag_up = ps_default_tag_up;      ///< worker-to-server tag (tags.hpp)
  int tag_down = ps_default_tag_down;  ///< server-to-worker tag
  int max_rejoins = 1;            ///< dense resyncs a step may trigger after a lost or malformed reply
};

/// What one worker step did.
struct dgs_step_stats {
  std::uint64_t step = 0;         ///< pushes so far
  std::size_t bytes_up = 0;       ///< this step's push frame
  std::size_t bytes_down = 0;     ///< this step's reply frame(s)
  std::size_t entries = 0;        ///< model entries the reply wrote
  std::uint64_t timestamp = 0;    ///< server time t of the model now held
  ps_pull_status status = ps_pull_status::updated;
};

namespace detail {
/// The layer partition of a model description (one layer per model layer).
inline layer_partition dgs_partition(const model_description& m) {
  std::vector<std::size_t> sizes;
  for (const auto& l : m.layers()) sizes.push_back(l.shape.size());
  return layer_partition(std::move(sizes));
}
/// The layers back to back; layout_error for another count or length.
inline std::vector<float> dgs_flatten(const model_description& m, std::span<const std::span<const float>> layers,
                                      const char* who) {
  if (layers.size() != m.size())
    throw layout_error(std::string(who) + ": " + std::to_string(layers.size()) + " layers for a model of " +
                       std::to_string(m.size()));
  std::vector<float> flat;
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (layers[i].size() != m[i].shape.size())
      throw layout_error(std::string(who) + ": layer '" + m[i].name + "' has " + std::to_string(layers[i].size()) +
                         " elements, expected " + std::to_string(m[i].shape.size()));
    flat.insert(flat.end(), layers[i].begin(), layers[i].end());
  }
  return flat;
}
}  // namespace detail

/// A DGS worker (transport rank >= 1): one call per step.
template <Transport T, ExecutionPolicy Policy = execution::seq>
class dgs_exchange {
 public:
  /// `initial`: the model every worker and the server start from, one span per layer.
  dgs_exchange(T& transport, model_description model, std::span<const std::span<const float>> initial,
               dgs_options options = {})
      : t_(&transport),
        model_desc_(std::move(model)),
        worker_(detail::dgs_partition(model_desc_),
                dgs_rule<Policy>{.ratio_percent = options.ratio_percent, .momentum = options.momentum,
                                 .mode = options.mode, .seed = options.seed},
                async_ps_worker_options{.server_rank = 0, .tag_up = options.tag_up, .tag_down = options.tag_down,
                                        .max_rejoins = options.max_rejoins}),
        model_(detail::dgs_flatten(model_desc_, initial, "exchange::dgs_exchange")) {
    if (transport.rank() == 0) throw invalid_argument_error("exchange::dgs_exchange: rank 0 is the server");
  }

  /// One step (Alg. 3 at worker k): pushes lr * gradients through SAMomentum
  /// (top R% of m u + lr g per layer) and applies the server's reply. On
  /// return `gradients` hold the model difference to add to the parameters
  /// (the new model minus the one before the step) and model() the new model.
  /// A push the server rejects throws state_error (the model is unchanged);
  /// gradients laid out for another model throw layout_error.
  const dgs_step_stats& step(std::span<const std::span<float>> gradients, float lr) {
    std::vector<std::span<const float>> in(gradients.begin(), gradients.end());
    const auto grad = detail::dgs_flatten(model_desc_, in, "exchange::dgs_exchange::step");
    const auto up = worker_.stats().bytes_up, down = worker_.stats().bytes_down;
    before_ = model_;
    const ps_reply r = worker_.step(*t_, grad, lr, model_);
    if (r.status == ps_pull_status::rejected)
      throw state_error("exchange::dgs_exchange: the server rejected push " + std::to_string(r.sequence) +
                        " (reason " + std::to_string(static_cast<int>(r.reason)) + ")");
    stats_.step = worker_.stats().pushes;
    stats_.bytes_up = static_cast<std::size_t>(worker_.stats().bytes_up - up);
    stats_.bytes_down = static_cast<std::size_t>(worker_.stats().bytes_down - down);
    stats_.entries = r.entries;
    stats_.timestamp = r.timestamp;
    stats_.status = r.status;
    std::size_t at = 0;
    for (auto& g : gradients)
      for (float& v : g) {
        v = model_[at] - before_[at];
        ++at;
      }
    return stats_;
  }

  /// Pulls the server's model into model() and leaves (the server's serve()
  /// returns when every worker has left). Call it once every worker's last
  /// step was served (a barrier among the workers), so that all pull the same final model.
  void finish() {
    worker_.join(*t_, model_);
    worker_.leave(*t_);
  }

  /// The model this worker holds (the server's values at its last reply), all layers back to back.
  std::span<const float> model() const noexcept { return model_; }
  /// Layer i of model().
  std::span<const float> layer(std::size_t i) const {
    const auto& p = worker_.layers();
    return std::span<const float>(model_).subspan(p.offset(i), p.size(i));
  }
  /// The model description the worker was built with.
  const model_description& layout() const noexcept { return model_desc_; }
  /// Statistics of the last step.
  const dgs_step_stats& stats() const noexcept { return stats_; }
  /// The driver's counters (pushes, rejected, resyncs, bytes both ways).
  const ps_worker_stats& worker_stats() const noexcept { return worker_.stats(); }

 private:
  T* t_;
  model_description model_desc_;
  async_ps_worker<sa_momentum<Policy>, Policy> worker_;
  std::vector<float> model_, before_;
  dgs_step_stats stats_;
};

/// The DGS server (transport rank 0): one call serves every worker until all
/// have left.
template <ExecutionPolicy Policy = execution::seq>
class dgs_server {
 public:
  /// `schedule`: the deterministic order of pushes (async_ps_options::schedule;
  /// round_robin() for equally fast workers), empty for arrival order.
  dgs_server(const model_description& model, std::span<const std::span<const float>> initial, int workers,
             dgs_options options = {}, std::vector<int> schedule = {})
      : server_(detail::dgs_partition(model), detail::dgs_flatten(model, initial, "exchange::dgs_server"), workers,
                dgs_rule<Policy>{.ratio_percent = options.ratio_percent, .momentum = options.momentum,
                                 .mode = options.mode, .seed = options.seed},
                async_ps_options{.downlink = ps_downlink::model_difference,
                                 .secondary_ratio = options.secondary_ratio,
                                 .tag_up = options.tag_up,
                                 .tag_down = options.tag_down,
                                 .schedule = std::move(schedule)}) {}

  /// worker 0, 1, ..., N-1, 0, ... for `steps` steps of each worker: the run
  /// then depends on the seeds only, each push computed on a model N-1 updates stale.
  static std::vector<int> round_robin(int workers, std::size_t steps) {
    std::vector<int> s;
    s.reserve(std::size_t(std::max(workers, 0)) * steps);
    for (std::size_t i = 0; i < steps; ++i)
      for (int k = 0; k < workers; ++k) s.push_back(k);
    return s;
  }

  /// Serves until every worker has left; the transport has 1 + N ranks, this is rank 0.
  template <Transport T>
  const ps_server_stats& serve(T& t) {
    return server_.serve(t);
  }
  /// theta_t.
  std::span<const float> model() const noexcept { return server_.model(); }
  const ps_server_stats& stats() const noexcept { return server_.stats(); }

 private:
  async_ps_server<sa_momentum<Policy>, Policy> server_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
