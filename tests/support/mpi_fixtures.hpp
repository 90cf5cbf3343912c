#pragma once
// Helpers of the MPI tests (tests/mpi/): the world's rank and size, an
// mpi_transport option set with a deadline, an "any rank" vote, and a
// transport wrapper whose rank stops participating mid-collective.

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/transport/mpi.hpp>

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <span>
#include <utility>
#include <vector>

namespace gradcomp::test_support {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// True on every rank iff `flag` is true on some rank.
inline bool any_rank(bool flag) {
  int mine = flag ? 1 : 0, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any != 0;
}

inline transport::mpi_transport_options with_timeout(std::chrono::milliseconds t) {
  transport::mpi_transport_options o;
  o.timeout = t;
  return o;
}

// A rank's way of leaving a collective mid-way.
struct stopped {};

// Forwards to an mpi_transport and "dies" (throws stopped) at the send after
// `sends_before_death` sends: the rank stops participating mid-collective.
struct stopping_transport {
  transport::mpi_transport* t;
  int sends_before_death;
  int sent = 0;
  int rank() const { return t->rank(); }
  int size() const { return t->size(); }
  void count() {
    if (sent++ >= sends_before_death) throw stopped{};
  }
  transport::mpi_transport::send_handle isend(int dest, int tag, std::vector<std::byte>&& b) {
    count();
    return t->isend(dest, tag, std::move(b));
  }
  transport::mpi_transport::recv_handle irecv(int source, int tag) { return t->irecv(source, tag); }
  transport::mpi_transport::send_handle isend_view(int dest, int tag, std::span<const std::byte> b) {
    count();
    return t->isend_view(dest, tag, b);
  }
  transport::mpi_transport::recv_into_handle irecv_into(int source, int tag, std::span<std::byte> b) {
    return t->irecv_into(source, tag, b);
  }
};
static_assert(ZeroCopyTransport<stopping_transport>);

// How a collective call ended on this rank: it died (stopped), it timed out,
// or some other exception; all false when it returned.
struct stop_outcome {
  bool died = false, timed_out = false, other = false;
};

// Runs `fn` (a collective over a stopping_transport) and says how it ended.
template <class F>
stop_outcome run_until_stopped(F&& fn) {
  stop_outcome o;
  try {
    fn();
  } catch (const stopped&) {
    o.died = true;  // this rank leaves the collective
  } catch (const timeout_error&) {
    o.timed_out = true;
  } catch (const std::exception&) {
    o.other = true;
  }
  return o;
}

}  // namespace gradcomp::test_support
