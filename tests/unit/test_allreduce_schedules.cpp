// schedules.hpp: the all-reduce schedules beyond the ring over the in-process
// transport: pipelined ring (bit for bit the ring), Rabenseifner (any N, the
// fold of non-powers of two), hierarchical two-level ring, and Rabenseifner,
// the hierarchical ring and the direct schedule in GradiVeQ's compressed domain. 1..8 ranks, odd counts, lengths below N,
// identical bits on every rank, the sum within float tolerance.
#include <doctest/doctest.h>

#include <gradcomp/dense.hpp>
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <support/equality.hpp>
#include <support/ring_fixtures.hpp>
#include <support/schedule_fixtures.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <span>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using gradcomp::ring_stats;
using gradcomp::schedule_kind;
using gradcomp::schedule_options;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::run_workers;
using namespace gradcomp::test_support;

namespace {

using vec = std::vector<float>;

const std::size_t lengths[] = {0, 1, 2, 3, 5, 7, 8, 13, 64, 257, 1000, 4099};

/// allreduce_linear of x (one vector per rank) with a copy of `codec` on each
/// of n in-process ranks, over the moving or the zero-copy face: every
/// rank's result and stats.
template <class Codec>
std::pair<std::vector<vec>, std::vector<ring_stats>> run_linear(int n, const Codec& codec, const std::vector<vec>& x,
                                                               const schedule_options& o, bool zero_copy) {
  std::vector<vec> out = x;
  std::vector<ring_stats> stats(static_cast<std::size_t>(n));
  run_workers(n, [&](inproc_endpoint& ep) {
    auto mine = codec;
    auto& v = out[std::size_t(ep.rank())];
    if (zero_copy) {
      auto z = ep.zero_copy();
      stats[std::size_t(ep.rank())] = gradcomp::allreduce_linear(z, mine, std::span<float>(v), o);
    } else {
      stats[std::size_t(ep.rank())] = gradcomp::allreduce_linear(ep, mine, std::span<float>(v), o);
    }
  }, {.recv_timeout = 60s});
  return {out, stats};
}

}  // namespace

TEST_CASE("schedules: rabenseifner_schedule folds non-powers of two like MPICH") {
  const gradcomp::rabenseifner_schedule s(4, 7);  // p = 4, r = 3: pairs (0,1) (2,3) (4,5), rank 6 alone
  CHECK(s.blocks() == 4);
  CHECK(s.folded_pairs() == 3);
  CHECK(s.folded_out());
  CHECK(s.fold_partner() == 5);
  CHECK(s.virtual_rank() == -1);
  const gradcomp::rabenseifner_schedule t(5, 7);
  CHECK(t.folds_in());
  CHECK(t.virtual_rank() == 2);
  CHECK(t.real_rank(2) == 5);
  CHECK(gradcomp::rabenseifner_schedule(6, 7).virtual_rank() == 3);
  CHECK(gradcomp::rabenseifner_schedule(6, 7).real_rank(3) == 6);
  CHECK(t.steps() == 2);
  CHECK(t.halving_distance(0) == 2);
  CHECK(t.halving_distance(1) == 1);
  CHECK(gradcomp::rabenseifner_schedule(0, 1).steps() == 0);
}

TEST_CASE("schedules: every dense schedule sums, bit-identical on every rank, N = 1..8, all lengths") {
  for (int n = 1; n <= 8; ++n)
    for (std::size_t len : lengths)
      for (schedule_kind kind : {schedule_kind::pipelined_ring, schedule_kind::rabenseifner, schedule_kind::hierarchical})
        for (std::size_t chunk : {std::size_t(0), std::size_t(3), std::size_t(32768)}) {
          CAPTURE(n);
          CAPTURE(len);
          CAPTURE(gradcomp::to_string(kind));
          CAPTURE(chunk);
          const auto x = inputs(n, len, 7 + len);
          schedule_options o{.kind = kind, .chunk_elements = chunk};
          if (kind == schedule_kind::hierarchical) o.group_size = n % 2 == 0 && n > 2 ? 2 : (n % 3 == 0 && n > 3 ? 3 : 0);
          const auto out = run_allreduce(n, x, o);
          const vec truth = exact_sum(x);
          for (int r = 0; r < n; ++r) CHECK(bit_equal(out[std::size_t(r)], out[0]));
          CHECK(max_rel(out[0], truth) < 1e-5);
        }
}

TEST_CASE("schedules: the pipelined ring is the ring bit for bit (sum and mean)") {
  for (int n : {2, 3, 5, 8})
    for (std::size_t len : {std::size_t(7), std::size_t(1000), std::size_t(4099)})
      for (bool average : {false, true}) {
        CAPTURE(n);
        CAPTURE(len);
        const auto x = inputs(n, len, 3);
        std::vector<vec> ring = x;
        run_workers(n, [&](inproc_endpoint& ep) {
          gradcomp::ring_allreduce(ep, ring[std::size_t(ep.rank())], {.average = average});
        });
        const auto piped = run_allreduce(n, x, {.kind = schedule_kind::pipelined_ring, .average = average, .chunk_elements = 17});
        for (int r = 0; r < n; ++r) CHECK(bit_equal(piped[std::size_t(r)], ring[0]));
      }
}

TEST_CASE("schedules: mean, hierarchical groups of 2, 3 and 4, and a group size that does not divide N") {
  for (int n : {4, 6, 8}) {
    const auto x = inputs(n, 1001, 11);
    vec mean = exact_sum(x);
    for (float& v : mean) v /= float(n);
    for (int g : {2, 3, 4}) {
      if (n % g != 0) continue;
      CAPTURE(n);
      CAPTURE(g);
      const auto out = run_allreduce(n, x, {.kind = schedule_kind::hierarchical, .average = true, .chunk_elements = 64, .group_size = g});
      for (int r = 0; r < n; ++r) CHECK(bit_equal(out[std::size_t(r)], out[0]));
      CHECK(max_rel(out[0], mean) < 1e-5);
    }
  }
  const auto x = inputs(5, 10, 1);
  CHECK_THROWS_AS(run_allreduce(5, x, {.kind = schedule_kind::hierarchical, .group_size = 2}),
                  gradcomp::invalid_argument_error);
}

TEST_CASE("schedules: Rabenseifner averages on the owner, and its traffic is 2(p-1)/p of the vector") {
  const int n = 8;
  const std::size_t len = 8000;
  const auto x = inputs(n, len, 5);
  std::vector<vec> out = x;
  std::vector<ring_stats> st(n);
  run_workers(n, [&](inproc_endpoint& ep) {
    st[std::size_t(ep.rank())] = gradcomp::rabenseifner_allreduce(ep, out[std::size_t(ep.rank())],
                                                                   {.average = true, .chunk_elements = 0});
  });
  vec mean = exact_sum(x);
  for (float& v : mean) v /= float(n);
  for (int r = 0; r < n; ++r) {
    CHECK(bit_equal(out[std::size_t(r)], out[0]));
    CHECK(st[std::size_t(r)].bytes_sent == 2 * (len - len / n) * sizeof(float));
    CHECK(st[std::size_t(r)].messages_sent == 6);  // 2 log2(8), one message per step without chunks
  }
  CHECK(max_rel(out[0], mean) < 1e-5);
}

TEST_CASE("schedules: tags are checked against the registry, the library schedule needs a library transport") {
  const auto x = inputs(2, 10, 1);
  CHECK_THROWS_AS(run_allreduce(2, x, {.kind = schedule_kind::rabenseifner, .tag_base = 32000}),
                  gradcomp::invalid_argument_error);
  CHECK_THROWS_AS(run_allreduce(2, x, {.kind = schedule_kind::library}), gradcomp::invalid_argument_error);
  CHECK(gradcomp::parse_schedule_kind("hierarchical") == schedule_kind::hierarchical);
  CHECK_THROWS_AS(gradcomp::parse_schedule_kind("tree"), gradcomp::invalid_argument_error);
}

TEST_CASE("schedules: a rank whose length differs is a transport_error, not a hang") {
  std::vector<vec> x = {vec(100, 1.0f), vec(100, 1.0f), vec(90, 1.0f), vec(100, 1.0f)};
  CHECK_THROWS(run_workers(4, [&](inproc_endpoint& ep) {
    gradcomp::rabenseifner_allreduce(ep, x[std::size_t(ep.rank())], {.chunk_elements = 0});
  }, {.recv_timeout = 5s}));
}

TEST_CASE("schedules: GradiVeQ on Rabenseifner: bit-identical, equals GradiVeQ on the ring within tolerance, N = 1..8") {
  for (int n = 1; n <= 8; ++n)
    for (std::size_t tail : {std::size_t(0), std::size_t(5)}) {
      const std::size_t K = 16, slices = std::size_t(3 * n + 1);
      const low_rank_layer layer(K, 3, slices * K + tail, 40 + std::uint64_t(n));
      CAPTURE(n);
      CAPTURE(tail);
      const auto codec = fitted_codec(layer, static_cast<std::size_t>(n));
      const std::vector<vec> x = rank_samples(layer, n, 5000);
      const vec reference = compressed_domain_sum(codec, x);
      std::vector<vec> rab = x, ring = x;
      run_workers(n, [&](inproc_endpoint& ep) {
        auto mine = codec;
        const auto st = gradcomp::allreduce_linear(ep, mine, rab[std::size_t(ep.rank())], {.kind = schedule_kind::rabenseifner});
        CHECK(st.encodes >= 1);
        gradcomp::ring_allreduce_linear(ep, mine, ring[std::size_t(ep.rank())]);
      });
      for (int r = 0; r < n; ++r) CHECK(bit_equal(rab[std::size_t(r)], rab[0]));
      CHECK(rel_error(rab[0], reference) < 1e-5);
      CHECK(rel_error(rab[0], ring[0]) < 1e-5);
    }
}

TEST_CASE("schedules: GradiVeQ on Rabenseifner with a workspace kept across calls: the same bits, both faces, N = 2-8") {
  // The workspace keeps the message buffers, the encoded payloads (reused:
  // each encode overwrites its payload) and, over the zero-copy face with
  // pieces, the one buffer of all complete blocks the doubling sends from and
  // receives into: none is reallocated after the first call.
  using payload = gradcomp::linear_compressor<>::payload_type;
  for (int n : {2, 3, 4, 5, 8})
    for (bool zero_copy : {false, true}) {
      CAPTURE(n);
      CAPTURE(zero_copy);
      const low_rank_layer layer(16, 3, 16 * std::size_t(3 * n + 1) + 5, 60 + std::uint64_t(n));
      const auto codec = fitted_codec(layer, static_cast<std::size_t>(n));
      const std::vector<vec> x = rank_samples(layer, n, 5000);
      const schedule_options base{.kind = schedule_kind::rabenseifner, .chunk_elements = 16};
      auto call = [&](std::vector<vec>& v, std::vector<gradcomp::schedule_workspace>* ws) {
        run_workers(n, [&](inproc_endpoint& ep) {
          auto mine = codec;
          schedule_options o = base;
          if (ws) o.workspace = &(*ws)[std::size_t(ep.rank())];
          if (zero_copy) {
            auto z = ep.zero_copy();
            gradcomp::allreduce_linear(z, mine, v[std::size_t(ep.rank())], o);
          } else {
            gradcomp::allreduce_linear(ep, mine, v[std::size_t(ep.rank())], o);
          }
        }, {.recv_timeout = 60s});
      };
      std::vector<vec> fresh = x;
      call(fresh, nullptr);
      std::vector<gradcomp::schedule_workspace> ws(static_cast<std::size_t>(n));
      std::vector<const std::byte*> assembly(static_cast<std::size_t>(n));
      std::vector<const payload*> payloads(static_cast<std::size_t>(n));
      for (int round = 0; round < 3; ++round) {
        std::vector<vec> kept = x;
        call(kept, &ws);
        for (int r = 0; r < n; ++r) CHECK(bit_equal(kept[std::size_t(r)], fresh[std::size_t(r)]));
        for (std::size_t r = 0; r < ws.size(); ++r) {
          const auto* a = ws[r].assembly().data();
          const auto* q = ws[r].payloads<payload>(0).data();
          if (round > 0) {
            CHECK(a == assembly[r]);
            CHECK(q == payloads[r]);
          }
          assembly[r] = a;
          payloads[r] = q;
          // Pieces over the zero-copy face (p >= 4: two blocks or more per half) assemble the
          // blocks, on the ranks of the power-of-two core (a folded-out rank only sends and receives once).
          const bool pieces = zero_copy && gradcomp::rabenseifner_schedule(0, n).blocks() >= 4;
          const bool core = gradcomp::rabenseifner_schedule(int(r), n).virtual_rank() >= 0;
          CHECK(!ws[r].assembly().empty() == (pieces && core));
        }
      }
    }
}

namespace {
/// dense_codec without segment_body_size: the compressed Rabenseifner's path
/// for codecs that do not know their payload sizes (length messages).
struct unsized_dense_codec : gradcomp::dense_codec<> {
  void segment_body_size() = delete;
};
}  // namespace

TEST_CASE("schedules: dense_codec on Rabenseifner equals the dense Rabenseifner; mean; with and without known sizes") {
  static_assert(gradcomp::ring_segmentation<gradcomp::dense_codec<>>::knows_body_size);
  static_assert(!gradcomp::ring_segmentation<unsized_dense_codec>::knows_body_size);
  auto run = [](auto codec, int n, bool zero_copy, const std::vector<vec>& x) {
    std::vector<vec> lin = x;
    run_workers(n, [&](inproc_endpoint& ep) {
      auto c = codec;
      const schedule_options o{.average = true, .chunk_elements = 64};
      if (zero_copy) {
        auto z = ep.zero_copy();
        gradcomp::rabenseifner_allreduce_linear(z, c, lin[std::size_t(ep.rank())], o);
      } else {
        gradcomp::rabenseifner_allreduce_linear(ep, c, lin[std::size_t(ep.rank())], o);
      }
    });
    return lin;
  };
  for (int n : {3, 4, 6}) {
    CAPTURE(n);
    const auto x = inputs(n, 333 * 8, 9);
    const auto dense = run_allreduce(n, x, {.kind = schedule_kind::rabenseifner, .average = true});
    for (bool zero_copy : {false, true}) {
      CAPTURE(zero_copy);
      const auto sized = run(gradcomp::dense_codec<>{}, n, zero_copy, x);
      const auto unsized = run(unsized_dense_codec{}, n, zero_copy, x);
      for (int r = 0; r < n; ++r) {
        CHECK(bit_equal(sized[std::size_t(r)], dense[0]));
        CHECK(bit_equal(unsized[std::size_t(r)], dense[0]));
      }
    }
  }
}

TEST_CASE("schedules: a GradiVeQ codec configured for another N is rejected") {
  const low_rank_layer layer(16, 3, 16 * 8, 3);
  const auto codec = fitted_codec(layer, 3);
  std::vector<vec> x = rank_samples(layer, 4, 1);
  CHECK_THROWS_AS(run_workers(4, [&](inproc_endpoint& ep) {
    auto mine = codec;
    gradcomp::rabenseifner_allreduce_linear(ep, mine, x[std::size_t(ep.rank())]);
  }), gradcomp::invalid_argument_error);
}

namespace {

// A library whose all-reduce leaves different bits on different ranks (as an
// algorithm summing in a rank-dependent order may): the ring's sum, with the
// last bit of element 0 flipped on rank 1. Its max runs the pipelined ring
// with a max in place of the addition.
struct sloppy_library {
  inproc_endpoint* ep;
  int rank() const { return ep->rank(); }
  int size() const { return ep->size(); }
  auto isend(int d, int tag, std::vector<std::byte>&& b) { return ep->isend(d, tag, std::move(b)); }
  auto irecv(int s, int tag) { return ep->irecv(s, tag); }
  void library_allreduce_sum(std::span<float> x) {
    gradcomp::ring_allreduce(*ep, x, {.tag_base = 100});
    if (ep->rank() == 1 && !x.empty()) {
      std::uint32_t w;
      std::memcpy(&w, &x[0], 4);
      w ^= 1u;
      std::memcpy(&x[0], &w, 4);
    }
  }
  void library_allreduce_max(std::span<float> x) {
    auto max = [](std::span<float> acc, std::span<const float> in) {
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = std::max(acc[i], in[i]);
    };
    gradcomp::detail::pipelined_ring_impl(*ep, x, schedule_options{.tag_base = 200, .tag_owner = gradcomp::tags::user}, max);
  }
};
static_assert(gradcomp::LibraryMaxTransport<sloppy_library>);

}  // namespace

TEST_CASE("schedules: the library schedule guarantees the same bits even when the library does not") {
  const int n = 3;
  const auto x = inputs(n, 50, 2);
  for (bool check : {true, false}) {
    std::vector<vec> out = x;
    std::vector<ring_stats> st(n);
    run_workers(n, [&](inproc_endpoint& ep) {
      sloppy_library lib{&ep};
      st[std::size_t(ep.rank())] = gradcomp::allreduce(
          lib, std::span<float>(out[std::size_t(ep.rank())]),
          {.kind = schedule_kind::library, .tag_base = 300, .tag_owner = gradcomp::tags::user, .check_library_bits = check});
    });
    CHECK(max_rel(out[0], exact_sum(x)) < 1e-5);
    if (check) {
      for (int r = 0; r < n; ++r) CHECK(bit_equal(out[std::size_t(r)], out[0]));
      CHECK(st[0].bytes_sent == 50 * sizeof(float));  // rank 0's bits were broadcast
    } else {
      CHECK_FALSE(bit_equal(out[1], out[0]));  // what the check prevents
    }
  }
}

TEST_CASE("schedules: the binomial broadcast reaches every rank with rank 0's bytes, N = 1..8") {
  for (int n = 1; n <= 8; ++n) {
    std::vector<std::vector<std::byte>> got(static_cast<std::size_t>(n));
    run_workers(n, [&](inproc_endpoint& ep) {
      std::vector<std::byte> b(5, std::byte(ep.rank() + 1));
      gradcomp::broadcast_bytes(ep, b);
      got[std::size_t(ep.rank())] = b;
    });
    for (const auto& b : got) CHECK(b == std::vector<std::byte>(5, std::byte(1)));
  }
}

TEST_CASE("schedules: a codec's measured costs: dense_codec sends its floats (ratio about 1), GradiVeQ far fewer") {
  gradcomp::dense_codec<> dense;
  const vec x = inputs(1, 4096, 3)[0];
  const auto d = gradcomp::measure_codec(dense, std::span<const float>(x));
  CHECK(d.elements == 4096);
  CHECK(d.wire_ratio >= 1.0);
  CHECK(d.wire_ratio < 1.05);  // the wire header only
  CHECK(d.encode_s >= 0.0);
  CHECK(d.compressed);
  const low_rank_layer layer(16, 3, 16 * 256, 4);
  auto codec = fitted_codec(layer, 2);
  const vec sample = layer.sample(1);
  const auto g = gradcomp::measure_codec(codec, std::span<const float>(sample));
  CHECK(g.wire_ratio < 0.5);
  CHECK(g.encode_s > 0.0);
  // The model prices the codec's work on top of the (smaller) transfers.
  const gradcomp::cost_model m;
  gradcomp::cost_problem p = g;
  p.ranks = 4;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p) > (g.encode_s + g.decode_s) * double(g.elements));
}

TEST_CASE("schedules: GradiVeQ on Rabenseifner sends every halving step in pieces: the same bits as one message, both faces") {
  // GradiVeQ knows its payload sizes before encoding, so every halving
  // step's halves go as at most max_chunks pieces (a power of two), each
  // sent as soon as its blocks are encoded and summed, over the moving face
  // and (exact receives, no length messages) the zero-copy face; a last
  // doubling half above two chunks goes as two messages. chunk_elements = 0
  // keeps one message each. Every cut sums each block in the same order.
  static_assert(gradcomp::ring_segmentation<gradcomp::linear_compressor<>>::knows_body_size);
  static_assert(!gradcomp::ring_segmentation<unsized_dense_codec>::knows_body_size);
  for (int n : {2, 3, 4, 5, 6, 8}) {
    CAPTURE(n);
    const std::size_t K = 16;
    const low_rank_layer layer(K, 3, K * std::size_t(9 * n + 2) + 7, 90 + std::uint64_t(n));
    const auto codec = fitted_codec(layer, static_cast<std::size_t>(n));
    const std::vector<vec> x = rank_samples(layer, n, 7000);
    auto run_face = [&](bool zero_copy, schedule_options o) {
      std::vector<vec> out = x;
      std::vector<ring_stats> stats(static_cast<std::size_t>(n));
      run_workers(n, [&](inproc_endpoint& ep) {
        auto mine = codec;
        auto& st = stats[std::size_t(ep.rank())];
        if (zero_copy) {
          auto z = ep.zero_copy();
          st = gradcomp::rabenseifner_allreduce_linear(z, mine, out[std::size_t(ep.rank())], o);
        } else {
          st = gradcomp::rabenseifner_allreduce_linear(ep, mine, out[std::size_t(ep.rank())], o);
        }
      }, {.recv_timeout = 60s});
      return std::pair{out, stats};
    };
    // Named references, not a structured binding: most_extra's lambda below
    // captures the statistics, which clang 14 refuses for a binding.
    const auto whole_run = run_face(false, {.chunk_elements = 0});
    const auto& whole = whole_run.first;
    const auto& whole_stats = whole_run.second;
    for (int r = 0; r < n; ++r) CHECK(bit_equal(whole[std::size_t(r)], whole[0]));
    for (bool zc : {false, true})
      for (std::size_t cap : {std::size_t(0), std::size_t(2), std::size_t(3), std::size_t(8)}) {
        CAPTURE(zc);
        CAPTURE(cap);
        // chunk_elements = 1: every piece is big enough, the cap and the blocks decide.
        const auto [got, stats] = run_face(zc, {.chunk_elements = 1, .max_chunks = cap});
        for (int r = 0; r < n; ++r) CHECK(bit_equal(got[std::size_t(r)], whole[0]));
        // Each rank of the power-of-two core sends the half it gives at each
        // step in more messages than one (when it has two blocks or more to
        // give): the largest power of two within the cap and the blocks.
        const gradcomp::rabenseifner_schedule rs(0, n);
        const int p = rs.blocks();
        std::size_t extra = 0, first = 1;
        for (int k = 0; k < rs.steps(); ++k) {
          const std::size_t given = std::size_t(p >> (k + 1)), most_pieces = cap == 0 ? given : std::min(cap, given);
          std::size_t pieces = 1;
          while (given >= 2 && pieces * 2 <= most_pieces) pieces *= 2;
          if (k == 0) first = pieces;
          extra += pieces - 1;
        }
        // Over the zero-copy face every halving peer also swaps a digest of
        // the blocks' sizes (8 bytes), and with pieces the last doubling
        // step's half goes in two (a vector of more than 4 chunks).
        if (zc && first > 1) extra += std::size_t(rs.steps());
        if (first > 1 && cap != 1) extra += 1;
        auto most_extra = [&](const std::vector<ring_stats>& st) {
          std::size_t most = 0;
          for (int r = 0; r < n; ++r)
            most = std::max(most, st[std::size_t(r)].messages_sent - whole_stats[std::size_t(r)].messages_sent);
          return most;
        };
        CHECK(most_extra(stats) == extra);
        // The default chunk (32768 floats' worth) is more than these halves
        // hold: one message per step, as chunk_elements = 0.
        const auto [whole_again, whole_again_stats] = run_face(zc, {.max_chunks = cap});
        for (int r = 0; r < n; ++r) CHECK(bit_equal(whole_again[std::size_t(r)], whole[0]));
        CHECK(most_extra(whole_again_stats) == 0);
      }
  }
}

namespace {
// The moving face of the in-process transport, recording every message's tag and size.
struct recording_endpoint {
  inproc_endpoint* ep;
  std::vector<std::pair<int, std::size_t>>* sent;
  int rank() const { return ep->rank(); }
  int size() const { return ep->size(); }
  auto isend(int d, int tag, std::vector<std::byte>&& b) {
    sent->emplace_back(tag, b.size());
    return ep->isend(d, tag, std::move(b));
  }
  auto irecv(int s, int tag) { return ep->irecv(s, tag); }
};
static_assert(gradcomp::Transport<recording_endpoint>);
}  // namespace

TEST_CASE("schedules: GradiVeQ on Rabenseifner: no halving piece holds less than chunk_elements floats' worth") {
  // 8 equal blocks of 40 slices: the first step's half in one message is
  // `half` bytes; with chunk_elements = half / 8 floats (half / 2 bytes) it
  // goes as 2 pieces, and the second step's quarter, half / 4 floats' worth,
  // as one message: pieces are counted from the range both peers split.
  const int n = 8;
  const std::size_t K = 16;
  const low_rank_layer layer(K, 3, K * 320, 77);
  const auto codec = fitted_codec(layer, std::size_t(n));
  const std::vector<vec> x = rank_samples(layer, n, 4000);
  auto run = [&](schedule_options o) {
    std::vector<vec> out = x;
    std::vector<std::vector<std::pair<int, std::size_t>>> sent(static_cast<std::size_t>(n));
    run_workers(n, [&](inproc_endpoint& ep) {
      auto mine = codec;
      recording_endpoint rec{&ep, &sent[std::size_t(ep.rank())]};
      gradcomp::rabenseifner_allreduce_linear(rec, mine, out[std::size_t(ep.rank())], o);
    }, {.recv_timeout = 60s});
    // the halving's messages (tag_base), in the order each rank sent them
    std::vector<std::vector<std::size_t>> halving(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      for (const auto& [tag, bytes] : sent[std::size_t(r)])
        if (tag == o.tag_base) halving[std::size_t(r)].push_back(bytes);
    return std::pair{out, halving};
  };
  const auto [whole, whole_halving] = run({.chunk_elements = 0});
  REQUIRE(whole_halving[0].size() == 3);  // one message per step
  const std::size_t half = whole_halving[0][0];
  const auto [got, halving] = run({.chunk_elements = half / 8});
  for (int r = 0; r < n; ++r) {
    CHECK(bit_equal(got[std::size_t(r)], whole[0]));
    const auto& m = halving[std::size_t(r)];
    REQUIRE(m.size() == 4);  // 2 pieces, then one message per step
    CHECK(m[0] + m[1] == half);
    CHECK(m[0] >= half / 2);
    CHECK(m[1] >= half / 2);
  }
  // One float's worth: the blocks and the cap decide (4, 2 and 1 pieces).
  const auto [small, small_halving] = run({.chunk_elements = 1});
  for (int r = 0; r < n; ++r) {
    CHECK(bit_equal(small[std::size_t(r)], whole[0]));
    CHECK(small_halving[std::size_t(r)].size() == 7);
  }
}

TEST_CASE("schedules: GradiVeQ pieces over the zero-copy face: a peer with another basis is an error, not a hang") {
  const std::size_t K = 16;
  const low_rank_layer layer(K, 3, K * 40, 5);
  const auto codec = fitted_codec(layer, 4);
  const low_rank_layer other_layer(K, 5, K * 40, 6);  // another rank's basis keeps more directions
  auto other = fitted_codec(other_layer, 4);
  std::vector<vec> x = rank_samples(layer, 4, 3);
  CHECK_THROWS_AS(run_workers(4, [&](inproc_endpoint& ep) {
    auto mine = ep.rank() == 1 ? other : codec;
    auto z = ep.zero_copy();
    gradcomp::rabenseifner_allreduce_linear(z, mine, x[std::size_t(ep.rank())]);
  }, {.recv_timeout = 5s}), gradcomp::error);
}

TEST_CASE("schedules: GradiVeQ on the hierarchical ring: bit-identical, the compressed sum, groups of 2-4, both faces") {
  struct shape {
    int n, g;
  };
  for (const shape sh : {shape{4, 2}, shape{6, 2}, shape{6, 3}, shape{8, 2}, shape{8, 4}, shape{9, 3}})
    for (std::size_t tail : {std::size_t(0), std::size_t(5)}) {
      const int n = sh.n;
      CAPTURE(n);
      CAPTURE(sh.g);
      CAPTURE(tail);
      const std::size_t K = 16;
      const low_rank_layer layer(K, 3, K * std::size_t(2 * n + 3) + tail, 70 + std::uint64_t(n));
      const auto codec = fitted_codec(layer, static_cast<std::size_t>(n));
      const std::vector<vec> x = rank_samples(layer, n, 8000);
      const vec reference = compressed_domain_sum(codec, x);
      for (bool zero_copy : {false, true})
        for (bool average : {false, true}) {
          CAPTURE(zero_copy);
          CAPTURE(average);
          const auto [out, stats] =
              run_linear(n, codec, x, {.kind = schedule_kind::hierarchical, .average = average, .group_size = sh.g}, zero_copy);
          for (int r = 0; r < n; ++r) CHECK(bit_equal(out[std::size_t(r)], out[0]));
          vec want = reference;
          if (average)
            for (auto& w : want) w /= float(n);
          CHECK(rel_error(out[0], want) < 1e-5);
          // Every block encoded and decoded exactly once per rank; 2(g-1) + 2(G-1) messages.
          const int groups = n / sh.g;
          for (const auto& st : stats) {
            CHECK(st.encodes == std::size_t(n));
            CHECK(st.decodes == std::size_t(n));
            CHECK(st.messages_sent == std::size_t(2 * (sh.g - 1) + 2 * (groups - 1)));
          }
        }
    }
}

TEST_CASE("schedules: GradiVeQ on the direct schedule: bit-identical, the compressed sum, one encode and decode, N = 1..8, both faces") {
  for (int n = 1; n <= 8; ++n)
    for (std::size_t tail : {std::size_t(0), std::size_t(5)}) {
      CAPTURE(n);
      CAPTURE(tail);
      const std::size_t K = 16;
      const low_rank_layer layer(K, 3, K * std::size_t(2 * n + 3) + tail, 90 + std::uint64_t(n));
      const auto codec = fitted_codec(layer, static_cast<std::size_t>(n));
      const std::vector<vec> x = rank_samples(layer, n, 8000);
      const vec reference = compressed_domain_sum(codec, x);
      for (bool zero_copy : {false, true})
        for (bool average : {false, true}) {
          CAPTURE(zero_copy);
          CAPTURE(average);
          const auto [out, stats] = run_linear(n, codec, x, {.kind = schedule_kind::direct, .average = average}, zero_copy);
          for (int r = 0; r < n; ++r) CHECK(bit_equal(out[std::size_t(r)], out[0]));
          vec want = reference;
          if (average)
            for (auto& w : want) w /= float(n);
          CHECK(rel_error(out[0], want) < 1e-5);
          // Every block encoded and decoded exactly once per rank; one message to each peer per phase.
          for (const auto& st : stats) {
            CHECK(st.encodes == std::size_t(n));
            CHECK(st.decodes == std::size_t(n));
            CHECK(st.messages_sent == std::size_t(2 * (n - 1)));
          }
        }
    }
}

TEST_CASE("schedules: dense_codec on the direct schedule equals the dense direct schedule bit for bit; the library has no compressed form") {
  for (int n : {2, 3, 5, 8}) {
    CAPTURE(n);
    const auto x = inputs(n, 301 * 8 + 3, 17);
    const auto dense = run_allreduce(n, x, {.kind = schedule_kind::direct, .chunk_elements = 0});
    for (bool zero_copy : {false, true}) {
      CAPTURE(zero_copy);
      const auto lin = run_linear(n, gradcomp::dense_codec<>{}, x, {.kind = schedule_kind::direct}, zero_copy).first;
      for (int r = 0; r < n; ++r) CHECK(bit_equal(lin[std::size_t(r)], dense[0]));
    }
  }
  run_workers(2, [&](inproc_endpoint& ep) {
    gradcomp::dense_codec<> c;
    vec v(10, 1.0f);
    CHECK_THROWS_AS(gradcomp::allreduce_linear(ep, c, std::span<float>(v), {.kind = schedule_kind::library}),
                    gradcomp::invalid_argument_error);
  });
}

TEST_CASE("schedules: the compressed hierarchical ring: one level is Algorithm 1's ring; a group size must divide N") {
  const std::size_t K = 16;
  const low_rank_layer layer(K, 3, K * 20 + 3, 17);
  const auto codec = fitted_codec(layer, 6);
  const std::vector<vec> x = rank_samples(layer, 6, 40);
  for (int g : {0, 1, 6}) {
    CAPTURE(g);
    std::vector<vec> hier = x, ring = x;
    run_workers(6, [&](inproc_endpoint& ep) {
      auto mine = codec;
      gradcomp::allreduce_linear(ep, mine, std::span<float>(hier[std::size_t(ep.rank())]),
                                 {.kind = schedule_kind::hierarchical, .group_size = g});
      gradcomp::ring_allreduce_linear(ep, mine, std::span<float>(ring[std::size_t(ep.rank())]));
    });
    for (int r = 0; r < 6; ++r) CHECK(bit_equal(hier[std::size_t(r)], ring[std::size_t(r)]));
  }
  std::vector<vec> bad = x;
  CHECK_THROWS_AS(run_workers(6, [&](inproc_endpoint& ep) {
    auto mine = codec;
    gradcomp::allreduce_linear(ep, mine, std::span<float>(bad[std::size_t(ep.rank())]),
                               {.kind = schedule_kind::hierarchical, .group_size = 4});
  }), gradcomp::invalid_argument_error);
  // dense_codec on it: the float sum within rounding, vectors shorter than the blocks included.
  for (std::size_t len : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(7), std::size_t(1001)}) {
    CAPTURE(len);
    const auto y = inputs(8, len, 5);
    std::vector<vec> dense = y;
    run_workers(8, [&](inproc_endpoint& ep) {
      gradcomp::dense_codec<> c;
      gradcomp::allreduce_linear(ep, c, std::span<float>(dense[std::size_t(ep.rank())]),
                                 {.kind = schedule_kind::hierarchical, .group_size = 4});
    });
    for (int r = 0; r < 8; ++r) CHECK(bit_equal(dense[std::size_t(r)], dense[0]));
    CHECK(max_rel(dense[0], exact_sum(y)) < 1e-5);
  }
}
