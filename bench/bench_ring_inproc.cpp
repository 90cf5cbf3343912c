// Ring all-reduce over the in-process transport: 4 workers, 64 MB of floats
// each. Algorithm bandwidth = 64 MB / wall time of one all-reduce, against the
// memcpy bandwidth of 64 MB measured in the same run. Then the same over an
// emulated 10 Gbit/s link, for information.
//
// Ends with: RESULT ring_inproc_vs_memcpy <algorithm bandwidth / memcpy bandwidth> x
#include "common.hpp"

#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/emulated_link.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace gb = gradcomp::bench;
using gradcomp::transport::emulated_link;
using gradcomp::transport::emulated_network;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::inproc_fabric;

using gb::policy;       // simd when xsimd is configured, else seq
using gb::policy_name;

int main(int argc, char** argv) {
  const int workers = 4;
  // Optional argument: megabytes per worker (default 64).
  const std::size_t megabytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 64;
  const std::size_t bytes = megabytes << 20;
  const std::size_t floats = bytes / sizeof(float);
  const int repeats = 5;

  std::printf("ring all-reduce over the in-process transport\n");
  std::printf("  workers %d, %zu MB (%zu floats) per worker, kernels %s, hardware threads %u\n", workers, megabytes,
              floats, policy_name, std::thread::hardware_concurrency());

  // Values stay small and exact: the sum grows by x4 per run (inputs 2^-10).
  std::vector<std::vector<float>> grads(workers, std::vector<float>(floats, 1.0f / 1024.0f));

  // Long-lived workers, as in training: the threads start once, and each
  // repetition is timed by rank 0 between two barriers.
  inproc_fabric fabric(workers);
  // Instrumentation (for information): the CPU time of the workers' threads
  // per all-reduce, summed over the workers, least over the timed runs.
  double best_cpu = 1e300;
  auto timed_runs = [&](int runs, auto&& allreduce) {
    std::barrier sync(workers);
    double best = 1e300;
    std::vector<std::vector<double>> cpu(std::size_t(workers), std::vector<double>(std::size_t(runs + 1)));
    fabric.run([&](inproc_endpoint& ep) {
      for (int i = 0; i < runs + 1; ++i) {  // the first run warms up
        sync.arrive_and_wait();
        const auto t0 = gb::clock::now();
        const double c0 = gb::thread_cpu_seconds();
        allreduce(ep);
        cpu[std::size_t(ep.rank())][std::size_t(i)] = gb::thread_cpu_seconds() - c0;
        sync.arrive_and_wait();
        const double s = std::chrono::duration<double>(gb::clock::now() - t0).count();
        if (ep.rank() == 0 && i > 0) best = std::min(best, s);
      }
    });
    best_cpu = 1e300;
    for (int i = 1; i < runs + 1; ++i) {
      double sum = 0;
      for (auto& c : cpu) sum += c[std::size_t(i)];
      best_cpu = std::min(best_cpu, sum);
    }
    return best;
  };
  const double t_ring = timed_runs(repeats, [&](inproc_endpoint& ep) {
    gradcomp::ring_allreduce(policy{}, ep, grads[std::size_t(ep.rank())]);
  });
  const double ring_gbps = double(bytes) / t_ring / 1e9;

  const double ring_cpu = best_cpu;
  std::uint64_t sent = fabric.endpoint(0).bytes_sent() / std::uint64_t(repeats + 1);
  const double memcpy = gb::memcpy_gbps(bytes);
  // Instrumentation: the memcpy's CPU time (same size, best of 5).
  double memcpy_cpu = 1e300;
  {
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    for (int i = 0; i < repeats + 1; ++i) {
      const double c0 = gb::thread_cpu_seconds();
      std::memcpy(dst.data(), src.data(), bytes);
      gb::do_not_optimize(dst[bytes / 2]);
      if (i > 0) memcpy_cpu = std::min(memcpy_cpu, gb::thread_cpu_seconds() - c0);
    }
  }

  // For information: the memory system's ceiling. Every core copies its own
  // 64 MB at once (best of 5): the aggregate rate against one core's. Any
  // in-process all-reduce of the 4 vectors reads each once and writes each
  // once (4 x 128 MB, non-temporal at best) where the memcpy moves 128 MB, so
  // with all cores streaming it reaches at most (128 / 512) x aggregate /
  // one core of the memcpy's rate; the wavefront ring moves about 176 MB per
  // worker (docs/performance.md), so its own ceiling is 128 / 704 of that.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  double all_cores = 1e300;
  {
    std::vector<std::vector<char>> src(cores, std::vector<char>(bytes, 1)), dst(cores, std::vector<char>(bytes, 0));
    std::barrier go(static_cast<std::ptrdiff_t>(cores));
    std::vector<double> took(cores);
    for (int i = 0; i < repeats + 1; ++i) {
      std::vector<std::thread> copiers;
      for (unsigned c = 0; c < cores; ++c)
        copiers.emplace_back([&, c] {
          go.arrive_and_wait();
          const auto t0 = gb::clock::now();
          std::memcpy(dst[c].data(), src[c].data(), bytes);
          gb::do_not_optimize(dst[c][bytes / 2]);
          took[c] = std::chrono::duration<double>(gb::clock::now() - t0).count();
        });
      for (auto& t : copiers) t.join();
      if (i > 0) all_cores = std::min(all_cores, *std::max_element(took.begin(), took.end()));
    }
  }
  const double aggregate = double(cores) * double(bytes) / all_cores / 1e9;  // GB copied per second, all cores
  const double scaling = aggregate / memcpy;

  std::printf("\n  %-34s %10.3f ms\n", "ring all-reduce (best of 5)", t_ring * 1e3);
  std::printf("  %-34s %10.1f MB per worker per all-reduce (2(N-1)/N of the vector)\n", "bytes sent", double(sent) / (1 << 20));
  gb::row("  ring algorithm bandwidth", ring_gbps, "GB/s", memcpy, "memcpy GB/s");
  // For information, less sensitive to other jobs than the wall clock: CPU
  // time does not count waiting for a core (memory contention still shows).
  std::printf("  %-34s %10.3f ms  (sum over the %d workers' threads, least of 5)\n", "ring CPU time per all-reduce",
              ring_cpu * 1e3, workers);
  std::printf("  %-34s %10.3f ms  (CPU-time ratio on %u cores: memcpy / (ring CPU / cores) = %.3f)\n",
              "memcpy CPU time", memcpy_cpu * 1e3, std::max(1u, std::thread::hardware_concurrency()),
              memcpy_cpu / (ring_cpu / double(std::max(1u, std::thread::hardware_concurrency()))));

  std::printf("  %-34s %10.3f GB/s  (%u cores copying at once: %.2f x one core)\n", "memcpy, all cores", aggregate,
              cores, scaling);
  std::printf("  %-34s %10.3f      (any in-process all-reduce: 128/512 x %.2f; the wavefront ring's traffic: "
              "128/704 x %.2f = %.3f)\n",
              "ceiling of the RESULT ratio", 0.25 * scaling, scaling, scaling, 128.0 / 704.0 * scaling);

  // Sanity: every element is 4^(runs) / 1024 on every rank.
  bool ok = true;
  const float expected = [&] {
    float v = 1.0f / 1024.0f;
    for (int i = 0; i < repeats + 1; ++i) v *= float(workers);
    return v;
  }();
  for (auto& g : grads) ok = ok && g.front() == expected && g.back() == expected && g[g.size() / 2] == expected;
  if (!ok) {
    std::printf("ERROR: wrong sum\n");
    return 1;
  }

  // For information: the same over an emulated 10 Gbit/s, 25 us link per worker.
  {
    const double rate = 10e9;
    emulated_network net(workers, {.bits_per_second = rate, .latency = std::chrono::microseconds(25)});
    const int emu_repeats = 2;
    const double t_emu = timed_runs(emu_repeats, [&](inproc_endpoint& ep) {
      emulated_link<inproc_endpoint> link(ep, net);
      gradcomp::ring_allreduce(policy{}, link, grads[std::size_t(ep.rank())]);
    });
    const double wire_per_worker = double(net.bytes_sent(0)) / double(emu_repeats + 1);
    const double bound = wire_per_worker * 8.0 / rate;  // the busiest link's transfer time
    std::printf("\n  over emulated_link at %.0f Gbit/s, 25 us latency (for information):\n", rate / 1e9);
    std::printf("  %-34s %10.3f ms  (link-time bound %.3f ms)\n", "ring all-reduce (best of 2)", t_emu * 1e3,
                bound * 1e3);
    std::printf("  %-34s %10.1f MB per worker\n", "bytes on the wire", wire_per_worker / (1 << 20));
    std::printf("  %-34s %10.3f GB/s  (%.1f%% of the link bound)\n", "algorithm bandwidth",
                double(bytes) / t_emu / 1e9, 100.0 * bound / t_emu);
  }

  std::printf("\n");
  gb::result("ring_inproc_vs_memcpy", ring_gbps / memcpy, "x");
  return 0;
}
