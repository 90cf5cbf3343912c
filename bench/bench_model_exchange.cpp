// bench_model_exchange: the whole-model exchange on ResNet-50's parameter
// tensors (their real shapes, 25.56M floats) over 4 in-process workers on
// emulated links of 1 Gbit/s with 50 us latency each way, with a GradiVeQ
// plan (convs: K = 256, d = 32 from a pooled PCA, timed on compressed steps;
// the rest dense), a two-bit plan and a dense plan; bucketed (4 MiB buckets)
// against one collective per layer (the same exchange with every layer in a
// bucket of its own). Also: the bucket layer's own cost with no transport
// (encode + sum + decode of a dense plan over the time to copy the floats),
// and the time from a failure on one rank until every rank has raised.
//
// RESULT model_exchange_bucketed_vs_per_layer_1gbit (GradiVeQ plan, time ratio),
//        model_exchange_bucketed_vs_per_layer_1gbit_<plan> (each plan),
//        model_exchange_messages_per_step (per rank, bucketed GradiVeQ plan),
//        model_exchange_bucket_layer_overhead, exchange_failure_agreement_ms.
// Options: --steps N (timed steps per configuration, default 2).
#include "common.hpp"
#include "resnet50_model.hpp"

#include <gradcomp/model_exchange.hpp>
#include <gradcomp/transport/emulated_link.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace gx = gradcomp::exchange;
using namespace gradcomp;
using wall = std::chrono::steady_clock;

namespace {

std::vector<std::vector<float>> gradients(const gx::model_description& m, int rank, std::uint64_t step) {
  std::vector<std::vector<float>> g;
  std::uint64_t seed = bench::splitmix(std::uint64_t(rank) * 1000003 + step);
  for (const auto& l : m.layers()) {
    std::vector<float> v(l.shape.size());
    const float a = float(bench::splitmix(seed++) >> 40) / float(1 << 24) - 0.5f;
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = 1e-2f * (a * std::sin(0.01f * float(i % 997)) +
                      0.2f * (float(bench::splitmix(seed + i) >> 40) / float(1 << 24) - 0.5f));
    g.push_back(std::move(v));
  }
  return g;
}

enum class which { gradiveq, two_bit, dense };
const char* name_of(which w) { return w == which::gradiveq ? "gradiveq" : w == which::two_bit ? "two_bit" : "dense"; }

gx::plan make_plan(const gx::model_description& m, which w, bool per_layer) {
  gx::plan_options o;
  o.bucket_bytes = per_layer ? sizeof(float) : std::size_t{4} << 20;
  o.rules.small_below = 4096;
  if (w == which::gradiveq) {
    o.rules.conv = gx::codec_kind::gradiveq;
    o.gradiveq.slice_size = 256;
    o.gradiveq.max_dimension = 32;  // K/d = 8, the paper's conv ratio
    o.gradiveq.lambda = 0.0;
    o.gradiveq.source = basis_source::pooled;
    o.gradiveq.pool_slices = 32;
    o.gradiveq_schedule = {.warmup_iterations = 0, .sampling_iterations = 2, .compressed_iterations = 1000,
                           .sampling = sampling_aggregation::uncompressed};
  } else if (w == which::two_bit) {
    o.rules.conv = gx::codec_kind::two_bit;
    o.rules.fallback = gx::codec_kind::two_bit;
  } else {
    o.rules.conv = gx::codec_kind::dense;
  }
  return gx::plan(m, o);
}

struct timing {
  double seconds_per_step = 0.0;
  std::size_t messages = 0;
  std::size_t bytes = 0;
};

/// Runs `setup` untimed steps then `steps` timed ones; seconds per step (slowest rank).
timing run(const gx::plan& plan, int setup, int steps) {
  const int n = 4;
  transport::emulated_network net(n, {.bits_per_second = 1e9, .latency = std::chrono::microseconds(50)});
  std::vector<double> secs(n);
  std::vector<gx::step_stats> last(n);
  transport::run_workers(n, [&](transport::inproc_endpoint& ep) {
    transport::emulated_link link(ep, net);
    gx::model_exchange<transport::emulated_link<transport::inproc_endpoint>, bench::policy> ex(link, plan);
    auto g0 = gradients(plan.model(), ep.rank(), 0);
    std::vector<std::vector<float>> g;
    for (int s = 0; s < setup + steps; ++s) {
      g = g0;
      std::vector<std::span<float>> sp(g.begin(), g.end());
      const auto t0 = wall::now();
      last[std::size_t(ep.rank())] = ex.step(sp);
      if (s >= setup) secs[std::size_t(ep.rank())] += std::chrono::duration<double>(wall::now() - t0).count();
    }
  });
  timing t;
  t.seconds_per_step = *std::max_element(secs.begin(), secs.end()) / steps;
  t.messages = last[0].wire.messages_sent;
  t.bytes = last[0].wire.bytes_sent;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 2;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--steps") steps = std::max(1, std::atoi(argv[i + 1]));
  const auto m = gradcomp::bench::resnet50_model();
  std::size_t total = 0;
  for (const auto& l : m.layers()) total += l.shape.size();
  std::printf("bench_model_exchange: ResNet-50, %zu tensors, %zu floats; 4 workers, 1 Gbit/s, 50 us; policy %s; load %.2f\n",
              m.size(), total, bench::policy_name, bench::load_average());

  double gradiveq_ratio = 0.0;
  std::size_t gradiveq_messages = 0;
  for (which w : {which::gradiveq, which::two_bit, which::dense}) {
    const int setup = w == which::gradiveq ? 3 : 1;  // GradiVeQ: 2 sampling steps, the fit, one compressed warm step
    const auto bucketed = run(make_plan(m, w, false), setup, steps);
    const auto per_layer = run(make_plan(m, w, true), setup, steps);
    const double ratio = bucketed.seconds_per_step / per_layer.seconds_per_step;
    std::printf("%-9s bucketed %8.3f s/step (%4zu messages, %10zu B sent)  per layer %8.3f s/step (%5zu messages)  ratio %.3f\n",
                name_of(w), bucketed.seconds_per_step, bucketed.messages, bucketed.bytes, per_layer.seconds_per_step,
                per_layer.messages, ratio);
    bench::result(std::string("model_exchange_bucketed_vs_per_layer_1gbit_") + name_of(w), ratio, "x");
    if (w == which::gradiveq) {
      gradiveq_ratio = ratio;
      gradiveq_messages = bucketed.messages;
    }
  }
  bench::result("model_exchange_bucketed_vs_per_layer_1gbit", gradiveq_ratio, "x");
  bench::result("model_exchange_messages_per_step", double(gradiveq_messages), "messages");

  // The bucket layer alone (one rank, no transport): what a framework binding pays on top of its collective.
  {
    const auto plan = make_plan(m, which::dense, false);
    gx::bucket_layer<bench::policy> layer(plan, 0, 1);
    auto g = gradients(m, 0, 0);
    std::vector<std::span<float>> out(g.begin(), g.end());
    std::vector<std::span<const float>> in(g.begin(), g.end());
    const double exchange = bench::best_seconds(3, [&] {
      layer.begin_step(in);
      while (auto* r = layer.next_round()) {
        (void)r;  // one rank: the sum is the buffer itself
        layer.complete_round();
      }
      layer.finish_step(out);
    });
    std::vector<float> flat(total), copy(total);
    const double memcpy_s = bench::best_seconds(3, [&] {
      std::memcpy(copy.data(), flat.data(), total * sizeof(float));
      bench::do_not_optimize(copy);
    });
    std::printf("bucket layer (dense plan, 1 rank): %.4f s per step, memcpy of the floats %.4f s\n", exchange, memcpy_s);
    bench::result("model_exchange_bucket_layer_overhead", exchange / memcpy_s, "x");
  }

  // Failure agreement: rank 2's gradient holds a NaN; the time from the step's
  // start until the last rank has thrown (throw policy), on the emulated links.
  {
    const int n = 4;
    const auto plan = make_plan(m, which::dense, false);
    transport::emulated_network net(n, {.bits_per_second = 1e9, .latency = std::chrono::microseconds(50)});
    std::vector<double> ms(n, 0.0);
    std::atomic<int> ready{0};
    transport::run_workers(n, [&](transport::inproc_endpoint& ep) {
      transport::emulated_link link(ep, net);
      gx::model_exchange<transport::emulated_link<transport::inproc_endpoint>, bench::policy> ex(
          link, plan, {.on_failure = gx::failure_policy::throw_error});
      auto g = gradients(m, ep.rank(), 0);
      if (ep.rank() == 2) g[5][3] = std::numeric_limits<float>::quiet_NaN();
      std::vector<std::span<float>> sp(g.begin(), g.end());
      ++ready;
      while (ready.load() < n) {
      }
      const auto t0 = wall::now();
      try {
        ex.step(sp);
      } catch (const gx::exchange_failure_error&) {
      }
      ms[std::size_t(ep.rank())] = std::chrono::duration<double, std::milli>(wall::now() - t0).count();
    });
    bench::result("exchange_failure_agreement_ms", *std::max_element(ms.begin(), ms.end()), "ms");
  }
  return 0;
}
