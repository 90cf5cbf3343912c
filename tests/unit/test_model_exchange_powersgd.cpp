// PowerSGD in the whole-model exchange (exchange/powersgd_bucket.hpp): the
// start period's one dense round, then two sum rounds per step (the P's with
// the bucket's dense layers, then the Q's), identical results on 2-4 ranks
// over inproc, the mean recovered for low-rank gradients, agreed failures
// that leave the state as it was, P and Q on every schedule, checkpoints that resume bit-identical,
// and the plan's fingerprint covering PowerSGD's options.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <gradcomp/model_exchange.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <support/equality.hpp>

namespace gx = gradcomp::exchange;
using gradcomp::test_support::bit_equal;
using gradcomp::transport::inproc_endpoint;

namespace {

/// Two convs (16 x 72 and 32 x 144 matrices), a linear weight 10 x 400, a
/// thin 3 x 200 weight (2 r >= 3: dense inside the PowerSGD bucket) and two biases.
gx::model_description powersgd_model() {
  gx::model_description m;
  m.add_conv("conv1", 16, 8, 3, 3).add_dense("conv1.bias", 16, 1).add_conv("conv2", 32, 16, 3, 3);
  m.add_matrix("fc", 10, 400).add_matrix("thin", 3, 200).add_dense("fc.bias", 10, 1);
  return m;
}

gx::plan_options powersgd_options(std::size_t rank = 2, std::size_t start = 2) {
  gx::plan_options o;
  o.rules.conv = gx::codec_kind::powersgd;
  o.rules.fallback = gx::codec_kind::powersgd;
  o.rules.small_below = 64;
  o.powersgd.rank = rank;
  o.powersgd.start_iter = start;
  o.powersgd.min_elements = 256;
  o.seed = 21;
  return o;
}

/// Gradients of (rank, step): every matrix layer is a_1 b_1w^T + a_2 b_2w^T
/// with column factors a shared by the ranks (so the sum has rank 2) plus
/// `noise`; 1-D layers are noise-like values.
std::vector<std::vector<float>> gradients(const gx::model_description& m, int rank, std::uint64_t step,
                                          float noise = 0.0f) {
  std::vector<std::vector<float>> g;
  std::uint64_t x = 0x9E3779B97F4A7C15ull * (std::uint64_t(rank) + 1) ^ (step * 0xBF58476D1CE4E5B9ull);
  auto next = [&x] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return float((x >> 40) & 0xFFFFFF) / float(1 << 24) - 0.5f;
  };
  for (std::size_t l = 0; l < m.size(); ++l) {
    const auto v = gradcomp::powersgd_view(m[l].shape);
    std::vector<float> out(m[l].shape.size());
    if (v.rows == 0) {
      for (auto& e : out) e = next();
    } else {
      for (std::size_t i = 0; i < v.rows; ++i) {
        const float a1 = std::sin(0.3f * float(i + l)), a2 = std::cos(0.7f * float(i) + float(l));
        for (std::size_t j = 0; j < v.cols; ++j) {
          const float b1 = std::sin(0.05f * float(j) * float(rank + 1) + 0.1f * float(step));
          const float b2 = float(rank + 1) * std::cos(0.11f * float(j) + float(step));
          out[i * v.cols + j] = a1 * b1 + a2 * b2 + noise * next();
        }
      }
    }
    g.push_back(std::move(out));
  }
  return g;
}

std::vector<std::span<float>> spans(std::vector<std::vector<float>>& g) { return {g.begin(), g.end()}; }

/// The mean of the n ranks' gradients of `step`, rebuilt from every rank's.
std::vector<std::vector<float>> mean_gradients(const gx::model_description& m, int n, std::uint64_t step) {
  std::vector<std::vector<float>> mean(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) mean[i].assign(m[i].shape.size(), 0.0f);
  for (int r = 0; r < n; ++r) {
    const auto gr = gradients(m, r, step);
    for (std::size_t i = 0; i < m.size(); ++i)
      for (std::size_t k = 0; k < gr[i].size(); ++k) mean[i][k] += gr[i][k] / float(n);
  }
  return mean;
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

TEST_CASE("powersgd plan: layers, buckets, options in the fingerprint, rank 0 refused") {
  const gx::plan p(powersgd_model(), powersgd_options());
  CHECK(p.kind(0) == gx::codec_kind::powersgd);
  CHECK(p.kind(1) == gx::codec_kind::dense);
  CHECK(p.kind(3) == gx::codec_kind::powersgd);
  CHECK(p.kind(4) == gx::codec_kind::powersgd);  // PowerSGD's own rule leaves it dense inside its bucket
  CHECK(std::string(gx::to_string(gx::codec_kind::powersgd)) == "powersgd");
  REQUIRE(p.buckets().size() == 2);
  CHECK(p.buckets()[0].kind == gx::codec_kind::powersgd);
  CHECK(p.buckets()[0].layers.size() == 4);
  CHECK(gx::plan(powersgd_model(), powersgd_options(4)).fingerprint() != p.fingerprint());
  CHECK(gx::plan(powersgd_model(), powersgd_options(2, 3)).fingerprint() != p.fingerprint());
  auto o = powersgd_options();
  o.powersgd.error_feedback = false;
  CHECK(gx::plan(powersgd_model(), o).fingerprint() != p.fingerprint());
  o = powersgd_options(0);
  CHECK_THROWS_AS(gx::bucket_layer<>(gx::plan(powersgd_model(), o), 0, 2), gradcomp::invalid_argument_error);
}

TEST_CASE("powersgd bucket layer by hand: one round in the start period, then P (with control) and Q") {
  const int n = 3;
  const auto m = powersgd_model();
  std::vector<gx::bucket_layer<>> layers;
  for (int r = 0; r < n; ++r) layers.emplace_back(gx::plan(m, powersgd_options()), r, n);
  const std::size_t p_len = (16 + 32 + 10) * 2, q_len = (72 + 144 + 400) * 2, thin = 600;
  for (std::uint64_t step = 0; step < 5; ++step) {
    CAPTURE(step);
    std::vector<std::vector<std::vector<float>>> g(n);
    for (int r = 0; r < n; ++r) {
      g[std::size_t(r)] = gradients(m, r, step);
      std::vector<std::span<const float>> in(g[std::size_t(r)].begin(), g[std::size_t(r)].end());
      layers[std::size_t(r)].begin_step(in);
    }
    std::vector<std::size_t> lengths;
    std::vector<bool> control;
    for (;;) {
      std::vector<gx::pending_round*> rs;
      for (auto& l : layers) rs.push_back(l.next_round());
      if (!rs[0]) break;
      REQUIRE(rs[0]->spec.op == gx::round_op::sum);
      lengths.push_back(rs[0]->buffer.size());
      control.push_back(rs[0]->carries_control);
      std::vector<float> sum(rs[0]->buffer.size(), 0.0f);
      for (auto* r : rs)
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += r->buffer[i];
      for (auto* r : rs) std::copy(sum.begin(), sum.end(), r->buffer.begin());
      for (auto& l : layers) l.complete_round();
    }
    const std::size_t ctrl = gx::control_block::length(n);
    if (step < 2) {
      CHECK(lengths == std::vector<std::size_t>{1152 + 4608 + 4000 + 600 + ctrl, 26});
    } else {
      CHECK(lengths == std::vector<std::size_t>{p_len + thin + ctrl, q_len, 26});
    }
    CHECK(control.front());
    auto out = g;
    for (int r = 0; r < n; ++r) {
      auto s = spans(out[std::size_t(r)]);
      const auto rep = layers[std::size_t(r)].finish_step(s);
      CHECK_FALSE(rep.skipped);
      CHECK(rep.bucket_phase[0] == (step < 2 ? "powersgd:start" : "powersgd:compressed"));
      if (step >= 2) {
        CHECK(rep.layer_bytes[0] == 4 * (16 + 72) * 2);
        CHECK(rep.layer_bytes[4] == 4 * 600);
      }
    }
    for (int r = 1; r < n; ++r)
      for (std::size_t i = 0; i < m.size(); ++i) CHECK(bit_equal(out[std::size_t(r)][i], out[0][i]));
    // The mean: exact for the dense layers, close for the (rank-2) compressed ones.
    for (std::size_t i = 0; i < m.size(); ++i) {
      std::vector<float> mean(m[i].shape.size(), 0.0f);
      for (int r = 0; r < n; ++r)
        for (std::size_t k = 0; k < mean.size(); ++k) mean[k] += g[std::size_t(r)][i][k];
      for (auto& v : mean) v /= float(n);
      CAPTURE(i);
      CHECK(rel_error(out[0][i], mean) < (step < 2 || i == 1 || i == 4 || i == 5 ? 1e-6 : 2e-3));
    }
  }
  const auto& b = dynamic_cast<const gx::powersgd_bucket<>&>(layers[0].bucket(0));
  CHECK(b.compressed());
  REQUIRE(b.compressor(0) != nullptr);
  CHECK(b.compressor(0)->steps() == 3);
  CHECK(b.compressor(3) == nullptr);  // "thin"
}

TEST_CASE("powersgd over inproc: 2-4 ranks, identical results, 2 rounds after the start period") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    const auto m = powersgd_model();
    std::vector<std::vector<std::vector<float>>> results(static_cast<std::size_t>(n));
    std::vector<std::vector<std::size_t>> rounds(static_cast<std::size_t>(n));
    std::vector<double> worst(static_cast<std::size_t>(n), 0.0);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, gx::plan(m, powersgd_options()));
      for (std::uint64_t step = 0; step < 6; ++step) {
        auto g = gradients(m, ep.rank(), step);
        const auto mean = mean_gradients(m, n, step);  // what every rank should get
        const auto& st = ex.step(spans(g));
        REQUIRE_FALSE(st.skipped);
        rounds[std::size_t(ep.rank())].push_back(st.rounds);
        for (std::size_t i = 0; i < m.size(); ++i)
          worst[std::size_t(ep.rank())] = std::max(worst[std::size_t(ep.rank())], rel_error(g[i], mean[i]));
        if (step == 5) results[std::size_t(ep.rank())] = g;
      }
    });
    for (int r = 0; r < n; ++r) {
      CHECK(rounds[std::size_t(r)] == std::vector<std::size_t>{2, 2, 3, 3, 3, 3});  // + the dense bias bucket
      CHECK(worst[std::size_t(r)] < 2e-3);
    }
    for (int r = 1; r < n; ++r)
      for (std::size_t i = 0; i < m.size(); ++i) CHECK(bit_equal(results[std::size_t(r)][i], results[0][i]));
  }
}

TEST_CASE("powersgd over inproc on every schedule: P and Q summed by each, identical results, the mean recovered") {
  using gradcomp::schedule_kind;
  const auto m = powersgd_model();
  const schedule_kind kinds[] = {schedule_kind::ring,   schedule_kind::pipelined_ring, schedule_kind::rabenseifner,
                                 schedule_kind::hierarchical, schedule_kind::direct, schedule_kind::library};
  for (int n : {2, 3, 4, 5, 8})
    for (auto kind : kinds) {
      CAPTURE(n);
      CAPTURE(std::string(gradcomp::to_string(kind)));
      std::vector<std::vector<std::vector<float>>> results(static_cast<std::size_t>(n));
      std::vector<double> worst(static_cast<std::size_t>(n), 0.0);
      std::vector<std::vector<std::string>> schedules(static_cast<std::size_t>(n));
      gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
        gradcomp::schedule_options so{.kind = kind, .chunk_elements = 64};  // several chunks per P and Q
        so.group_size = n % 2 == 0 && n > 2 ? 2 : 0;
        gx::model_exchange ex(ep, gx::plan(m, powersgd_options()), {}, gx::schedule_collectives<>(so));
        for (std::uint64_t step = 0; step < 5; ++step) {
          auto g = gradients(m, ep.rank(), step);
          const auto mean = mean_gradients(m, n, step);
          const auto& st = ex.step(spans(g));
          REQUIRE_FALSE(st.skipped);
          for (std::size_t i = 0; i < m.size(); ++i)
            worst[std::size_t(ep.rank())] = std::max(worst[std::size_t(ep.rank())], rel_error(g[i], mean[i]));
          if (step == 4) {
            results[std::size_t(ep.rank())] = g;
            for (const auto& round : st.round_log) schedules[std::size_t(ep.rank())].push_back(round.schedule);
          }
        }
      });
      // After the start period: the P round and the Q round of the PowerSGD bucket, and the bias bucket's sum.
      const std::string ran = kind == schedule_kind::library ? "rabenseifner" : gradcomp::to_string(kind);  // inproc: no library
      for (int r = 0; r < n; ++r) {
        CHECK(worst[std::size_t(r)] < 2e-3);
        CHECK(schedules[std::size_t(r)] == std::vector<std::string>{ran, ran, ran});
      }
      for (int r = 1; r < n; ++r)
        for (std::size_t i = 0; i < m.size(); ++i) CHECK(bit_equal(results[std::size_t(r)][i], results[0][i]));
    }
}

TEST_CASE("powersgd over inproc: a non-finite gradient after the start period is agreed, the state is unchanged") {
  const int n = 3;
  const auto m = powersgd_model();
  std::vector<int> ok(n, 0);
  gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, gx::plan(m, powersgd_options(2, 1)));
    for (std::uint64_t step = 0; step < 3; ++step) {
      auto g = gradients(m, ep.rank(), step, 0.1f);
      ex.step(spans(g));
    }
    const auto before = ex.save_state();
    auto g = gradients(m, ep.rank(), 3, 0.1f);
    if (ep.rank() == 1) g[2][40] = std::numeric_limits<float>::quiet_NaN();
    const auto& st = ex.step(spans(g));
    ok[std::size_t(ep.rank())] = st.skipped && st.failures.size() == 1 && st.failures[0].rank == 1 &&
                                 st.failures[0].reason == gx::failure_reason::non_finite_gradient &&
                                 st.failures[0].layer == 2 && ex.save_state() == before && ex.steps() == 3;
    // The next step runs normally.
    auto h = gradients(m, ep.rank(), 4, 0.1f);
    ok[std::size_t(ep.rank())] &= !ex.step(spans(h)).skipped;
  });
  for (int r = 0; r < n; ++r) CHECK(ok[std::size_t(r)] == 1);
}

TEST_CASE("powersgd checkpoint: stopped at step k and resumed ends bit-identical (4 workers)") {
  const int n = 4;
  const std::uint64_t total = 8;
  const auto plan = gx::plan(powersgd_model(), powersgd_options(2, 2));
  const auto& m = plan.model();
  auto train = [&](gx::model_exchange<inproc_endpoint>& ex, int rank, std::vector<std::vector<float>>& w,
                   std::uint64_t first, std::uint64_t last) {
    for (std::uint64_t step = first; step < last; ++step) {
      auto g = gradients(m, rank, step, 0.2f);
      for (std::size_t l = 0; l < w.size(); ++l)
        for (std::size_t i = 0; i < w[l].size(); ++i) g[l][i] += 0.1f * w[l][i];
      REQUIRE_FALSE(ex.step(spans(g)).skipped);
      for (std::size_t l = 0; l < w.size(); ++l)
        for (std::size_t i = 0; i < w[l].size(); ++i) w[l][i] -= 0.1f * g[l][i];
    }
  };
  auto zero = [&] {
    std::vector<std::vector<float>> w;
    for (const auto& l : m.layers()) w.emplace_back(l.shape.size(), 0.0f);
    return w;
  };
  std::vector<std::vector<std::vector<float>>> straight(n);
  gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, plan);
    auto w = zero();
    train(ex, ep.rank(), w, 0, total);
    straight[std::size_t(ep.rank())] = w;
  });
  for (std::uint64_t k : {1u, 2u, 5u}) {  // in the start period, at its end, compressed
    CAPTURE(k);
    std::vector<std::vector<std::byte>> saved(n);
    std::vector<std::vector<std::vector<float>>> weights(n);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      auto w = zero();
      train(ex, ep.rank(), w, 0, k);
      saved[std::size_t(ep.rank())] = ex.save_state();
      weights[std::size_t(ep.rank())] = w;
    });
    std::vector<std::vector<std::vector<float>>> resumed(n);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      ex.restore_state(saved[std::size_t(ep.rank())]);
      CHECK(ex.steps() == k);
      auto w = weights[std::size_t(ep.rank())];
      train(ex, ep.rank(), w, k, total);
      resumed[std::size_t(ep.rank())] = w;
    });
    for (int r = 0; r < n; ++r)
      for (std::size_t l = 0; l < m.size(); ++l) CHECK(bit_equal(resumed[std::size_t(r)][l], straight[std::size_t(r)][l]));
  }
  // A checkpoint of another PowerSGD rank is another plan.
  std::vector<std::vector<std::byte>> saved(1);
  gradcomp::transport::run_workers(1, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, gx::plan(powersgd_model(), powersgd_options(2, 0)));
    auto g = gradients(m, 0, 0);
    ex.step(spans(g));
    saved[0] = ex.save_state();
    gx::model_exchange other(ep, gx::plan(powersgd_model(), powersgd_options(3, 0)));
    CHECK_THROWS_AS(other.restore_state(saved[0]), gradcomp::layout_error);
  });
}

TEST_CASE("powersgd bucket without a compressible layer: one dense round, phase powersgd:dense") {
  gx::model_description m;
  m.add_matrix("thin", 3, 200).add_matrix("small", 8, 8);  // 2 r >= 3; 64 < min_elements
  const int n = 2;
  std::vector<gx::bucket_layer<>> layers;
  for (int r = 0; r < n; ++r) layers.emplace_back(gx::plan(m, powersgd_options(2, 0)), r, n);
  for (std::uint64_t step = 0; step < 2; ++step) {
    std::vector<std::vector<std::vector<float>>> g(n);
    for (int r = 0; r < n; ++r) {
      g[std::size_t(r)] = gradients(m, r, step);
      std::vector<std::span<const float>> in(g[std::size_t(r)].begin(), g[std::size_t(r)].end());
      layers[std::size_t(r)].begin_step(in);
    }
    std::size_t rounds = 0;
    for (;;) {
      std::vector<gx::pending_round*> rs;
      for (auto& l : layers) rs.push_back(l.next_round());
      if (!rs[0]) break;
      ++rounds;
      CHECK(rs[0]->buffer.size() == 600 + 64 + gx::control_block::length(n));
      std::vector<float> sum(rs[0]->buffer.size(), 0.0f);
      for (auto* r : rs)
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += r->buffer[i];
      for (auto* r : rs) std::copy(sum.begin(), sum.end(), r->buffer.begin());
      for (auto& l : layers) l.complete_round();
    }
    CHECK(rounds == 1);
    auto out = g;
    for (int r = 0; r < n; ++r) {
      auto s = spans(out[std::size_t(r)]);
      const auto rep = layers[std::size_t(r)].finish_step(s);
      CHECK(rep.bucket_phase[0] == "powersgd:dense");
    }
    for (std::size_t k = 0; k < 600; ++k)
      CHECK(out[0][0][k] == doctest::Approx((g[0][0][k] + g[1][0][k]) / 2.0f).epsilon(1e-6));
  }
}
