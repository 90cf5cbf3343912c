// Plain ring all-reduce over mpi_transport against MPI_Allreduce, in the same
// run, 4 MB to 256 MB of floats. Run under mpirun, e.g.
//   mpirun --oversubscribe -np 4 build/bench/bench_mpi_ring [--max-mb 256] [--repeats 3]
// Times are the slowest rank's, best of `repeats`. Ends with
//   RESULT mpi_ring_vs_mpi_allreduce_64mb <ring time / MPI_Allreduce time> x
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/mpi.hpp>

#include "common.hpp"

namespace {

// Slowest rank's time of one call, best over `repeats` after a warm-up.
template <class F>
double collective_seconds(int repeats, F&& fn) {
  double best = 1e300;
  for (int r = -1; r < repeats; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    fn();
    double mine = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r >= 0) best = std::min(best, slowest);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  gradcomp::transport::mpi_environment env(&argc, &argv);
  int max_mb = 256, repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--max-mb")) max_mb = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
  }
  gradcomp::transport::mpi_transport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), size = transport.size();
  if (rank == 0)
    std::printf("ring all-reduce over transport::mpi_transport vs MPI_Allreduce, %d ranks, best of %d\n"
                "%10s %14s %14s %12s\n",
                size, repeats, "size", "ring (ms)", "allreduce (ms)", "ring/allred");
  double ratio_64mb = -1;
  for (int mb = 4; mb <= max_mb; mb *= 4) {
    const std::size_t n = std::size_t(mb) * (1u << 20) / sizeof(float);
    std::vector<float> input(n), ring_data(n), mpi_data(n);
    for (std::size_t i = 0; i < n; ++i) input[i] = float((i * 7 + std::size_t(rank) * 13) % 101) - 50.0f;
    const double ring_s = collective_seconds(repeats, [&] {
      std::copy(input.begin(), input.end(), ring_data.begin());
      gradcomp::ring_allreduce(gradcomp::execution::simd{}, transport, std::span<float>(ring_data));
    });
    const double copy_s = collective_seconds(repeats, [&] { std::copy(input.begin(), input.end(), mpi_data.begin()); });
    const double mpi_s = collective_seconds(repeats, [&] {
      std::copy(input.begin(), input.end(), mpi_data.begin());
      MPI_Allreduce(MPI_IN_PLACE, mpi_data.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    // Integer-valued inputs: both sums are exact, so they must agree exactly.
    int mismatch = std::memcmp(ring_data.data(), mpi_data.data(), n * sizeof(float)) != 0, any = 0;
    MPI_Allreduce(&mismatch, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) {
      if (rank == 0) std::fprintf(stderr, "ring result differs from MPI_Allreduce at %d MB\n", mb);
      return 1;
    }
    // Both timings include the same input copy; subtract it.
    const double ring_net = std::max(ring_s - copy_s, 1e-9), mpi_net = std::max(mpi_s - copy_s, 1e-9);
    if (rank == 0) std::printf("%7d MB %14.2f %14.2f %12.3f\n", mb, ring_net * 1e3, mpi_net * 1e3, ring_net / mpi_net);
    if (mb == 64) ratio_64mb = ring_net / mpi_net;
  }
  if (rank == 0 && ratio_64mb > 0) gradcomp::bench::result("mpi_ring_vs_mpi_allreduce_64mb", ratio_64mb, "x");
  return 0;
}
