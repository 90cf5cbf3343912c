// The whole-model exchange: plan rules and buckets, the transport-free bucket
// layer driven by hand, the exchange over inproc (2-4 ranks), agreed failures,
// checkpoints (stop at step k, resume, bit-identical) and statistics.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include <gradcomp/model_exchange.hpp>
#include <gradcomp/transport/fault_injection.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <support/equality.hpp>
#include <support/exchange_fixtures.hpp>

namespace gx = gradcomp::exchange;
using gradcomp::layer_shape;
using gradcomp::test_support::bit_equal;
using gradcomp::transport::inproc_endpoint;

namespace {

/// A small model: two conv layers, a conv bias, a fully connected weight and its bias.
gx::model_description small_model() {
  gx::model_description m;
  m.add_conv("conv1", 8, 4, 3, 3).add_dense("conv1.bias", 8, 1).add_conv("conv2", 8, 8, 3, 3);
  m.add_dense("fc", 600).add_dense("fc.bias", 10, 1);
  return m;
}

/// Options with a short GradiVeQ schedule (warm-up 2, L_t 3, L_c 3).
gx::plan_options short_options(gx::codec_kind rest = gx::codec_kind::dense) {
  gx::plan_options o = gradcomp::test_support::short_exchange_options(7);
  o.rules.fallback = rest;
  return o;
}

/// Deterministic gradients of (rank, step): low-rank structure plus noise.
std::vector<std::vector<float>> gradients(const gx::model_description& m, int rank, std::uint64_t step) {
  return gradcomp::test_support::exchange_gradients(m, rank, step);
}

std::vector<std::span<float>> spans(std::vector<std::vector<float>>& g) {
  return {g.begin(), g.end()};
}

/// One step of `layers` (one per rank, in one thread) on g[rank]; the sums in
/// rank order, the all-gathers in rank order; the outputs in `out`.
void drive_step(std::vector<gx::bucket_layer<>>& layers, const std::vector<std::vector<std::vector<float>>>& g,
                std::vector<std::vector<std::vector<float>>>& out) {
  for (std::size_t r = 0; r < layers.size(); ++r) {
    std::vector<std::span<const float>> in(g[r].begin(), g[r].end());
    layers[r].begin_step(in);
  }
  for (;;) {
    std::vector<gx::pending_round*> rs;
    for (auto& l : layers) rs.push_back(l.next_round());
    if (!rs[0]) break;
    if (rs[0]->spec.op == gx::round_op::all_gather) {
      std::vector<std::vector<std::byte>> all;
      for (auto* r : rs) all.push_back(r->payload);
      for (auto& l : layers) l.complete_round(all);
    } else {
      REQUIRE(rs[0]->spec.op == gx::round_op::sum);
      std::vector<float> sum(rs[0]->buffer.size(), 0.0f);
      for (auto* r : rs)
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += r->buffer[i];
      for (auto* r : rs) std::copy(sum.begin(), sum.end(), r->buffer.begin());
      for (auto& l : layers) l.complete_round();
    }
  }
  out = g;
  for (std::size_t r = 0; r < layers.size(); ++r) {
    auto s = spans(out[r]);
    REQUIRE_FALSE(layers[r].finish_step(s).skipped);
  }
}

}  // namespace

TEST_CASE("plan: rules pick codecs, explicit choices win, small layers of one codec share buckets") {
  auto o = short_options(gx::codec_kind::two_bit);
  o.rules.explicit_choices = {{"conv2", gx::codec_kind::top_k}};
  gx::plan p(small_model(), o);
  CHECK(p.kind(0) == gx::codec_kind::gradiveq);
  CHECK(p.kind(1) == gx::codec_kind::dense);  // 1-D bias
  CHECK(p.kind(2) == gx::codec_kind::top_k);  // explicit
  CHECK(p.kind(3) == gx::codec_kind::two_bit);
  CHECK(p.kind(4) == gx::codec_kind::dense);  // 1-D, small
  // conv1.bias and fc.bias are fused into one dense bucket.
  std::size_t dense_buckets = 0;
  for (const auto& b : p.buckets())
    if (b.kind == gx::codec_kind::dense) {
      ++dense_buckets;
      CHECK(b.layers == std::vector<std::size_t>{1, 4});
    }
  CHECK(dense_buckets == 1);
  // Bucket size is respected: with 64-byte buckets every layer is alone.
  auto tiny = o;
  tiny.bucket_bytes = 64;
  gx::plan q(small_model(), tiny);
  CHECK(q.buckets().size() == 5);
  CHECK(q.fingerprint() != p.fingerprint());
  CHECK_THROWS_AS(gx::plan(small_model(), [&] {
                    auto bad = o;
                    bad.rules.explicit_choices = {{"nope", gx::codec_kind::dense}};
                    return bad;
                  }()),
                  gradcomp::layout_error);
}

TEST_CASE("bucket layer: a framework drives the rounds with its own collectives") {
  // Three ranks in one thread; the "framework" sums buffers in rank order and gathers payloads.
  const int n = 3;
  auto o = short_options(gx::codec_kind::qsgd);
  std::vector<gx::bucket_layer<>> layers;
  for (int r = 0; r < n; ++r) layers.emplace_back(gx::plan(small_model(), o), r, n);
  const auto m = small_model();
  for (std::uint64_t step = 0; step < 9; ++step) {
    std::vector<std::vector<std::vector<float>>> g(n), out;
    for (int r = 0; r < n; ++r) g[std::size_t(r)] = gradients(m, r, step);
    drive_step(layers, g, out);
    for (int r = 1; r < n; ++r)
      for (std::size_t i = 0; i < m.size(); ++i) CHECK(bit_equal(out[std::size_t(r)][i], out[0][i]));
    // Dense layers (the biases) are the exact mean.
    for (std::size_t i : {std::size_t(1), std::size_t(4)})
      for (std::size_t k = 0; k < m[i].shape.size(); ++k) {
        float sum = 0.0f;
        for (int r = 0; r < n; ++r) sum += g[std::size_t(r)][i][k];
        CHECK(out[0][i][k] == doctest::Approx(sum / n).epsilon(1e-5));
      }
  }
  CHECK(layers[0].schedule().phase() == gradcomp::gradiveq_phase::sampling);  // 2 + 3 + 3 steps, a second cycle
  CHECK(layers[0].schedule().cycle() == 2);
}


TEST_CASE("bucket layer: deferred fits (defer_fits): one rank fits, the others adopt its bases bit for bit") {
  const int n = 3;
  const auto m = small_model();
  for (const bool feedback : {false, true}) {
    CAPTURE(feedback);
    auto o = short_options();
    o.gradiveq_schedule.error_feedback = feedback;
    gx::bucket_layer_options deferred;
    deferred.defer_fits = true;
    std::vector<gx::bucket_layer<>> replicated, shared;
    for (int r = 0; r < n; ++r) {
      replicated.emplace_back(gx::plan(m, o), r, n);
      shared.emplace_back(gx::plan(m, o), r, n, deferred);
    }
    std::size_t fits = 0;
    for (std::uint64_t step = 0; step < 15; ++step) {
      std::vector<std::vector<std::vector<float>>> g(n), a, b;
      for (int r = 0; r < n; ++r) g[std::size_t(r)] = gradients(m, r, step);
      drive_step(replicated, g, a);
      drive_step(shared, g, b);
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < m.size(); ++i) CHECK(bit_equal(a[std::size_t(r)][i], b[std::size_t(r)][i]));
      CHECK_FALSE(replicated[0].fit_pending());
      if (shared[0].fit_pending()) {
        for (auto& l : shared) {
          CHECK(l.fit_pending());
          CHECK(l.fit_work() == shared[0].fit_work());  // every rank balances alike
          CHECK(l.fit_work() > 0.0);
          CHECK_THROWS_AS(l.save_state(), gradcomp::state_error);
        }
        std::vector<std::span<const float>> in(g[0].begin(), g[0].end());
        CHECK_THROWS_AS(shared[0].begin_step(in), gradcomp::state_error);  // the fit first
        const int owner = static_cast<int>(fits % n);  // a different rank fits each time
        const auto bases = shared[std::size_t(owner)].fit_bases();
        CHECK_THROWS_AS(shared[std::size_t(owner)].fit_bases(), gradcomp::state_error);  // done
        for (int r = 0; r < n; ++r) {
          if (r == owner) continue;
          auto& l = shared[std::size_t(r)];
          auto damaged = bases;
          damaged.resize(damaged.size() / 2);
          CHECK_THROWS_AS(l.adopt_bases(damaged), gradcomp::wire::wire_error);
          CHECK(l.fit_pending());
          l.adopt_bases(bases);
          CHECK_FALSE(l.fit_pending());
          CHECK_THROWS_AS(l.adopt_bases(bases), gradcomp::state_error);  // no fit pending any more
        }
        ++fits;
      }
      for (int r = 0; r < n; ++r) {
        const auto x = replicated[std::size_t(r)].save_state();
        const auto y = shared[std::size_t(r)].save_state();
        CHECK(x == y);  // the same checkpoint, byte for byte
      }
    }
    CHECK(fits == 2);  // warm-up 2, L_t 3, L_c 3: fits after steps 5 and 11
  }
}

TEST_CASE("bucket layer: adopt_bases refuses another layer's, another step's and another plan's bases") {
  const int n = 2;
  const auto m = small_model();
  auto o = short_options();
  gx::bucket_layer_options deferred;
  deferred.defer_fits = true;
  std::vector<gx::bucket_layer<>> shared;
  for (int r = 0; r < n; ++r) shared.emplace_back(gx::plan(m, o), r, n, deferred);
  auto other_lambda = o;
  other_lambda.gradiveq.lambda = 0.2;
  std::vector<gx::bucket_layer<>> other;
  for (int r = 0; r < n; ++r) other.emplace_back(gx::plan(m, other_lambda), r, n, deferred);
  std::vector<std::vector<std::byte>> first_fit;
  for (std::uint64_t step = 0; step < 12; ++step) {
    std::vector<std::vector<std::vector<float>>> g(n), out;
    for (int r = 0; r < n; ++r) g[std::size_t(r)] = gradients(m, r, step);
    drive_step(shared, g, out);
    drive_step(other, g, out);
    if (!shared[0].fit_pending()) continue;
    const auto bases = shared[0].fit_bases();
    const auto foreign = other[0].fit_bases();
    other[1].adopt_bases(foreign);
    auto& l = shared[1];
    CHECK_THROWS_AS(l.adopt_bases(foreign), gradcomp::state_error);  // another lambda: option_mismatch_error
    if (!first_fit.empty()) {
      CHECK_THROWS_WITH_AS(l.adopt_bases(first_fit.front()), doctest::Contains("expects fit 2"), gradcomp::state_error);
    }
    CHECK(l.fit_pending());  // nothing changed
    l.adopt_bases(bases);
    first_fit.push_back(bases);
  }
  CHECK(first_fit.size() == 2);
  // A layer without deferred fits never has one pending.
  gx::bucket_layer<> plain(gx::plan(m, o), 0, n);
  CHECK_FALSE(plain.fit_pending());
  CHECK_THROWS_AS(plain.fit_bases(), gradcomp::state_error);
  CHECK_THROWS_AS(plain.adopt_bases(first_fit.front()), gradcomp::state_error);
}

TEST_CASE("model_exchange over inproc: every codec, 2-4 ranks, identical results and statistics") {
  for (int n : {2, 3, 4}) {
    for (auto rest : {gx::codec_kind::dense, gx::codec_kind::two_bit, gx::codec_kind::qsgd, gx::codec_kind::top_k}) {
      CAPTURE(n);
      CAPTURE(gx::to_string(rest));
      const auto m = small_model();
      std::vector<std::vector<std::vector<float>>> results(static_cast<std::size_t>(n));
      std::vector<gx::step_stats> last(static_cast<std::size_t>(n));
      gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
        gx::model_exchange ex(ep, gx::plan(m, short_options(rest)));
        for (std::uint64_t step = 0; step < 8; ++step) {
          auto g = gradients(m, ep.rank(), step);
          const auto& st = ex.step(spans(g));
          if (step == 7) {
            results[std::size_t(ep.rank())] = g;
            last[std::size_t(ep.rank())] = st;
          }
        }
      });
      for (int r = 1; r < n; ++r)
        for (std::size_t i = 0; i < m.size(); ++i) CHECK(bit_equal(results[std::size_t(r)][i], results[0][i]));
      const auto& st = last[0];
      CHECK_FALSE(st.skipped);
      CHECK(st.step == 8);
      // Step 7 is the third compressed step of GradiVeQ's first cycle.
      bool compressed = false;
      for (const auto& ph : st.bucket_phase) compressed |= ph == "gradiveq:compressed";
      CHECK(compressed);
      CHECK(st.layer_bytes[0] < 4 * m[0].shape.size());  // conv1 compressed
      CHECK(st.layer_bytes[1] == 4 * m[1].shape.size());  // dense bias
      CHECK(st.wire.bytes_sent > 0);
      CHECK(st.wire.messages_sent >= 2 * std::size_t(n - 1));
      CHECK(st.rounds == st.bucket_bytes.size());  // one round per bucket
      CHECK(st.encode_seconds >= 0.0);
      CHECK(st.wire.wire_seconds > 0.0);
    }
  }
}

TEST_CASE("model_exchange: a non-finite gradient on one rank is agreed in the same step (skip and throw)") {
  const int n = 4;
  const auto m = small_model();
  SUBCASE("skip: every rank skips, names rank 2 and the layer, and the state is as before") {
    std::vector<gx::step_stats> seen(n);
    std::vector<int> same_state(n, 0);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, gx::plan(m, short_options(gx::codec_kind::two_bit)));
      auto g0 = gradients(m, ep.rank(), 0);
      ex.step(spans(g0));
      const auto before = ex.save_state();
      auto g = gradients(m, ep.rank(), 1);
      if (ep.rank() == 2) g[3][17] = std::numeric_limits<float>::quiet_NaN();
      const auto copy = g;
      seen[std::size_t(ep.rank())] = ex.step(spans(g));
      same_state[std::size_t(ep.rank())] = ex.save_state() == before && (ep.rank() == 2 || g == copy);
    });
    for (int r = 0; r < n; ++r) {
      CHECK(seen[std::size_t(r)].skipped);
      REQUIRE(seen[std::size_t(r)].failures.size() == 1);
      CHECK(seen[std::size_t(r)].failures[0].rank == 2);
      CHECK(seen[std::size_t(r)].failures[0].reason == gx::failure_reason::non_finite_gradient);
      CHECK(seen[std::size_t(r)].failures[0].layer == 3);
      CHECK(same_state[std::size_t(r)] == 1);
    }
  }
  SUBCASE("throw: every rank throws the same typed error within 1 s, never the transport timeout") {
    std::vector<std::string> messages(n);
    std::vector<double> ms(n, 1e9);
    gradcomp::transport::inproc_options io;
    io.recv_timeout = std::chrono::seconds(120);
    gradcomp::transport::run_workers(
        n,
        [&](inproc_endpoint& ep) {
          gx::exchange_options eo;
          eo.on_failure = gx::failure_policy::throw_error;
          gx::model_exchange ex(ep, gx::plan(m, short_options(gx::codec_kind::qsgd)), eo);
          auto g = gradients(m, ep.rank(), 0);
          if (ep.rank() == 1) g[0][5] = std::numeric_limits<float>::infinity();
          const auto t0 = std::chrono::steady_clock::now();
          try {
            ex.step(spans(g));
          } catch (const gx::exchange_failure_error& e) {
            messages[std::size_t(ep.rank())] = e.what();
            CHECK(e.rank() == 1);
            CHECK(e.reason() == gx::failure_reason::non_finite_gradient);
          }
          ms[std::size_t(ep.rank())] =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        },
        io);
    for (int r = 0; r < n; ++r) {
      CHECK(messages[std::size_t(r)] == messages[0]);
      CHECK(ms[std::size_t(r)] < 1000.0);
    }
    CHECK(messages[0].find("rank 1") != std::string::npos);
    CHECK(messages[0].find("conv1") != std::string::npos);
  }
  SUBCASE("a requested skip on one rank skips everywhere") {
    std::vector<int> skipped(n, 0);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, gx::plan(m, short_options()));
      auto g = gradients(m, ep.rank(), 0);
      skipped[std::size_t(ep.rank())] = ex.step(spans(g), ep.rank() == 3).skipped;
      CHECK(ex.steps() == 0);
    });
    for (int r = 0; r < n; ++r) CHECK(skipped[std::size_t(r)] == 1);
  }
}

TEST_CASE("model_exchange: a codec error and an overflowing sum are agreed; a layout mismatch always throws") {
  const int n = 2;
  const auto m = small_model();
  SUBCASE("codec error: QSGD refuses a bucket whose norm overflows float") {
    std::vector<int> ok(n, 0);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, gx::plan(m, short_options(gx::codec_kind::qsgd)));
      auto g0 = gradients(m, ep.rank(), 0);
      ex.step(spans(g0));
      const auto before = ex.save_state();
      auto g = gradients(m, ep.rank(), 1);
      if (ep.rank() == 1) g[3][0] = g[3][1] = 3.0e38f;  // finite, but the bucket's L2 norm overflows
      const auto& st = ex.step(spans(g));
      ok[std::size_t(ep.rank())] = st.skipped && st.failures.size() == 1 && st.failures[0].rank == 1 &&
                                   st.failures[0].reason == gx::failure_reason::codec_error &&
                                   ex.save_state() == before && (ep.rank() == 1) == !st.local_detail.empty();
    });
    for (int r = 0; r < n; ++r) CHECK(ok[std::size_t(r)] == 1);
  }
  SUBCASE("a sum that overflows to Inf is seen by every rank alike") {
    std::vector<int> ok(n, 0);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, gx::plan(m, short_options()));
      auto g = gradients(m, ep.rank(), 0);
      g[1][2] = 3.0e38f;  // conv1.bias, dense: 3e38 + 3e38 = Inf
      const auto copy = g;
      const auto& st = ex.step(spans(g));
      ok[std::size_t(ep.rank())] = st.skipped && st.failures.size() == 1 && st.failures[0].rank == -1 &&
                                   st.failures[0].reason == gx::failure_reason::non_finite_sum && g == copy &&
                                   ex.steps() == 0;
    });
    for (int r = 0; r < n; ++r) CHECK(ok[std::size_t(r)] == 1);
  }
  SUBCASE("gradients of the wrong length on one rank: every rank throws, even under the skip policy") {
    std::vector<int> thrown(n, 0);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, gx::plan(m, short_options()));
      auto g = gradients(m, ep.rank(), 0);
      if (ep.rank() == 0) g[4].pop_back();
      try {
        ex.step(spans(g));
      } catch (const gx::exchange_failure_error& e) {
        thrown[std::size_t(ep.rank())] = e.reason() == gx::failure_reason::layout_mismatch && e.rank() == 0;
      }
    });
    for (int r = 0; r < n; ++r) CHECK(thrown[std::size_t(r)] == 1);
  }
}

TEST_CASE("model_exchange: a dead rank makes the others fail with a typed error, not a hang") {
  const int n = 3;
  const auto m = small_model();
  std::atomic<int> transport_errors{0};
  gradcomp::transport::inproc_options io;
  io.recv_timeout = std::chrono::seconds(120);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS(gradcomp::transport::run_workers(
      n,
      [&](inproc_endpoint& ep) {
        gradcomp::transport::fault_plan plan;
        if (ep.rank() == 1) plan.kill_after_sends(1);
        gradcomp::transport::fault_injecting t(ep, plan);
        gx::model_exchange ex(t, gx::plan(m, short_options()));
        auto g = gradients(m, ep.rank(), 0);
        try {
          ex.step(spans(g));
        } catch (const gradcomp::transport_error&) {
          ++transport_errors;
          throw;
        }
      },
      io));
  CHECK(transport_errors.load() >= 1);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}
