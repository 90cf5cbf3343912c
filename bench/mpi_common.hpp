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

#include <gradcomp/transport/mpi.hpp>

namespace gradcomp::bench {

/// `--max-mb M` (largest size; the sizes are 4, 16, 64, ... MB up to M),
/// `--repeats R` and `--persistent-requests K` (mpi_transport_options::
/// persistent_requests: 0 posts every message with plain MPI_Isend/MPI_Irecv;
/// -1, the default, keeps the library's default).
struct mpi_bench_options {
  int max_mb = 64;
  int repeats = 3;
  long persistent_requests = -1;
};

/// Reads --max-mb, --repeats and --persistent-requests from the command line over the given defaults.
inline mpi_bench_options parse_mpi_bench_options(int argc, char** argv, mpi_bench_options o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--max-mb")) o.max_mb = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeats")) o.repeats = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--persistent-requests")) o.persistent_requests = std::atol(argv[i + 1]);
  }
  return o;
}

/// The transport options the command line asks for.
inline transport::mpi_transport_options mpi_transport_options_from(const mpi_bench_options& o) {
  transport::mpi_transport_options t;
  if (o.persistent_requests >= 0) t.persistent_requests = static_cast<std::size_t>(o.persistent_requests);
  return t;
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
