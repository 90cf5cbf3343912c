// The all-reduce schedules of schedules.hpp over mpi_transport against the
// ring, in the same run, with MPI_Allreduce beside them. Run under mpirun, e.g.
//   mpirun --oversubscribe -np 4 build/bench/bench_mpi_schedules [--max-mb 64] [--repeats 3] [--persistent-requests K]
// Times are the slowest rank's, best of `repeats`. Ends with
//   RESULT mpi_schedule_<name>_vs_ring_<size>mb <time / ring time> x   (largest size)
//   RESULT mpi_schedule_choice_regret_<size>mb <cost model's choice / fastest> x
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/mpi.hpp>

#include "common.hpp"
#include "mpi_common.hpp"

int main(int argc, char** argv) {
  gradcomp::transport::mpi_environment env(&argc, &argv);
  const auto options = gradcomp::bench::parse_mpi_bench_options(argc, argv, {.max_mb = 64, .repeats = 3});
  const int max_mb = options.max_mb, repeats = options.repeats;
  using gradcomp::bench::collective_seconds;
  gradcomp::transport::mpi_transport t(MPI_COMM_WORLD, gradcomp::bench::mpi_transport_options_from(options));
  const int rank = t.rank(), size = t.size();
  using gradcomp::schedule_kind;
  std::vector<gradcomp::schedule_options> kinds = {{.kind = schedule_kind::ring},
                                                   {.kind = schedule_kind::pipelined_ring},
                                                   {.kind = schedule_kind::rabenseifner},
                                                   {.kind = schedule_kind::library}};
  if (size % 2 == 0 && size > 2) kinds.push_back({.kind = schedule_kind::hierarchical, .group_size = 2});
  gradcomp::schedule_workspace workspace;  // the scratch kept across calls, as the exchange keeps it
  for (auto& o : kinds) o.workspace = &workspace;
  const gradcomp::cost_model model = gradcomp::calibrate<gradcomp::bench::policy>(t);
  if (rank == 0)
    std::printf("all-reduce schedules over mpi_transport, %d ranks, best of %d, load %.2f, %zu persistent requests kept\n"
                "calibrated: latency %.1f us, %.3f GB/s, addition %.3f ns per float\n%10s",
                size, repeats, gradcomp::bench::load_average(), t.options().persistent_requests, model.inter.latency_s * 1e6,
                1e-9 / std::max(1e-30, model.inter.seconds_per_byte), model.add_s * 1e9, "size");
  if (rank == 0) {
    for (const auto& o : kinds) std::printf(" %15s", gradcomp::to_string(o.kind));
    std::printf(" %15s %10s\n", "MPI_Allreduce", "model");
  }
  std::vector<double> last;
  gradcomp::schedule_decision last_choice;
  int last_mb = 0;
  for (int mb = 4; mb <= max_mb; mb *= 4) {
    const std::vector<float> input = gradcomp::bench::mpi_bench_input(mb, rank);
    const std::size_t n = input.size();
    std::vector<float> data(n);
    std::vector<double> s;
    for (const auto& o : kinds)
      s.push_back(collective_seconds(repeats, [&] {
        std::copy(input.begin(), input.end(), data.begin());
        gradcomp::allreduce(gradcomp::bench::policy{}, t, std::span<float>(data), o);
      }));
    const double mpi = collective_seconds(repeats, [&] {
      std::copy(input.begin(), input.end(), data.begin());
      MPI_Allreduce(MPI_IN_PLACE, data.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    // The choice of the calibrated model, which has no groups: the hierarchical schedule is timed above
    // (forced, g = 2) but every link here is one link, and a model told g = 2 over one measured link
    // prices the two-level ring at Rabenseifner's bytes and hops (docs/drivers.md).
    last_choice = gradcomp::agree_schedule(t, model, {.elements = n, .ranks = size});
    if (rank == 0) {
      std::printf("%8d MB", mb);
      for (double v : s) std::printf(" %12.2f ms", v * 1e3);
      std::printf(" %12.2f ms %10s\n", mpi * 1e3, gradcomp::to_string(last_choice.kind));
    }
    last = s;
    last_mb = mb;
  }
  if (rank == 0 && !last.empty()) {
    const std::string suffix = "_vs_ring_" + std::to_string(last_mb) + "mb";
    for (std::size_t i = 1; i < kinds.size(); ++i)
      gradcomp::bench::result(std::string("mpi_schedule_") + gradcomp::to_string(kinds[i].kind) + suffix, last[i] / last[0], "x");
    double chosen = last[0];
    for (std::size_t i = 0; i < kinds.size(); ++i)
      if (kinds[i].kind == last_choice.kind) chosen = last[i];
    gradcomp::bench::result("mpi_schedule_choice_regret_" + std::to_string(last_mb) + "mb",
                            chosen / *std::min_element(last.begin(), last.end()), "x");
  }
  return 0;
}
