// Aggregation of an 11M-float gradient across MPI ranks over a real
// bandwidth-limited network: run it one rank per network namespace with
// bench/netns/run.sh (veth links on a bridge, each limited by tc tbf, MPI
// over TCP), e.g.
//
//   sudo bash bench/netns/run.sh --ranks 4 --rate 1gbit -- $PWD/build/bench/bench_mpi_netns
//
// Methods (as bench_gradiveq_ring.cpp, which does the same over emulated links):
//   uncompressed ring          ring_allreduce (raw floats, zero-copy over MPI)
//   GradiVeQ ring              ring_allreduce_linear, Algorithm 1 of seed 002: K = 256, d = 32 (K/d = 8)
//   QSGD-4 re-encode ring      ring_allreduce_reencode: decode-add-re-encode at every hop
//   top-1% all-gather          ring_allgather_decode with sparsifier_with_memory (R = 1%)
//
// Every time is the slowest rank's wall time of one all-reduce, best of
// `--repeats` (default 3) after one warm-up, with the ratio to the
// uncompressed ring of the same run; the wire floor is the busiest rank's
// bytes / link rate. The link rate comes from GRADCOMP_NETNS_RATE (exported by
// run.sh); without it the bench still runs (e.g. plain mpirun) and says so.
// Options: --elements N (default 11 * 2^20), --repeats R.
// Ends with: RESULT netns_gradiveq_speedup_<rate> (uncompressed / GradiVeQ
// time; netns_gradiveq_speedup_1gbit at --rate 1gbit).
#include <mpi.h>

#include "common.hpp"
#include "conv_like_gradients.hpp"

#include <gradcomp/gradiveq.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/detail/random.hpp>
#include <gradcomp/transport/mpi.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

namespace gb = gradcomp::bench;
using gradcomp::ring_stats;

namespace {

using gb::policy;       // simd when xsimd is configured, else seq
using gb::policy_name;

constexpr std::size_t K = 256;      // slice size
constexpr std::size_t rank_r = 32;  // rank of the synthetic gradients = forced d

// "1gbit", "10gbit", "500mbit", "100kbit" (tc's units) -> bits per second; 0 if unknown.
double parse_rate(const std::string& s) {
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return 0;
  const double v = std::atof(s.substr(0, i).c_str());
  const std::string unit = s.substr(i);
  if (unit == "gbit") return v * 1e9;
  if (unit == "mbit") return v * 1e6;
  if (unit == "kbit") return v * 1e3;
  if (unit == "bit" || unit.empty()) return v;
  return 0;
}

std::uint64_t hash_of(std::span<const std::byte> x) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::byte b : x) h = (h ^ std::uint64_t(b)) * 1099511628211ull;
  return h;
}

// True iff every rank passed the same bytes.
bool identical_everywhere(std::span<const std::byte> x) {
  const std::uint64_t mine = hash_of(x);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<std::uint64_t> all(static_cast<std::size_t>(size));
  MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return std::all_of(all.begin(), all.end(), [&](std::uint64_t h) { return h == all.front(); });
}

double rel_error(std::span<const float> got, std::span<const float> want) {
  double e = 0, w = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    e += (double(got[i]) - double(want[i])) * (double(got[i]) - double(want[i]));
    w += double(want[i]) * double(want[i]);
  }
  return w > 0 ? std::sqrt(e / w) : 0.0;
}

struct measurement {
  double seconds = 0;              // slowest rank's time, best run
  std::uint64_t busiest_bytes = 0;  // most bytes any rank sent in one call
  double wait_max = 0, encode_max = 0, decode_max = 0;
  double cpu_max = 0, cpu_sum = 0;  // CPU seconds of one call: the busiest rank's, and summed over ranks
  bool identical = true;
  double error = 0;  // relative L2 error of the result against the uncompressed ring's
};

}  // namespace

int main(int argc, char** argv) {
  gradcomp::transport::mpi_environment env(&argc, &argv);
  std::size_t length = std::size_t(11) << 20;
  int repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--elements")) length = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--repeats")) repeats = std::max(1, std::atoi(argv[i + 1]));
  }
  gradcomp::transport::mpi_transport t(MPI_COMM_WORLD);
  const int rank = t.rank(), n = t.size();
  const char* rate_env = std::getenv("GRADCOMP_NETNS_RATE");
  const std::string rate_name = rate_env ? rate_env : "";
  const double rate = parse_rate(rate_name);
  const double load_start = gb::load_average();
  const double bench_start = MPI_Wtime();
  char host[MPI_MAX_PROCESSOR_NAME];
  int host_len = 0;
  MPI_Get_processor_name(host, &host_len);

  if (rank == 0) {
    std::printf("ring all-reduces over MPI (TCP) between network namespaces, %d ranks, %zu floats (%.1f MB) per rank\n", n,
                length, double(length) * 4 / 1e6);
    std::printf("  link rate: %s (GRADCOMP_NETNS_RATE%s), kernels %s, best of %d after a warm-up, load average %.2f\n",
                rate_env ? rate_env : "unknown", rate_env ? "" : " not set: not run by bench/netns/run.sh?", policy_name,
                repeats, load_start);
  }

  // --- inputs: rank r's gradient, as worker r of bench_gradiveq_ring ---------
  const std::size_t slices = length / K;
  const gb::conv_like_gradients source(K, rank_r);
  std::vector<float> grad(length), work(length), reference(length);
  source.fill(grad.data(), slices, 100 + std::uint64_t(rank));
  for (std::size_t i = slices * K; i < length; ++i) grad[i] = 0.01f * float(i % 7);

  // --- GradiVeQ basis: 48 aggregated samples of the first slice, the same on
  // every rank (the same samples fit the same basis; checked below) -----------
  gradcomp::gradiveq_options gopt;
  gopt.slice_size = K;
  gopt.summands = std::size_t(n);
  gopt.lambda = 1e-4;
  gopt.max_dimension = rank_r;  // K/d = 8 as in the paper's experiments
  gradcomp::linear_compressor<policy> codec(length, gopt);
  gb::fit_on_aggregated_samples(codec, source, length, n);
  const auto state = codec.save_state();
  const bool same_basis = identical_everywhere(state);
  if (rank == 0)
    std::printf("  GradiVeQ: K = %zu, d = %zu (K/d = %.1f), layer ratio %.2f, basis identical on every rank: %s\n", K,
                codec.dimension(), double(K) / double(codec.dimension()), codec.compression_ratio(),
                same_basis ? "yes" : "NO");
  if (!same_basis) return 1;

  // Runs `op(data)` (returning ring_stats) repeats + 1 times from the same input.
  auto measure = [&](auto&& op, bool is_reference) {
    measurement m;
    double best = 1e300;
    ring_stats best_stats;
    double best_cpu = 0;
    for (int i = -1; i < repeats; ++i) {
      std::memcpy(work.data(), grad.data(), length * sizeof(float));
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime(), c0 = gb::process_cpu_seconds();
      const ring_stats st = op(std::span<float>(work));
      double mine = MPI_Wtime() - t0, slowest = 0;
      const double cpu = gb::process_cpu_seconds() - c0;
      MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (i >= 0 && slowest < best) {
        best = slowest;
        best_stats = st;
        best_cpu = cpu;
      }
    }
    m.seconds = best;
    std::uint64_t mine_bytes = best_stats.bytes_sent;
    MPI_Allreduce(&mine_bytes, &m.busiest_bytes, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&best_stats.wait_seconds, &m.wait_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&best_stats.encode_seconds, &m.encode_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&best_stats.decode_seconds, &m.decode_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&best_cpu, &m.cpu_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&best_cpu, &m.cpu_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    m.identical = identical_everywhere(std::as_bytes(std::span<const float>(work)));
    if (is_reference) reference = work;
    double err = rel_error(work, reference), worst = 0;
    MPI_Allreduce(&err, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    m.error = worst;
    return m;
  };
  // Cores of the machine the namespaces share (all ranks run on this one host).
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  auto print_row = [&](const char* name, const measurement& m, const measurement* base) {
    if (rank != 0) return;
    const double floor = rate > 0 ? double(m.busiest_bytes) * 8.0 / rate : 0.0;
    std::printf("  %-24s %9.1f ms", name, m.seconds * 1e3);
    if (base) std::printf(" %7.2fx", base->seconds / m.seconds);
    else std::printf(" %8s", "1.00x");
    std::printf(" %9.2f MB", double(m.busiest_bytes) / 1e6);
    if (rate > 0) std::printf(" %8.1f ms %6.2fx", floor * 1e3, m.seconds / floor);
    std::printf(" | cpu %6.1f / %6.1f ms | enc %6.1f dec %6.1f wait %7.1f ms | err %.2g%s\n", m.cpu_max * 1e3,
                m.cpu_sum / cores * 1e3, m.encode_max * 1e3, m.decode_max * 1e3, m.wait_max * 1e3, m.error, m.identical ? "" : "  NOT IDENTICAL ON EVERY RANK");
    std::fflush(stdout);
  };
  if (rank == 0) {
    std::printf("\n  %-24s %12s %8s %12s", "method", "time", "speedup", "bytes/rank");
    if (rate > 0) std::printf(" %11s %7s", "wire floor", "t/flr");
    std::printf(" | cpu max/rank, sum/%u cores | wall-time parts, max over ranks | rel. error vs uncompressed\n", cores);
  }

  // Uncompressed ring: raw floats; each rank sends 2(N-1) segments.
  const auto ring = gradcomp::ring_schedule(rank, n, length);
  const measurement u = measure(
      [&](std::span<float> data) {
        ring_stats st;
        const double t0 = MPI_Wtime();
        gradcomp::ring_allreduce(policy{}, t, data);
        st.seconds = MPI_Wtime() - t0;
        for (int s = 0; s < ring.steps(); ++s)
          st.bytes_sent += (ring.size(ring.reduce_scatter_send(s)) + ring.size(ring.all_gather_send(s))) * sizeof(float);
        return st;
      },
      true);
  print_row("uncompressed ring", u, nullptr);

  auto gq_codec = codec;
  const measurement g = measure(
      [&](std::span<float> data) { return gradcomp::ring_allreduce_linear(policy{}, t, gq_codec, data); }, false);
  print_row("GradiVeQ ring (Alg. 1)", g, &u);

  auto q_codecs = gradcomp::make_ring_codecs(n, 0, [&](int j, std::size_t) {
    return gradcomp::qsgd<policy>({.bits = 4, .bucket_size = 512, .seed = std::uint64_t(rank * 64 + j + 1)});
  });
  const measurement q = measure(
      [&](std::span<float> data) { return gradcomp::ring_allreduce_reencode(policy{}, t, q_codecs, data); }, false);
  print_row("QSGD-4 re-encode ring", q, &u);

  gradcomp::sparsifier_with_memory<policy> topk(length, {.ratio_percent = 1.0});
  const measurement k = measure(
      [&](std::span<float> data) { return gradcomp::ring_allgather_decode(policy{}, t, topk, data); }, false);
  print_row("top-1% all-gather", k, &u);

  const double load_end = gb::load_average();
  const bool all_identical = u.identical && g.identical && q.identical && k.identical;
  if (rank == 0) {
    std::printf("\n  GradiVeQ vs uncompressed %.2fx, QSGD-4 %.2fx, top-1%% %.2fx; results identical on every rank: %s\n",
                u.seconds / g.seconds, u.seconds / q.seconds, u.seconds / k.seconds, all_identical ? "yes" : "NO");
    // The least time GradiVeQ can take on this host: its wire floor, or its
    // ranks' CPU time spread over the cores when that is longer.
    const double g_floor = rate > 0 ? double(g.busiest_bytes) * 8.0 / rate : 0.0;
    const double g_bound = std::max(g_floor, g.cpu_sum / cores);
    std::printf("  GradiVeQ ring: at least %.1f ms here (max of wire floor %.1f ms and CPU %.1f ms / %u cores), took %.1f ms "
                "(%.1fx that bound): %s-bound\n",
                g_bound * 1e3, g_floor * 1e3, g.cpu_sum * 1e3, cores, g.seconds * 1e3, g.seconds / g_bound,
                g.cpu_sum / cores > g_floor ? "CPU" : "wire");
    std::printf("  load average %.2f -> %.2f (machine shared with other jobs), rank 0 on %.*s, total %.0f s\n", load_start,
                load_end, host_len, host, MPI_Wtime() - bench_start);
    gb::result("netns_gradiveq_speedup_" + (rate_name.empty() ? std::string("unknown_rate") : rate_name),
               u.seconds / g.seconds, "x");
  }
  return all_identical ? 0 : 1;
}
