// transport/emulated_link.hpp and transport/fault_injection.hpp.
// Timing checks are lower bounds only (a slow machine cannot make them fail).
#include <doctest/doctest.h>

#include <gradcomp/transport/emulated_link.hpp>
#include <gradcomp/transport/fault_injection.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <bit>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using gradcomp::message;
using gradcomp::transport::emulated_link;
using gradcomp::transport::emulated_network;
using gradcomp::transport::fault_injecting;
using gradcomp::transport::fault_plan;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::inproc_fabric;
using gradcomp::transport::run_workers;
namespace faults = gradcomp::transport::faults;
using clk = std::chrono::steady_clock;

static_assert(gradcomp::Transport<emulated_link<inproc_endpoint>>);
static_assert(gradcomp::Transport<fault_injecting<inproc_endpoint>>);
static_assert(gradcomp::Transport<fault_injecting<emulated_link<inproc_endpoint>>>);
static_assert(gradcomp::Transport<emulated_link<emulated_link<inproc_endpoint>>>);

namespace {
std::vector<std::byte> pattern(std::size_t n, int seed = 0) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = std::byte((i * 31 + std::size_t(seed)) & 0xFF);
  return b;
}
}  // namespace

// ---------------------------------------------------------------------------
// emulated_link

TEST_CASE("emulated_link: delivery no earlier than bytes/rate + latency") {
  inproc_fabric f(2);
  emulated_network net(2, {.bits_per_second = 1e9, .latency = 5ms});
  emulated_link<inproc_endpoint> a(f.endpoint(0), net), b(f.endpoint(1), net);
  const std::size_t bytes = 250'000;  // 2 ms at 1 Gbit/s
  CHECK(net.transfer_time(bytes) == 2ms);
  const auto t0 = clk::now();
  auto s = a.isend(1, 0, pattern(bytes));
  message m = b.irecv(0, 0).wait();
  const auto got = clk::now() - t0;
  CHECK(m.bytes == pattern(bytes));
  CHECK(got >= 2ms + 5ms);
  s.wait();
  CHECK(clk::now() - t0 >= 2ms);  // the send completes once the last bit left
  CHECK(net.bytes_sent(0) == bytes);
  CHECK(net.bytes_received(1) == bytes);
  CHECK(a.bytes_sent() == bytes);
  CHECK(b.bytes_received() == bytes);
  CHECK(net.messages_sent(0) == 1);
  CHECK(net.messages_received(1) == 1);
  CHECK(net.bytes_sent(1) == 0);
}

TEST_CASE("emulated_link: messages from one sender are serialised") {
  inproc_fabric f(3);
  emulated_network net(3, {.bits_per_second = 1e9, .latency = 1ms});
  emulated_link<inproc_endpoint> a(f.endpoint(0), net), b(f.endpoint(1), net), c(f.endpoint(2), net);
  const std::size_t bytes = 500'000;  // 4 ms each
  const auto t0 = clk::now();
  a.isend(1, 0, pattern(bytes));
  a.isend(2, 0, pattern(bytes));  // other destination, same outgoing link: waits for the first
  a.isend(1, 0, pattern(bytes));
  c.irecv(0, 0).wait();
  CHECK(clk::now() - t0 >= 8ms + 1ms);
  b.irecv(0, 0).wait();
  b.irecv(0, 0).wait();
  CHECK(clk::now() - t0 >= 12ms + 1ms);
  CHECK(net.total_bytes_sent() == 3 * bytes);
}

TEST_CASE("emulated_link: test() and wait_for() respect the delivery time") {
  inproc_fabric f(2);
  emulated_network net(2, {.bits_per_second = 1e9, .latency = 200ms});
  emulated_link<inproc_endpoint> a(f.endpoint(0), net), b(f.endpoint(1), net);
  const auto t0 = clk::now();
  auto h = b.irecv(0, 3);
  a.isend(1, 3, pattern(10));
  // The message is in the inproc mailbox at once, but not yet "delivered".
  if (clk::now() - t0 < 150ms) CHECK_FALSE(h.test());
  std::optional<message> m = h.wait_for(1ms);
  if (clk::now() - t0 < 199ms) CHECK_FALSE(m.has_value());
  m = h.wait_for(10s);
  REQUIRE(m.has_value());
  CHECK(clk::now() - t0 >= 200ms);
  CHECK(m->bytes == pattern(10));
  CHECK(net.bytes_received(1) == 10);
}

TEST_CASE("emulated_link: rank/size, bad configurations and arguments") {
  inproc_fabric f(2);
  emulated_network net(2, {.bits_per_second = 10e9});
  emulated_link<inproc_endpoint> a(f.endpoint(1), net);
  CHECK(a.rank() == 1);
  CHECK(a.size() == 2);
  CHECK_THROWS_AS(emulated_network(2, {.bits_per_second = 0}), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(emulated_network(2, {.bits_per_second = -1e9}), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(emulated_network(2, {.bits_per_second = 1e9, .latency = -1ms}), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(emulated_network(0, {}), gradcomp::invalid_argument_error);
  emulated_network wrong(3, {});
  CHECK_THROWS_AS(emulated_link<inproc_endpoint>(f.endpoint(0), wrong), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(a.isend(2, 0, {}), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(a.isend(0, -1, {}), gradcomp::invalid_argument_error);
  CHECK(net.bytes_sent(1) == 0);
  // A failed send leaves no delivery time behind: the next message is not delayed by it.
  emulated_link<inproc_endpoint> b(f.endpoint(0), net);
  a.isend(0, 0, pattern(3));
  CHECK(b.irecv(1, 0).wait().bytes.size() == 3);
}

TEST_CASE("emulated_link: closed peers and timeouts pass through") {
  inproc_fabric f(2, {.recv_timeout = 20ms});
  emulated_network net(2, {.bits_per_second = 1e9});
  emulated_link<inproc_endpoint> a(f.endpoint(0), net), b(f.endpoint(1), net);
  CHECK_THROWS_AS(b.irecv(0, 0).wait(), gradcomp::timeout_error);
  a.close();
  auto h = b.irecv(0, 0);
  CHECK(h.test());  // failed: wait() would not block
  CHECK_THROWS_AS(h.wait(), gradcomp::transport_error);
  CHECK_THROWS_AS(b.isend(0, 0, pattern(1)), gradcomp::transport_error);
}

TEST_CASE("emulated_link: many threads, counters add up") {
  constexpr int n = 4;
  emulated_network net(n, {.bits_per_second = 100e9, .latency = 10us});
  run_workers(n, [&](inproc_endpoint& ep) {
    emulated_link<inproc_endpoint> link(ep, net);
    for (int k = 0; k < 20; ++k)
      for (int d = 0; d < n; ++d)
        if (d != ep.rank()) link.isend(d, k % 3, pattern(100 + std::size_t(k), ep.rank()));
    for (int k = 0; k < 20; ++k)
      for (int s = 0; s < n; ++s)
        if (s != ep.rank()) CHECK(link.irecv(s, k % 3).wait().bytes == pattern(100 + std::size_t(k), s));
  });
  std::uint64_t per_rank = 0;
  for (int k = 0; k < 20; ++k) per_rank += (n - 1) * (100 + std::uint64_t(k));
  for (int r = 0; r < n; ++r) {
    CHECK(net.bytes_sent(r) == per_rank);
    CHECK(net.bytes_received(r) == per_rank);
  }
  net.reset_counters();
  CHECK(net.total_bytes_sent() == 0);
}

// ---------------------------------------------------------------------------
// fault_injecting

TEST_CASE("fault_injecting: an empty plan passes everything through") {
  inproc_fabric f(2);
  fault_injecting<inproc_endpoint> a(f.endpoint(0), fault_plan{});
  CHECK(a.rank() == 0);
  CHECK(a.size() == 2);
  a.isend(1, 4, pattern(64)).wait();
  CHECK(f.endpoint(1).irecv(0, 4).wait().bytes == pattern(64));
  CHECK(a.stats().sends == 1);
  CHECK(a.stats().dropped == 0);
}

TEST_CASE("fault_injecting: drop by index, by count, by predicate") {
  inproc_fabric f(2, {.recv_timeout = 10ms});
  auto& rx = f.endpoint(1);
  SUBCASE("nth send") {
    fault_injecting<inproc_endpoint> a(f.endpoint(0), fault_plan{}.drop(faults::nth_send(1)));
    for (int i = 0; i < 3; ++i) {
      auto h = a.isend(1, 0, pattern(4, i));
      CHECK(h.test());  // a dropped send still completes for the sender
      h.wait();
    }
    CHECK(rx.irecv(0, 0).wait().bytes == pattern(4, 0));
    CHECK(rx.irecv(0, 0).wait().bytes == pattern(4, 2));
    CHECK_THROWS_AS(rx.irecv(0, 0).wait(), gradcomp::timeout_error);
    CHECK(a.stats().dropped == 1);
  }
  SUBCASE("the first k sends") {
    fault_injecting<inproc_endpoint> a(f.endpoint(0), fault_plan{}.drop(faults::every_send(), 2));
    for (int i = 0; i < 4; ++i) a.isend(1, 0, pattern(4, i));
    CHECK(rx.irecv(0, 0).wait().bytes == pattern(4, 2));
    CHECK(rx.irecv(0, 0).wait().bytes == pattern(4, 3));
    CHECK(a.stats().dropped == 2);
  }
  SUBCASE("a predicate") {
    fault_plan plan;
    plan.drop([](const gradcomp::transport::send_info& s) { return s.tag == 7 && s.bytes > 10; });
    fault_injecting<inproc_endpoint> a(f.endpoint(0), plan);
    a.isend(1, 7, pattern(20));
    a.isend(1, 7, pattern(5));
    a.isend(1, 8, pattern(20));
    CHECK(rx.irecv(0, 7).wait().bytes.size() == 5);
    CHECK(rx.irecv(0, 8).wait().bytes.size() == 20);
    CHECK(a.stats().dropped == 1);
  }
}

TEST_CASE("fault_injecting: random drops are deterministic for a seed") {
  auto survivors = [](std::uint64_t seed) {
    inproc_fabric f(2, {.recv_timeout = 10ms});
    fault_injecting<inproc_endpoint> a(f.endpoint(0), fault_plan(seed).drop_randomly(0.5));
    for (int i = 0; i < 64; ++i) a.isend(1, 0, pattern(1, i));
    std::vector<int> got;
    for (std::uint64_t i = 0; i < 64 - a.stats().dropped; ++i)
      got.push_back(std::to_integer<int>(f.endpoint(1).irecv(0, 0).wait().bytes[0]));
    return got;
  };
  const auto a = survivors(7), b = survivors(7), c = survivors(8);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(a.size() > 10);
  CHECK(a.size() < 54);
  CHECK_THROWS_AS(fault_plan{}.drop_randomly(1.5), gradcomp::invalid_argument_error);
}

TEST_CASE("fault_injecting: corrupt given bits, or random bits with a seed") {
  inproc_fabric f(2);
  auto& rx = f.endpoint(1);
  SUBCASE("given offsets") {
    fault_injecting<inproc_endpoint> a(f.endpoint(0), fault_plan{}.flip_bits(faults::every_send(), {0, 13, 999}, 1));
    a.isend(1, 0, pattern(8));
    a.isend(1, 0, pattern(8));  // times = 1: untouched
    auto expected = pattern(8);
    expected[0] ^= std::byte{0x01};
    expected[1] ^= std::byte{0x20};
    CHECK(rx.irecv(0, 0).wait().bytes == expected);
    CHECK(rx.irecv(0, 0).wait().bytes == pattern(8));
    CHECK(a.stats().corrupted == 1);
  }
  SUBCASE("random offsets") {
    auto corrupted = [&](std::uint64_t seed) {
      inproc_fabric g(2);
      fault_injecting<inproc_endpoint> a(g.endpoint(0), fault_plan(seed).flip_random_bits(faults::every_send(), 3));
      a.isend(1, 0, pattern(256));
      return g.endpoint(1).irecv(0, 0).wait().bytes;
    };
    const auto x = corrupted(1), y = corrupted(1), z = corrupted(2);
    CHECK(x == y);
    CHECK(x != z);
    CHECK(x != pattern(256));
    int flipped = 0;
    const auto clean = pattern(256);
    for (std::size_t i = 0; i < x.size(); ++i) flipped += std::popcount(std::to_integer<unsigned>(x[i] ^ clean[i]));
    CHECK(flipped >= 1);  // 3 flips, two may hit the same bit
    CHECK(flipped <= 3);
  }
}

TEST_CASE("fault_injecting: truncate") {
  inproc_fabric f(2);
  fault_injecting<inproc_endpoint> a(f.endpoint(0), fault_plan{}.truncate(faults::with_tag(2), 3));
  a.isend(1, 2, pattern(10));
  a.isend(1, 1, pattern(10));
  a.isend(1, 2, pattern(2));  // already short: unchanged
  auto m = f.endpoint(1).irecv(0, 2).wait();
  const auto full = pattern(10);
  CHECK(m.bytes == std::vector<std::byte>(full.begin(), full.begin() + 3));
  CHECK(f.endpoint(1).irecv(0, 1).wait().bytes.size() == 10);
  CHECK(f.endpoint(1).irecv(0, 2).wait().bytes.size() == 2);
  CHECK(a.stats().truncated == 1);
}

TEST_CASE("fault_injecting: delay") {
  inproc_fabric f(2);
  fault_injecting<inproc_endpoint> a(f.endpoint(0), fault_plan{}.delay(faults::sends_to(1), 30ms, 1));
  const auto t0 = clk::now();
  a.isend(1, 0, pattern(4));
  CHECK(clk::now() - t0 >= 30ms);
  CHECK(f.endpoint(1).irecv(0, 0).wait().bytes == pattern(4));
  CHECK(a.stats().delayed == 1);
  CHECK_THROWS_AS(fault_plan{}.delay(faults::every_send(), -1ms), gradcomp::invalid_argument_error);
}

TEST_CASE("fault_injecting: kill after k sends") {
  inproc_fabric f(3, {.recv_timeout = 30s});
  fault_injecting<inproc_endpoint> a(f.endpoint(0), fault_plan{}.kill_after_sends(2));
  a.isend(1, 0, pattern(4));
  CHECK_FALSE(a.killed());
  a.isend(2, 0, pattern(4));
  CHECK(a.killed());
  CHECK(f.closed(0));  // the inproc rank is closed too
  CHECK_THROWS_AS(a.isend(1, 0, pattern(4)), gradcomp::transport_error);
  CHECK_THROWS_AS(a.irecv(1, 0), gradcomp::transport_error);
  // Peers: what was sent before the death arrives; then errors, not hangs.
  CHECK(f.endpoint(1).irecv(0, 0).wait().bytes == pattern(4));
  const auto t0 = clk::now();
  CHECK_THROWS_AS(f.endpoint(1).irecv(0, 0).wait(), gradcomp::transport_error);
  CHECK(clk::now() - t0 < 20s);
  CHECK_THROWS_AS(f.endpoint(2).isend(0, 0, pattern(1)), gradcomp::transport_error);

  fault_injecting<inproc_endpoint> dead(f.endpoint(1), fault_plan{}.kill_after_sends(0));
  CHECK(dead.killed());
  CHECK(f.closed(1));
}

TEST_CASE("fault_injecting: rules apply in order, a drop ends the chain") {
  inproc_fabric f(2);
  fault_plan plan;
  plan.truncate(faults::every_send(), 2).flip_bits(faults::every_send(), {0}).drop(faults::nth_send(1));
  fault_injecting<inproc_endpoint> a(f.endpoint(0), plan);
  a.isend(1, 0, pattern(5));
  a.isend(1, 0, pattern(5));
  a.isend(1, 0, pattern(5));
  const auto full = pattern(5);
  auto expected = std::vector<std::byte>(full.begin(), full.begin() + 2);
  expected[0] ^= std::byte{1};
  CHECK(f.endpoint(1).irecv(0, 0).wait().bytes == expected);
  CHECK(f.endpoint(1).irecv(0, 0).wait().bytes == expected);
  CHECK(a.stats().dropped == 1);
  CHECK(a.stats().truncated == 3);
  CHECK(a.stats().corrupted == 3);
}

TEST_CASE("fault_injecting over emulated_link: a dropped message does not shift delivery times") {
  inproc_fabric f(2);
  emulated_network net(2, {.bits_per_second = 1e9, .latency = 1ms});
  emulated_link<inproc_endpoint> la(f.endpoint(0), net), lb(f.endpoint(1), net);
  fault_injecting<emulated_link<inproc_endpoint>> a(la, fault_plan{}.drop(faults::nth_send(0)));
  a.isend(1, 0, pattern(100, 1));
  a.isend(1, 0, pattern(100, 2));
  CHECK(lb.irecv(0, 0).wait().bytes == pattern(100, 2));
  CHECK(net.bytes_sent(0) == 100);  // the dropped one never reached the wire
}

TEST_CASE("emulated_link: a dropped handle whose message arrived keeps later delivery times right") {
  inproc_fabric f(2);
  emulated_network net(2, {.bits_per_second = 1e9, .latency = 300ms});
  emulated_link<inproc_endpoint> a(f.endpoint(0), net), b(f.endpoint(1), net);
  {
    auto h = b.irecv(0, 0);
    a.isend(1, 0, pattern(1, 1));  // matched to h, which is dropped unread
  }
  const auto t0 = clk::now();
  a.isend(1, 0, pattern(2'000'000, 2));  // 16 ms on the link
  auto moved = b.irecv(0, 0);
  auto h2 = std::move(moved);
  CHECK(h2.wait().bytes == pattern(2'000'000, 2));
  CHECK(clk::now() - t0 >= 316ms);  // its own delivery time, not the dropped message's
}
