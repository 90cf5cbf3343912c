// detail::wait_sends: one T::wait_all for a BatchWaitTransport, one wait() per
// handle otherwise (tested with the real one over MPI in tests/mpi).
#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/wait_sends.hpp>

namespace {

struct counts {
  int handle_waits = 0;
  int batch_calls = 0;
  std::size_t batched = 0;
};
counts tally;

struct send_handle {
  bool done = false;
  void wait() {
    ++tally.handle_waits;
    done = true;
  }
  bool test() { return done; }
};
struct recv_handle {
  gradcomp::message wait() { return {}; }
  bool test() { return true; }
};
struct recv_into_handle {
  std::size_t wait() { return 0; }
  bool test() { return true; }
};

// Sends and receives nothing: only the shape of a transport, for the dispatch.
struct plain_transport {
  int rank() const { return 0; }
  int size() const { return 1; }
  send_handle isend(int, int, std::vector<std::byte>&&) { return {}; }
  recv_handle irecv(int, int) { return {}; }
  send_handle isend_view(int, int, std::span<const std::byte>) { return {}; }
  recv_into_handle irecv_into(int, int, std::span<std::byte>) { return {}; }
};
struct batch_transport : plain_transport {
  static void wait_all(std::span<send_handle> handles) {
    ++tally.batch_calls;
    tally.batched += handles.size();
    for (auto& h : handles) h.done = true;
  }
  static void wait_all(std::span<recv_into_handle* const>) { ++tally.batch_calls; }
};

static_assert(gradcomp::ZeroCopyTransport<plain_transport>);
static_assert(!gradcomp::BatchWaitTransport<plain_transport>);
static_assert(gradcomp::BatchWaitTransport<batch_transport>);

}  // namespace

TEST_CASE("wait_sends: one wait_all call where the transport batches, else a wait() per handle") {
  std::vector<send_handle> sends(5);
  tally = {};
  gradcomp::detail::wait_sends<batch_transport>(std::span(sends));
  CHECK(tally.batch_calls == 1);
  CHECK(tally.batched == 5);
  CHECK(tally.handle_waits == 0);
  for (auto& h : sends) CHECK(h.test());

  std::vector<send_handle> more(4);
  tally = {};
  gradcomp::detail::wait_sends<plain_transport>(std::span(more));
  CHECK(tally.batch_calls == 0);
  CHECK(tally.handle_waits == 4);
  for (auto& h : more) CHECK(h.test());

  std::vector<send_handle> none;
  tally = {};
  gradcomp::detail::wait_sends<batch_transport>(std::span(none));
  CHECK(tally.batched == 0);
}
