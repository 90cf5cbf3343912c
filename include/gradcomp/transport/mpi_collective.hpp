#pragma once
/// \file transport/mpi_collective.hpp
/// The MPI library's own all-reduce as mpi_transport runs it
/// (gradcomp::LibraryAllreduceTransport): part of <gradcomp/transport/mpi.hpp>
/// (component gradcomp::mpi).

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/transport/mpi_wait.hpp>

namespace gradcomp::transport::detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// MPI_Allreduce in place of `count` elements of `elem` bytes at `data` over
/// `comm`, in pieces of at most INT_MAX elements (MPI's int count). With a
/// `timeout` (not zero) MPI_Iallreduce on copies, polled until the deadline:
/// timeout_error, the copies then kept alive in `abandoned` (MPI may still
/// write them). mpi_transport::library_allreduce_sum / _max.
inline void mpi_library_allreduce(MPI_Comm comm, int rank, void* data, std::size_t count, std::size_t elem,
                                  MPI_Datatype type, MPI_Op op, std::chrono::milliseconds timeout,
                                  std::vector<std::shared_ptr<std::vector<std::byte>>>& abandoned) {
  auto* base = static_cast<std::byte*>(data);
  for (std::size_t at = 0; at < count;) {
    const std::size_t n = std::min<std::size_t>(count - at, static_cast<std::size_t>(INT_MAX));
    std::byte* piece = base + at * elem;
    if (timeout.count() == 0) {
      // The blocking call: no deadline asked for (mpi_transport asks for none under SMPI, where no rank dies).
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, piece, static_cast<int>(n), type, op, comm), "MPI_Allreduce");
    } else {
      // Send and receive buffers of our own, which MPI may keep using after
      // a timeout: they are then kept alive in `abandoned`.
      auto bufs = std::make_shared<std::vector<std::byte>>(2 * n * elem);
      std::memcpy(bufs->data(), piece, n * elem);
      MPI_Request request = MPI_REQUEST_NULL;
      mpi_check(MPI_Iallreduce(bufs->data(), bufs->data() + n * elem, static_cast<int>(n), type, op, comm,
                                       &request),
                        "MPI_Iallreduce");
      const auto started = mpi_wtime_clock::now();
      // MPI's non-blocking collectives advance only while polled: yield, never sleep
      // (a busy core, as inside a blocking MPI_Allreduce).
      poll_backoff backoff(/*may_sleep=*/false);
      for (;;) {
        int done = 0;
        mpi_check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test (all-reduce)");
        if (done) break;
        if (mpi_wtime_clock::now() - started > timeout) {
          abandoned.push_back(std::move(bufs));
          throw timeout_error("gradcomp mpi: rank " + std::to_string(rank) +
                              ": the library all-reduce did not complete within " +
                              std::to_string(timeout.count()) + " ms (a rank died or stopped)");
        }
        backoff.pause();
      }
      std::memcpy(piece, bufs->data() + n * elem, n * elem);
    }
    at += n;
  }
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::transport::detail
