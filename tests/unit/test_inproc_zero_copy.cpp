// transport/inproc.hpp, the zero-copy face (inproc_zero_copy: isend_view,
// irecv_into): delivery whichever side comes first, mixing with moved
// vectors, size mismatches, deadlines, closed peers, dropped handles; and
// ring_allreduce over inproc (the wavefront ring it takes through that face)
// bit for bit equal to the moving ring and to the MPI-style zero-copy ring.
// Runs under TSan in CI (the name matches the tsan stage's pattern).
#include <doctest/doctest.h>

#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/inproc.hpp>

#include "support/equality.hpp"

#include <chrono>
#include <cstddef>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using gradcomp::any_source;
using gradcomp::message;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::inproc_fabric;
using gradcomp::transport::inproc_zero_copy;
using gradcomp::transport::run_workers;

static_assert(gradcomp::ZeroCopyTransport<inproc_zero_copy>);
static_assert(gradcomp::ZeroCopyCapableTransport<inproc_endpoint>);
static_assert(!gradcomp::ZeroCopyTransport<inproc_endpoint>);
static_assert(!gradcomp::BatchWaitTransport<inproc_zero_copy>);  // waited one handle at a time (MPI has wait_all)
static_assert(gradcomp::SendHandle<inproc_zero_copy::view_send_handle>);
static_assert(gradcomp::RecvIntoHandle<inproc_zero_copy::recv_into_handle>);

namespace {

std::vector<std::byte> pattern(std::size_t n, int seed) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = std::byte(static_cast<unsigned char>((i * 31 + std::size_t(seed) * 7) & 0xFF));
  return b;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("inproc zero-copy: a view sent before the receive is copied by irecv_into") {
  inproc_fabric f(2);
  auto a = f.endpoint(0).zero_copy(), b = f.endpoint(1).zero_copy();
  CHECK(a.rank() == 0);
  CHECK(b.size() == 2);
  CHECK(&a.endpoint() == &f.endpoint(0));
  const auto out = pattern(1000, 1);
  auto s = a.isend_view(1, 7, out);
  CHECK_FALSE(s.test());  // nobody has read it yet
  std::vector<std::byte> in(1200, std::byte{0});
  auto r = b.irecv_into(0, 7, in);
  CHECK(r.test());
  CHECK(s.test());  // the receive copied it at once
  CHECK(r.wait() == 1000);
  s.wait();
  CHECK(std::memcmp(in.data(), out.data(), 1000) == 0);
  CHECK(in[1000] == std::byte{0});  // the rest of the buffer untouched
  CHECK(f.endpoint(0).bytes_sent() == 1000);
  CHECK(f.endpoint(0).messages_sent() == 1);
  CHECK(f.endpoint(1).bytes_received() == 1000);
  CHECK(f.endpoint(1).messages_received() == 1);
  CHECK_FALSE(r.valid());
  CHECK_THROWS_AS(r.wait(), gradcomp::state_error);
}

TEST_CASE("inproc zero-copy: a receive posted first is filled by isend_view, which completes at once") {
  inproc_fabric f(2);
  auto a = f.endpoint(0).zero_copy(), b = f.endpoint(1).zero_copy();
  std::vector<std::byte> in(64);
  auto r = b.irecv_into(0, 3, in);
  CHECK_FALSE(r.test());
  const auto out = pattern(64, 2);
  auto s = a.isend_view(1, 3, out);
  CHECK(s.test());
  s.wait();
  CHECK(r.wait() == 64);
  CHECK(in == out);
  // An empty view is a message too.
  auto r0 = b.irecv_into(0, 4, std::span<std::byte>{});
  a.isend_view(1, 4, std::span<const std::byte>{}).wait();
  CHECK(r0.wait() == 0);
}

TEST_CASE("inproc zero-copy: views and moved vectors share one matching order") {
  inproc_fabric f(2);
  auto a = f.endpoint(0).zero_copy(), b = f.endpoint(1).zero_copy();
  const auto v1 = pattern(10, 1), v3 = pattern(30, 3);
  auto s1 = a.isend_view(1, 9, v1);          // a view ...
  a.isend(1, 9, pattern(20, 2));             // ... a moved vector ...
  auto s3 = a.isend_view(1, 9, v3);          // ... a view, same source and tag
  message m1 = b.irecv(0, 9).wait();         // a plain receive gets a copy of the view
  CHECK(m1.bytes == v1);
  CHECK(s1.test());
  std::vector<std::byte> in2(25), in3(30);
  auto r2 = b.irecv_into(0, 9, in2);         // irecv_into takes the moved vector
  auto r3 = b.irecv_into(0, 9, in3);
  CHECK(r2.wait() == 20);
  CHECK(std::memcmp(in2.data(), pattern(20, 2).data(), 20) == 0);
  CHECK(r3.wait() == 30);
  CHECK(in3 == v3);
  s3.wait();
  // any_source, and a moved vector into a posted irecv_into (the sender copies).
  std::vector<std::byte> in4(5);
  auto r4 = b.irecv_into(any_source, 10, in4);
  a.isend(1, 10, pattern(5, 4));
  CHECK(r4.wait() == 5);
  CHECK(in4 == pattern(5, 4));
  // A view into a posted plain receive.
  auto r5 = b.irecv(0, 11);
  const auto v5 = pattern(7, 5);
  a.isend_view(1, 11, v5).wait();
  CHECK(r5.wait().bytes == v5);
}

TEST_CASE("inproc zero-copy: a message longer than the buffer is an error; a shorter one fits") {
  inproc_fabric f(2);
  auto a = f.endpoint(0).zero_copy(), b = f.endpoint(1).zero_copy();
  std::vector<std::byte> small(8, std::byte{0x5A});
  const auto big = pattern(12, 1);
  for (bool receive_first : {false, true}) {
    CAPTURE(receive_first);
    std::optional<inproc_zero_copy::recv_into_handle> r;
    if (receive_first) r.emplace(b.irecv_into(0, 1, small));
    auto s = a.isend_view(1, 1, big);
    if (!receive_first) r.emplace(b.irecv_into(0, 1, small));
    s.wait();  // the message was consumed: the sender is done
    try {
      r->wait();
      FAIL("a longer message was accepted");
    } catch (const gradcomp::transport_error& e) {
      CHECK(contains(e.what(), "expected at most 8 bytes"));
      CHECK(contains(e.what(), "got 12"));
    }
    CHECK(small == std::vector<std::byte>(8, std::byte{0x5A}));  // never truncated into the buffer
  }
  // A moved vector longer than the buffer, too.
  auto r = b.irecv_into(0, 2, small);
  a.isend(1, 2, pattern(9, 0));
  CHECK_THROWS_AS(r.wait(), gradcomp::transport_error);
  // Shorter is fine: wait() says how much came.
  auto r2 = b.irecv_into(0, 3, small);
  a.isend_view(1, 3, std::span<const std::byte>(big).first(5)).wait();
  CHECK(r2.wait() == 5);
  CHECK(std::memcmp(small.data(), big.data(), 5) == 0);
}

TEST_CASE("inproc zero-copy: deadlines expire on both sides, and an expired view is withdrawn") {
  inproc_fabric f(2, {.recv_timeout = 50ms});
  auto a = f.endpoint(0).zero_copy(), b = f.endpoint(1).zero_copy();
  std::vector<std::byte> in(16);
  {
    auto r = b.irecv_into(0, 5, in);
    CHECK_FALSE(r.wait_for(1ms).has_value());  // still posted
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(r.wait(), gradcomp::timeout_error);
    CHECK(std::chrono::steady_clock::now() - t0 >= 40ms);
  }
  const auto out = pattern(16, 1);
  auto s = a.isend_view(1, 6, out);
  try {
    s.wait();
    FAIL("a view nobody received completed");
  } catch (const gradcomp::timeout_error& e) {
    CHECK(contains(e.what(), "was not received"));
  }
  CHECK(s.test());  // done with (the error was reported)
  // The view is gone: a receive posted now sees the next message instead.
  const auto next = pattern(16, 2);
  a.isend(1, 6, std::vector<std::byte>(next));
  auto r = b.irecv_into(0, 6, in);
  CHECK(r.wait() == 16);
  CHECK(in == next);
  // wait_for of a receive that gets its message in time.
  auto r2 = b.irecv_into(0, 8, in);
  a.isend_view(1, 8, out).wait();
  auto got = r2.wait_for(1s);
  REQUIRE(got.has_value());
  CHECK(*got == 16);
}

TEST_CASE("inproc zero-copy: a dead peer is an error, never a hang") {
  inproc_fabric f(3);
  auto a = f.endpoint(0).zero_copy(), c = f.endpoint(2).zero_copy();
  const auto out = pattern(32, 1);
  std::vector<std::byte> in(32);
  // A view waiting for a receiver that dies.
  auto s = a.isend_view(1, 1, out);
  auto r = a.irecv_into(1, 2, in);
  std::thread killer([&] {
    std::this_thread::sleep_for(20ms);
    f.close(1);
  });
  try {
    s.wait();
    FAIL("a view to a closed rank completed");
  } catch (const gradcomp::transport_error& e) {
    CHECK(contains(e.what(), "rank 1 is closed"));
  }
  CHECK_THROWS_AS(r.wait(), gradcomp::transport_error);  // a receive from it fails too
  killer.join();
  // Sending to a closed rank fails at once; so does receiving from one.
  CHECK_THROWS_AS(a.isend_view(1, 3, out), gradcomp::transport_error);
  CHECK_THROWS_AS(c.irecv_into(1, 3, in).wait(), gradcomp::transport_error);
  // A closed rank cannot send views.
  f.close(2);
  CHECK_THROWS_AS(c.isend_view(0, 3, out), gradcomp::transport_error);
  // Bad arguments.
  CHECK_THROWS_AS(a.isend_view(3, 0, out), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(a.isend_view(0, -1, out), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(a.irecv_into(-2, 0, in), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(a.irecv_into(0, -1, in), gradcomp::invalid_argument_error);
}

TEST_CASE("inproc zero-copy: dropped handles withdraw a view and cancel a receive") {
  inproc_fabric f(2, {.recv_timeout = 2s});
  auto a = f.endpoint(0).zero_copy(), b = f.endpoint(1).zero_copy();
  std::vector<std::byte> in(4, std::byte{0});
  {
    auto out = pattern(4, 1);
    auto dropped = a.isend_view(1, 1, out);
  }  // withdrawn: its memory may go
  a.isend(1, 1, pattern(4, 2));
  auto r = b.irecv_into(0, 1, in);
  CHECK(r.wait() == 4);
  CHECK(in == pattern(4, 2));
  {
    auto dropped = b.irecv_into(0, 2, in);
  }  // cancelled: the next message goes to the next receive
  std::fill(in.begin(), in.end(), std::byte{0});
  const auto out = pattern(4, 3);
  auto s = a.isend_view(1, 2, out);
  CHECK_FALSE(s.test());
  CHECK(in == std::vector<std::byte>(4, std::byte{0}));  // the cancelled buffer was not written
  std::vector<std::byte> in2(4);
  auto r2 = b.irecv_into(0, 2, in2);
  CHECK(r2.wait() == 4);
  CHECK(in2 == out);
  s.wait();
  // Moving handles keeps them working; a moved-into handle drops its old one.
  auto m1 = b.irecv_into(0, 5, in2);
  auto m2 = std::move(m1);
  CHECK_FALSE(m1.valid());
  a.isend_view(1, 5, out).wait();
  CHECK(m2.wait() == 4);
}

TEST_CASE("inproc zero-copy: many views between threads, both orders, contents intact") {
  const int n = 4, rounds = 300;
  run_workers(n, [&](inproc_endpoint& ep) {
    auto z = ep.zero_copy();
    const int next = (z.rank() + 1) % n, prev = (z.rank() + n - 1) % n;
    std::mt19937 gen(static_cast<unsigned>(z.rank()));
    for (int i = 0; i < rounds; ++i) {
      const std::size_t len = 1 + (std::size_t(i) * 977) % 5000;
      const auto out = pattern(len, z.rank() * 1000 + i);
      std::vector<std::byte> in(5000);
      // Alternate who comes first, and sometimes yield to shuffle the interleaving.
      std::optional<inproc_zero_copy::recv_into_handle> r;
      if (i % 2 == 0) r.emplace(z.irecv_into(prev, 1, in));
      if (gen() % 3 == 0) std::this_thread::yield();
      auto s = z.isend_view(next, 1, out);
      if (i % 2 == 1) r.emplace(z.irecv_into(prev, 1, in));
      REQUIRE(r->wait() == len);
      s.wait();
      REQUIRE(std::memcmp(in.data(), pattern(len, prev * 1000 + i).data(), len) == 0);
    }
  });
}

// ---------------------------------------------------------------------------
// ring_allreduce over inproc takes the wavefront zero-copy ring: the same
// bits as the moving ring and as the MPI-style zero-copy ring.

namespace {

// Hides zero_copy(): the moving ring, as before the zero-copy face existed.
struct moving_only {
  inproc_endpoint* ep;
  int rank() const { return ep->rank(); }
  int size() const { return ep->size(); }
  auto isend(int d, int tag, std::vector<std::byte>&& b) { return ep->isend(d, tag, std::move(b)); }
  auto irecv(int s, int tag) { return ep->irecv(s, tag); }
};
static_assert(!gradcomp::ZeroCopyCapableTransport<moving_only>);

enum class path { moving, zero_copy, wavefront };

void run(path p, int n, std::vector<std::vector<float>>& data, gradcomp::ring_options opts = {}) {
  run_workers(n, [&](inproc_endpoint& ep) {
    auto& mine = data[std::size_t(ep.rank())];
    if (p == path::moving) {
      moving_only t{&ep};
      gradcomp::ring_allreduce(gradcomp::execution::seq{}, t, mine, opts);
    } else if (p == path::zero_copy) {
      auto face = ep.zero_copy();  // a ZeroCopyTransport itself: the MPI path
      gradcomp::ring_allreduce(gradcomp::execution::seq{}, face, mine, opts);
    } else {
      gradcomp::ring_allreduce(gradcomp::execution::seq{}, ep, mine, opts);
    }
  });
}

}  // namespace

TEST_CASE("ring_allreduce over inproc: multi-chunk segments, bit for bit the moving ring's result") {
  const std::size_t chunk = gradcomp::detail::ring_zero_copy_chunk;
  for (int n : {2, 3, 4, 5}) {
    // Segments of several chunks, segments whose chunk counts differ by one,
    // a tail chunk of one float, one chunk per segment, and empty segments.
    for (std::size_t len : {std::size_t(n) * chunk * 3 + 7, std::size_t(n) * chunk + 3, std::size_t(n) * chunk * 2 + 1,
                            std::size_t(n) * 100 + 1, std::size_t(n) - 1}) {
      CAPTURE(n);
      CAPTURE(len);
      std::mt19937 gen(static_cast<unsigned>(n * 31 + int(len % 1000)));
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<std::vector<float>> in(static_cast<std::size_t>(n), std::vector<float>(len));
      for (auto& v : in)
        for (auto& x : v) x = dist(gen) * 1000.0f;  // rounding depends on the order of additions
      for (bool average : {false, true}) {
        CAPTURE(average);
        auto moving = in, zero = in, wave = in;
        run(path::moving, n, moving, {.average = average});
        run(path::zero_copy, n, zero, {.average = average});
        run(path::wavefront, n, wave, {.average = average});
        for (int r = 0; r < n; ++r) {
          CHECK(gradcomp::test_support::bit_equal(wave[std::size_t(r)], moving[std::size_t(r)]));
          CHECK(gradcomp::test_support::bit_equal(zero[std::size_t(r)], moving[std::size_t(r)]));
        }
      }
    }
  }
}

TEST_CASE("ring_allreduce over inproc: the wavefront ring's message order") {
  // Ticks s + c, then steps: (0,0) | (0,1) (1,0) | (0,2) (1,1) (2,0) | (1,2) (2,1) | (2,2)
  auto order = gradcomp::detail::ring_wave_order(3, [](int) { return std::size_t{3}; });
  const std::vector<std::pair<int, std::size_t>> want{{0, 0}, {0, 1}, {1, 0}, {0, 2}, {1, 1},
                                                      {2, 0}, {1, 2}, {2, 1}, {2, 2}};
  REQUIRE(order.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CHECK(order[i].step == want[i].first);
    CHECK(order[i].chunk == want[i].second);
  }
  // Steps with different chunk counts: every message once.
  auto uneven = gradcomp::detail::ring_wave_order(2, [](int s) { return std::size_t(s == 0 ? 1 : 3); });
  CHECK(uneven.size() == 4);
}

TEST_CASE("ring_allreduce over inproc: a peer that dies mid-way is an error, not a hang") {
  const std::size_t len = 4 * gradcomp::detail::ring_zero_copy_chunk * 2;
  for (int dead : {0, 2}) {
    CAPTURE(dead);
    const auto t0 = std::chrono::steady_clock::now();
    bool threw = false;
    try {
      run_workers(
          4,
          [&](inproc_endpoint& ep) {
            std::vector<float> v(len, 1.0f);
            if (ep.rank() == dead) {
              // Takes part in the first messages, then fails.
              auto z = ep.zero_copy();
              auto s = z.isend_view((dead + 1) % 4, gradcomp::ring_options{}.tag_base,
                                    std::as_bytes(std::span<const float>(v).first(gradcomp::detail::ring_zero_copy_chunk)));
              std::this_thread::sleep_for(10ms);
              throw std::runtime_error("worker died");
            }
            gradcomp::ring_allreduce(ep, v);
          },
          {.recv_timeout = 60s});
    } catch (const std::exception&) {
      threw = true;
    }
    CHECK(threw);
    CHECK(std::chrono::steady_clock::now() - t0 < 30s);
  }
}
