// doctest main for tests under mpirun: every rank runs every test case; the
// exit code is non-zero on every rank if any rank failed, and only rank 0
// prints doctest's summary (the others report failures only).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context(argc, argv);
  if (rank != 0) context.setOption("minimal", true);
  const int failed_here = context.run() != 0 ? 1 : 0;
  int failed_anywhere = 0;
  MPI_Allreduce(&failed_here, &failed_anywhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed_here) std::fprintf(stderr, "rank %d: tests failed\n", rank);
  MPI_Finalize();
  return failed_anywhere;
}
