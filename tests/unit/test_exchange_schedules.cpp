// The cost model of schedules/cost_model.hpp (its formulas, its choices), the
// agreed choice (rank 0 decides, whatever the other ranks' models say), and
// the exchange's rounds on other schedules (exchange/schedule_collectives.hpp,
// exchange/auto_collectives.hpp): the same bits on every rank, the choices
// recorded, saved in the checkpoint and restored.
#include <doctest/doctest.h>

#include <gradcomp/model_exchange.hpp>
#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <support/equality.hpp>
#include <support/exchange_fixtures.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

namespace gx = gradcomp::exchange;
using gradcomp::cost_model;
using gradcomp::cost_problem;
using gradcomp::schedule_kind;
using gradcomp::test_support::bit_equal;
using gradcomp::transport::inproc_endpoint;
using gradcomp::transport::run_workers;

static_assert(gx::RoundCollectives<gx::rabenseifner_collectives<>, inproc_endpoint>);
static_assert(gx::RoundCollectives<gx::hierarchical_collectives<>, inproc_endpoint>);
static_assert(gx::RoundCollectives<gx::library_collectives<>, inproc_endpoint>);
static_assert(gx::RoundCollectives<gx::auto_collectives<>, inproc_endpoint>);

namespace {

cost_model plain_model(double alpha, double beta, double gamma) {
  cost_model m;
  m.inter = {alpha, beta};
  m.intra = m.inter;
  m.add_s = gamma;
  m.message_overhead_s = 0;
  m.chunk_elements = 0;  // no pipelining: the textbook formulas
  return m;
}

gx::model_description small_model() {
  gx::model_description m;
  m.add_conv("conv1", 8, 4, 3, 3).add_dense("conv1.bias", 8, 1).add_conv("conv2", 8, 8, 3, 3);
  m.add_dense("fc", 600).add_dense("fc.bias", 10, 1);
  return m;
}

std::vector<std::vector<float>> gradients(const gx::model_description& m, int rank, std::uint64_t step) {
  std::vector<std::vector<float>> g;
  std::uint64_t x = 0x9E3779B97F4A7C15ull * (std::uint64_t(rank) + 1) ^ (step * 0xBF58476D1CE4E5B9ull);
  auto next = [&x] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return float((x >> 40) & 0xFFFFFF) / float(1 << 24) - 0.5f;
  };
  for (const auto& l : m.layers()) {
    std::vector<float> v(l.shape.size());
    for (float& e : v) e = next();
    g.push_back(std::move(v));
  }
  return g;
}

gx::plan_options plan_opts() {
  gx::plan_options o = gradcomp::test_support::short_exchange_options(7);
  o.rules.fallback = gx::codec_kind::dense;
  return o;
}

// Runs `steps` exchange steps on n ranks with collectives made by make(); returns each rank's last gradients.
template <class Make>
std::vector<std::vector<std::vector<float>>> run_exchange(int n, int steps, Make make) {
  const auto m = small_model();
  std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(n));
  run_workers(n, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, gx::plan(m, plan_opts()), {}, make());
    for (int s = 0; s < steps; ++s) {
      auto g = gradients(m, ep.rank(), std::uint64_t(s));
      std::vector<std::span<float>> sp(g.begin(), g.end());
      const auto& st = ex.step(sp);
      CHECK_FALSE(st.skipped);
      if (s + 1 == steps) out[std::size_t(ep.rank())] = g;
    }
  });
  return out;
}

}  // namespace

TEST_CASE("cost model: the ring and Rabenseifner formulas, term by term") {
  const double a = 1e-5, b = 1e-9, g = 2e-9;
  const cost_model m = plain_model(a, b, g);
  cost_problem p{.elements = 1000, .ranks = 4};
  // Ring: 3 reduce-scatter hops of 250 floats (added), 3 all-gather hops.
  const double ring = 3 * (a + 1000 * b + 250 * g) + 3 * (a + 1000 * b);
  CHECK(gradcomp::predict_seconds(m, schedule_kind::ring, p) == doctest::Approx(ring).epsilon(1e-12));
  CHECK(gradcomp::predict_seconds(m, schedule_kind::pipelined_ring, p) == doctest::Approx(ring).epsilon(1e-12));
  // Rabenseifner, p = 4: halving 500 then 250 floats, doubling 250 then 500.
  const double rab = (a + 2000 * b + 500 * g) + (a + 1000 * b + 250 * g) + (a + 1000 * b) + (a + 2000 * b);
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p) == doctest::Approx(rab).epsilon(1e-12));
  // N = 5: the fold (whole vector, added) and the unfold come on top.
  p.ranks = 5;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p) ==
        doctest::Approx(rab + (a + 4000 * b + 1000 * g) + (a + 4000 * b)).epsilon(1e-12));
  // A codec: its wire ratio shrinks the bytes, its encode and decode are added once.
  cost_problem c{.elements = 1000, .ranks = 4, .wire_ratio = 0.25, .encode_s = 1e-8, .decode_s = 3e-8, .compressed = true};
  const double ring_c = 3 * (a + 250 * b + 62.5 * g) + 3 * (a + 250 * b) + 1000 * 4e-8;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::ring, c) == doctest::Approx(ring_c).epsilon(1e-12));
  CHECK(std::isinf(gradcomp::predict_seconds(m, schedule_kind::pipelined_ring, c)));
  CHECK(std::isinf(gradcomp::predict_seconds(m, schedule_kind::hierarchical, c)));
  CHECK(std::isinf(gradcomp::predict_seconds(m, schedule_kind::library, p)));  // never priced: forced only
}

TEST_CASE("cost model: pipelining hides the additions, groups price the slow link") {
  cost_model m = plain_model(1e-6, 1e-9, 1e-9);
  m.chunk_elements = 1000;
  m.message_overhead_s = 1e-7;
  const cost_problem p{.elements = 4000000, .ranks = 4};
  // Each hop: 1M floats = 4 MB (4 ms on the wire), 1 ms of additions, 1000 chunks.
  const double hop_rs = 1e-6 + 4e-3 + 1e-3 / 1000 + 999 * 1e-7, hop_ag = 1e-6 + 4e-3 + 999 * 1e-7;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::pipelined_ring, p) == doctest::Approx(3 * hop_rs + 3 * hop_ag));
  CHECK(gradcomp::predict_seconds(m, schedule_kind::pipelined_ring, p) < gradcomp::predict_seconds(m, schedule_kind::ring, p));
  // 8 ranks in groups of 4 under switches whose uplinks are 10x slower: hierarchical wins.
  cost_model h = plain_model(1e-5, 1e-9, 1e-10);
  h.intra = {1e-6, 1e-10};
  h.group_size = 4;
  const cost_problem q{.elements = 1 << 22, .ranks = 8};
  CHECK(gradcomp::predict(h, q).best == schedule_kind::hierarchical);
  h.group_size = 3;  // does not divide 8: not priced
  CHECK(std::isinf(gradcomp::predict_seconds(h, schedule_kind::hierarchical, q)));
}

TEST_CASE("cost model: Rabenseifner for small messages or many ranks, the ring for big messages at odd N") {
  const cost_model m = plain_model(50e-6, 8e-9, 0.5e-9);  // 1 Gbit/s, 50 us
  CHECK(gradcomp::predict(m, {.elements = 1000, .ranks = 16}).best == schedule_kind::rabenseifner);
  CHECK(gradcomp::predict(m, {.elements = 1000, .ranks = 5}).best == schedule_kind::rabenseifner);
  // 5 ranks, 64 MB: the fold sends the whole vector twice more than the ring.
  CHECK(gradcomp::predict(m, {.elements = 1 << 24, .ranks = 5}).best == schedule_kind::ring);
  CHECK(gradcomp::predict(m, {.elements = 100, .ranks = 1}).best == schedule_kind::ring);
}

TEST_CASE("agreement: rank 0 decides, every rank runs its choice whatever its own model says") {
  const int n = 4;
  std::vector<gradcomp::schedule_decision> got(n);
  run_workers(n, [&](inproc_endpoint& ep) {
    // Rank 0's model says latency is everything (Rabenseifner); the others' models
    // price a fast group link that would make them pick the hierarchical ring.
    cost_model m = ep.rank() == 0 ? plain_model(1e-3, 1e-12, 0) : plain_model(0, 1e-6, 1e-6);
    m.group_size = ep.rank() == 0 ? 0 : 2;
    if (ep.rank() != 0) m.intra = {0, 1e-12};  // the others would pick the hierarchical ring
    got[std::size_t(ep.rank())] = gradcomp::agree_schedule(ep, m, {.elements = 1 << 20, .ranks = n});
  });
  CHECK(got[0].kind == schedule_kind::rabenseifner);
  for (int r = 1; r < n; ++r) {
    CHECK(got[std::size_t(r)].kind == got[0].kind);
    CHECK(got[std::size_t(r)].predicted == got[0].predicted);
    CHECK_FALSE(got[std::size_t(r)].forced);
  }
  // A forced choice (rank 0's) wins over the model.
  run_workers(n, [&](inproc_endpoint& ep) {
    got[std::size_t(ep.rank())] = gradcomp::agree_schedule(ep, cost_model{}, {.elements = 10, .ranks = n},
                                                           schedule_kind::pipelined_ring);
  });
  for (int r = 0; r < n; ++r) {
    CHECK(got[std::size_t(r)].kind == schedule_kind::pipelined_ring);
    CHECK(got[std::size_t(r)].forced);
  }
}

TEST_CASE("agreement: calibration gives every rank rank 0's measured model") {
  for (int n : {1, 2, 5}) {
    std::vector<cost_model> got(static_cast<std::size_t>(n));
    run_workers(n, [&](inproc_endpoint& ep) { got[std::size_t(ep.rank())] = gradcomp::calibrate(ep); });
    CHECK(got[0].add_s > 0);
    CHECK(got[0].inter.latency_s > 0);
    for (int r = 1; r < n; ++r) {
      CHECK(got[std::size_t(r)].inter.latency_s == got[0].inter.latency_s);
      CHECK(got[std::size_t(r)].inter.seconds_per_byte == got[0].inter.seconds_per_byte);
      CHECK(got[std::size_t(r)].add_s == got[0].add_s);
    }
  }
}

TEST_CASE("exchange on other schedules: the same bits on every rank, close to the ring's result") {
  for (int n : {2, 3, 4, 5}) {
    CAPTURE(n);
    const auto ring = run_exchange(n, 8, [] { return gx::ring_collectives<>{}; });
    const auto rab = run_exchange(n, 8, [] { return gx::rabenseifner_collectives<>(64); });
    const auto hier = run_exchange(n, 8, [n] { return gx::hierarchical_collectives<>(n % 2 == 0 ? 2 : 0, 64); });
    const auto lib = run_exchange(n, 8, [] { return gx::library_collectives<>{}; });  // no library over inproc: Rabenseifner
    for (int r = 0; r < n; ++r)
      for (std::size_t l = 0; l < ring[0].size(); ++l) {
        CHECK(bit_equal(rab[std::size_t(r)][l], rab[0][l]));
        CHECK(bit_equal(hier[std::size_t(r)][l], hier[0][l]));
        CHECK(bit_equal(lib[std::size_t(r)][l], rab[0][l]));
        for (std::size_t i = 0; i < ring[0][l].size(); ++i) {
          CHECK(rab[0][l][i] == doctest::Approx(ring[0][l][i]).epsilon(1e-3));
          CHECK(hier[0][l][i] == doctest::Approx(ring[0][l][i]).epsilon(1e-3));
        }
      }
  }
}

TEST_CASE("step_stats::round_log: every round of a step, with its bucket, size and schedule") {
  const int n = 3;
  const auto m = small_model();
  auto run = [&](auto collectives, const char* sum_schedule) {
    run_workers(n, [&](inproc_endpoint& ep) {
      const gx::plan p(m, plan_opts());
      gx::model_exchange ex(ep, p, {}, collectives);
      for (std::uint64_t s = 0; s < 3; ++s) {
        auto g = gradients(m, ep.rank(), s);
        std::vector<std::span<float>> sp(g.begin(), g.end());
        const auto& st = ex.step(sp);
        REQUIRE_FALSE(st.round_log.empty());
        CHECK(st.round_log.size() == st.rounds);
        for (const auto& round : st.round_log) {
          CHECK(round.bucket < p.buckets().size());
          CHECK(round.size > 0);
          CHECK(round.schedule == (round.op == gx::round_op::sum ? sum_schedule : "all_gather"));
        }
      }
    });
  };
  run(gx::ring_collectives<>{}, "ring");
  run(gx::schedule_collectives<>({.kind = schedule_kind::direct}), "direct");
  run(gx::rabenseifner_collectives<>{}, "rabenseifner");
}

TEST_CASE("exchange with auto_collectives: agreed choices recorded, saved in the checkpoint, resumed bit for bit") {
  const int n = 4;
  const auto m = small_model();
  std::vector<std::vector<std::vector<float>>> straight(n), resumed(n);
  std::vector<std::vector<gx::round_schedule>> decisions(n);
  std::vector<std::vector<std::byte>> checkpoint(n);
  gx::auto_collectives_options opt;
  opt.model = plain_model(1e-3, 1e-9, 1e-9);  // latency-bound: Rabenseifner for every buffer
  opt.calibrate = false;
  auto run = [&](int from, int to, bool save, bool restore, auto& out) {
    run_workers(n, [&](inproc_endpoint& ep) {
      const auto r = std::size_t(ep.rank());
      gx::model_exchange ex(ep, gx::plan(m, plan_opts()), {}, gx::auto_collectives<>(opt));
      if (restore) ex.restore_state(checkpoint[r]);
      for (int s = from; s < to; ++s) {
        auto g = gradients(m, ep.rank(), std::uint64_t(s));
        std::vector<std::span<float>> sp(g.begin(), g.end());
        const auto& st = ex.step(sp);
        if (s + 1 == to) out[r] = g;
        // The step's statistics name each round's schedule: the agreed choice of its length and cells.
        CHECK_FALSE(st.round_log.empty());
        for (const auto& round : st.round_log) {
          if (round.op == gx::round_op::all_gather) {
            CHECK(round.schedule == "all_gather");
            continue;
          }
          const auto cells = round.op == gx::round_op::max ? gx::buffer_element::float32 : round.element;
          const auto& ds = ex.collectives().decisions();
          const auto d = std::find_if(ds.begin(), ds.end(), [&](const gx::round_schedule& x) { return x.length == round.size && x.element == cells; });
          REQUIRE(d != ds.end());
          CHECK(round.schedule == gradcomp::to_string(d->decision.kind));
        }
      }
      if (save) checkpoint[r] = ex.save_state();
      decisions[r] = ex.collectives().decisions();
      CHECK(ex.collectives().last_schedule().has_value());
    });
  };
  run(0, 8, false, false, straight);
  REQUIRE_FALSE(decisions[0].empty());
  for (const auto& d : decisions[0]) CHECK(d.decision.kind == schedule_kind::rabenseifner);
  for (int r = 1; r < n; ++r) {
    REQUIRE(decisions[std::size_t(r)].size() == decisions[0].size());
    for (std::size_t i = 0; i < decisions[0].size(); ++i) {
      CHECK(decisions[std::size_t(r)][i].length == decisions[0][i].length);
      CHECK(decisions[std::size_t(r)][i].decision.kind == decisions[0][i].decision.kind);
    }
  }
  const auto first = decisions[0];
  std::vector<std::vector<std::vector<float>>> half(n);
  run(0, 4, true, false, half);
  run(4, 8, false, true, resumed);
  for (int r = 0; r < n; ++r)
    for (std::size_t l = 0; l < m.size(); ++l) CHECK(bit_equal(resumed[std::size_t(r)][l], straight[std::size_t(r)][l]));
  CHECK(decisions[0].size() == first.size());  // restored: no new decision for the same buffers
  // A forced schedule is recorded as forced.
  opt.forced = schedule_kind::pipelined_ring;
  run(0, 2, false, false, half);
  for (const auto& d : decisions[0]) {
    CHECK(d.decision.kind == schedule_kind::pipelined_ring);
    CHECK(d.decision.forced);
  }
  // Corrupted collectives state: a state_error, nothing restored.
  run_workers(1, [&](inproc_endpoint& ep) {
    gx::auto_collectives<> c(opt);
    std::vector<std::byte> bad(12, std::byte{1});
    CHECK_THROWS_AS(c.restore_state(bad), gradcomp::state_error);
    (void)ep;
  });
}

TEST_CASE("exchange schedules: summable buffers of every element (payloads/summable.hpp) on every schedule") {
  static_assert(GRADCOMP_EXCHANGE_SUMMABLE == 1);
  for (int n : {2, 3, 5})
    for (auto e : {gx::buffer_element::float16, gx::buffer_element::bfloat16, gx::buffer_element::int32_words})
      for (auto kind : {schedule_kind::pipelined_ring, schedule_kind::rabenseifner, schedule_kind::hierarchical}) {
        CAPTURE(n);
        CAPTURE(static_cast<int>(e));
        CAPTURE(static_cast<int>(kind));
        const std::size_t len = 301;
        // Small integers: exact in every element type, so every order of summation gives the same values.
        auto cell = [&](int r, std::size_t i) {
          const std::uint32_t v = std::uint32_t((i * 7 + std::size_t(r) * 3) % 13);
          return e == gx::buffer_element::int32_words ? std::bit_cast<float>(v + 0xFFFFFFF0u) : float(v);
        };
        std::vector<std::vector<float>> x(static_cast<std::size_t>(n), std::vector<float>(len));
        for (int r = 0; r < n; ++r)
          for (std::size_t i = 0; i < len; ++i) x[std::size_t(r)][i] = cell(r, i);
        run_workers(n, [&](inproc_endpoint& ep) {
          gx::schedule_collectives<> c({.kind = kind, .chunk_elements = 50, .group_size = n % 2 == 0 ? 2 : 0});
          gx::wire_counters w;
          c.sum(ep, std::span<float>(x[std::size_t(ep.rank())]), e, gradcomp::tags::exchange.first, w);
        });
        for (std::size_t i = 0; i < len; ++i) {
          if (e == gx::buffer_element::int32_words) {
            std::uint32_t want = 0;
            for (int r = 0; r < n; ++r) want += std::bit_cast<std::uint32_t>(cell(r, i));
            CHECK(std::bit_cast<std::uint32_t>(x[0][i]) == want);
          } else {
            float want = 0;
            for (int r = 0; r < n; ++r) want += cell(r, i);
            CHECK(x[0][i] == want);
          }
          for (int r = 1; r < n; ++r) CHECK(std::bit_cast<std::uint32_t>(x[std::size_t(r)][i]) == std::bit_cast<std::uint32_t>(x[0][i]));
        }
      }
}

TEST_CASE("exchange schedules: float16 and bfloat16 cells travel packed, 2 bytes each, on every schedule, with the 4-byte wire's bits") {
  const schedule_kind kinds[] = {schedule_kind::ring,         schedule_kind::pipelined_ring, schedule_kind::rabenseifner,
                                 schedule_kind::hierarchical, schedule_kind::direct,         schedule_kind::library};
  const int tag = gradcomp::tags::exchange.first;
  int order_mattered = 0;  // cases where another order than the ring's gave other bits: the inputs round
  for (int n = 1; n <= 8; ++n)
    for (auto e : {gx::buffer_element::float16, gx::buffer_element::bfloat16})
      for (std::size_t len : {std::size_t(1), std::size_t(7), std::size_t(301), std::size_t(1001)})
        for (auto kind : kinds)
          for (std::size_t chunk : {std::size_t(0), std::size_t(50)}) {
            CAPTURE(n);
            CAPTURE(static_cast<int>(e));
            CAPTURE(len);
            CAPTURE(gradcomp::to_string(kind));
            CAPTURE(chunk);
            // Values of the element type over several binades, so that the sums round (and
            // their order matters); cell 0 saturates float16 (65504) from 2 ranks on.
            std::vector<std::vector<float>> x(static_cast<std::size_t>(n), std::vector<float>(len));
            std::uint64_t seed = 0x243F6A8885A308D3ull ^ (std::uint64_t(n) << 32) ^ len;
            for (int r = 0; r < n; ++r) {
              auto& v = x[std::size_t(r)];
              for (std::size_t i = 0; i < len; ++i) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                const float u = float((seed >> 40) & 0xFFFFFF) / float(1 << 24) - 0.5f;
                v[i] = std::ldexp(u, int(i % 9) - 2);
              }
              v[0] = 40000.0f;
              gradcomp::summable::round_cells(e, v);
            }
            gradcomp::schedule_options so{.kind = kind, .chunk_elements = chunk};
            so.group_size = n == 6 ? 3 : (n % 2 == 0 && n > 2 ? 2 : 0);
            auto packed = x, copy_face = x, wide = x, ring = x;
            std::vector<std::vector<float>> f32 = x;
            const std::size_t nn = static_cast<std::size_t>(n);
            std::vector<std::uint64_t> sent_packed(nn), sent_copy_face(nn), sent_wide(nn), sent_f32(nn), counted(nn);
            run_workers(n, [&](inproc_endpoint& ep) {
              const std::size_t r = static_cast<std::size_t>(ep.rank());
              gx::schedule_collectives<> c(so);
              // The exchange's sum of the 16-bit buffer: packed cells.
              gx::wire_counters w;
              std::uint64_t b = ep.bytes_sent();
              c.sum(ep, std::span<float>(packed[r]), e, tag, w);
              sent_packed[r] = ep.bytes_sent() - b;
              counted[r] = w.bytes_sent;
              // The same over the zero-copy face (the MPI path: receives into buffers, sends of views).
              auto z = ep.zero_copy();
              gx::wire_counters wz;
              b = ep.bytes_sent();
              c.sum(z, std::span<float>(copy_face[r]), e, tag + 2, wz);
              sent_copy_face[r] = ep.bytes_sent() - b;
              // The previous wire: the same schedule and additions with 4-byte cells (an addition
              // that declares no element), as element_adder ran before cells were packed.
              auto wide_add = [e](std::span<float> acc, std::span<const float> in) { gradcomp::summable::add_into(e, acc, in); };
              gradcomp::schedule_options o = so;
              o.kind = kind == schedule_kind::library ? schedule_kind::rabenseifner : kind;  // inproc has no library
              o.tag_base = tag + 4;
              o.tag_owner = gradcomp::tags::exchange;
              b = ep.bytes_sent();
              gradcomp::detail::allreduce_with<gradcomp::execution::seq>(ep, std::span<float>(wide[r]), o, wide_add);
              sent_wide[r] = ep.bytes_sent() - b;
              // A float32 buffer of the same length on the same collectives.
              gx::wire_counters w32;
              b = ep.bytes_sent();
              c.sum(ep, std::span<float>(f32[r]), gx::buffer_element::float32, tag + 6, w32);
              sent_f32[r] = ep.bytes_sent() - b;
              // The ring of ring/summable.hpp (2-byte cells, the ring's order).
              gradcomp::ring_allreduce_summable(ep, std::span<float>(ring[r]), e);
            });
            const bool ring_order = kind == schedule_kind::ring || kind == schedule_kind::pipelined_ring;
            for (std::size_t r = 0; r < nn; ++r) {
              CHECK(bit_equal(packed[r], wide[0]));
              CHECK(bit_equal(copy_face[r], wide[0]));
              if (ring_order) CHECK(bit_equal(packed[r], ring[0]));
              if (!ring_order && r == 0 && !bit_equal(packed[0], ring[0])) ++order_mattered;
              CHECK(counted[r] == sent_packed[r]);
              CHECK(sent_copy_face[r] == sent_packed[r]);
              CHECK(2 * sent_packed[r] == sent_wide[r]);
              CHECK(2 * sent_packed[r] == sent_f32[r]);
            }
            if (e == gx::buffer_element::float16 && n > 1) CHECK(packed[0][0] == 65504.0f);
            if (n > 1 && len > 1) CHECK(sent_packed[0] > 0);
          }
  CHECK(order_mattered > 0);
}

TEST_CASE("exchange schedules: max rounds run on every schedule, with max_round's bits on every rank") {
  const schedule_kind kinds[] = {schedule_kind::ring,         schedule_kind::pipelined_ring, schedule_kind::rabenseifner,
                                 schedule_kind::hierarchical, schedule_kind::direct,         schedule_kind::library};
  const int tag = gradcomp::tags::exchange.first;
  for (int n = 1; n <= 8; ++n)
    for (auto e : {gx::buffer_element::float32, gx::buffer_element::float16, gx::buffer_element::bfloat16})
      for (std::size_t len : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(1001)})
        for (auto kind : kinds) {
          CAPTURE(n);
          CAPTURE(static_cast<int>(e));
          CAPTURE(len);
          CAPTURE(std::string(gradcomp::to_string(kind)));
          // Values over several binades, not rounded to the element (the round does it), no zeros
          // (the sign of a max of +0 and -0 depends on the order); a NaN from the last rank at cell 3.
          std::vector<std::vector<float>> x(static_cast<std::size_t>(n), std::vector<float>(len));
          std::uint64_t seed = 0x13198A2E03707344ull ^ (std::uint64_t(n) << 32) ^ len;
          for (int r = 0; r < n; ++r)
            for (std::size_t i = 0; i < len; ++i) {
              seed = seed * 6364136223846793005ull + 1442695040888963407ull;
              const float u = float((seed >> 40) & 0xFFFFFF) / float(1 << 24) - 0.5f;
              x[std::size_t(r)][i] = std::ldexp(u == 0.0f ? 0.25f : u, int(i % 9) - 2);
            }
          if (len > 3) x[std::size_t(n - 1)][3] = std::numeric_limits<float>::quiet_NaN();
          gradcomp::schedule_options so{.kind = kind, .chunk_elements = 50};
          so.group_size = n == 6 ? 3 : (n % 2 == 0 && n > 2 ? 2 : 0);
          auto on_schedule = x, reference = x;
          const std::size_t nn = static_cast<std::size_t>(n);
          std::vector<std::uint64_t> sent(nn), counted(nn), sent_all_gather(nn);
          run_workers(n, [&](inproc_endpoint& ep) {
            const std::size_t r = static_cast<std::size_t>(ep.rank());
            gx::schedule_collectives<> c(so);
            gx::wire_counters w;
            std::uint64_t b = ep.bytes_sent();
            c.max(ep, std::span<float>(on_schedule[r]), e, tag, w);
            sent[r] = ep.bytes_sent() - b;
            counted[r] = w.bytes_sent;
            // The ring collectives' max: an all-gather of the (packed) cells, then the max in rank order.
            gx::ring_collectives<> ring;
            gx::wire_counters wr;
            b = ep.bytes_sent();
            ring.max(ep, std::span<float>(reference[r]), e, tag + 2, wr);
            sent_all_gather[r] = ep.bytes_sent() - b;
          });
          for (std::size_t r = 0; r < nn; ++r) {
            CHECK(bit_equal(on_schedule[r], on_schedule[0]));
            CHECK(counted[r] == sent[r]);
          }
          for (std::size_t i = 0; i < len; ++i) {
            if (i == 3 && len > 3) {
              CHECK(std::isnan(on_schedule[0][i]));
              continue;
            }
            CHECK(std::bit_cast<std::uint32_t>(on_schedule[0][i]) == std::bit_cast<std::uint32_t>(reference[0][i]));
          }
          // Eight ranks: every schedule moves 2 (N-1)/N of the buffer in 4-byte cells, the all-gather
          // N-1 times it in the element's cells (2 bytes for the 16-bit ones).
          if (n == 8 && len == 1001) {
            const std::uint64_t cells = 2 * 7 * 1001 / 8;
            CHECK(sent[0] >= 4 * cells);
            CHECK(sent_all_gather[0] == 7 * 1001 * gx::element_bytes(e));
            CHECK((e == gx::buffer_element::float32 ? 2 : 1) * sent[0] < sent_all_gather[0]);
          }
        }
}

TEST_CASE("exchange schedules: a max round of int32_words is an invalid_argument_error on every schedule, before any message") {
  for (auto kind : {schedule_kind::ring, schedule_kind::rabenseifner, schedule_kind::direct, schedule_kind::library})
    run_workers(3, [&](inproc_endpoint& ep) {
      gx::schedule_collectives<> c({.kind = kind});
      std::vector<float> v(10, 1.0f);
      gx::wire_counters w;
      CHECK_THROWS_AS(c.max(ep, std::span<float>(v), gx::buffer_element::int32_words, gradcomp::tags::exchange.first, w),
                      gradcomp::invalid_argument_error);
      CHECK(ep.bytes_sent() == 0);
    });
}

TEST_CASE("auto_collectives: a max round takes the agreed schedule of its length, recorded like a sum's") {
  const int n = 4;
  std::vector<std::vector<float>> x(n, std::vector<float>(4096));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < x[0].size(); ++i) x[std::size_t(r)][i] = float((i * 31 + std::size_t(r) * 7) % 101) + 1.0f;
  std::vector<std::vector<gx::round_schedule>> seen(n);
  run_workers(n, [&](inproc_endpoint& ep) {
    gx::auto_collectives_options o;
    o.calibrate = false;
    o.forced = schedule_kind::rabenseifner;
    gx::auto_collectives<> c(o);
    gx::wire_counters w;
    c.max(ep, std::span<float>(x[std::size_t(ep.rank())]), gx::buffer_element::float16, gradcomp::tags::exchange.first, w);
    seen[std::size_t(ep.rank())] = c.decisions();
    CHECK(c.last_schedule() == schedule_kind::rabenseifner);
    // Rabenseifner's 2 (N-1)/N of 4096 four-byte cells, not the all-gather's (N-1) x 4096 two-byte ones.
    CHECK(w.bytes_sent == 2 * 3 * 1024 * 4);
  });
  for (std::size_t i = 0; i < x[0].size(); ++i) {
    float want = 0;
    for (int r = 0; r < n; ++r) want = std::max(want, x[std::size_t(r)][i]);
    for (int r = 0; r < n; ++r) CHECK(x[std::size_t(r)][i] == want);  // small integers: exact in float16
  }
  for (int r = 0; r < n; ++r) {
    REQUIRE(seen[std::size_t(r)].size() == 1);
    CHECK(seen[std::size_t(r)][0].length == 4096);
    CHECK(seen[std::size_t(r)][0].element == gx::buffer_element::float32);  // the cells the schedule moves
    CHECK(seen[std::size_t(r)][0].decision.forced);
  }
}

TEST_CASE("cost model: 16-bit cells put half the bytes on the wire") {
  cost_model m = plain_model(10e-6, 1e-9, 0.0);
  cost_problem p32;
  p32.elements = 1 << 20;
  p32.ranks = 4;
  cost_problem p16 = p32;
  p16.cell_bytes = 2.0;
  for (auto kind : {schedule_kind::ring, schedule_kind::rabenseifner}) {
    const double latency = kind == schedule_kind::ring ? 6 * 10e-6 : 4 * 10e-6;
    const double t32 = gradcomp::predict_seconds(m, kind, p32), t16 = gradcomp::predict_seconds(m, kind, p16);
    CHECK(t16 - latency == doctest::Approx((t32 - latency) / 2).epsilon(1e-9));
  }
}

TEST_CASE("auto_collectives: a version-1 state (before schedule_kind::direct) still restores, direct unpriced") {
  const int n = 2;
  const auto m = small_model();
  gx::auto_collectives_options opt;
  opt.model = plain_model(1e-3, 1e-9, 1e-9);
  opt.calibrate = false;
  std::vector<std::byte> v2;
  std::vector<gx::round_schedule> saved;
  run_workers(n, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, gx::plan(m, plan_opts()), {}, gx::auto_collectives<>(opt));
    auto g = gradients(m, ep.rank(), 0);
    std::vector<std::span<float>> sp(g.begin(), g.end());
    ex.step(sp);
    if (ep.rank() == 0) {
      v2 = ex.collectives().save_state();
      saved = ex.collectives().decisions();
    }
  });
  REQUIRE_FALSE(saved.empty());
  // The same state as version 1 wrote it: no message_s, five predictions per entry.
  const std::size_t head = 8 + 7 * 8 + 4 * 8, entry = 8 + 3 + 8 * gradcomp::schedule_kind_count;
  REQUIRE(v2.size() == head + saved.size() * entry);
  std::vector<std::byte> v1(v2.begin(), v2.begin() + std::ptrdiff_t(8 + 6 * 8));  // magic, version, 6 doubles
  v1.insert(v1.end(), v2.begin() + std::ptrdiff_t(8 + 7 * 8), v2.begin() + std::ptrdiff_t(head));
  const std::uint32_t one = 1;
  std::memcpy(v1.data() + 4, &one, 4);
  for (std::size_t i = 0; i < saved.size(); ++i) {
    const auto* e = v2.data() + head + i * entry;
    v1.insert(v1.end(), e, e + entry - 8);  // drop the direct schedule's prediction (the last)
  }
  gx::auto_collectives<> c(opt);
  c.restore_state(v1);
  const auto& got = c.decisions();
  REQUIRE(got.size() == saved.size());
  for (std::size_t i = 0; i < saved.size(); ++i) {
    CHECK(got[i].length == saved[i].length);
    CHECK(got[i].decision.kind == saved[i].decision.kind);
    CHECK(std::isinf(got[i].decision.predicted[std::size_t(schedule_kind::direct)]));
    CHECK(got[i].decision.predicted[0] == saved[i].decision.predicted[0]);
  }
  CHECK(c.model().message_s == 0.0);
  // Version 2: version 1's head with six predictions per entry.
  std::vector<std::byte> two(v1.begin(), v1.begin() + std::ptrdiff_t(8 + 6 * 8 + 4 * 8));
  const std::uint32_t version2 = 2;
  std::memcpy(two.data() + 4, &version2, 4);
  two.insert(two.end(), v2.begin() + std::ptrdiff_t(head), v2.end());
  gx::auto_collectives<> c2(opt);
  c2.restore_state(two);
  REQUIRE(c2.decisions().size() == saved.size());
  CHECK(c2.decisions()[0].decision.predicted == saved[0].decision.predicted);
  // Truncated current bytes are refused.
  std::vector<std::byte> cut(v2.begin(), v2.end() - 1);
  gx::auto_collectives<> d(opt);
  CHECK_THROWS_AS(d.restore_state(cut), gradcomp::state_error);
}

TEST_CASE("auto_collectives: the model's message_s is saved and restored") {
  gx::auto_collectives_options opt;
  opt.model = plain_model(1e-3, 1e-9, 1e-9);
  opt.model.message_s = 7.5e-6;
  opt.calibrate = false;
  gx::auto_collectives<> a(opt);
  gx::auto_collectives_options zero = opt;
  zero.model.message_s = 0;
  gx::auto_collectives<> b(zero);
  b.restore_state(a.save_state());
  CHECK(b.model().message_s == 7.5e-6);
}

TEST_CASE("cost model: message_s is paid per message, 2(N-1)k for direct and k per Rabenseifner hop") {
  cost_model m = plain_model(20e-6, 8e-11, 0.5e-9);  // 100 Gbit/s, 20 us
  m.price_direct = true;
  m.chunk_elements = 32768;
  const cost_problem p{.elements = 262144, .ranks = 64};
  const double direct0 = gradcomp::predict_seconds(m, schedule_kind::direct, p);
  const double rab0 = gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p);
  const double ring0 = gradcomp::predict_seconds(m, schedule_kind::ring, p);
  m.message_s = 10e-6;
  // 4096 floats per peer: one chunk, 2 x 63 messages
  CHECK(gradcomp::predict_seconds(m, schedule_kind::direct, p) == doctest::Approx(direct0 + 126 * 10e-6).epsilon(1e-12));
  // 6 halving and 6 doubling hops; the two largest parts (131072 and 65536 floats) go as 4 and 2
  // chunks of 32768: 2 x (4 + 2 + 1 + 1 + 1 + 1) = 20 messages
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p) == doctest::Approx(rab0 + 20 * 10e-6).epsilon(1e-12));
  CHECK(gradcomp::predict_seconds(m, schedule_kind::ring, p) == doctest::Approx(ring0 + 126 * 10e-6).epsilon(1e-12));
  // with 10 us a message, direct's 126 messages cost more than Rabenseifner's log-depth hops
  CHECK(gradcomp::predict(m, p).best == schedule_kind::rabenseifner);
  // a measured message_s replaces the chunks' message_overhead_s: never both
  m.message_overhead_s = 5e-6;
  CHECK(gradcomp::predict_seconds(m, schedule_kind::rabenseifner, p) == doctest::Approx(rab0 + 20 * 10e-6).epsilon(1e-12));
  CHECK(gradcomp::predict_seconds(m, schedule_kind::direct, p) == doctest::Approx(direct0 + 126 * 10e-6).epsilon(1e-12));
  m.message_overhead_s = 0;
  m.message_s = 0;
  CHECK(gradcomp::predict(m, p).best == schedule_kind::direct);
}

TEST_CASE("measure_message_seconds: one value on every rank, from bursts in pairs (odd N: the last idles)") {
  for (int n : {1, 2, 3, 4, 5}) {
    std::vector<double> got(std::size_t(n), -1.0);
    std::vector<double> zero_copy(std::size_t(n), -1.0);
    run_workers(n, [&](inproc_endpoint& ep) {
      got[std::size_t(ep.rank())] = gradcomp::measure_message_seconds(ep, 16, 2);
      auto z = ep.zero_copy();  // the isend_view / irecv_into face the schedules use
      zero_copy[std::size_t(ep.rank())] = gradcomp::measure_message_seconds(z, 16, 2);
    });
    for (std::size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i] >= 0.0);
      CHECK(got[i] == got[0]);
      CHECK(zero_copy[i] >= 0.0);
      CHECK(zero_copy[i] == zero_copy[0]);
    }
    if (n == 1) CHECK(got[0] == 0.0);
  }
}
