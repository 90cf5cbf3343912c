#pragma once
// Shared pieces of the bench_mpi_* executables (run under mpirun): their
// command-line options, the slowest rank's time of a collective call, and
// the integer-valued inputs whose sums are exact in any order.

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace gradcomp::bench {

/// `--max-mb M` (largest size; the sizes are 4, 16, 64, ... MB up to M) and `--repeats R`.
struct mpi_bench_options {
  int max_mb = 64;
  int repeats = 3;
};

/// Reads --max-mb and --repeats from the command line over the given defaults.
inline mpi_bench_options parse_mpi_bench_options(int argc, char** argv, mpi_bench_options o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--max-mb")) o.max_mb = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeats")) o.repeats = std::atoi(argv[i + 1]);
  }
  return o;
}

/// Slowest rank's wall time (MPI_Wtime) of one call of `fn`, best over
/// `repeats` after a warm-up; every call starts at a barrier.
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

/// Rank `rank`'s input of `mb` megabytes of floats: small integers
/// ((7 i + 13 rank) mod 101 - 50), so every summation order gives the same exact sum.
inline std::vector<float> mpi_bench_input(int mb, int rank) {
  const std::size_t n = std::size_t(mb) * (std::size_t{1} << 20) / sizeof(float);
  std::vector<float> input(n);
  for (std::size_t i = 0; i < n; ++i) input[i] = float((i * 7 + std::size_t(rank) * 13) % 101) - 50.0f;
  return input;
}

}  // namespace gradcomp::bench
