// schedules: the cap on the messages per exchange (schedule_options::max_chunks)
// of the Rabenseifner and direct schedules. The cap changes the chunk size,
// never an addition: the same bits as uncapped 128 KiB-or-smaller chunks,
// over the moving and the zero-copy in-process transports, float32 and
// packed float16 cells, 1..8 ranks. A counting transport shows that no rank
// ever has more than the cap's receives posted from one peer, plus one per
// later halving step for Rabenseifner's forwarded pieces (and that without a
// cap it does); the cost model prices the cap.
#include <doctest/doctest.h>

#include <gradcomp/exchange/schedule_collectives.hpp>
#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <support/equality.hpp>
#include <support/ring_fixtures.hpp>
#include <support/schedule_fixtures.hpp>

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

using face = gradcomp::test_support::inproc_face;

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

TEST_CASE("max_chunks: Rabenseifner and direct give the same bits with any cap, N = 1..8") {
  for (schedule_kind kind : {schedule_kind::rabenseifner, schedule_kind::direct})
    for (int n = 1; n <= 8; ++n)
      for (std::size_t len : {0, 1, 7, 64, 1000, 4099})
        for (face f : {face::moving, face::zero_copy}) {
          CAPTURE(gradcomp::to_string(kind));
          CAPTURE(n);
          CAPTURE(len);
          CAPTURE(int(f));
          const auto x = inputs(n, len, 5 + len);
          schedule_options o{.kind = kind, .chunk_elements = 5, .max_chunks = 0};
          const auto all = run(n, x, o, f);
          for (int r = 0; r < n; ++r) CHECK(bit_equal(all[std::size_t(r)], all[0]));
          CHECK(max_rel(all[0], exact_sum(x)) < 1e-5);
          for (std::size_t w : {1, 2, 3, 16}) {
            CAPTURE(w);
            o.max_chunks = w;
            const auto got = run(n, x, o, f);
            for (int r = 0; r < n; ++r) CHECK(bit_equal(got[std::size_t(r)], all[0]));
          }
        }
}

TEST_CASE("max_chunks: 16 ranks, vectors shorter than the blocks (uneven halves), zero-copy, the same bits") {
  // With fewer floats than blocks a kept half can hold more than half of the
  // vector: the scratch of two consecutive steps must still fit.
  for (schedule_kind kind : {schedule_kind::rabenseifner, schedule_kind::direct})
    for (int n : {12, 16})
      for (std::size_t len : {1, 3, 7, 9, 15, 17, 40}) {
        CAPTURE(gradcomp::to_string(kind));
        CAPTURE(n);
        CAPTURE(len);
        const auto x = inputs(n, len, 77 + len);
        schedule_options o{.kind = kind, .chunk_elements = 1, .max_chunks = 0};
        const auto all = run(n, x, o, face::zero_copy);
        for (int r = 0; r < n; ++r) CHECK(bit_equal(all[std::size_t(r)], all[0]));
        CHECK(max_rel(all[0], exact_sum(x)) < 1e-5);
        o.max_chunks = 2;
        const auto got = run(n, x, o, face::zero_copy);
        for (int r = 0; r < n; ++r) CHECK(bit_equal(got[std::size_t(r)], all[0]));
      }
}

TEST_CASE("max_chunks: packed float16 cells, the mean, the same bits with and without a cap") {
  for (schedule_kind kind : {schedule_kind::rabenseifner, schedule_kind::direct})
    for (int n : {3, 4, 6}) {
      CAPTURE(gradcomp::to_string(kind));
      CAPTURE(n);
      const auto x = as_half(inputs(n, 777, 9));
      schedule_options o{.kind = kind, .chunk_elements = 16, .max_chunks = 0};
      const auto all = run(n, x, o, face::zero_copy, gradcomp::summable_element::float16);
      o.max_chunks = 2;
      const auto got = run(n, x, o, face::zero_copy, gradcomp::summable_element::float16);
      for (int r = 0; r < n; ++r) CHECK(bit_equal(got[std::size_t(r)], all[0]));
      CHECK(max_rel(all[0], exact_sum(x)) < 2e-2);  // float16 rounding per hop
    }
  for (schedule_kind kind : {schedule_kind::rabenseifner, schedule_kind::direct}) {
    const auto x = inputs(5, 999, 4);
    schedule_options o{.kind = kind, .average = true, .chunk_elements = 8, .max_chunks = 1};
    const auto got = run(5, x, o, face::moving);
    o.max_chunks = 0;
    const auto all = run(5, x, o, face::moving);
    CHECK(bit_equal(got[0], all[0]));
    vec mean = exact_sum(x);
    for (float& v : mean) v /= 5.0f;
    CHECK(max_rel(got[0], mean) < 1e-5);
  }
}

TEST_CASE("max_chunks: no rank posts more than the cap's receives from one peer; without a cap it does") {
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
        const auto got = run(n, x, {.kind = kind, .chunk_elements = 4, .max_chunks = w}, face::zero_copy,
                             gradcomp::summable_element::float32, &counts);
        // Direct: a segment in at most w messages. Rabenseifner: the first
        // step's half in at most w chunks, cut further at the boundaries of
        // the pieces forwarded at later steps (one more per later step).
        const int bound = int(w) + (kind == schedule_kind::rabenseifner ? gradcomp::rabenseifner_schedule(0, n).steps() : 0);
        for (const auto& c : counts) {
          CHECK(c.most_of_any() >= 1);
          CHECK(c.most_of_any() <= bound);
        }
        CHECK(max_rel(got[0], exact_sum(x)) < 1e-5);
      }
      run(n, x, {.kind = kind, .chunk_elements = 4, .max_chunks = 0}, face::zero_copy,
          gradcomp::summable_element::float32, &counts);
      CHECK(counts[0].most_of_any() > 3 + gradcomp::rabenseifner_schedule(0, n).steps());
    }
}

TEST_CASE("cost model: the cap on chunks per exchange; one message exposes Rabenseifner's additions") {
  gradcomp::cost_model m;
  m.inter = {.latency_s = 500e-6, .seconds_per_byte = 1.0 / 1.25e9};  // 10 Gbit/s
  m.chunk_elements = 32768;
  m.add_s = 1e-9;
  const gradcomp::cost_problem p{.elements = std::size_t(1) << 24, .ranks = 16};
  m.max_chunks = 0;
  const double uncapped = gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p);
  m.max_chunks = 1024;  // more than any hop's 128 KiB chunks: the same
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p) == doctest::Approx(uncapped));
  m.max_chunks = 1;  // whole messages: every addition after its transfer
  const double whole = gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p);
  CHECK(whole > uncapped + 0.5 * double(p.elements) * m.add_s);
  m.max_chunks = 8;
  const double capped = gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p);
  CHECK(capped < whole);  // 8 chunks hide all but one chunk's additions (and send fewer messages than 128 KiB ones)
  // The pipelined ring sends each chunk as it is summed: no cap, unchanged.
  m.max_chunks = 0;
  const double ring = gradcomp::predict_seconds(m, schedule_kind::pipelined_ring, p);
  m.max_chunks = 1;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::pipelined_ring, p) == doctest::Approx(ring));
}

TEST_CASE("Rabenseifner's layout: a step's pieces tile its range, and begin with exactly what the next step sends on") {
  using gradcomp::detail::rabenseifner_layout;
  using gradcomp::detail::rabenseifner_piece;
  // The first `count` pieces of a and b are the same (and b has exactly `count` when it is a whole layout).
  const auto same_pieces = [](const std::vector<rabenseifner_piece>& a, const std::vector<rabenseifner_piece>& b,
                              std::size_t count) {
    if (a.size() < count || b.size() < count) return false;
    for (std::size_t c = 0; c < count; ++c)
      if (a[c].begin != b[c].begin || a[c].size != b[c].size) return false;
    return true;
  };
  for (int n : {2, 4, 6, 8, 16, 64})
    for (std::size_t len : {std::size_t(0), std::size_t(5), std::size_t(1000), std::size_t(100003)})
      for (std::size_t cs : {std::size_t(0), std::size_t(7), std::size_t(4096)}) {
        CAPTURE(n);
        CAPTURE(len);
        CAPTURE(cs);
        const gradcomp::rabenseifner_schedule rs(n - 1, n);
        const int p = rs.blocks();
        const auto b = gradcomp::detail::rabenseifner_float_bounds(len, p);
        for (int v = 0; v < p; ++v) {
          int lo = 0, hi = p;
          std::vector<std::vector<rabenseifner_piece>> keep(std::size_t(rs.steps())), give(std::size_t(rs.steps()));
          for (int k = 0; k < rs.steps(); ++k) {
            const int d = rs.halving_distance(k), mid = lo + (hi - lo) / 2;
            const bool lower = (v & d) == 0;
            const int klo = lower ? lo : mid, khi = lower ? mid : hi;
            rabenseifner_layout(rs, v, k, klo, khi, b, cs, keep[std::size_t(k)]);
            rabenseifner_layout(rs, v, k, lower ? mid : lo, lower ? hi : mid, b, cs, give[std::size_t(k)]);
            // The pieces tile [b[klo], b[khi]) exactly once.
            std::vector<int> covered(b[std::size_t(khi)] - b[std::size_t(klo)], 0);
            for (const auto& pc : keep[std::size_t(k)])
              for (std::size_t i = pc.begin; i < pc.begin + pc.size; ++i) ++covered[i - b[std::size_t(klo)]];
            CHECK(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));
            // The partner (v XOR d) lays out my give range as its keep range: the same pieces.
            std::vector<rabenseifner_piece> theirs;
            rabenseifner_layout(rs, v ^ d, k, lower ? mid : lo, lower ? hi : mid, b, cs, theirs);
            CHECK(theirs.size() == give[std::size_t(k)].size());
            CHECK(same_pieces(theirs, give[std::size_t(k)], theirs.size()));
            lo = klo;
            hi = khi;
          }
          for (int k = 0; cs != 0 && k + 1 < rs.steps(); ++k) {
            const auto& next = give[std::size_t(k + 1)];
            REQUIRE(keep[std::size_t(k)].size() >= next.size());
            CHECK(same_pieces(keep[std::size_t(k)], next, next.size()));
          }
        }
      }
}
