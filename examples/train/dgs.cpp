// DGS (seed 001) in the demo: the asynchronous parameter server through
// gradcomp's sibling of the whole-model exchange (exchange/dgs_exchange.hpp),
// with the demo's learning-rate scaling, weight decay and byte columns.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <gradcomp/exchange/dgs_exchange.hpp>
#include <gradcomp/execution.hpp>

#include "exchange.hpp"

namespace train {
namespace {

using policy = gradcomp::execution::simd;
namespace gx = gradcomp::exchange;

gx::model_description describe(std::span<const layer_desc> layers) {
  gx::model_description model;
  for (const auto& l : layers) model.add(l.name, l.shape, std::size_t(l.dims));
  return model;
}

/// DGS's options (seed 001): top (100 - sparsity)% per layer, SAMomentum, secondary compression.
gx::dgs_options dgs_config(const run_options& o) {
  return {.ratio_percent = 100.0 - o.dgs_sparsity, .momentum = float(o.dgs_momentum),
          .mode = gradcomp::threshold_mode::exact, .seed = o.seed,
          .secondary_ratio = o.dgs_secondary ? 100.0 - o.dgs_sparsity : 0.0};
}

std::vector<std::span<const float>> spans_of(std::span<const std::vector<float>> v) {
  return std::vector<std::span<const float>>(v.begin(), v.end());
}

/// A worker of the asynchronous DGS parameter server (exchange::dgs_exchange):
/// pushes lr * (grad + wd * w) through SAMomentum and hands back the model of
/// the server's reply. Learning rate: an asynchronous push moves the model by
/// one worker's local-batch step, and SAMomentum's m differs from SGD's, so
/// the pushed rate is lr * (1 - m_dgs) / (1 - m_sgd) / N: the same step size
/// per image as the synchronous runs.
class dgs_exchanger final : public exchanger {
 public:
  dgs_exchanger(counted_transport& t, std::span<const layer_desc> layers, const run_options& o,
                std::span<const std::vector<float>> initial)
      : ex_(t, describe(layers), spans_of(initial), dgs_config(o)),
        scale_((1.0 - o.dgs_momentum) / (1.0 - o.momentum) / double(t.size() - 1)),
        weight_decay_(float(o.weight_decay)) {}
  update_kind kind() const noexcept override { return update_kind::model; }
  bool synchronous() const noexcept override { return false; }

  void exchange(std::size_t, double lr, std::span<const std::span<float>> layers) override {
    for (std::size_t i = 0; i < layers.size(); ++i)
      for (std::size_t e = 0; e < layers[i].size(); ++e) layers[i][e] += weight_decay_ * ex_.layer(i)[e];
    const auto& st = ex_.step(layers, float(lr * scale_));
    const std::size_t raw = 4 * ex_.model().size();
    counters += {raw, st.bytes_up, raw, st.bytes_up, st.bytes_down};
    entries_ += st.entries;
    write_model(layers);
  }
  bool finish(counted_transport& ctl, std::span<const std::span<float>> model_out) override {
    barrier(ctl, 120);  // every push is served before anyone pulls the final model
    ex_.finish();
    write_model(model_out);
    return true;
  }
  std::string summary() const override {
    char b[200];
    const auto pushes = ex_.stats().step;
    std::snprintf(b, sizeof b,
                  "worker 0: %.1f model entries received per pull (of %zu); replicas differ while training and "
                  "pull the server's final model at the end",
                  pushes ? double(entries_) / double(pushes) : 0.0, ex_.model().size());
    return b;
  }

 private:
  void write_model(std::span<const std::span<float>> layers) const {
    for (std::size_t i = 0; i < layers.size(); ++i) std::copy_n(ex_.layer(i).begin(), layers[i].size(), layers[i].begin());
  }
  gx::dgs_exchange<counted_transport, policy> ex_;
  double scale_;
  float weight_decay_;
  std::uint64_t entries_ = 0;
};

}  // namespace

std::unique_ptr<exchanger> make_dgs_exchanger(counted_transport& data, std::span<const layer_desc> layers,
                                              const run_options& o, std::span<const std::vector<float>> initial) {
  return std::make_unique<dgs_exchanger>(data, layers, o, initial);
}

std::string run_dgs_server(counted_transport& t, const run_options& o, std::span<const layer_desc> layers,
                           std::span<const std::vector<float>> initial, std::size_t total_steps) {
  // Deterministic: pushes served round-robin, so the run depends on the seed only; each gradient is
  // still computed on a model N-1 updates stale, as in a free-running run of equally fast workers.
  const int workers = t.size() - 1;
  gx::dgs_server<policy> server(describe(layers), spans_of(initial), workers, dgs_config(o),
                                gx::dgs_server<policy>::round_robin(workers, total_steps));
  const auto& st = server.serve(t);
  std::uint64_t up = 0, down = 0;
  for (auto b : st.bytes_up) up += b;
  for (auto b : st.bytes_down) down += b;
  char b[300];
  std::snprintf(b, sizeof b, "server: %llu pushes, %llu rejected, %llu resyncs; %.1f KiB up and %.1f KiB down per push%s%s",
                (unsigned long long)st.pushes, (unsigned long long)st.rejected, (unsigned long long)st.resyncs,
                st.pushes ? double(up) / double(st.pushes) / 1024.0 : 0.0,
                st.pushes ? double(down) / double(st.pushes) / 1024.0 : 0.0, st.last_error.empty() ? "" : "; ",
                st.last_error.c_str());
  return b;
}

}  // namespace train
