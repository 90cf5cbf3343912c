// Parameter-server bench (seed 001, DGS):
//  1. bytes up and down per worker per iteration for ASGD, GD-async,
//     DGC-async and DGS at R = 1% and 0.1%, with and without secondary
//     compression, on a ResNet-18-shaped model (11.2M floats, 62 tensors) with
//     synthetic gradients, 4 workers, round-robin (the bytes do not depend on
//     timing, so the deterministic simulation is used: the same frames a
//     transport carries, header and indices included);
//  2. the asynchronous server's throughput in pushes per second for 4 and 16
//     worker threads over the in-process transport (DGS pushes at R = 1% with
//     secondary compression), against the same server fed the same frames
//     without transport or threads.
// Baselines of the same run: ASGD's bytes (dense up, dense down) for part 1;
// the transport-free server and a memcpy-bound rate for part 2.
#include "common.hpp"

#include <gradcomp/parameter_server.hpp>
#include <gradcomp/presets/parameter_server_rules.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

using namespace gradcomp;
namespace bench = gradcomp::bench;

namespace {

// The weight tensors of ResNet-18 for CIFAR-10 (conv, batch-norm scale and
// shift, fully connected): 11,173,962 floats.
std::vector<std::size_t> resnet18_layers() {
  std::vector<std::size_t> s;
  auto conv = [&](std::size_t cin, std::size_t cout, std::size_t k) { s.push_back(cin * cout * k * k); };
  auto bn = [&](std::size_t c) {
    s.push_back(c);
    s.push_back(c);
  };
  conv(3, 64, 3);
  bn(64);
  std::size_t cin = 64;
  for (std::size_t cout : {64, 128, 256, 512}) {
    for (int block = 0; block < 2; ++block) {
      const std::size_t in = block == 0 ? cin : cout;
      conv(in, cout, 3);
      bn(cout);
      conv(cout, cout, 3);
      bn(cout);
      if (block == 0 && in != cout) {
        conv(in, cout, 1);
        bn(cout);
      }
    }
    cin = cout;
  }
  s.push_back(512 * 10);
  s.push_back(10);
  return s;
}

using bench::splitmix;

// A synthetic gradient: per layer a scale, per element roughly Gaussian
// (sum of four uniforms) from a counter-based stream of (worker, step).
void synthetic_gradient(const layer_partition& L, int worker, int step, std::vector<float>& g) {
  g.resize(L.total());
  std::uint64_t state = splitmix(std::uint64_t(worker) * 1000003u + std::uint64_t(step) + 17);
  for (std::size_t j = 0; j < L.layers(); ++j) {
    const float scale = 0.01f * float(1 + (splitmix(j) % 8));
    auto dst = L.layer(std::span<float>(g), j);
    for (auto& v : dst) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;  // LCG: fast and good enough here
      const std::uint64_t h = state ^ (state >> 29);
      const float u = float((h & 0xFFFF) + ((h >> 16) & 0xFFFF) + ((h >> 32) & 0xFFFF) + ((h >> 48) & 0xFFFF)) *
                          (1.0f / 65536.0f) -
                      2.0f;
      v = scale * u;
    }
  }
}

struct bytes_row {
  std::string method;
  double ratio = 0;
  bool secondary = false;
  double up = 0, down = 0;  // bytes per worker per iteration
  double ms_per_push = 0;
};

template <class C, class Rule>
bytes_row measure_bytes(const char* name, const layer_partition& L, const std::vector<float>& theta0, Rule rule,
                        async_ps_options opt, double ratio) {
  const int N = 4, warm = 1, measured = 2;
  async_ps_simulation<C, execution::simd> sim(L, theta0, N, rule, opt);
  std::vector<float> g;
  const float lr = 0.1f;
  int step = 0;
  for (int r = 0; r < warm; ++r)
    for (int k = 0; k < N; ++k) {
      synthetic_gradient(L, k, step++, g);
      (void)sim.step(k, g, lr);
    }
  std::vector<std::uint64_t> up0(N), down0(N);
  for (int k = 0; k < N; ++k) {
    up0[std::size_t(k)] = sim.worker(k).stats().bytes_up;
    down0[std::size_t(k)] = sim.worker(k).stats().bytes_down;
  }
  const auto t0 = bench::clock::now();
  for (int r = 0; r < measured; ++r)
    for (int k = 0; k < N; ++k) {
      synthetic_gradient(L, k, step++, g);
      (void)sim.step(k, g, lr);
    }
  const double secs = std::chrono::duration<double>(bench::clock::now() - t0).count();
  bytes_row row;
  row.method = name;
  row.ratio = ratio;
  row.secondary = opt.secondary_ratio > 0;
  for (int k = 0; k < N; ++k) {
    row.up += double(sim.worker(k).stats().bytes_up - up0[std::size_t(k)]);
    row.down += double(sim.worker(k).stats().bytes_down - down0[std::size_t(k)]);
  }
  row.up /= double(N * measured);
  row.down /= double(N * measured);
  row.ms_per_push = secs * 1e3 / double(N * measured);
  return row;
}

// Pushes per second of the asynchronous server with `workers` threads, each
// sending the same pre-encoded DGS frame `pushes` times (and applying the replies).
struct throughput {
  double threaded = 0, direct = 0;
  ps_memory_report memory;
};

throughput measure_throughput(const layer_partition& L, const std::vector<float>& theta0, int workers, int pushes) {
  const dgs_rule<execution::simd> rule{.ratio_percent = 1};
  async_ps_options opt;
  opt.secondary_ratio = 1;
  using worker_t = async_ps_worker<sa_momentum<execution::simd>, execution::simd>;
  std::vector<worker_t> ws;
  std::vector<std::vector<std::byte>> frames(static_cast<std::size_t>(workers));
  {
    std::vector<float> g;
    for (int k = 0; k < workers; ++k) {
      ws.emplace_back(L, rule);
      synthetic_gradient(L, k, 0, g);
      frames[std::size_t(k)] = ws.back().make_push(g, 0.1f);  // the worker's sequence now matches the frame's
    }
  }
  throughput out;
  {  // the same frames straight into handle(): no transport, no threads
    async_ps_server<sa_momentum<execution::simd>, execution::simd> server(L, theta0, workers, rule, opt);
    const int total = workers * pushes;
    const auto t0 = bench::clock::now();
    for (int i = 0; i < total; ++i) {
      auto h = server.handle(i % workers, frames[std::size_t(i % workers)]);
      bench::do_not_optimize(h.reply.size());
    }
    out.direct = double(total) / std::chrono::duration<double>(bench::clock::now() - t0).count();
  }
  async_ps_server<sa_momentum<execution::simd>, execution::simd> server(L, theta0, workers, rule, opt);
  std::atomic<std::int64_t> elapsed_ns{0};
  transport::run_workers(workers + 1, [&](transport::inproc_endpoint& ep) {
    if (ep.rank() == 0) {
      const auto t0 = bench::clock::now();
      server.serve(ep);
      elapsed_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(bench::clock::now() - t0).count();
      return;
    }
    const int k = ep.rank() - 1;
    auto& w = ws[std::size_t(k)];
    std::vector<float> model = theta0;
    auto& frame = frames[std::size_t(k)];
    for (int p = 0; p < pushes; ++p) {
      ep.isend(0, ps_default_tag_up, std::vector<std::byte>(frame)).wait();
      auto h = ep.irecv(0, ps_default_tag_down);
      auto m = h.wait();
      (void)w.apply_reply(m.bytes, model);
    }
    w.leave(ep);
  });
  out.threaded = double(workers * pushes) / (double(elapsed_ns.load()) * 1e-9);
  out.memory = server.memory();
  return out;
}

}  // namespace

int main() {
  const layer_partition L(resnet18_layers());
  const std::size_t n = L.total();
  std::printf("bench_parameter_server: model of %zu floats in %zu tensors (ResNet-18, CIFAR-10 shapes), %.1f MB\n", n,
              L.layers(), double(n) * 4 / 1e6);
  const double memcpy = bench::memcpy_gbps();
  std::printf("baseline memcpy: %.2f GB/s\n\n", memcpy);
  std::vector<float> theta0(n);
  for (std::size_t i = 0; i < n; ++i) theta0[i] = float(int(splitmix(i) % 2001) - 1000) * 1e-4f;

  // ---- 1. bytes per worker per iteration
  std::vector<bytes_row> rows;
  {
    async_ps_options dense;
    dense.downlink = ps_downlink::dense;
    rows.push_back(measure_bytes<dense_codec<execution::simd>>("ASGD", L, theta0, asgd_rule<execution::simd>{}, dense, 100));
  }
  for (double R : {1.0, 0.1}) {
    for (bool secondary : {false, true}) {
      async_ps_options opt;
      opt.secondary_ratio = secondary ? R : 0.0;
      rows.push_back(measure_bytes<sparsifier_with_memory<execution::simd>>(
          "GD-async", L, theta0, gd_async_rule<execution::simd>{.ratio_percent = R}, opt, R));
      rows.push_back(measure_bytes<sparsifier_with_memory<execution::simd>>(
          "DGC-async", L, theta0, dgc_async_rule<execution::simd>{.ratio_percent = R, .momentum = 0.7f}, opt, R));
      rows.push_back(measure_bytes<sa_momentum<execution::simd>>(
          "DGS", L, theta0, dgs_rule<execution::simd>{.ratio_percent = R, .momentum = 0.7f}, opt, R));
    }
  }
  const double asgd_up = rows[0].up, asgd_down = rows[0].down;
  std::printf("bytes per worker per iteration, 4 workers round-robin (after one warm-up round, mean of 2 rounds)\n");
  std::printf("%-10s %6s %9s %14s %14s %10s %10s %10s\n", "method", "R%", "2nd comp", "up B/iter", "down B/iter",
              "up/ASGD", "down/ASGD", "ms/push");
  double dgs_up = 0, dgs_down = 0;
  for (const auto& r : rows) {
    std::printf("%-10s %6.3g %9s %14.0f %14.0f %10.5f %10.5f %10.1f\n", r.method.c_str(), r.ratio,
                r.method == "ASGD" ? "-" : (r.secondary ? "yes" : "no"), r.up, r.down, r.up / asgd_up,
                r.down / asgd_down, r.ms_per_push);
    if (r.method == "DGS" && r.ratio == 1.0 && r.secondary) {
      dgs_up = r.up;
      dgs_down = r.down;
    }
  }

  // ---- 2. server throughput
  std::printf("\nasynchronous server throughput (DGS pushes, R = 1%%, secondary compression 1%%, 11.2M floats)\n");
  const double model_bytes = double(n) * 4;
  const double memcpy_bound = memcpy * 1e9 / model_bytes;  // pushes/s if a push cost one copy of the model
  double rate16 = 0;
  for (int workers : {4, 16}) {
    const int pushes = workers == 4 ? 12 : 4;
    const auto t = measure_throughput(L, theta0, workers, pushes);
    char name[64];
    std::snprintf(name, sizeof name, "pushes/s, %d worker threads", workers);
    bench::row(name, t.threaded, "1/s", t.direct, "transport-free");
    std::printf("%-40s %12.4g %-6s  (memcpy-bound %.4g, ratio %.3f)\n", "", t.threaded, "1/s", memcpy_bound,
                t.threaded / memcpy_bound);
    std::printf("  server memory: model %.1f MB + %d copies w_k %.1f MB (= N x model) + scratch %.1f MB\n",
                double(t.memory.model_bytes) / 1e6, workers, double(t.memory.replica_bytes) / 1e6,
                double(t.memory.scratch_bytes) / 1e6);
    if (workers == 16) rate16 = t.threaded;
  }
  std::printf("\n");
  bench::result("dgs_up_bytes_vs_asgd", dgs_up / asgd_up, "fraction");
  bench::result("dgs_down_bytes_vs_asgd", dgs_down / asgd_down, "fraction");
  bench::result("ps_async_pushes_per_s_16w", rate16, "pushes/s");
  return 0;
}
