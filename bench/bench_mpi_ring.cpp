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
#include "mpi_common.hpp"

int main(int argc, char** argv) {
  gradcomp::transport::mpi_environment env(&argc, &argv);
  const auto options = gradcomp::bench::parse_mpi_bench_options(argc, argv, {.max_mb = 256, .repeats = 3});
  const int max_mb = options.max_mb, repeats = options.repeats;
  using gradcomp::bench::collective_seconds;
  gradcomp::transport::mpi_transport transport(MPI_COMM_WORLD, gradcomp::bench::mpi_transport_options_from(options));
  const int rank = transport.rank(), size = transport.size();
  if (rank == 0)
    std::printf("ring all-reduce over transport::mpi_transport vs MPI_Allreduce, %d ranks, best of %d\n"
                "%10s %14s %14s %12s\n",
                size, repeats, "size", "ring (ms)", "allreduce (ms)", "ring/allred");
  double ratio_64mb = -1;
  for (int mb = 4; mb <= max_mb; mb *= 4) {
    const std::vector<float> input = gradcomp::bench::mpi_bench_input(mb, rank);
    const std::size_t n = input.size();
    std::vector<float> ring_data(n), mpi_data(n);
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
