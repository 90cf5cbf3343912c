// schedules: the receive window (schedule_options::window_chunks) of the
// Rabenseifner and direct schedules. A window changes when a chunk's receive
// is posted, never an addition: the same bits as every chunk at once, over
// the moving and the zero-copy in-process transports, float32 and packed
// float16 cells, 1..8 ranks. A counting transport shows that no rank ever has
// more than W receives posted from one peer (and that without a window it
// does), and the cost model prices a window too small for the link's latency.
#include <doctest/doctest.h>

#include <gradcomp/exchange/schedule_collectives.hpp>
#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <support/equality.hpp>
#include <support/ring_fixtures.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

using namespace std::chrono_literals;
using gradcomp::schedule_kind;
using gradcomp::schedule_options;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::inproc_zero_copy;
using gradcomp::transport::run_workers;
using namespace gradcomp::test_support;

namespace {

using vec = std::vector<float>;

/// Receives posted and not yet waited for, per peer, and the most ever.
struct posted_counts {
  std::map<int, int> now, most;
  void post(int peer) { most[peer] = std::max(most[peer], ++now[peer]); }
  void done(int peer) { --now[peer]; }
  int most_of_any() const {
    int m = 0;
    for (const auto& [peer, c] : most) m = std::max(m, c);
    return m;
  }
};

/// inproc_zero_copy that counts its posted receives (one rank's; a thread of its own).
class counting_transport {
 public:
  class recv_into_handle {
   public:
    recv_into_handle(gradcomp::transport::inproc_zero_copy::recv_into_handle h, posted_counts* c, int peer)
        : h_(std::move(h)), c_(c), peer_(peer) {}
    std::size_t wait() {
      const std::size_t n = h_.wait();
      c_->done(peer_);
      return n;
    }
    bool test() { return h_.test(); }

   private:
    gradcomp::transport::inproc_zero_copy::recv_into_handle h_;
    posted_counts* c_;
    int peer_;
  };

  counting_transport(inproc_endpoint& ep, posted_counts& c) : z_(ep.zero_copy()), c_(&c) {}
  int rank() const { return z_.rank(); }
  int size() const { return z_.size(); }
  auto isend(int dest, int tag, std::vector<std::byte>&& b) { return z_.isend(dest, tag, std::move(b)); }
  auto irecv(int source, int tag) { return z_.irecv(source, tag); }
  auto isend_view(int dest, int tag, std::span<const std::byte> b) { return z_.isend_view(dest, tag, b); }
  recv_into_handle irecv_into(int source, int tag, std::span<std::byte> b) {
    c_->post(source);
    return recv_into_handle(z_.irecv_into(source, tag, b), c_, source);
  }

 private:
  inproc_zero_copy z_;
  posted_counts* c_;
};
static_assert(gradcomp::ZeroCopyTransport<counting_transport>);

enum class face { moving, zero_copy };

std::vector<vec> run(int n, const std::vector<vec>& x, schedule_options o, face f,
                     gradcomp::summable_element e = gradcomp::summable_element::float32,
                     std::vector<posted_counts>* counts = nullptr) {
  std::vector<vec> out = x;
  if (counts) counts->assign(std::size_t(n), {});
  run_workers(n, [&](inproc_endpoint& ep) {
    const gradcomp::exchange::element_adder<> add{e};
    std::span<float> mine(out[std::size_t(ep.rank())]);
    auto go = [&](auto& t) {
      if (o.kind == schedule_kind::direct)
        gradcomp::detail::direct_impl(t, mine, o, add);
      else
        gradcomp::detail::rabenseifner_impl(t, mine, o, add);
    };
    if (counts) {
      counting_transport t(ep, (*counts)[std::size_t(ep.rank())]);
      go(t);
    } else if (f == face::zero_copy) {
      auto z = ep.zero_copy();
      go(z);
    } else {
      go(ep);
    }
  }, {.recv_timeout = 60s});
  return out;
}

/// Float16-representable inputs (summable cells of that element).
std::vector<vec> as_half(std::vector<vec> x) {
  for (auto& v : x) gradcomp::summable::round_cells(gradcomp::summable_element::float16, std::span<float>(v));
  return x;
}

}  // namespace

TEST_CASE("schedule window: Rabenseifner and direct give the same bits with any window, N = 1..8") {
  for (schedule_kind kind : {schedule_kind::rabenseifner, schedule_kind::direct})
    for (int n = 1; n <= 8; ++n)
      for (std::size_t len : {0, 1, 7, 64, 1000, 4099})
        for (face f : {face::moving, face::zero_copy}) {
          CAPTURE(gradcomp::to_string(kind));
          CAPTURE(n);
          CAPTURE(len);
          CAPTURE(int(f));
          const auto x = inputs(n, len, 5 + len);
          schedule_options o{.kind = kind, .chunk_elements = 5, .window_chunks = 0};
          const auto all = run(n, x, o, f);
          for (int r = 0; r < n; ++r) CHECK(bit_equal(all[std::size_t(r)], all[0]));
          CHECK(max_rel(all[0], exact_sum(x)) < 1e-5);
          for (std::size_t w : {1, 2, 3, 16}) {
            CAPTURE(w);
            o.window_chunks = w;
            const auto got = run(n, x, o, f);
            for (int r = 0; r < n; ++r) CHECK(bit_equal(got[std::size_t(r)], all[0]));
          }
        }
}

TEST_CASE("schedule window: packed float16 cells, the mean, the same bits with and without a window") {
  for (schedule_kind kind : {schedule_kind::rabenseifner, schedule_kind::direct})
    for (int n : {3, 4, 6}) {
      CAPTURE(gradcomp::to_string(kind));
      CAPTURE(n);
      const auto x = as_half(inputs(n, 777, 9));
      schedule_options o{.kind = kind, .chunk_elements = 16, .window_chunks = 0};
      const auto all = run(n, x, o, face::zero_copy, gradcomp::summable_element::float16);
      o.window_chunks = 2;
      const auto got = run(n, x, o, face::zero_copy, gradcomp::summable_element::float16);
      for (int r = 0; r < n; ++r) CHECK(bit_equal(got[std::size_t(r)], all[0]));
      CHECK(max_rel(all[0], exact_sum(x)) < 2e-2);  // float16 rounding per hop
    }
  for (schedule_kind kind : {schedule_kind::rabenseifner, schedule_kind::direct}) {
    const auto x = inputs(5, 999, 4);
    schedule_options o{.kind = kind, .average = true, .chunk_elements = 8, .window_chunks = 1};
    const auto got = run(5, x, o, face::moving);
    o.window_chunks = 0;
    const auto all = run(5, x, o, face::moving);
    CHECK(bit_equal(got[0], all[0]));
    vec mean = exact_sum(x);
    for (float& v : mean) v /= 5.0f;
    CHECK(max_rel(got[0], mean) < 1e-5);
  }
}

TEST_CASE("schedule window: no rank posts more than W receives from one peer; without a window it does") {
  for (schedule_kind kind : {schedule_kind::rabenseifner, schedule_kind::direct})
    for (int n : {2, 5, 8}) {
      CAPTURE(gradcomp::to_string(kind));
      CAPTURE(n);
      // Every exchange with one peer carries at least 64 / 8 = 8 chunks of 4 floats.
      const std::size_t len = 64 * std::size_t(n);
      const auto x = inputs(n, len, 21);
      std::vector<posted_counts> counts;
      for (std::size_t w : {1, 3}) {
        CAPTURE(w);
        const auto got = run(n, x, {.kind = kind, .chunk_elements = 4, .window_chunks = w}, face::zero_copy,
                             gradcomp::summable_element::float32, &counts);
        for (const auto& c : counts) {
          CHECK(c.most_of_any() >= 1);
          CHECK(c.most_of_any() <= int(w));
        }
        CHECK(max_rel(got[0], exact_sum(x)) < 1e-5);
      }
      run(n, x, {.kind = kind, .chunk_elements = 4, .window_chunks = 0}, face::zero_copy,
          gradcomp::summable_element::float32, &counts);
      CHECK(counts[0].most_of_any() > 3);
    }
}

TEST_CASE("cost model: a window too small for the link's latency slows Rabenseifner; a wide one changes nothing") {
  gradcomp::cost_model m;
  m.inter = {.latency_s = 500e-6, .seconds_per_byte = 1.0 / 1.25e9};  // 10 Gbit/s, 0.5 ms per message
  m.chunk_elements = 32768;                                          // 105 us per chunk on the wire
  const gradcomp::cost_problem p{.elements = std::size_t(1) << 24, .ranks = 16};
  m.window_chunks = 0;
  const double unbounded = gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p);
  m.window_chunks = 1024;  // more than any hop's chunks: the same
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p) == doctest::Approx(unbounded));
  m.window_chunks = 16;  // 16 x 105 us > 0.5 ms + 105 us: the wire stays busy
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p) == doctest::Approx(unbounded));
  m.window_chunks = 2;  // 2 chunks per 0.6 ms: about a third of the rate
  const double narrow = gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p);
  CHECK(narrow > 2.0 * unbounded);
  // The pipelined ring has no window (a chunk is sent as it is summed): unchanged.
  m.window_chunks = 0;
  const double ring = gradcomp::predict_seconds(m, schedule_kind::pipelined_ring, p);
  m.window_chunks = 2;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::pipelined_ring, p) == doctest::Approx(ring));
}
