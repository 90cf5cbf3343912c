// Aggregation of an 11M-float gradient across 4 in-process workers over
// emulated links of 1 Gbit/s and 10 Gbit/s (seed 002, Sec. 4.2: GradiVeQ
// slashes the ring all-reduce time 5.25x against the uncompressed ring):
//
//   uncompressed ring          ring_allreduce (raw floats)
//   GradiVeQ ring              ring_allreduce_linear, Algorithm 1: K = 256, d = 32 (K/d = 8)
//   4-bit QSGD ring            ring_allreduce_reencode: decode-add-re-encode at every hop
//   top-1% all-gather          ring_allgather_decode with sparsifier_with_memory (R = 1%)
//   4-bit QSGD all-gather      ring_allgather_decode with qsgd
//   PowerSGD rank 2            powersgd.hpp on the slices x K matrix of the vector: two dense
//                              ring_allreduce calls (the P's with the tail values appended,
//                              then the Q's) around encode_p / encode_q / decode; warm start,
//                              no error feedback (the runs repeat one input, so a residual would
//                              pile up; its local cost is in bench_powersgd)
//   fp16 / bf16 ring           ring_allreduce_linear with fp16_codec / bf16_codec: one rounding per hop
//   homomorphic ring           ring_allreduce_linear with homomorphic_quantizer: a max ring of the
//                              scales (one per 512 values), then 4-bit lanes summed as integers
//
// Every time is the best of a few runs (rank 0's wall time between two
// barriers of long-lived workers, so it includes the slowest rank), with the
// ratio to the uncompressed ring of the same link in the same run. The wire
// floor of a method is its busiest rank's bytes on the wire / link rate.
// Per-rank breakdowns (encode, decode, combine, wait) come from ring_stats,
// and "no link" rows run the same rings over the bare in-process transport:
// the CPU time the 4 workers need on this machine.
//
// Optional argument: elements (default 11 * 2^20).
// Ends with: RESULT gradiveq_ring_speedup_1gbit, gradiveq_ring_speedup_10gbit,
// gradiveq_ring_vs_wire_floor_1gbit, qsgd4_ring_speedup_1gbit, powersgd_ring_speedup_1gbit,
// powersgd_ring_rel_error_1gbit.
// gradiveq_ring_vs_wire_floor_1gbit, qsgd4_ring_speedup_1gbit,
// fp16_ring_speedup_1gbit, fp16_ring_vs_wire_floor_1gbit (with
// uncompressed_ring_vs_wire_floor_1gbit, the float32 ring's own figure, beside
// it), bf16_ring_speedup_1gbit, homomorphic_ring_speedup_1gbit, and the
// relative errors of the fp16, bf16, homomorphic, QSGD-4 re-encode and QSGD-4
// all-gather rings (homomorphic_error_gain_vs_qsgd4_reencode: QSGD-4
// re-encode's error over the homomorphic ring's).
#include "common.hpp"
#include "conv_like_gradients.hpp"

#include <gradcomp/gradiveq.hpp>
#include <gradcomp/powersgd.hpp>
#include <gradcomp/half.hpp>
#include <gradcomp/homomorphic.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/detail/random.hpp>
#include <gradcomp/transport/emulated_link.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

namespace gb = gradcomp::bench;
using gradcomp::ring_stats;
using gradcomp::transport::emulated_link;
using gradcomp::transport::emulated_network;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::inproc_fabric;

namespace {

using gb::policy;       // simd when xsimd is configured, else seq
using gb::policy_name;

constexpr int workers = 4;
constexpr std::size_t K = 256;      // slice size
constexpr std::size_t rank_r = 32;  // rank of the synthetic gradients = forced d

// Share of the last 10 s in which runnable tasks waited for a CPU
// (/proc/pressure/cpu "some avg10", percent; -1 if unavailable).
double cpu_pressure() {
  double p = -1;
  if (FILE* f = std::fopen("/proc/pressure/cpu", "r")) {
    if (std::fscanf(f, "some avg10=%lf", &p) != 1) p = -1;
    std::fclose(f);
  }
  return p;
}

double max_rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0, w = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    e += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    w += want[i] * want[i];
  }
  return w > 0 ? std::sqrt(e / w) : 0.0;
}

struct measurement {
  double seconds = 0;                   // best wall time of one all-reduce
  std::vector<ring_stats> stats;        // per rank, of the best run
  std::vector<std::uint64_t> wire;      // bytes each rank put on the link per call
  std::vector<double> cpu;              // thread CPU seconds of each rank in the best run
  bool identical = true;                // every rank ended with the same bits
  double error = 0;                     // relative L2 error of rank 0's result against the exact sum
};

// The methods: make_state(rank) builds a worker's codecs once; run() is one all-reduce.
struct uncompressed_op {
  int make_state(int) const { return 0; }
  template <class T>
  ring_stats run(T& t, int&, std::span<float> data) const {
    ring_stats st;  // the plain ring reports nothing; bytes come from the link's counters
    const auto t0 = gb::clock::now();
    gradcomp::ring_allreduce(policy{}, t, data);
    st.seconds = std::chrono::duration<double>(gb::clock::now() - t0).count();
    return st;
  }
};
struct gradiveq_op {
  const gradcomp::linear_compressor<policy>* codec;
  gradcomp::linear_compressor<policy> make_state(int) const { return *codec; }
  template <class T>
  ring_stats run(T& t, gradcomp::linear_compressor<policy>& c, std::span<float> data) const {
    return gradcomp::ring_allreduce_linear(policy{}, t, c, data);
  }
};
struct qsgd_reencode_op {
  std::vector<gradcomp::qsgd<policy>> make_state(int rank) const {
    return gradcomp::make_ring_codecs(workers, 0, [&](int j, std::size_t) {
      return gradcomp::qsgd<policy>({.bits = 4, .bucket_size = 512, .seed = std::uint64_t(rank * 64 + j + 1)});
    });
  }
  template <class T>
  ring_stats run(T& t, std::vector<gradcomp::qsgd<policy>>& codecs, std::span<float> data) const {
    return gradcomp::ring_allreduce_reencode(policy{}, t, codecs, data);
  }
};
struct qsgd_allgather_op {
  gradcomp::qsgd<policy> make_state(int rank) const {
    return gradcomp::qsgd<policy>({.bits = 4, .bucket_size = 512, .seed = std::uint64_t(rank * 64 + 99)});
  }
  template <class T>
  ring_stats run(T& t, gradcomp::qsgd<policy>& c, std::span<float> data) const {
    return gradcomp::ring_allgather_decode(policy{}, t, c, data);
  }
};
struct topk_allgather_op {
  std::size_t length;
  gradcomp::sparsifier_with_memory<policy> make_state(int) const {
    return gradcomp::sparsifier_with_memory<policy>(length, {.ratio_percent = 1.0});
  }
  template <class T>
  ring_stats run(T& t, gradcomp::sparsifier_with_memory<policy>& c, std::span<float> data) const {
    return gradcomp::ring_allgather_decode(policy{}, t, c, data);
  }
};
// PowerSGD rank 2 (Vogels et al. 2019) on the rows x cols matrix of the
// first rows * cols values (the slices of K): P summed with the tail values
// in one dense ring, then Q; every rank orthonormalises the same summed P.
struct powersgd_op {
  std::size_t rows, cols, length;
  gradcomp::powersgd_compressor<policy> make_state(int) const {
    gradcomp::powersgd_options o;
    o.rank = 2;
    o.error_feedback = false;
    o.seed = 7;
    return gradcomp::powersgd_compressor<policy>(rows, cols, o);
  }
  template <class T>
  ring_stats run(T& t, gradcomp::powersgd_compressor<policy>& c, std::span<float> data) const {
    ring_stats st;
    const auto t0 = gb::clock::now();
    const std::size_t n = rows * cols, tail = length - n;
    std::vector<float> p(c.p_length() + tail), q(c.q_length());
    const auto e0 = gb::clock::now();
    c.encode_p(data.first(n), std::span<float>(p).first(c.p_length()));
    std::memcpy(p.data() + c.p_length(), data.data() + n, tail * sizeof(float));
    st.encode_seconds += std::chrono::duration<double>(gb::clock::now() - e0).count();
    gradcomp::ring_allreduce(policy{}, t, std::span<float>(p));
    const auto e1 = gb::clock::now();
    c.encode_q(std::span<const float>(p).first(c.p_length()), q);
    st.encode_seconds += std::chrono::duration<double>(gb::clock::now() - e1).count();
    gradcomp::ring_allreduce(policy{}, t, std::span<float>(q));
    const auto d0 = gb::clock::now();
    c.decode(q, data.first(n));
    std::memcpy(data.data() + n, p.data() + c.p_length(), tail * sizeof(float));
    st.decode_seconds = std::chrono::duration<double>(gb::clock::now() - d0).count();
    st.seconds = std::chrono::duration<double>(gb::clock::now() - t0).count();
    return st;
  }
};

// The linear 16-bit codecs and the homomorphic quantizer, through Algorithm 1
// (ring_allreduce_linear: one add-and-re-encode per hop for fp16 / bf16; the
// max ring of the agreed scales first for the homomorphic quantizer).
template <class C>
struct linear_op {
  C make_state(int) const { return C{}; }
  template <class T>
  ring_stats run(T& t, C& c, std::span<float> data) const {
    return gradcomp::ring_allreduce_linear(policy{}, t, c, data);
  }
};
struct homomorphic_op {
  gradcomp::homomorphic_quantizer<policy> make_state(int rank) const {
    // One seed on every worker and its own worker index: stratified rounding.
    return gradcomp::homomorphic_quantizer<policy>({.seed = 7, .worker = std::size_t(rank)}, workers);
  }
  template <class T>
  ring_stats run(T& t, gradcomp::homomorphic_quantizer<policy>& c, std::span<float> data) const {
    return gradcomp::ring_allreduce_linear(policy{}, t, c, data);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const std::size_t length = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t(11) << 20;
  const std::size_t slices = length / K;
  const int repeats = 3;  // timed runs per method and link, after one warm-up run
  const auto bench_start = gb::clock::now();
  const double load_start = gb::load_average();
  const double pressure_start = cpu_pressure();

  std::printf("GradiVeQ ring all-reduce (seed 002, Algorithm 1) against the uncompressed ring and the QSGD/top-k baselines\n");
  std::printf("  workers %d (threads) on %u hardware threads, %zu floats (%.1f MB) per worker, kernels %s, Eigen %d thread(s)\n",
              workers, std::thread::hardware_concurrency(), length, double(length) * 4 / 1e6, policy_name,
              Eigen::nbThreads());

  // --- inputs ---------------------------------------------------------------
  const gb::conv_like_gradients source(K, rank_r);
  std::vector<std::vector<float>> grads(workers, std::vector<float>(length));
  {
    std::vector<std::thread> fill;
    for (int r = 0; r < workers; ++r)
      fill.emplace_back([&, r] {
        auto& g = grads[std::size_t(r)];
        source.fill(g.data(), slices, 100 + std::uint64_t(r));
        for (std::size_t i = slices * K; i < length; ++i) g[i] = 0.01f * float(i % 7);
      });
    for (auto& t : fill) t.join();
  }
  std::vector<double> exact(length, 0.0);
  for (const auto& g : grads)
    for (std::size_t i = 0; i < length; ++i) exact[i] += g[i];

  // --- GradiVeQ basis: L_t = 48 aggregated samples of the first slice ---------
  // (s = infinity: only slice 0 of each sample is read, so one layer buffer
  // with its first slice replaced by each sample's sum is enough.)
  gradcomp::gradiveq_options gopt;
  gopt.slice_size = K;
  gopt.summands = workers;
  gopt.lambda = 1e-4;           // eq. 6 would keep more than 32 directions of the noisy samples...
  gopt.max_dimension = rank_r;  // ...so d is forced to 32: K/d = 8 as in the paper's experiments
  gradcomp::linear_compressor<policy> codec(length, gopt);
  const auto fit_start = gb::clock::now();
  gb::fit_on_aggregated_samples(codec, source, length, workers);
  const double fit_seconds = std::chrono::duration<double>(gb::clock::now() - fit_start).count();
  std::printf("  GradiVeQ: K = %zu, d = %zu (K/d = %.1f), %zu slices, tail %zu, layer ratio %.2f, fit %.1f ms\n", K,
              codec.dimension(), double(K) / double(codec.dimension()), codec.slices(), codec.tail_length(),
              codec.compression_ratio(), fit_seconds * 1e3);

  // --- one step's compute against one step's wire time ------------------------
  // Thread CPU time (best of 5) of what a rank does per step of Algorithm 1
  // on one segment (N = 4: 1/4 of the vector): reduce-scatter = compress the
  // own segment, parse the received sum, accumulate, serialise the new sum;
  // all-gather = parse, decompress.
  {
    const auto b = codec.segment_bounds(workers);
    const std::span<const float> seg(grads[0].data(), b[1]);
    gradcomp::gradiveq_payload p, q;
    std::vector<float> out(b[1]);
    std::vector<std::byte> bytes;
    auto best_cpu = [](auto&& fn) {
      double best = 1e300;
      for (int i = 0; i < 5; ++i) {
        const double c0 = gb::thread_cpu_seconds();
        fn();
        best = std::min(best, gb::thread_cpu_seconds() - c0);
      }
      return best;
    };
    const double enc = best_cpu([&] { codec.encode_segment(0, seg, p); });
    const double ser = best_cpu([&] { gradcomp::wire::serialize_into(p, bytes); });
    const double par = best_cpu([&] { q = gradcomp::wire::parse<gradcomp::gradiveq_payload>(bytes); });
    const double acc = best_cpu([&] { codec.accumulate(q, p); });
    const double dec = best_cpu([&] { codec.decode(p, out); });
    const double flops = 2.0 * double(b[1]) * double(codec.dimension());
    std::printf("  one step, one segment of %zu floats (payload %zu bytes), thread CPU time:\n", b[1], bytes.size());
    std::printf("    compress %.2f ms (%.1f GFLOP/s), decompress %.2f ms (%.1f GFLOP/s), serialise %.2f ms, parse %.2f ms, "
                "accumulate %.2f ms\n",
                enc * 1e3, flops / enc / 1e9, dec * 1e3, flops / dec / 1e9, ser * 1e3, par * 1e3, acc * 1e3);
    std::printf("    reduce-scatter step %.2f ms, all-gather step %.2f ms of compute per rank; x %d ranks / %u hardware "
                "threads = %.2f / %.2f ms of wall per step\n",
                (enc + par + acc + ser) * 1e3, (par + dec) * 1e3, workers, std::thread::hardware_concurrency(),
                (enc + par + acc + ser) * 1e3 * workers / std::max(1u, std::thread::hardware_concurrency()),
                (par + dec) * 1e3 * workers / std::max(1u, std::thread::hardware_concurrency()));
    std::printf("    against the wire time of one payload: %.2f ms at 1 Gbit/s, %.2f ms at 10 Gbit/s\n",
                double(bytes.size()) * 8.0 / 1e9 * 1e3, double(bytes.size()) * 8.0 / 10e9 * 1e3);
  }

  // --- the timed runs --------------------------------------------------------
  inproc_fabric fabric(workers);
  std::vector<std::vector<float>> work(workers, std::vector<float>(length));
  // Runs `op(rank, link_or_endpoint, data)` `repeats` + 1 times on every worker.
  auto measure = [&](emulated_network* net, auto&& op) {
    measurement m;
    m.stats.resize(workers);
    m.wire.assign(workers, 0);
    m.cpu.assign(workers, 0.0);
    std::vector<double> cpu(workers, 0.0);
    std::barrier sync(workers);
    double best = 1e300;
    std::vector<ring_stats> current(workers);
    if (net) net->reset_counters();
    fabric.run([&](inproc_endpoint& ep) {
      const auto r = std::size_t(ep.rank());
      std::optional<emulated_link<inproc_endpoint>> link;
      if (net) link.emplace(ep, *net);
      auto state = op.make_state(ep.rank());  // codecs live across the runs, as in training
      for (int i = 0; i < repeats + 1; ++i) {
        std::memcpy(work[r].data(), grads[r].data(), length * sizeof(float));
        sync.arrive_and_wait();
        const auto t0 = gb::clock::now();
        const double c0 = gb::thread_cpu_seconds();
        if (link) current[r] = op.run(*link, state, std::span<float>(work[r]));
        else current[r] = op.run(ep, state, std::span<float>(work[r]));
        cpu[r] = gb::thread_cpu_seconds() - c0;
        sync.arrive_and_wait();
        const double s = std::chrono::duration<double>(gb::clock::now() - t0).count();
        if (r == 0 && i > 0 && s < best) {
          best = s;
          m.stats = current;
          m.cpu = cpu;
        }
        sync.arrive_and_wait();  // rank 0 has copied the stats
      }
    });
    m.seconds = best;
    if (net)
      for (int r = 0; r < workers; ++r) m.wire[std::size_t(r)] = net->bytes_sent(r) / std::uint64_t(repeats + 1);
    for (int r = 1; r < workers; ++r)
      m.identical = m.identical && std::memcmp(work[std::size_t(r)].data(), work[0].data(), length * sizeof(float)) == 0;
    m.error = max_rel_error(work[0], exact);
    return m;
  };

  // time, ratio, wire bytes of the busiest rank and its floor, CPU seconds
  // (max per rank, and the sum over ranks / hardware threads: the time the
  // CPU alone needs if nothing else ran), then the per-rank wall-time parts.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  auto print_row = [&](const char* name, const measurement& m, const measurement* base, double rate) {
    std::uint64_t busiest = 0;
    for (auto w : m.wire) busiest = std::max(busiest, w);
    const double floor = rate > 0 ? double(busiest) * 8.0 / rate : 0.0;
    double enc = 0, dec = 0, comb = 0, wait = 0, cpu_max = 0, cpu_sum = 0;
    for (const auto& s : m.stats) {
      enc = std::max(enc, s.encode_seconds);
      dec = std::max(dec, s.decode_seconds);
      comb = std::max(comb, s.combine_seconds);
      wait = std::max(wait, s.wait_seconds);
    }
    for (double c : m.cpu) {
      cpu_max = std::max(cpu_max, c);
      cpu_sum += c;
    }
    std::printf("  %-22s %7.1f ms", name, m.seconds * 1e3);
    if (base) std::printf(" %6.2fx", base->seconds / m.seconds);
    else std::printf(" %7s", "");
    if (rate > 0) std::printf(" %6.2f MB %6.1f ms %5.2fx", double(busiest) / 1e6, floor * 1e3, m.seconds / floor);
    std::printf(" | cpu %5.1f / %5.1f ms | enc %5.1f dec %5.1f comb %5.1f wait %5.1f ms | err %.2g%s\n", cpu_max * 1e3,
                cpu_sum / cores * 1e3, enc * 1e3, dec * 1e3, comb * 1e3, wait * 1e3, m.error,
                m.identical ? "" : "  NOT IDENTICAL");
  };
  // The least time a method can take here: its wire floor or, when the
  // workers' CPU time summed over the ranks exceeds it, that CPU time spread
  // over the hardware threads (4 workers share them).
  auto lower_bound = [&](const measurement& m, double rate) {
    std::uint64_t busiest = 0;
    for (auto w : m.wire) busiest = std::max(busiest, w);
    double cpu_sum = 0;
    for (double c : m.cpu) cpu_sum += c;
    return std::max(rate > 0 ? double(busiest) * 8.0 / rate : 0.0, cpu_sum / cores);
  };
  auto header = [&](bool link) {
    std::printf("  %-22s %10s %7s", "method", "time", link ? "speedup" : "vs ring");
    if (link) std::printf(" %9s %9s %6s", "wire/rank", "floor", "t/flr");
    std::printf(" | cpu max/rank, sum/%u | wall-time parts, max over ranks     | rel. error\n", cores);
  };

  const gradiveq_op gq{&codec};
  const qsgd_reencode_op q4;
  const qsgd_allgather_op q4ag;
  const topk_allgather_op topk{length};
  const powersgd_op psgd{slices, K, length};

  // The uncompressed, GradiVeQ and QSGD-4 re-encode rings over `net` (nullptr:
  // the bare transport), each printed with its ratio to the uncompressed one.
  struct three_rings {
    measurement u, g, q;
  };
  auto measure_rings = [&](emulated_network* net, double rate) {
    three_rings m;
    m.u = measure(net, uncompressed_op{});
    print_row("uncompressed ring", m.u, nullptr, rate);
    m.g = measure(net, gq);
    print_row("GradiVeQ ring (Alg. 1)", m.g, &m.u, rate);
    m.q = measure(net, q4);
    print_row("QSGD-4 re-encode ring", m.q, &m.u, rate);
    return m;
  };

  // No link: the CPU time of each ring on this machine (4 workers on the cores we have).
  std::printf("\n  bare in-process transport (no link: CPU and memory time only), best of %d:\n", repeats);
  header(false);
  (void)measure_rings(nullptr, 0);

  double speedup[2] = {0, 0}, vs_floor_1g = 0, qsgd_speedup_1g = 0, psgd_speedup_1g = 0, psgd_error_1g = 0;
  double fp16_speedup_1g = 0, fp16_floor_1g = 0, u_floor_1g = 0, bf16_speedup_1g = 0, hom_speedup_1g = 0;
  double err_fp16 = 0, err_bf16 = 0, err_hom = 0, err_q4 = 0, err_q4ag = 0;
  auto floor_of = [](const measurement& m, double rate) {
    std::uint64_t busiest = 0;
    for (auto w : m.wire) busiest = std::max(busiest, w);
    return double(busiest) * 8.0 / rate;
  };
  const double rates[2] = {1e9, 10e9};
  for (int li = 0; li < 2; ++li) {
    const double rate = rates[li];
    emulated_network net(workers, {.bits_per_second = rate, .latency = std::chrono::microseconds(25)});
    std::printf("\n  emulated links of %.0f Gbit/s, 25 us latency, best of %d:\n", rate / 1e9, repeats);
    header(true);
    const auto [u, g, q] = measure_rings(&net, rate);
    const auto qa = measure(&net, q4ag);
    print_row("QSGD-4 all-gather", qa, &u, rate);
    const auto tk = measure(&net, topk);
    print_row("top-1% all-gather", tk, &u, rate);
    const auto ps = measure(&net, psgd);
    print_row("PowerSGD r2 (2 rings)", ps, &u, rate);
    const auto f16 = measure(&net, linear_op<gradcomp::fp16_codec<policy>>{});
    print_row("fp16 ring (Alg. 1)", f16, &u, rate);
    const auto b16 = measure(&net, linear_op<gradcomp::bf16_codec<policy>>{});
    print_row("bf16 ring (Alg. 1)", b16, &u, rate);
    const auto hom = measure(&net, homomorphic_op{});
    print_row("homomorphic 4-bit ring", hom, &u, rate);
    std::printf("  t/flr of the uncompressed ring %.2fx, of the fp16 ring %.2fx; relative error: fp16 %.3g, bf16 %.3g, "
                "homomorphic %.3g, QSGD-4 re-encode %.3g (%.2fx the homomorphic's), QSGD-4 all-gather %.3g\n",
                u.seconds / floor_of(u, rate), f16.seconds / floor_of(f16, rate), f16.error, b16.error, hom.error,
                q.error, hom.error > 0 ? q.error / hom.error : 0.0, qa.error);
    speedup[li] = u.seconds / g.seconds;
    std::printf("  GradiVeQ: %.1f ms measured; at least %.1f ms here (max of wire floor and CPU/%u); "
                "uncompressed ring / that bound = %.2fx\n",
                g.seconds * 1e3, lower_bound(g, rate) * 1e3, cores, u.seconds / lower_bound(g, rate));
    if (li == 0) {
      std::uint64_t busiest = 0;
      for (auto w : g.wire) busiest = std::max(busiest, w);
      vs_floor_1g = g.seconds / (double(busiest) * 8.0 / rate);
      qsgd_speedup_1g = u.seconds / q.seconds;
      psgd_speedup_1g = u.seconds / ps.seconds;
      psgd_error_1g = ps.error;
      fp16_speedup_1g = u.seconds / f16.seconds;
      fp16_floor_1g = f16.seconds / floor_of(f16, rate);
      u_floor_1g = u.seconds / floor_of(u, rate);
      bf16_speedup_1g = u.seconds / b16.seconds;
      hom_speedup_1g = u.seconds / hom.seconds;
      err_fp16 = f16.error;
      err_bf16 = b16.error;
      err_hom = hom.error;
      err_q4 = q.error;
      err_q4ag = qa.error;
    }
  }

  // For information: a link slow enough (250 Mbit/s: 46 ms per GradiVeQ
  // segment) that the compute of a step fits under its transfer even on this
  // shared machine, i.e. the regime seed 002 describes.
  {
    const double rate = 0.25e9;
    emulated_network net(workers, {.bits_per_second = rate, .latency = std::chrono::microseconds(25)});
    std::printf("\n  for information, emulated links of %.2f Gbit/s, 25 us latency, best of %d:\n", rate / 1e9, repeats);
    header(true);
    (void)measure_rings(&net, rate);
  }

  std::printf("\n  total bench time %.1f s; load average %.1f at the start, %.1f at the end; CPU pressure (PSI some avg10) "
              "%.0f%% at the start, %.0f%% at the end\n\n",
              std::chrono::duration<double>(gb::clock::now() - bench_start).count(), load_start, gb::load_average(),
              pressure_start, cpu_pressure());
  gb::result("gradiveq_ring_speedup_1gbit", speedup[0], "x");
  gb::result("gradiveq_ring_speedup_10gbit", speedup[1], "x");
  gb::result("gradiveq_ring_vs_wire_floor_1gbit", vs_floor_1g, "x");
  gb::result("qsgd4_ring_speedup_1gbit", qsgd_speedup_1g, "x");
  gb::result("powersgd_ring_speedup_1gbit", psgd_speedup_1g, "x");
  gb::result("powersgd_ring_rel_error_1gbit", psgd_error_1g, "");
  gb::result("fp16_ring_speedup_1gbit", fp16_speedup_1g, "x");
  gb::result("fp16_ring_vs_wire_floor_1gbit", fp16_floor_1g, "x");
  gb::result("uncompressed_ring_vs_wire_floor_1gbit", u_floor_1g, "x");
  gb::result("bf16_ring_speedup_1gbit", bf16_speedup_1g, "x");
  gb::result("homomorphic_ring_speedup_1gbit", hom_speedup_1g, "x");
  gb::result("fp16_ring_rel_error", err_fp16, "");
  gb::result("bf16_ring_rel_error", err_bf16, "");
  gb::result("homomorphic_ring_rel_error", err_hom, "");
  gb::result("qsgd4_reencode_ring_rel_error", err_q4, "");
  gb::result("qsgd4_allgather_rel_error", err_q4ag, "");
  gb::result("homomorphic_error_gain_vs_qsgd4_reencode", err_hom > 0 ? err_q4 / err_hom : 0.0, "x");
  return 0;
}
