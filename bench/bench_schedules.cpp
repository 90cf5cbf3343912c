// The all-reduce schedules of schedules.hpp against the ring, in the same run:
//  1. in-process, 4 workers, 16 MB of floats each (the kernels of the build):
//     ring, pipelined ring, Rabenseifner, hierarchical (groups of 2);
//  2. over emulated links (10 Gbit/s, 25 us per worker), 4 and 8 workers, a
//     latency-bound 64 KB and a bandwidth-bound 8 MB: Rabenseifner's 2 log2 N
//     steps against the ring's 2(N-1);
//  3. GradiVeQ (K = 256, d = 32) on Rabenseifner against Algorithm 1 on the
//     ring, 4 workers over an emulated 1 Gbit/s, 50 us link;
//  4. the cost model calibrated on the in-process transport: its choice for
//     the 16 MB of part 1 against the fastest schedule measured there.
// Times are rank 0's between two barriers, best of `repeats`. Ends with
//   RESULT schedule_<name>_vs_ring_inproc <time / ring time> x
//   RESULT schedule_rabenseifner_vs_ring_emulated_<N>_<size> <time / ring time> x
//   RESULT gradiveq_rabenseifner_vs_ring_emulated_1gbit <time / ring time> x
//   RESULT schedule_model_regret_inproc <chosen schedule's time / fastest> x
#include "common.hpp"
#include "conv_like_gradients.hpp"

#include <gradcomp/gradiveq.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/emulated_link.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace gb = gradcomp::bench;
using gb::policy;
using gradcomp::schedule_kind;
using gradcomp::schedule_options;
using gradcomp::transport::emulated_link;
using gradcomp::transport::emulated_network;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::inproc_fabric;

namespace {

// Best time of `runs` calls of fn(endpoint) on every rank (one warm-up first).
template <class Fn>
double timed(inproc_fabric& fabric, int runs, Fn&& fn) {
  std::barrier sync(fabric.size());
  double best = 1e300;
  fabric.run([&](inproc_endpoint& ep) {
    for (int i = 0; i < runs + 1; ++i) {
      sync.arrive_and_wait();
      const auto t0 = gb::clock::now();
      fn(ep);
      sync.arrive_and_wait();
      const double s = std::chrono::duration<double>(gb::clock::now() - t0).count();
      if (ep.rank() == 0 && i > 0) best = std::min(best, s);
    }
  });
  return best;
}

std::string size_name(std::size_t bytes) {
  return bytes >= (1u << 20) ? std::to_string(bytes >> 20) + "mb" : std::to_string(bytes >> 10) + "kb";
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  std::printf("all-reduce schedules against the ring (kernels %s, %u hardware threads, load %.2f)\n", gb::policy_name,
              std::thread::hardware_concurrency(), gb::load_average());

  // --- 1. in-process ----------------------------------------------------------
  const int workers = 4;
  const std::size_t floats = (std::size_t(16) << 20) / sizeof(float);
  std::vector<std::vector<float>> grads(workers);
  for (int r = 0; r < workers; ++r) grads[std::size_t(r)] = gb::uniform_gradient(floats);
  inproc_fabric fabric(workers);
  const std::vector<std::pair<schedule_kind, schedule_options>> kinds = {
      {schedule_kind::ring, {.kind = schedule_kind::ring}},
      {schedule_kind::pipelined_ring, {.kind = schedule_kind::pipelined_ring}},
      {schedule_kind::rabenseifner, {.kind = schedule_kind::rabenseifner}},
      {schedule_kind::hierarchical, {.kind = schedule_kind::hierarchical, .group_size = 2}}};
  std::vector<double> inproc_s;
  std::printf("\n1. in-process, %d workers, 16 MB each (best of %d)\n", workers, repeats);
  for (const auto& [kind, o] : kinds) {
    auto copy = grads;
    const double s = timed(fabric, repeats, [&](inproc_endpoint& ep) {
      gradcomp::allreduce(policy{}, ep, std::span<float>(copy[std::size_t(ep.rank())]), o);
    });
    inproc_s.push_back(s);
    std::printf("  %-16s %9.3f ms  %.3f x the ring\n", gradcomp::to_string(kind), s * 1e3, s / inproc_s[0]);
  }

  // --- 2. emulated 10 Gbit/s links ------------------------------------------------
  std::printf("\n2. emulated 10 Gbit/s, 25 us links (best of %d)\n", std::max(2, repeats / 2));
  std::vector<std::pair<std::string, double>> emulated;
  for (int n : {4, 8})
    for (std::size_t bytes : {std::size_t(64) << 10, std::size_t(8) << 20}) {
      inproc_fabric f(n);
      emulated_network net(n, {.bits_per_second = 10e9, .latency = std::chrono::microseconds(25)});
      std::vector<std::vector<float>> g(static_cast<std::size_t>(n), gb::uniform_gradient(bytes / 4));
      double t[2];
      for (int k = 0; k < 2; ++k) {
        const schedule_options o{.kind = k == 0 ? schedule_kind::ring : schedule_kind::rabenseifner};
        t[k] = timed(f, std::max(2, repeats / 2), [&](inproc_endpoint& ep) {
          emulated_link<inproc_endpoint> link(ep, net);
          gradcomp::allreduce(policy{}, link, std::span<float>(g[std::size_t(ep.rank())]), o);
        });
      }
      std::printf("  N = %d, %6s: ring %8.3f ms, rabenseifner %8.3f ms (%.3f x)\n", n, size_name(bytes).c_str(),
                  t[0] * 1e3, t[1] * 1e3, t[1] / t[0]);
      emulated.emplace_back("schedule_rabenseifner_vs_ring_emulated_" + std::to_string(n) + "_" + size_name(bytes),
                            t[1] / t[0]);
    }

  // --- 3. GradiVeQ on Rabenseifner -------------------------------------------------
  const std::size_t K = 256, length = K * 4096;  // 4 MB of floats
  const gb::conv_like_gradients source(K, 32);
  gradcomp::gradiveq_options gopt;
  gopt.slice_size = K;
  gopt.summands = workers;
  gopt.lambda = 1e-4;
  gopt.max_dimension = 32;
  gradcomp::linear_compressor<policy> codec(length, gopt);
  gb::fit_on_aggregated_samples(codec, source, length, workers);
  std::vector<std::vector<float>> gq(workers, std::vector<float>(length));
  for (int r = 0; r < workers; ++r) source.fill(gq[std::size_t(r)].data(), length / K, 9000 + std::uint64_t(r));
  emulated_network net1(workers, {.bits_per_second = 1e9, .latency = std::chrono::microseconds(50)});
  double tg[2];
  for (int k = 0; k < 2; ++k) {
    auto copy = gq;
    tg[k] = timed(fabric, std::max(2, repeats / 2), [&](inproc_endpoint& ep) {
      emulated_link<inproc_endpoint> link(ep, net1);
      gradcomp::allreduce_linear(policy{}, link, codec, std::span<float>(copy[std::size_t(ep.rank())]),
                                 {.kind = k == 0 ? schedule_kind::ring : schedule_kind::rabenseifner});
    });
  }
  std::printf("\n3. GradiVeQ K = %zu, d = %zu, 4 MB, %d workers over emulated 1 Gbit/s, 50 us\n", K, codec.dimension(),
              workers);
  std::printf("  ring (Algorithm 1) %8.3f ms, rabenseifner %8.3f ms (%.3f x)\n", tg[0] * 1e3, tg[1] * 1e3, tg[1] / tg[0]);

  // --- 4. the cost model's choice --------------------------------------------------
  std::vector<gradcomp::schedule_decision> decision(workers);
  fabric.run([&](inproc_endpoint& ep) {
    gradcomp::cost_model base;
    base.group_size = 2;
    const auto m = gradcomp::calibrate<policy>(ep, base);
    decision[std::size_t(ep.rank())] = gradcomp::agree_schedule(ep, m, {.elements = floats, .ranks = workers});
  });
  std::size_t chosen = 0;
  for (std::size_t i = 0; i < kinds.size(); ++i)
    if (kinds[i].first == decision[0].kind) chosen = i;
  const double fastest = *std::min_element(inproc_s.begin(), inproc_s.end());
  std::printf("\n4. cost model (calibrated in-process): predicted");
  for (const auto& [kind, o] : kinds)
    std::printf(" %s %.3f ms", gradcomp::to_string(kind), decision[0].predicted[std::size_t(kind)] * 1e3);
  std::printf("\n  chose %s: measured %.3f ms, fastest %.3f ms\n", gradcomp::to_string(decision[0].kind),
              inproc_s[chosen] * 1e3, fastest * 1e3);

  std::printf("\n");
  for (std::size_t i = 1; i < kinds.size(); ++i)
    gb::result(std::string("schedule_") + gradcomp::to_string(kinds[i].first) + "_vs_ring_inproc", inproc_s[i] / inproc_s[0], "x");
  for (const auto& [name, v] : emulated) gb::result(name, v, "x");
  gb::result("gradiveq_rabenseifner_vs_ring_emulated_1gbit", tg[1] / tg[0], "x");
  gb::result("schedule_model_regret_inproc", inproc_s[chosen] / fastest, "x");
  return 0;
}
