#pragma once
/// \file transport/mpi_probe.hpp
/// mpi_transport's receive of a message whose length is not known in advance
/// (irecv): part of <gradcomp/transport/mpi.hpp> (component gradcomp::mpi).

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include <gradcomp/concepts.hpp>
#include <gradcomp/transport/mpi_wait.hpp>

namespace gradcomp::transport::detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Handle of a pending receive of unknown length (mpi_transport::irecv):
/// matched with MPI_Improbe and received with MPI_Mrecv, or under SMPI (no
/// matched probe) probed with MPI_Iprobe and received with MPI_Recv.
class mpi_probe_recv_handle {
 public:
  mpi_probe_recv_handle() = default;
  mpi_probe_recv_handle(MPI_Comm comm, int self, int source, int tag, mpi_wtime_clock::time_point started,
                        std::chrono::milliseconds timeout) noexcept
      : comm_(comm), self_(self), source_(source), tag_(tag), started_(started), timeout_(timeout) {}
  mpi_probe_recv_handle(mpi_probe_recv_handle&&) noexcept = default;
  mpi_probe_recv_handle& operator=(mpi_probe_recv_handle&&) noexcept = default;

  /// Blocks until the message has arrived and returns it.
  message wait() {
    if (!received_ && timeout_.count() == 0) {
      MPI_Status status;
      mpi_check(MPI_Probe(source_, tag_, comm_, &status), "MPI_Probe");
    }
    poll_backoff backoff;
    while (!test()) {
      if (timeout_.count() > 0 && mpi_wtime_clock::now() - started_ > timeout_)
        throw timeout_error("gradcomp mpi: rank " + std::to_string(self_) + " waited " +
                            std::to_string(timeout_.count()) + " ms for a message from " +
                            (source_ == MPI_ANY_SOURCE ? std::string("any rank") : "rank " + std::to_string(source_)) +
                            " with tag " + std::to_string(tag_));
      backoff.pause();
    }
    return std::move(*received_);
  }
  /// Polls; true once the message is here (wait() then returns at once).
  bool test() {
    if (received_) return true;
    int found = 0;
    MPI_Status status;
#if GRADCOMP_MPI_MATCHED_PROBE
    MPI_Message handle;
    mpi_check(MPI_Improbe(source_, tag_, comm_, &found, &handle, &status), "MPI_Improbe");
#else
    mpi_check(MPI_Iprobe(source_, tag_, comm_, &found, &status), "MPI_Iprobe");
#endif
    if (!found) return false;
    int count = 0;
    mpi_check(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count");
    message m;
    m.source = status.MPI_SOURCE;
    m.tag = status.MPI_TAG;
    m.bytes.resize(static_cast<std::size_t>(count));
#if GRADCOMP_MPI_MATCHED_PROBE
    mpi_check(MPI_Mrecv(m.bytes.data(), count, MPI_BYTE, &handle, MPI_STATUS_IGNORE), "MPI_Mrecv");
#else
    // The probed message: same source and tag, and no receive in between
    // (one thread at a time per transport), so MPI delivers exactly it.
    mpi_check(MPI_Recv(m.bytes.data(), count, MPI_BYTE, m.source, m.tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
#endif
    received_ = std::move(m);
    return true;
  }
  /// Waits at most `limit`; empty if nothing arrived.
  template <class Rep, class Period>
  std::optional<message> wait_for(std::chrono::duration<Rep, Period> limit) {
    const auto deadline = mpi_wtime_clock::now() + limit;
    poll_backoff backoff;
    while (!test()) {
      if (mpi_wtime_clock::now() >= deadline) return std::nullopt;
      backoff.pause();
    }
    return std::move(*received_);
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int self_ = 0;
  int source_ = 0;
  int tag_ = 0;
  mpi_wtime_clock::time_point started_;
  std::chrono::milliseconds timeout_{0};
  std::optional<message> received_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::transport::detail
