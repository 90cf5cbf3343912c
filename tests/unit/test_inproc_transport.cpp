// transport/inproc.hpp: matching order, any_source, timeouts, closed ranks,
// invalid arguments, run_workers. Runs under TSan in CI.
#include <doctest/doctest.h>

#include <gradcomp/transport/inproc.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using gradcomp::any_source;
using gradcomp::message;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::inproc_fabric;
using gradcomp::transport::run_workers;

namespace {

std::vector<std::byte> bytes_of(std::initializer_list<int> v) {
  std::vector<std::byte> b;
  for (int x : v) b.push_back(std::byte(x));
  return b;
}
int first(const message& m) { return m.bytes.empty() ? -1 : std::to_integer<int>(m.bytes.front()); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

static_assert(gradcomp::Transport<inproc_endpoint>);
static_assert(gradcomp::SendHandle<inproc_endpoint::send_handle>);
static_assert(gradcomp::RecvHandle<inproc_endpoint::recv_handle>);

TEST_CASE("inproc: rank, size, and a message moves without a copy") {
  inproc_fabric f(3);
  CHECK(f.size() == 3);
  CHECK(f.endpoint(2).rank() == 2);
  CHECK(f.endpoint(2).size() == 3);
  std::vector<std::byte> buf(1000, std::byte{7});
  const std::byte* where = buf.data();
  auto s = f.endpoint(0).isend(1, 5, std::move(buf));
  CHECK(s.test());
  s.wait();
  message m = f.endpoint(1).irecv(0, 5).wait();
  CHECK(m.source == 0);
  CHECK(m.tag == 5);
  CHECK(m.bytes.size() == 1000);
  CHECK(m.bytes.data() == where);  // zero copy: the same buffer
  CHECK(f.endpoint(0).bytes_sent() == 1000);
  CHECK(f.endpoint(0).messages_sent() == 1);
  CHECK(f.endpoint(1).bytes_received() == 1000);
  CHECK(f.endpoint(1).messages_received() == 1);
}

TEST_CASE("inproc: per (source, tag) FIFO and tags kept apart") {
  inproc_fabric f(2);
  auto& a = f.endpoint(0);
  auto& b = f.endpoint(1);
  for (int i = 0; i < 5; ++i) a.isend(1, 1, bytes_of({i}));
  for (int i = 10; i < 13; ++i) a.isend(1, 2, bytes_of({i}));
  // Tag 2 first: tag-1 messages stay queued in order.
  CHECK(first(b.irecv(0, 2).wait()) == 10);
  for (int i = 0; i < 5; ++i) CHECK(first(b.irecv(0, 1).wait()) == i);
  CHECK(first(b.irecv(0, 2).wait()) == 11);
  CHECK(first(b.irecv(0, 2).wait()) == 12);
}

TEST_CASE("inproc: receives are matched in the order they were posted") {
  inproc_fabric f(3);
  auto& r = f.endpoint(2);
  auto h1 = r.irecv(0, 3);
  auto h2 = r.irecv(any_source, 3);
  auto h3 = r.irecv(0, 3);
  CHECK_FALSE(h1.test());
  f.endpoint(1).isend(2, 3, bytes_of({1}));  // only h2 matches rank 1
  CHECK_FALSE(h1.test());
  CHECK(h2.test());
  f.endpoint(0).isend(2, 3, bytes_of({2}));  // oldest matching: h1
  f.endpoint(0).isend(2, 3, bytes_of({3}));  // then h3
  CHECK(first(h3.wait()) == 3);
  CHECK(first(h1.wait()) == 2);
  message m2 = h2.wait();
  CHECK(m2.source == 1);
  CHECK(first(m2) == 1);
}

TEST_CASE("inproc: any_source takes the oldest queued message of any sender") {
  inproc_fabric f(4);
  f.endpoint(3).isend(0, 9, bytes_of({30}));
  f.endpoint(1).isend(0, 9, bytes_of({10}));
  f.endpoint(2).isend(0, 8, bytes_of({20}));  // other tag: not matched
  auto& me = f.endpoint(0);
  message a = me.irecv(any_source, 9).wait();
  message b = me.irecv(any_source, 9).wait();
  CHECK(a.source == 3);
  CHECK(b.source == 1);
  CHECK(me.irecv(any_source, 8).wait().source == 2);
}

TEST_CASE("inproc: sending to oneself works") {
  inproc_fabric f(1);
  auto& e = f.endpoint(0);
  e.isend(0, 0, bytes_of({42}));
  CHECK(first(e.irecv(0, 0).wait()) == 42);
  e.isend(0, 0, bytes_of({43}));
  message m = e.irecv(any_source, 0).wait();
  CHECK(m.source == 0);
  CHECK(first(m) == 43);
}

TEST_CASE("inproc: a receive with nothing to come times out with a clear error") {
  inproc_fabric f(2, {.recv_timeout = 50ms});
  auto h = f.endpoint(1).irecv(0, 77);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    h.wait();
    FAIL("no timeout");
  } catch (const gradcomp::timeout_error& e) {
    const std::string what = e.what();
    CHECK(contains(what, "rank 1"));
    CHECK(contains(what, "rank 0"));
    CHECK(contains(what, "tag 77"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 >= 50ms);
  // The receive stays posted: a later message still completes it.
  f.endpoint(0).isend(1, 77, bytes_of({5}));
  CHECK(first(h.wait()) == 5);
}

TEST_CASE("inproc: timeout_error is a transport_error; set_recv_timeout applies to later receives") {
  inproc_fabric f(2);
  f.set_recv_timeout(10ms);
  CHECK(f.endpoint(0).recv_timeout() == 10ms);
  CHECK_THROWS_AS(f.endpoint(0).irecv(1, 0).wait(), gradcomp::transport_error);
}

TEST_CASE("inproc: wait_for returns nullopt on timeout, the message when it comes") {
  inproc_fabric f(2);
  auto h = f.endpoint(0).irecv(1, 1);
  CHECK_FALSE(h.wait_for(5ms).has_value());
  std::thread sender([&] {
    std::this_thread::sleep_for(20ms);
    f.endpoint(1).isend(0, 1, bytes_of({9}));
  });
  std::optional<message> m = h.wait_for(30s);
  sender.join();
  REQUIRE(m.has_value());
  CHECK(first(*m) == 9);
  CHECK_FALSE(h.valid());
  CHECK_THROWS_AS(h.wait(), gradcomp::state_error);
}

TEST_CASE("inproc: closed ranks") {
  inproc_fabric f(3, {.recv_timeout = 30s});
  auto& a = f.endpoint(0);
  auto& b = f.endpoint(1);
  a.isend(1, 0, bytes_of({1}));  // queued before the close: still delivered
  auto pending = b.irecv(2, 0);
  f.close(0);
  CHECK(f.closed(0));
  CHECK(a.closed());

  SUBCASE("sends to a closed rank throw") { CHECK_THROWS_AS(b.isend(0, 0, bytes_of({1})), gradcomp::transport_error); }
  SUBCASE("a closed rank cannot send") { CHECK_THROWS_AS(a.isend(1, 0, bytes_of({1})), gradcomp::transport_error); }
  SUBCASE("queued messages from it are delivered, then receives fail at once") {
    CHECK(first(b.irecv(0, 0).wait()) == 1);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(b.irecv(0, 0).wait(), gradcomp::transport_error);
    CHECK(std::chrono::steady_clock::now() - t0 < 20s);  // not the 30 s timeout
    auto h = b.irecv(0, 0);
    CHECK(h.test());  // wait() would not block
  }
  SUBCASE("a blocked receiver is woken when its peer closes") {
    std::thread closer([&] {
      std::this_thread::sleep_for(20ms);
      f.close(2);
    });
    try {
      pending.wait();
      FAIL("no error");
    } catch (const gradcomp::timeout_error&) {
      FAIL("timed out instead of seeing the close");
    } catch (const gradcomp::transport_error& e) {
      CHECK(contains(e.what(), "rank 2 is closed"));
    }
    closer.join();
  }
  SUBCASE("any_source fails only when every other rank is closed") {
    b.irecv(0, 0).wait();  // drain the queued one
    auto any = b.irecv(any_source, 5);
    CHECK_FALSE(any.test());
    f.close(2);
    CHECK(any.test());
    CHECK_THROWS_AS(any.wait(), gradcomp::transport_error);
  }
}

TEST_CASE("inproc: invalid arguments") {
  inproc_fabric f(2);
  auto& e = f.endpoint(0);
  CHECK_THROWS_AS(e.isend(2, 0, {}), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(e.isend(-1, 0, {}), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(e.isend(1, -3, {}), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(e.irecv(5, 0), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(e.irecv(-2, 0), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(e.irecv(1, -1), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(f.endpoint(2), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(inproc_fabric(0), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(inproc_fabric(2, {.recv_timeout = 0ms}), gradcomp::invalid_argument_error);
  // Nothing was sent by the failed calls.
  CHECK(e.messages_sent() == 0);
}

TEST_CASE("inproc: a dropped receive handle is cancelled") {
  inproc_fabric f(2);
  { auto h = f.endpoint(1).irecv(0, 0); }
  f.endpoint(0).isend(1, 0, bytes_of({4}));
  CHECK(first(f.endpoint(1).irecv(0, 0).wait()) == 4);
  // Moved handles keep working; the moved-from one is empty.
  auto h = f.endpoint(1).irecv(0, 0);
  auto g = std::move(h);
  CHECK_FALSE(h.valid());
  f.endpoint(0).isend(1, 0, bytes_of({6}));
  CHECK(first(g.wait()) == 6);
}

TEST_CASE("run_workers: one thread per rank, all-to-all exchange") {
  constexpr int n = 6;
  std::atomic<int> total{0};
  run_workers(n, [&](inproc_endpoint& ep) {
    for (int d = 0; d < n; ++d) ep.isend(d, 1, bytes_of({ep.rank()}));
    int sum = 0;
    std::vector<inproc_endpoint::recv_handle> hs;
    for (int s = 0; s < n; ++s) hs.push_back(ep.irecv(s, 1));
    for (int s = 0; s < n; ++s) {
      message m = hs[static_cast<std::size_t>(s)].wait();
      CHECK(m.source == s);  // doctest assertions are thread-safe
      sum += first(m);
    }
    total += sum;
  });
  CHECK(total == n * (n * (n - 1) / 2));
}

TEST_CASE("run_workers: the first exception is rethrown and its rank closed, so peers fail fast") {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run_workers(
        4,
        [](inproc_endpoint& ep) {
          if (ep.rank() == 2) throw std::runtime_error("worker 2 failed");
          // Everyone else waits for rank 2, which never sends.
          ep.irecv(2, 0).wait();
        },
        {.recv_timeout = 60s});
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "worker 2 failed");
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 30s);
}

TEST_CASE("inproc: concurrent senders to one receiver") {
  constexpr int n = 5, per_sender = 200;
  inproc_fabric f(n);
  f.run([&](inproc_endpoint& ep) {
    if (ep.rank() != 0) {
      for (int i = 0; i < per_sender; ++i) {
        std::vector<std::byte> b(4);
        b[0] = std::byte(i & 0xFF);
        b[1] = std::byte(i >> 8);
        ep.isend(0, 0, std::move(b));
      }
    } else {
      std::vector<int> next(n, 0);
      for (int i = 0; i < (n - 1) * per_sender; ++i) {
        message m = ep.irecv(any_source, 0).wait();
        const int v = std::to_integer<int>(m.bytes[0]) | (std::to_integer<int>(m.bytes[1]) << 8);
        CHECK(v == next[static_cast<std::size_t>(m.source)]++);  // FIFO per sender
      }
    }
  });
}

TEST_CASE("inproc: handles may outlive their fabric") {
  gradcomp::transport::inproc_recv_handle matched, unmatched;
  {
    inproc_fabric f(2, {.recv_timeout = 10ms});
    f.endpoint(0).isend(1, 0, bytes_of({8}));
    matched = f.endpoint(1).irecv(0, 0);
    unmatched = f.endpoint(1).irecv(0, 1);
  }
  CHECK(first(matched.wait()) == 8);
  CHECK_THROWS_AS(unmatched.wait(), gradcomp::timeout_error);
}
