// docs/exchange.md: a complete 4-worker program (kept identical to the page by ctest).
#include <cstdio>
#include <span>
#include <vector>

#include <gradcomp/model_exchange.hpp>
#include <gradcomp/transport/inproc.hpp>

namespace gx = gradcomp::exchange;

int main() {
  gx::model_description model;
  model.add_conv("conv1", 16, 3, 3, 3).add_dense("conv1.bias", 16, 1);
  model.add_conv("conv2", 32, 16, 3, 3).add_dense("fc", 32 * 10);
  gx::plan_options options;  // conv -> GradiVeQ, 1-D and small -> dense, the rest -> default
  options.gradiveq_schedule = {.warmup_iterations = 5, .sampling_iterations = 10, .compressed_iterations = 20};
  const gx::plan plan(model, options);

  gradcomp::transport::run_workers(4, [&](gradcomp::transport::inproc_endpoint& ep) {
    gx::model_exchange exchange(ep, plan);  // one per rank, the same plan on every rank
    std::vector<std::vector<float>> grads;
    for (const auto& layer : model.layers()) grads.emplace_back(layer.shape.size());
    for (int step = 0; step < 40; ++step) {
      for (auto& g : grads)  // stand-in for backward(): this rank's gradients
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = float((i * 7 + step + ep.rank()) % 13) - 6.0f;
      std::vector<std::span<float>> layers(grads.begin(), grads.end());
      const gx::step_stats& st = exchange.step(layers);  // grads now hold the mean over ranks
      if (st.skipped) continue;                            // every rank skipped: do not apply
      if (ep.rank() == 0 && step % 10 == 9)
        std::printf("step %d: %zu rounds, %zu bytes sent, phase %s\n", step + 1, st.rounds,
                    st.wire.bytes_sent, st.bucket_phase.front().c_str());
    }
    if (ep.rank() == 0) std::printf("checkpoint: %zu bytes\n", exchange.save_state().size());
  });
}
