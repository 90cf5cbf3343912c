// LGC's ring form inside the whole-model exchange (exchange/lgc_bucket.hpp):
// the same aggregates as lgc_ring_node, bit for bit; the same results on every
// rank; the phases as rounds; a skipped step rolled back; checkpoints resumed
// bit-identical in every phase.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <gradcomp/exchange/lgc_bucket.hpp>
#include <gradcomp/model_exchange.hpp>
#include <gradcomp/protocols/lgc.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <support/equality.hpp>
#include <support/lgc_fixtures.hpp>

namespace gx = gradcomp::exchange;
using gradcomp::test_support::bit_equal;
using gradcomp::transport::inproc_endpoint;

namespace {

using grads = std::vector<std::vector<float>>;

gradcomp::lgc_options small_lgc(float momentum) {
  gradcomp::lgc_options o;
  o.alpha_percent = 1.0;
  o.window = 32;
  o.architecture = gradcomp::test_support::small_arch();
  o.schedule = {2, 2};  // phase 1: steps 0-1, phase 2: steps 2-3, phase 3 from step 4
  o.momentum = momentum;
  o.seed = 5;
  return o;
}

/// stem (first layer: dense), a norm weight and fc.bias (rank 1: dense), two
/// convs through the autoencoder, fc top-k only: LGC layers [50, 6000, 4000, 300].
/// With `extra`, a dense-coded layer first (its own bucket, carrying the control block).
gx::plan lgc_plan(float momentum, bool extra = false, gx::codec_kind kind = gx::codec_kind::lgc_ring) {
  gx::model_description m;
  if (extra) m.add_dense("extra", 64);
  m.add_conv("stem", 4, 1, 3, 3).add_dense("norm.weight", 4, 1);
  m.add_conv("conv_a", 60, 10, 10, 1).add_conv("conv_b", 40, 10, 10, 1);
  m.add_dense("fc", 300, 2).add_dense("fc.bias", 10, 1);
  gx::plan_options o;
  o.rules.conv = o.rules.small = o.rules.fallback = kind;
  if (extra) o.rules.explicit_choices = {{"extra", gx::codec_kind::dense}};
  o.lgc = small_lgc(momentum);
  o.lgc_factory = gx::lgc_bucket_factory<>();
  return gx::plan(std::move(m), o);
}

/// Gradients of `rank` at `step`: multiples of 1/64 below 16 (sums of a few
/// are exact in any order) when `exact`, else smooth values plus noise.
grads gradients(const gx::model_description& m, int rank, std::uint64_t step, bool exact) {
  grads g;
  std::uint64_t x = 0x9E3779B97F4A7C15ull * (std::uint64_t(rank) + 3) ^ (step * 0xBF58476D1CE4E5B9ull);
  for (std::size_t l = 0; l < m.size(); ++l) {
    std::vector<float> v(m[l].shape.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const int q = int((x >> 40) % 1001) - 500;
      v[i] = exact ? float(q) / 64.0f : 0.3f * std::sin(0.01f * float(i) + float(step)) + float(q) / 2000.0f;
    }
    g.push_back(std::move(v));
  }
  return g;
}

std::vector<std::span<float>> spans(grads& g) { return std::vector<std::span<float>>(g.begin(), g.end()); }

/// The exchange's aggregates of `steps` steps on every rank.
std::vector<std::vector<grads>> run_exchange(int n, const gx::plan& plan, std::uint64_t steps, bool exact) {
  std::vector<std::vector<grads>> out(static_cast<std::size_t>(n));
  gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, plan);
    for (std::uint64_t s = 0; s < steps; ++s) {
      auto g = gradients(plan.model(), ep.rank(), s, exact);
      REQUIRE_FALSE(ex.step(spans(g)).skipped);
      out[std::size_t(ep.rank())].push_back(g);
    }
  });
  return out;
}

}  // namespace

TEST_CASE("lgc bucket: the same aggregates as lgc_ring_node, bit for bit (2 and 4 ranks)") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    const auto plan = lgc_plan(0.0f);
    const auto& m = plan.model();
    const std::uint64_t steps = 7;
    const auto mine = run_exchange(n, plan, steps, true);
    // The reference: lgc_ring_node on LGC's layers (the dense ones concatenated).
    std::vector<std::vector<grads>> ref(static_cast<std::size_t>(n));
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gradcomp::lgc_ring_node<> node(ep.rank(), n, {50, 6000, 4000, 300}, small_lgc(0.0f));
      for (std::uint64_t s = 0; s < steps; ++s) {
        const auto g = gradients(m, ep.rank(), s, true);
        grads layers(1);
        for (std::size_t i : {0u, 1u, 5u}) layers[0].insert(layers[0].end(), g[i].begin(), g[i].end());
        layers.push_back(g[2]);
        layers.push_back(g[3]);
        layers.push_back(g[4]);
        node.step(ep, spans(layers));
        grads back = g;
        std::copy(layers[0].begin(), layers[0].begin() + 36, back[0].begin());
        std::copy(layers[0].begin() + 36, layers[0].begin() + 40, back[1].begin());
        std::copy(layers[0].begin() + 40, layers[0].end(), back[5].begin());
        back[2] = layers[1];
        back[3] = layers[2];
        back[4] = layers[3];
        ref[std::size_t(ep.rank())].push_back(back);
      }
    });
    for (int r = 0; r < n; ++r)
      for (std::uint64_t s = 0; s < steps; ++s)
        for (std::size_t l = 0; l < m.size(); ++l) {
          CAPTURE(r);
          CAPTURE(s);
          CAPTURE(l);
          CHECK(bit_equal(mine[std::size_t(r)][s][l], ref[std::size_t(r)][s][l]));
        }
  }
}

TEST_CASE("lgc bucket: identical results on every rank, the phases as rounds (3 ranks, a dense bucket first)") {
  const int n = 3;
  const auto plan = lgc_plan(0.9f, true);
  REQUIRE(plan.buckets().size() == 2);
  std::vector<std::vector<grads>> out(n);
  std::vector<std::vector<std::string>> phases(n);
  std::vector<std::vector<std::size_t>> rounds(n);
  gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, plan);
    for (std::uint64_t s = 0; s < 7; ++s) {
      auto g = gradients(plan.model(), ep.rank(), s, false);
      const auto& st = ex.step(spans(g));
      REQUIRE_FALSE(st.skipped);
      phases[std::size_t(ep.rank())].push_back(st.bucket_phase[1]);
      rounds[std::size_t(ep.rank())].push_back(st.rounds);
      out[std::size_t(ep.rank())].push_back(g);
    }
    const auto& b = dynamic_cast<const gx::lgc_ring_bucket<>&>(ex.buckets().bucket(1));
    CHECK(b.steps() == 7);
    CHECK(b.training_steps() == (ep.rank() == 0 ? 2u : 0u));  // rank 0 trained in phase 2
    CHECK(b.last_traffic().payload_bytes > 0);
  });
  const std::vector<std::string> want = {"lgc:full",       "lgc:full",       "lgc:topk-training", "lgc:topk-training",
                                         "lgc:compressed", "lgc:compressed", "lgc:compressed"};
  const std::vector<std::size_t> want_rounds = {2, 2, 4, 4, 3, 3, 3};  // the dense bucket's sum round + LGC's
  for (int r = 0; r < n; ++r) {
    CHECK(phases[std::size_t(r)] == want);
    CHECK(rounds[std::size_t(r)] == want_rounds);
    for (std::size_t s = 0; s < 7; ++s)
      for (std::size_t l = 0; l < plan.model().size(); ++l) CHECK(bit_equal(out[std::size_t(r)][s][l], out[0][s][l]));
  }
  // Phase 3 sends codes: the autoencoder layers' aggregate is a reconstruction, non-zero at the index set only.
  std::size_t nonzero = 0;
  for (float v : out[0][6][3]) nonzero += v != 0.0f ? 1 : 0;
  CHECK(nonzero > 0);
  CHECK(nonzero <= 60);  // k of conv_a at 1%
}

TEST_CASE("lgc bucket: a skipped step is rolled back in every phase (4 ranks)") {
  const int n = 4;
  const auto plan = lgc_plan(0.9f, true);
  const auto straight = run_exchange(n, plan, 7, false);
  for (std::uint64_t skip_at : {1u, 3u, 4u, 5u}) {
    CAPTURE(skip_at);
    std::vector<std::vector<grads>> out(n);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      for (std::uint64_t s = 0; s < 7; ++s) {
        if (s == skip_at) {  // rank 2 asks to skip: every rank skips, the state stays as before
          auto g = gradients(plan.model(), ep.rank(), 100 + s, false);
          CHECK(ex.step(spans(g), ep.rank() == 2).skipped);
        }
        auto g = gradients(plan.model(), ep.rank(), s, false);
        REQUIRE_FALSE(ex.step(spans(g)).skipped);
        out[std::size_t(ep.rank())].push_back(g);
      }
    });
    for (int r = 0; r < n; ++r)
      for (std::size_t s = 0; s < 7; ++s)
        for (std::size_t l = 0; l < plan.model().size(); ++l)
          CHECK(bit_equal(out[std::size_t(r)][s][l], straight[std::size_t(r)][s][l]));
  }
}

TEST_CASE("lgc bucket: stopped at step k and resumed from checkpoints ends bit-identical (4 ranks)") {
  const int n = 4;
  const auto plan = lgc_plan(0.9f, true);
  const std::uint64_t total = 8;
  const auto straight = run_exchange(n, plan, total, false);
  for (std::uint64_t k : {1u, 3u, 4u, 6u}) {  // phase 1, phase 2 (trainer mid-way), at the weights' step, phase 3
    CAPTURE(k);
    std::vector<std::vector<std::byte>> saved(n);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      for (std::uint64_t s = 0; s < k; ++s) {
        auto g = gradients(plan.model(), ep.rank(), s, false);
        REQUIRE_FALSE(ex.step(spans(g)).skipped);
      }
      saved[std::size_t(ep.rank())] = ex.save_state();
    });
    std::vector<grads> last(n);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      ex.restore_state(saved[std::size_t(ep.rank())]);
      for (std::uint64_t s = k; s < total; ++s) {
        auto g = gradients(plan.model(), ep.rank(), s, false);
        REQUIRE_FALSE(ex.step(spans(g)).skipped);
        last[std::size_t(ep.rank())] = g;
      }
    });
    for (int r = 0; r < n; ++r)
      for (std::size_t l = 0; l < plan.model().size(); ++l)
        CHECK(bit_equal(last[std::size_t(r)][l], straight[std::size_t(r)][total - 1][l]));
  }
}

TEST_CASE("lgc bucket: the plan needs the factory; the LGC options enter the fingerprint") {
  gx::model_description m;
  m.add_conv("stem", 4, 1, 3, 3).add_conv("conv_a", 60, 10, 10, 1).add_dense("fc", 300, 2);
  gx::plan_options o;
  o.rules.conv = o.rules.small = o.rules.fallback = gx::codec_kind::lgc_ring;
  o.lgc = small_lgc(0.9f);
  CHECK_THROWS_AS(gx::plan(m, o), gradcomp::invalid_argument_error);
  o.lgc_factory = gx::lgc_bucket_factory<>();
  o.bucket_bytes = 64;  // LGC's layers stay one bucket whatever the bucket size
  const gx::plan a(m, o);
  CHECK(a.buckets().size() == 1);
  o.lgc.alpha_percent = 2.0;
  const gx::plan b(m, o);
  CHECK(a.fingerprint() != b.fingerprint());
  // Another world size in the checkpoint: refused.
  std::vector<std::byte> saved;
  gradcomp::transport::run_workers(2, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, a);
    if (ep.rank() == 0) saved = ex.save_state();
  });
  gradcomp::transport::run_workers(3, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, a);
    CHECK_THROWS_AS(ex.restore_state(saved), gradcomp::option_mismatch_error);
  });
}

TEST_CASE("lgc ps bucket: the same aggregates as lgc_ps_worker / lgc_ps_server, bit for bit (4 ranks)") {
  const int n = 4;
  const auto plan = lgc_plan(0.0f, false, gx::codec_kind::lgc_ps);
  const auto& m = plan.model();
  const std::uint64_t steps = 7;
  std::vector<std::vector<grads>> mine(n);
  std::vector<std::vector<std::string>> phases(n);
  gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, plan);
    for (std::uint64_t s = 0; s < steps; ++s) {
      auto g = gradients(m, ep.rank(), s, true);
      const auto& st = ex.step(spans(g));
      REQUIRE_FALSE(st.skipped);
      phases[std::size_t(ep.rank())].push_back(st.bucket_phase[0]);
      mine[std::size_t(ep.rank())].push_back(g);
    }
  });
  // The reference: K = 4 workers and the server (rank 4) on LGC's layers.
  std::vector<std::vector<grads>> ref(n);
  gradcomp::transport::run_workers(n + 1, [&](inproc_endpoint& ep) {
    if (ep.rank() == n) {
      gradcomp::lgc_ps_server<> server(n, {50, 6000, 4000, 300}, small_lgc(0.0f));
      for (std::uint64_t s = 0; s < steps; ++s) server.step(ep);
      return;
    }
    gradcomp::lgc_ps_worker<> worker(ep.rank(), n, {50, 6000, 4000, 300}, small_lgc(0.0f));
    for (std::uint64_t s = 0; s < steps; ++s) {
      const auto g = gradients(m, ep.rank(), s, true);
      grads layers(1);
      for (std::size_t i : {0u, 1u, 5u}) layers[0].insert(layers[0].end(), g[i].begin(), g[i].end());
      layers.push_back(g[2]);
      layers.push_back(g[3]);
      layers.push_back(g[4]);
      worker.step(ep, spans(layers));
      grads back = g;
      std::copy(layers[0].begin(), layers[0].begin() + 36, back[0].begin());
      std::copy(layers[0].begin() + 36, layers[0].begin() + 40, back[1].begin());
      std::copy(layers[0].begin() + 40, layers[0].end(), back[5].begin());
      back[2] = layers[1];
      back[3] = layers[2];
      back[4] = layers[3];
      ref[std::size_t(ep.rank())].push_back(back);
    }
  });
  CHECK(phases[0][1] == "lgc_ps:full");
  CHECK(phases[0][3] == "lgc_ps:topk-training");
  CHECK(phases[0][6] == "lgc_ps:compressed");
  for (int r = 0; r < n; ++r)
    for (std::uint64_t s = 0; s < steps; ++s)
      for (std::size_t l = 0; l < m.size(); ++l) {
        CAPTURE(r);
        CAPTURE(s);
        CAPTURE(l);
        CHECK(bit_equal(mine[std::size_t(r)][s][l], ref[std::size_t(r)][s][l]));
      }
}

TEST_CASE("lgc ps bucket: skip rollback and checkpoints resumed bit-identical (4 ranks)") {
  const int n = 4;
  const auto plan = lgc_plan(0.9f, true, gx::codec_kind::lgc_ps);
  const std::uint64_t total = 7;
  const auto straight = run_exchange(n, plan, total, false);
  for (std::uint64_t k : {1u, 3u, 4u, 5u}) {
    CAPTURE(k);
    std::vector<std::vector<std::byte>> saved(n);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      for (std::uint64_t s = 0; s < k; ++s) {
        auto g = gradients(plan.model(), ep.rank(), s, false);
        REQUIRE_FALSE(ex.step(spans(g)).skipped);
      }
      auto bad = gradients(plan.model(), ep.rank(), 100, false);  // rank 1 asks to skip: rolled back everywhere
      CHECK(ex.step(spans(bad), ep.rank() == 1).skipped);
      saved[std::size_t(ep.rank())] = ex.save_state();
    });
    std::vector<grads> last(n);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      ex.restore_state(saved[std::size_t(ep.rank())]);
      for (std::uint64_t s = k; s < total; ++s) {
        auto g = gradients(plan.model(), ep.rank(), s, false);
        REQUIRE_FALSE(ex.step(spans(g)).skipped);
        last[std::size_t(ep.rank())] = g;
      }
    });
    for (int r = 0; r < n; ++r)
      for (std::size_t l = 0; l < plan.model().size(); ++l)
        CHECK(bit_equal(last[std::size_t(r)][l], straight[std::size_t(r)][total - 1][l]));
  }
}
