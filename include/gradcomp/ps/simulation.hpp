#pragma once
/// \file ps/simulation.hpp
/// async_ps_simulation: the asynchronous server and its workers in one
/// thread, exchanging the frames a transport would carry (deterministic runs).

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ps/async_server.hpp>
#include <gradcomp/ps/async_worker.hpp>

namespace gradcomp {

/// The asynchronous parameter server and N workers in one thread, exchanging
/// the same frames a transport would carry, in the order the caller chooses:
/// step(k, ...) is worker k pushing and pulling (seed 001 Alg. 1/3 at worker
/// k, Alg. 2 at the server). Bit for bit the run of async_ps_server::serve
/// with the same schedule. Workers start from theta_0.
template <Codec C, ExecutionPolicy Policy = execution::seq>
class async_ps_simulation {
 public:
  template <class MakeCodec>
    requires std::invocable<MakeCodec&, std::size_t, std::size_t>
  async_ps_simulation(layer_partition layers, std::span<const float> theta0, int workers, MakeCodec&& make,
                      async_ps_options options = {})
      : server_(layers, theta0, workers, make, std::move(options)) {
    workers_.reserve(static_cast<std::size_t>(workers));
    models_.reserve(static_cast<std::size_t>(workers));
    for (int k = 0; k < workers; ++k) {
      workers_.emplace_back(layers, make);
      models_.emplace_back(theta0.begin(), theta0.end());
    }
  }

  int workers() const noexcept { return server_.workers(); }
  async_ps_server<C, Policy>& server() noexcept { return server_; }
  const async_ps_server<C, Policy>& server() const noexcept { return server_; }
  async_ps_worker<C, Policy>& worker(int k) { return workers_.at(static_cast<std::size_t>(k)); }
  /// Worker k's model theta_k.
  std::span<float> model(int k) { return models_.at(static_cast<std::size_t>(k)); }
  std::span<const float> model(int k) const { return models_.at(static_cast<std::size_t>(k)); }

  /// Worker k pushes lr * gradient (computed by the caller at model(k)) and
  /// applies the server's reply.
  [[nodiscard]] ps_reply step(int k, std::span<const float> gradient, float lr) {
    auto& w = worker(k);
    auto up = w.make_push(gradient, lr);
    ps_handled h = server_.handle(k, std::span<const std::byte>(up));
    return w.apply_reply(std::span<const std::byte>(h.reply), model(k));
  }

  /// Worker k (re)joins: its model becomes the server's.
  ps_reply join(int k) {
    auto& w = worker(k);
    auto up = w.make_join();
    ps_handled h = server_.handle(k, std::span<const std::byte>(up));
    return w.apply_reply(std::span<const std::byte>(h.reply), model(k));
  }

 private:
  async_ps_server<C, Policy> server_;
  std::vector<async_ps_worker<C, Policy>> workers_;
  std::vector<std::vector<float>> models_;
};

}  // namespace gradcomp
