// ring_allreduce.hpp: exact sums, bit-identical results, every N and length,
// averaging, policy dispatch, mismatched lengths and dead peers. Runs under TSan in CI.
#include <doctest/doctest.h>

#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/emulated_link.hpp>
#include <gradcomp/transport/fault_injection.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <support/equality.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <stdexcept>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using gradcomp::ring_allreduce;
using gradcomp::ring_options;
using gradcomp::ring_schedule;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::inproc_fabric;
using gradcomp::transport::run_workers;

namespace ring_test_policy {
// A test-only policy: derives from seq and intercepts add_into, counting calls.
struct counting : gradcomp::execution::seq {};
inline std::atomic<int> add_calls{0};
inline void add_into(counting, std::span<float> acc, std::span<const float> x) noexcept {
  add_calls.fetch_add(1);
  gradcomp::execution::add_into(gradcomp::execution::seq{}, acc, x);
}
}  // namespace ring_test_policy

static_assert(gradcomp::ExecutionPolicy<ring_test_policy::counting>);

namespace {

// A ZeroCopyTransport over inproc for testing the ring's zero-copy path
// (the one MPI takes). It enforces the contract adversarially: a receive
// buffer is filled with garbage when posted (reading it before wait() gives
// wrong sums), and a send buffer is checked unchanged when the send is waited.
class zero_copy_adapter {
 public:
  explicit zero_copy_adapter(inproc_endpoint& ep) : ep_(&ep) {}
  int rank() const { return ep_->rank(); }
  int size() const { return ep_->size(); }
  auto isend(int dest, int tag, std::vector<std::byte>&& bytes) {
    ++moving_calls;
    return ep_->isend(dest, tag, std::move(bytes));
  }
  auto irecv(int source, int tag) {
    ++moving_calls;
    return ep_->irecv(source, tag);
  }

  struct view_send {
    std::span<const std::byte> view;
    std::vector<std::byte> snapshot;
    void wait() {
      if (!view.empty() && std::memcmp(view.data(), snapshot.data(), view.size()) != 0)
        throw std::logic_error("isend_view: buffer changed before its send completed");
    }
    bool test() { return true; }
  };
  view_send isend_view(int dest, int tag, std::span<const std::byte> out) {
    ++view_calls;
    std::vector<std::byte> copy(out.begin(), out.end());
    ep_->isend(dest, tag, std::vector<std::byte>(copy));
    return view_send{out, std::move(copy)};
  }

  struct into_recv {
    inproc_endpoint::recv_handle inner;
    std::span<std::byte> into;
    std::size_t wait() {
      gradcomp::message m = inner.wait();
      if (m.bytes.size() > into.size()) throw gradcomp::transport_error("irecv_into: message longer than buffer");
      if (!m.bytes.empty()) std::memcpy(into.data(), m.bytes.data(), m.bytes.size());
      return m.bytes.size();
    }
    bool test() { return inner.test(); }
  };
  into_recv irecv_into(int source, int tag, std::span<std::byte> in) {
    ++view_calls;
    for (auto& b : in) b = std::byte{0xFF};  // NaN patterns until the message lands
    return into_recv{ep_->irecv(source, tag), in};
  }

  int moving_calls = 0, view_calls = 0;

 private:
  inproc_endpoint* ep_;
};

static_assert(gradcomp::ZeroCopyTransport<zero_copy_adapter>);
static_assert(!gradcomp::ZeroCopyTransport<inproc_endpoint>);

// Runs ring_allreduce on n workers, over the moving path or the zero-copy one.
void run_ring(int n, std::vector<std::vector<float>>& data, bool zero_copy, ring_options opts = {}) {
  run_workers(n, [&](inproc_endpoint& ep) {
    auto& mine = data[std::size_t(ep.rank())];
    if (zero_copy) {
      zero_copy_adapter t(ep);
      ring_allreduce(t, mine, opts);
      CHECK(t.moving_calls == 0);
      if (n > 1) CHECK(t.view_calls == 4 * (n - 1));
    } else {
      ring_allreduce(ep, mine, opts);
    }
  });
}

// Inputs: rank r, element i. Integer-valued so any summation order is exact.
float int_input(int r, std::size_t i) { return static_cast<float>(static_cast<int>((i * 7 + std::size_t(r) * 13) % 101) - 50); }

std::vector<std::vector<float>> random_inputs(int n, std::size_t len, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> v(static_cast<std::size_t>(n), std::vector<float>(len));
  for (auto& x : v)
    for (auto& y : x) y = dist(gen) * 1000.0f;  // wide spread of exponents: rounding differs by order
  return v;
}

using gradcomp::test_support::bit_equal;

const std::vector<std::size_t>& lengths_for(int n) {
  static std::vector<std::size_t> out;
  std::set<std::size_t> s{0, 1, std::size_t(n - 1), std::size_t(n + 1), 1000, 1001, 7, 33, std::size_t(3 * n + 2)};
  out.assign(s.begin(), s.end());
  return out;
}

// Calls fn(zero_copy, n, len) over both ring paths, N = 1..8 and every length
// of lengths_for(N), with the three captured for failure messages.
template <class Fn>
void for_each_ring_case(Fn fn) {
  for (bool zero_copy : {false, true})
    for (int n = 1; n <= 8; ++n)
      for (std::size_t len : lengths_for(n)) {
        CAPTURE(n);
        CAPTURE(zero_copy);
        CAPTURE(len);
        fn(zero_copy, n, len);
      }
}

}  // namespace

TEST_CASE("ring_schedule: segments cover the vector, sizes differ by at most one") {
  for (int n = 1; n <= 9; ++n)
    for (std::size_t len : {0u, 1u, 5u, 8u, 9u, 100u, 1001u}) {
      ring_schedule s(0, n, len);
      std::size_t at = 0, lo = len, hi = 0;
      for (int j = 0; j < n; ++j) {
        CHECK(s.begin(j) == at);
        at = s.end(j);
        lo = std::min(lo, s.size(j));
        hi = std::max(hi, s.size(j));
      }
      CHECK(at == len);
      CHECK(hi - lo <= 1);
    }
}

TEST_CASE("ring_schedule: the steps chain into Algorithm 1 of seed 002") {
  for (int n = 1; n <= 8; ++n)
    for (int r = 0; r < n; ++r) {
      ring_schedule me(r, n, 100), pred(r == 0 ? n - 1 : r - 1, n, 100);
      CHECK(me.prev() == pred.rank());
      CHECK(me.steps() == n - 1);
      CHECK(me.reduce_scatter_send(0) == r);  // line 3: node n starts with segment n
      for (int s = 0; s < me.steps(); ++s) {
        CHECK(me.reduce_scatter_recv(s) == pred.reduce_scatter_send(s));  // what the predecessor sends
        CHECK(me.all_gather_recv(s) == pred.all_gather_send(s));
        if (s + 1 < me.steps()) {
          CHECK(me.reduce_scatter_send(s + 1) == me.reduce_scatter_recv(s));  // forwarded next step
          CHECK(me.all_gather_send(s + 1) == me.all_gather_recv(s));
        }
      }
      if (n > 1) CHECK(me.reduce_scatter_recv(n - 2) == me.owned_segment());
      CHECK(me.owned_segment() == (r + 1) % n);  // line 9
      CHECK(me.all_gather_send(0) == me.owned_segment());
    }
  CHECK_THROWS_AS(ring_schedule(0, 0, 10), gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(ring_schedule(3, 3, 10), gradcomp::invalid_argument_error);
}

TEST_CASE("ring_allreduce: exact sums of integer-valued floats, N = 1..8, many lengths") {
  for_each_ring_case([](bool zero_copy, int n, std::size_t len) {
    std::vector<std::vector<float>> data(static_cast<std::size_t>(n), std::vector<float>(len));
    std::vector<float> expected(len, 0.0f);
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < len; ++i) {
        data[std::size_t(r)][i] = int_input(r, i);
        expected[i] += int_input(r, i);
      }
    run_ring(n, data, zero_copy);
    for (int r = 0; r < n; ++r) CHECK(data[std::size_t(r)] == expected);
  });
}

TEST_CASE("ring_allreduce: random floats end bit-identical on every rank") {
  for_each_ring_case([](bool zero_copy, int n, std::size_t len) {
    auto data = random_inputs(n, len, static_cast<std::uint32_t>(n * 1000 + len));
    std::vector<double> reference(len, 0.0);
    for (auto& v : data)
      for (std::size_t i = 0; i < len; ++i) reference[i] += v[i];
    run_ring(n, data, zero_copy);
    for (int r = 1; r < n; ++r) CHECK(bit_equal(data[std::size_t(r)], data[0]));
    for (std::size_t i = 0; i < len; ++i) CHECK(data[0][i] == doctest::Approx(reference[i]).epsilon(1e-4));
  });
}

TEST_CASE("ring_allreduce: average divides by N, identically on every rank") {
  for (bool zero_copy : {false, true})
  for (int n : {1, 2, 3, 5}) {
    CAPTURE(n);
      CAPTURE(zero_copy);
    const std::size_t len = 101;
    std::vector<std::vector<float>> data(static_cast<std::size_t>(n), std::vector<float>(len));
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < len; ++i) data[std::size_t(r)][i] = float(r + 1) * float(i);
    run_ring(n, data, zero_copy, {.average = true});
    const float mean_factor = float(n * (n + 1) / 2) / float(n);
    for (int r = 0; r < n; ++r) {
      CHECK(bit_equal(data[std::size_t(r)], data[0]));
      for (std::size_t i = 0; i < len; ++i) CHECK(data[std::size_t(r)][i] == doctest::Approx(mean_factor * float(i)));
    }
  }
}

TEST_CASE("ring_allreduce: the policy overload dispatches add_into to the policy") {
  for (int n : {1, 2, 4, 7}) {
    CAPTURE(n);
    ring_test_policy::add_calls = 0;
    std::vector<std::vector<float>> data(static_cast<std::size_t>(n), std::vector<float>(50, 1.0f));
    run_workers(n, [&](inproc_endpoint& ep) {
      ring_allreduce(ring_test_policy::counting{}, ep, data[std::size_t(ep.rank())]);
    });
    // N-1 additions per rank in the reduce-scatter.
    CHECK(ring_test_policy::add_calls.load() == n * (n - 1));
    for (auto& v : data)
      for (float x : v) CHECK(x == float(n));
  }
}

TEST_CASE("ring_allreduce: several collectives share a transport through tag bases") {
  const int n = 4;
  std::vector<std::vector<float>> a(n, std::vector<float>(37, 1.0f)), b(n, std::vector<float>(11, 2.0f));
  run_workers(n, [&](inproc_endpoint& ep) {
    const auto r = std::size_t(ep.rank());
    // Two collectives at once on one (thread-safe) endpoint: disjoint tags keep them apart.
    std::thread other([&] { ring_allreduce(ep, b[r], {.tag_base = 200}); });
    ring_allreduce(ep, a[r], {.tag_base = 100});
    other.join();
    ring_allreduce(ep, a[r]);  // default tags, afterwards
  });
  for (int r = 0; r < n; ++r) {
    for (float x : a[std::size_t(r)]) CHECK(x == 16.0f);
    for (float x : b[std::size_t(r)]) CHECK(x == 8.0f);
  }
  inproc_fabric f(2);
  std::vector<float> v(3);
  CHECK_THROWS_AS(ring_allreduce(f.endpoint(0), v, {.tag_base = -1}), gradcomp::invalid_argument_error);
}

TEST_CASE("ring_allreduce: tags come from the registry; a tag_base in another piece's range is refused") {
  // The default is the first tag of the ring's range (tags.hpp), unchanged.
  CHECK(ring_options{}.tag_base == gradcomp::tags::ring.first);
  CHECK(ring_options{}.tag_base == 32000);
  CHECK(gradcomp::ring_default_tag_base == 32000);
  inproc_fabric f(2);
  std::vector<float> v(3, 1.0f);
  auto refused = [&](ring_options o, const char* names) {
    CAPTURE(o.tag_base);
    try {
      ring_allreduce(f.endpoint(0), v, o);
      FAIL("a colliding tag_base was accepted");
    } catch (const gradcomp::invalid_argument_error& e) {
      CHECK(std::string(e.what()).find("ring_allreduce") != std::string::npos);
      CHECK(std::string(e.what()).find(names) != std::string::npos);
    }
  };
  refused({.tag_base = 31000}, "parameter servers");  // the parameter servers' [31000, 31016)
  refused({.tag_base = 30999}, "parameter servers");  // its second tag, 31000, collides
  refused({.tag_base = 30000}, "LGC");                // LGC's [30000, 30032)
  refused({.tag_base = 16384}, "model exchange");     // the whole-model exchange's buckets
  refused({.tag_base = 16383}, "model exchange");     // user range, but tag_base + 1 is not
  refused({.tag_base = 32767}, "32767");              // tag_base + 1 leaves what every MPI accepts
  refused({.tag_base = -1}, "tag_base");
  CHECK(f.endpoint(0).messages_sent() == 0);           // refused before any message
  CHECK(f.endpoint(1).messages_received() == 0);

  // Accepted: the user range, anywhere inside the ring's own range, and a
  // protocol's own range when it names it as tag_owner.
  std::vector<std::vector<float>> x(2, std::vector<float>(5, 1.0f));
  run_workers(2, [&](inproc_endpoint& ep) {
    auto& mine = x[std::size_t(ep.rank())];
    ring_allreduce(ep, mine, {.tag_base = 16382});
    ring_allreduce(ep, mine, {.tag_base = 32062});
    ring_allreduce(ep, mine, {.tag_base = 30004, .tag_owner = gradcomp::tags::lgc});
  });
  for (const auto& r : x)
    for (float e : r) CHECK(e == 8.0f);
  // Naming another owner does not open a third piece's range.
  refused({.tag_base = 31000, .tag_owner = gradcomp::tags::lgc}, "parameter servers");
}

TEST_CASE("ring_allreduce: ranks disagreeing on the length get transport_error, not a hang") {
  for (bool zero_copy : {false, true})
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    CAPTURE(zero_copy);
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      run_workers(
          n,
          [&](inproc_endpoint& ep) {
            std::vector<float> v(ep.rank() == 1 ? 10 : 12, 1.0f);
            if (zero_copy) {
              zero_copy_adapter t(ep);
              ring_allreduce(t, v);
            } else {
              ring_allreduce(ep, v);
            }
          },
          {.recv_timeout = 60s});
    } catch (const gradcomp::transport_error& e) {
      what = e.what();
    }
    CAPTURE(what);
    if (zero_copy) {  // a longer message is the transport's error, a shorter one the ring's
      CHECK(!what.empty());
    } else {
      CHECK(what.find("expected") != std::string::npos);
      CHECK(what.find("got") != std::string::npos);
    }
    CHECK(std::chrono::steady_clock::now() - t0 < 30s);  // failed fast, not at the timeout
  }
}

TEST_CASE("ring_allreduce: a killed peer is an error, not a hang") {
  using gradcomp::transport::fault_injecting;
  using gradcomp::transport::fault_plan;
  for (std::uint64_t k : {0u, 1u, 2u, 4u}) {
    CAPTURE(k);
    const auto t0 = std::chrono::steady_clock::now();
    bool threw = false;
    try {
      run_workers(
          4,
          [&](inproc_endpoint& ep) {
            fault_plan plan;
            if (ep.rank() == 2) plan.kill_after_sends(k);
            fault_injecting<inproc_endpoint> t(ep, plan);
            std::vector<float> v(1000, 1.0f);
            ring_allreduce(t, v);
          },
          {.recv_timeout = 60s});
    } catch (const gradcomp::transport_error&) {
      threw = true;
    }
    CHECK(threw);
    CHECK(std::chrono::steady_clock::now() - t0 < 30s);
  }
}

TEST_CASE("ring_allreduce: a dropped message ends in a timeout error") {
  using gradcomp::transport::fault_injecting;
  using gradcomp::transport::fault_plan;
  namespace faults = gradcomp::transport::faults;
  CHECK_THROWS_AS(run_workers(
                      3,
                      [&](inproc_endpoint& ep) {
                        fault_plan plan;
                        if (ep.rank() == 0) plan.drop(faults::nth_send(1));
                        fault_injecting<inproc_endpoint> t(ep, plan);
                        std::vector<float> v(30, 1.0f);
                        ring_allreduce(t, v);
                      },
                      {.recv_timeout = 200ms}),
                  gradcomp::timeout_error);
}

TEST_CASE("ring_allreduce: a truncated segment is reported as a length mismatch") {
  using gradcomp::transport::fault_injecting;
  using gradcomp::transport::fault_plan;
  namespace faults = gradcomp::transport::faults;
  try {
    run_workers(3, [&](inproc_endpoint& ep) {
      fault_plan plan;
      if (ep.rank() == 1) plan.truncate(faults::nth_send(2), 6);
      fault_injecting<inproc_endpoint> t(ep, plan);
      std::vector<float> v(30, 1.0f);
      ring_allreduce(t, v);
    });
    FAIL("no error");
  } catch (const gradcomp::transport_error& e) {
    CHECK(std::string(e.what()).find("got 6") != std::string::npos);
  }
}

TEST_CASE("ring_allreduce: over an emulated link the result is the same") {
  using gradcomp::transport::emulated_link;
  using gradcomp::transport::emulated_network;
  const int n = 3;
  const std::size_t len = 1000;
  std::vector<std::vector<float>> data(n, std::vector<float>(len));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < len; ++i) data[std::size_t(r)][i] = int_input(r, i);
  emulated_network net(n, {.bits_per_second = 1e9, .latency = 10us});
  run_workers(n, [&](inproc_endpoint& ep) {
    emulated_link<inproc_endpoint> link(ep, net);
    ring_allreduce(link, data[std::size_t(ep.rank())]);
  });
  for (std::size_t i = 0; i < len; ++i) {
    float e = 0;
    for (int r = 0; r < n; ++r) e += int_input(r, i);
    for (int r = 0; r < n; ++r) CHECK(data[std::size_t(r)][i] == e);
  }
  // Rank r sends every segment but r+1 in the reduce-scatter and every one
  // but r+2 in the all-gather: about 2(N-1)/N of the vector.
  for (int r = 0; r < n; ++r) {
    ring_schedule s(r, n, len);
    CHECK(net.bytes_sent(r) == (2 * len - s.size((r + 1) % n) - s.size((r + 2) % n)) * sizeof(float));
    CHECK(net.messages_sent(r) == 2u * (n - 1));
  }
  CHECK(net.total_bytes_sent() == 2 * (n - 1) * len * sizeof(float));
}
