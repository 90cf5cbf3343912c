// transport/mpi.hpp under mpirun with 2, 3 and 4 ranks.
#include <doctest/doctest.h>

#include <gradcomp/transport/mpi.hpp>

#include <cstring>
#include <numeric>

using namespace gradcomp;

namespace {

std::vector<std::byte> bytes_of(int value, std::size_t length) {
  std::vector<std::byte> b(length);
  for (std::size_t i = 0; i < length; ++i) b[i] = static_cast<std::byte>((value * 31 + int(i)) & 0xFF);
  return b;
}

}  // namespace

TEST_CASE("point-to-point round the ring, many lengths") {
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int n = t.size(), r = t.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (std::size_t length : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{3} << 20}) {
    auto recv = t.irecv(prev, 7);
    auto send = t.isend(next, 7, bytes_of(r, length));
    message m = recv.wait();
    send.wait();
    CHECK(m.source == prev);
    CHECK(m.tag == 7);
    CHECK(m.bytes == bytes_of(prev, length));
  }
}

TEST_CASE("messages with the same source and tag arrive in order") {
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int n = t.size(), r = t.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<transport::mpi_transport::send_handle> sends;
  for (int k = 0; k < 10; ++k) sends.push_back(t.isend(next, 3, bytes_of(k, 16)));
  for (int k = 0; k < 10; ++k) CHECK(t.irecv(prev, 3).wait().bytes == bytes_of(k, 16));
  for (auto& s : sends) s.wait();
}

TEST_CASE("any_source gathers one message from every other rank") {
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int n = t.size(), r = t.rank();
  if (r == 0) {
    std::vector<int> seen(n, 0);
    for (int k = 1; k < n; ++k) {
      message m = t.irecv(any_source, 11).wait();
      REQUIRE(m.source > 0);
      REQUIRE(m.source < n);
      CHECK(m.bytes == bytes_of(m.source, 64));
      ++seen[m.source];
    }
    CHECK(std::accumulate(seen.begin(), seen.end(), 0) == n - 1);
    for (int k = 1; k < n; ++k) CHECK(seen[k] == 1);
  } else {
    t.isend(0, 11, bytes_of(r, 64)).wait();
  }
  t.barrier();
}

TEST_CASE("a peer that never sends gives a timeout_error, not a hang") {
  transport::mpi_transport_options options;
  options.timeout = std::chrono::milliseconds(200);
  transport::mpi_transport t(MPI_COMM_WORLD, options);
  auto h = t.irecv((t.rank() + 1) % t.size(), 99);
  CHECK_THROWS_AS(h.wait(), timeout_error);
  auto h2 = t.irecv(any_source, 98);
  CHECK_FALSE(h2.wait_for(std::chrono::milliseconds(20)).has_value());
  t.barrier();
}

TEST_CASE("bad ranks and tags are typed errors") {
  transport::mpi_transport t(MPI_COMM_WORLD);
  CHECK_THROWS_AS(t.isend(t.size(), 0, {}), invalid_argument_error);
  CHECK_THROWS_AS(t.isend(-2, 0, {}), invalid_argument_error);
  CHECK_THROWS_AS(t.irecv(t.size() + 3, 0), invalid_argument_error);
  CHECK_THROWS_AS(t.isend(0, -1, {}), invalid_argument_error);
  CHECK_THROWS_AS(t.isend(0, t.max_tag() + 1, {}), invalid_argument_error);
  CHECK_THROWS_AS(transport::mpi_transport(MPI_COMM_NULL), invalid_argument_error);
}

TEST_CASE("gradcomp traffic does not mix with the application's own messages") {
  // The transport duplicates the communicator: a user message with the same
  // tag on MPI_COMM_WORLD is not matched by the transport's receive.
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int n = t.size(), r = t.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  int user_value = 1000 + r, user_in = -1;
  MPI_Request user_req;
  MPI_Isend(&user_value, 1, MPI_INT, next, 5, MPI_COMM_WORLD, &user_req);
  auto send = t.isend(next, 5, bytes_of(r, 8));
  auto recv = t.irecv(prev, 5);
  CHECK(recv.wait().bytes == bytes_of(prev, 8));
  MPI_Recv(&user_in, 1, MPI_INT, prev, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Wait(&user_req, MPI_STATUS_IGNORE);
  send.wait();
  CHECK(user_in == 1000 + prev);
}

TEST_CASE("zero-copy: isend_view and irecv_into move caller-owned memory") {
  static_assert(ZeroCopyTransport<transport::mpi_transport>);
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int n = t.size(), r = t.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (std::size_t length : {std::size_t{0}, std::size_t{5}, std::size_t{1} << 22}) {
    const auto out = bytes_of(r, length);
    std::vector<std::byte> in(length + 16, std::byte{0xAB});
    auto recv = t.irecv_into(prev, 21, in);
    auto send = t.isend_view(next, 21, out);
    CHECK(recv.wait() == length);
    send.wait();
    CHECK(std::equal(in.begin(), in.begin() + std::ptrdiff_t(length), bytes_of(prev, length).begin()));
    CHECK(in[length] == std::byte{0xAB});  // nothing written past the message
  }
}

TEST_CASE("wait_all: a batch of views and receives waited in one call, with and without a deadline") {
  static_assert(BatchWaitTransport<transport::mpi_transport>);
  for (const int timeout_ms : {0, 60000}) {  // one MPI_Waitall; each handle's own wait() with a deadline
    transport::mpi_transport_options options;
    options.timeout = std::chrono::milliseconds(timeout_ms);
    transport::mpi_transport t(MPI_COMM_WORLD, options);
    const int n = t.size(), r = t.rank();
    std::vector<std::vector<std::byte>> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
    std::vector<transport::mpi_transport::recv_into_handle> recvs;
    std::vector<transport::mpi_transport::send_handle> sends;
    recvs.reserve(static_cast<std::size_t>(n));
    for (int p = 0; p < n; ++p) {  // every rank sends p + 3 bytes to rank p, its own too
      in[static_cast<std::size_t>(p)].assign(static_cast<std::size_t>(r + 3), std::byte{0});
      recvs.push_back(t.irecv_into(p, 31, in[static_cast<std::size_t>(p)]));
    }
    for (int p = 0; p < n; ++p) {
      out[static_cast<std::size_t>(p)] = bytes_of(100 * r + p, static_cast<std::size_t>(p + 3));
      sends.push_back(t.isend_view(p, 31, out[static_cast<std::size_t>(p)]));
    }
    std::vector<transport::mpi_transport::recv_into_handle*> handles{nullptr};  // null entries are skipped
    for (auto& h : recvs) handles.push_back(&h);
    transport::mpi_transport::wait_all(std::span<transport::mpi_transport::recv_into_handle* const>(handles));
    transport::mpi_transport::wait_all(std::span<transport::mpi_transport::send_handle>(sends));
    for (int p = 0; p < n; ++p) {
      CHECK(recvs[static_cast<std::size_t>(p)].wait() == static_cast<std::size_t>(r + 3));  // done: returns at once
      CHECK(in[static_cast<std::size_t>(p)] == bytes_of(100 * p + r, static_cast<std::size_t>(r + 3)));
      CHECK(sends[static_cast<std::size_t>(p)].test());
    }
    transport::mpi_transport::wait_all(std::span<transport::mpi_transport::recv_into_handle* const>(handles));  // again: nothing
    t.barrier();
  }
}

TEST_CASE("wait_all: a message longer than its buffer is a transport_error") {
  transport::mpi_transport t(MPI_COMM_WORLD, transport::mpi_transport_options{.timeout = std::chrono::milliseconds(0)});
  const int n = t.size(), r = t.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<std::byte> small(8), fits(64);
  auto a = t.irecv_into(prev, 32, fits);
  auto b = t.irecv_into(prev, 33, small);
  auto sa = t.isend(next, 32, bytes_of(r, 64));
  auto sb = t.isend(next, 33, bytes_of(r, 64));
  std::vector<transport::mpi_transport::recv_into_handle*> handles{&a, &b};
  CHECK_THROWS_AS(transport::mpi_transport::wait_all(std::span<transport::mpi_transport::recv_into_handle* const>(handles)),
                  transport_error);
  sa.wait();
  sb.wait();
  t.barrier();
}

TEST_CASE("irecv_into: a message longer than the buffer is an error, not a silent truncation") {
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int n = t.size(), r = t.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<std::byte> small(8);
  auto recv = t.irecv_into(prev, 22, small);
  auto send = t.isend(next, 22, bytes_of(r, 64));
  CHECK_THROWS_AS(recv.wait(), transport_error);
  send.wait();
  t.barrier();
}

TEST_CASE("irecv_into with a timeout, and a handle dropped unwaited is cancelled safely") {
  transport::mpi_transport_options options;
  options.timeout = std::chrono::milliseconds(100);
  transport::mpi_transport t(MPI_COMM_WORLD, options);
  std::vector<std::byte> buffer(16);
  {
    auto h = t.irecv_into((t.rank() + 1) % t.size(), 23, buffer);
    CHECK_THROWS_AS(h.wait(), timeout_error);
  }
  { auto dropped = t.irecv_into((t.rank() + 1) % t.size(), 24, buffer); }
  t.barrier();
}

namespace {

/// One step of post batches: every rank sends two messages with the same tag
/// to every other rank (lengths 3 + step + p and 5 + r, so a swap of the two
/// shows as a length or a content error), all posts of the step in one batch.
void batched_step(transport::mpi_transport& t, int step, std::vector<std::vector<std::byte>>& in,
                  std::vector<std::vector<std::byte>>& out) {
  const int n = t.size(), r = t.rank();
  const auto first_len = [&](int from) { return static_cast<std::size_t>(3 + step % 2 + from); };
  std::vector<transport::mpi_transport::recv_into_handle> recvs;
  std::vector<transport::mpi_transport::send_handle> sends;
  recvs.reserve(2 * static_cast<std::size_t>(n));
  {
    auto batch = t.batch_posts();
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      auto& a = in[2 * std::size_t(p)];
      auto& b = in[2 * std::size_t(p) + 1];
      recvs.push_back(t.irecv_into(p, 41, std::span<std::byte>(a).first(first_len(p))));
      recvs.push_back(t.irecv_into(p, 41, std::span<std::byte>(b).first(static_cast<std::size_t>(5 + p))));
    }
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      auto& a = out[2 * std::size_t(p)];
      auto& b = out[2 * std::size_t(p) + 1];
      std::ranges::copy(bytes_of(1000 * step + 10 * r + 1, a.size()), a.begin());
      std::ranges::copy(bytes_of(1000 * step + 10 * r + 2, b.size()), b.begin());
      sends.push_back(t.isend_view(p, 41, std::span<const std::byte>(a).first(first_len(r))));
      sends.push_back(t.isend_view(p, 41, std::span<const std::byte>(b).first(static_cast<std::size_t>(5 + r))));
    }
  }  // the batch starts here: the two messages of each peer in two waves, in posting order
  std::vector<transport::mpi_transport::recv_into_handle*> handles;
  for (auto& h : recvs) handles.push_back(&h);
  transport::mpi_transport::wait_all(std::span<transport::mpi_transport::recv_into_handle* const>(handles));
  transport::mpi_transport::wait_all(std::span<transport::mpi_transport::send_handle>(sends));
  std::size_t i = 0;
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    CHECK(recvs[i++].wait() == first_len(p));
    CHECK(recvs[i++].wait() == static_cast<std::size_t>(5 + p));
    const auto& a = in[2 * std::size_t(p)];
    const auto& b = in[2 * std::size_t(p) + 1];
    CHECK(std::equal(a.begin(), a.begin() + std::ptrdiff_t(first_len(p)), bytes_of(1000 * step + 10 * p + 1, a.size()).begin()));
    CHECK(std::equal(b.begin(), b.begin() + 5 + p, bytes_of(1000 * step + 10 * p + 2, b.size()).begin()));
  }
}

}  // namespace

TEST_CASE("post batches: persistent requests kept across steps, same-tag messages in posting order") {
  static_assert(BatchPostTransport<transport::mpi_transport>);
  for (const std::size_t keep : {std::size_t{0}, std::size_t{16384}, std::size_t{3}}) {  // none, all, fewer than a step
    transport::mpi_transport t(MPI_COMM_WORLD, transport::mpi_transport_options{.persistent_requests = keep});
    const int n = t.size();
    std::vector<std::vector<std::byte>> in(2 * std::size_t(n), std::vector<std::byte>(64)), out = in;
    for (int step = 0; step < 4; ++step) {
      batched_step(t, step, in, out);
      // two lengths per peer and tag alternate with the step: at most 2 receive and 2 send keys each step
      if (keep == 0) CHECK(t.kept_requests() == 0);
      if (keep == 16384) CHECK(t.kept_requests() == std::size_t((step == 0 ? 4 : 6) * (n - 1)));
      if (keep == 3) CHECK(t.kept_requests() <= std::size_t(4 * (n - 1)) + 3);
    }
    t.barrier();
  }
}

TEST_CASE("post batches: a wait inside an open batch starts it; a handle dropped before the start is withdrawn") {
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int n = t.size(), r = t.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<std::byte> in(32), out = bytes_of(r, 32);
  {
    auto batch = t.batch_posts();
    auto recv = t.irecv_into(prev, 42, in);
    auto send = t.isend_view(next, 42, out);
    CHECK(recv.wait() == 32);  // would never return if the batch waited for its close
    send.wait();
    CHECK(in == bytes_of(prev, 32));
  }
  {
    auto batch = t.batch_posts();
    { auto dropped = t.irecv_into(prev, 43, in); }  // never started: nothing to cancel
    batch.close();
  }
  auto recv = t.irecv_into(prev, 43, in);  // gets the message the dropped receive never took
  auto send = t.isend(next, 43, bytes_of(r + 7, 32));
  CHECK(recv.wait() == 32);
  send.wait();
  CHECK(in == bytes_of(prev + 7, 32));
  t.barrier();
}
