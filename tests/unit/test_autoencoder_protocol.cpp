// Tests of the LGC protocols of autoencoder.hpp over the in-process
// transport: the ring form (Algorithm 2) and the parameter-server form
// (Algorithm 1) with the three-phase schedule (Section V-B): exact averages
// in the full and top-k phases, schedule transitions, weight distribution,
// byte accounting, determinism, and the decoded average against the true one.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <numeric>
#include <vector>

#include <gradcomp/autoencoder.hpp>
#include <gradcomp/protocols/lgc.hpp>
#include <gradcomp/detail/random.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <support/error_checks.hpp>
#include <support/lgc_fixtures.hpp>

using namespace gradcomp;

namespace {

using test_support::small_arch;  // window 32 -> 16 code floats

const std::vector<std::size_t> model = {50, 6000, 4000, 300};  // alpha 1%: k = -, 60, 40, 3; mu = 100

lgc_options small_options(std::uint64_t full, std::uint64_t train, float momentum) {
  lgc_options o;
  o.alpha_percent = 1.0;
  o.window = 32;
  o.architecture = small_arch();
  o.schedule = {full, train};
  o.momentum = momentum;
  o.seed = 5;
  return o;
}

// Gradient of `rank` at `step`: a shared component plus a per-rank innovation.
std::vector<std::vector<float>> gradient(int rank, std::uint64_t step, const std::vector<std::size_t>& sizes) {
  return test_support::ranked_gradient(rank, step, sizes);
}

// "Hot" gradients: every 100th element carries a large shared smooth value
// (so all ranks' top-k fall there), the rest is small noise.
std::vector<std::vector<float>> hot_gradient(int rank, std::uint64_t step, const std::vector<std::size_t>& sizes) {
  const gradcomp::detail::counter_rng rng(91);
  std::vector<std::vector<float>> g(sizes.size());
  const double amp = 1.0 + 0.5 * std::sin(0.37 * double(step));
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    const auto own = rng.stream((step * 16 + l) * 64 + std::uint64_t(rank) + 1);
    g[l].resize(sizes[l]);
    for (std::size_t i = 0; i < sizes[l]; ++i) {
      const double noise = 0.05 * (2.0 * own.uniform_double(i) - 1.0);
      g[l][i] = float(i % 100 == 7 ? amp * (1.0 + 0.5 * std::sin(double(i) / 400.0 + double(step))) + noise : 0.01 * noise);
    }
  }
  return g;
}

std::vector<std::span<float>> spans(std::vector<std::vector<float>>& g) {
  return std::vector<std::span<float>>(g.begin(), g.end());
}

// Reference top-k by magnitude, ties towards the lower index, increasing indices.
std::vector<std::uint32_t> reference_topk(const std::vector<float>& x, std::size_t k) {
  std::vector<std::uint32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](std::uint32_t a, std::uint32_t b) { return std::abs(x[a]) > std::abs(x[b]); });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<float> flatten(const std::vector<std::vector<float>>& g) {
  std::vector<float> out;
  for (const auto& l : g) out.insert(out.end(), l.begin(), l.end());
  return out;
}

struct ring_record {
  std::vector<std::vector<std::vector<float>>> inputs, outputs;  // [step] -> layers
  std::vector<lgc_phase> phases;
  std::vector<lgc_traffic> traffic;
  std::vector<int> leaders;
  std::vector<std::vector<float>> own_values;  // last_values() per step
  std::vector<lgc_index_payload> index_sets;
  std::vector<std::byte> weights;
  lgc_traffic total;
  std::uint64_t training_steps = 0;
};

template <class Policy = execution::seq, class GradFn>
std::vector<ring_record> run_ring(int ranks, const lgc_options& o, std::uint64_t steps, GradFn grad) {
  std::vector<ring_record> rec(static_cast<std::size_t>(ranks));
  transport::run_workers(ranks, [&](transport::inproc_endpoint& ep) {
    const int r = ep.rank();
    auto& out = rec[std::size_t(r)];
    lgc_ring_node<Policy> node(r, ranks, model, o);
    for (std::uint64_t s = 0; s < steps; ++s) {
      auto g = grad(r, s, model);
      out.inputs.push_back(g);
      out.phases.push_back(node.phase());
      out.leaders.push_back(node.leader(s));
      node.step(ep, spans(g));
      out.outputs.push_back(g);
      out.traffic.push_back(node.last_traffic());
      out.own_values.push_back(node.last_values());
      out.index_sets.push_back(node.last_index_set());
    }
    out.total = node.total_traffic();
    out.training_steps = node.training_steps();
    out.weights = const_cast<lgc_network&>(node.network()).save();
  });
  return rec;
}

}  // namespace

TEST_CASE("lgc ring: schedule, exact averages in the full and top-k phases, identical decoding everywhere") {
  const int ranks = 3;
  const lgc_options o = small_options(2, 4, 0.0f);
  const auto rec = run_ring(ranks, o, 9, [](int r, std::uint64_t s, const auto& sizes) { return gradient(r, s, sizes); });

  for (std::size_t s = 0; s < 9; ++s) {
    const lgc_phase expected = s < 2 ? lgc_phase::full : s < 6 ? lgc_phase::topk_training : lgc_phase::compressed;
    for (int r = 0; r < ranks; ++r) CHECK(rec[std::size_t(r)].phases[s] == expected);
    // Every rank ends with the same aggregate, bit for bit.
    for (int r = 1; r < ranks; ++r) CHECK(flatten(rec[std::size_t(r)].outputs[s]) == flatten(rec[0].outputs[s]));
    for (int r = 1; r < ranks; ++r) CHECK(rec[std::size_t(r)].leaders[s] == rec[0].leaders[s]);
  }
  // Full phase (eq. 14): the exact mean.
  for (std::size_t s = 0; s < 2; ++s) {
    std::vector<float> mean(flatten(rec[0].inputs[s]).size(), 0.0f);
    for (int r = 0; r < ranks; ++r) {
      const auto in = flatten(rec[std::size_t(r)].inputs[s]);
      for (std::size_t i = 0; i < mean.size(); ++i) mean[i] += in[i] / float(ranks);
    }
    const auto out = flatten(rec[0].outputs[s]);
    for (std::size_t i = 0; i < mean.size(); ++i) REQUIRE(out[i] == doctest::Approx(mean[i]).epsilon(1e-5));
  }
  // First top-k step (eq. 15, accumulators empty, momentum 0): the mean of
  // every node's gradient at the leader's top-k indices, zero elsewhere; the
  // first layer dense.
  {
    const std::size_t s = 2;
    const int lead = rec[0].leaders[s];
    for (std::size_t l = 0; l < model.size(); ++l) {
      std::vector<float> expect(model[l], 0.0f);
      if (l == 0) {
        for (int r = 0; r < ranks; ++r)
          for (std::size_t i = 0; i < model[l]; ++i) expect[i] += rec[std::size_t(r)].inputs[s][l][i] / float(ranks);
      } else {
        const std::size_t k = sparse_selection_count(model[l], 1.0);
        for (std::uint32_t i : reference_topk(rec[std::size_t(lead)].inputs[s][l], k))
          for (int r = 0; r < ranks; ++r) expect[i] += rec[std::size_t(r)].inputs[s][l][i] / float(ranks);
        CHECK(rec[0].index_sets[s].indices[l - 1] == reference_topk(rec[std::size_t(lead)].inputs[s][l], k));
      }
      for (std::size_t i = 0; i < model[l]; ++i) REQUIRE(rec[0].outputs[s][l][i] == doctest::Approx(expect[i]).epsilon(1e-5));
    }
  }
  // Compressed phase: non-zero only at the leader's indices (and the dense layer).
  for (std::size_t s = 6; s < 9; ++s) {
    const auto& ix = rec[0].index_sets[s];
    for (std::size_t l = 1; l < model.size(); ++l) {
      std::size_t nonzero = 0;
      for (float v : rec[0].outputs[s][l]) {
        REQUIRE(std::isfinite(v));
        nonzero += v != 0.0f;
      }
      CHECK(nonzero <= ix.indices[l - 1].size());
    }
  }
  // The trained weights reached every node, once.
  CHECK(rec[0].training_steps == 4);
  for (int r = 1; r < ranks; ++r) CHECK(rec[std::size_t(r)].weights == rec[0].weights);
  // The leader rule is seeded and not constant.
  std::vector<int> seen;
  lgc_ring_node<> probe(0, ranks, model, o);
  for (std::uint64_t s = 0; s < 30; ++s) seen.push_back(probe.leader(s));
  CHECK(std::count(seen.begin(), seen.end(), seen[0]) < 30);
  for (std::size_t s = 0; s < 9; ++s) CHECK(seen[s] == rec[0].leaders[s]);
}

TEST_CASE("lgc ring: exact byte accounting per iteration and for the run") {
  const int ranks = 3;
  const lgc_options o = small_options(1, 2, 0.9f);
  const auto rec = run_ring(ranks, o, 6, [](int r, std::uint64_t s, const auto& sizes) { return gradient(r, s, sizes); });
  const std::uint64_t original = 4 * (50 + 6000 + 4000 + 300);
  lgc_network probe(lgc_form::ring, 1, 32, small_arch(), 5);
  const std::size_t weights = probe.save().size();
  lgc_code_payload code;
  code.value_count = 100;
  code.window = 32;
  code.code_per_window = 16;
  code.codes.assign(4 * 16, 0.0f);
  const std::size_t code_bytes = wire::serialized_size(code);
  CHECK(code_bytes == 32 + 4 + 4 * 64);
  for (int r = 0; r < ranks; ++r) {
    const auto& rr = rec[std::size_t(r)];
    lgc_traffic sum;
    for (std::size_t s = 0; s < 6; ++s) {
      const auto& t = rr.traffic[s];
      CHECK(t.original_bytes == original);
      const bool leader = rr.leaders[s] == r;
      const std::size_t index_bytes = leader && s > 0 ? wire::serialized_size(rr.index_sets[s]) : 0;
      std::size_t expect = 0;
      if (s == 0)
        expect = 32 + original;  // one dense payload of the whole model
      else if (s < 3)
        expect = (32 + 4 * 50) + (32 + 4 * 3) + (32 + 4 * 100) + index_bytes;  // dense, last layer, top-k values
      else
        expect = (32 + 4 * 50) + (32 + 4 * 3) + code_bytes + index_bytes + (s == 3 && r == 0 ? weights : 0);
      CHECK(t.payload_bytes == expect);
      CHECK(t.wire_bytes > 0);
      CHECK(t.compression_ratio() == doctest::Approx(double(original) / double(expect)));
      sum += t;
    }
    CHECK(rr.total.payload_bytes == sum.payload_bytes);
    CHECK(rr.total.wire_bytes == sum.wire_bytes);
    CHECK(rr.total.original_bytes == 6 * original);
  }
  // The compressed phase sends far less than the top-k phase (code + dense first layer).
  CHECK(rec[1].traffic[5].compression_ratio() > 30.0);
}

TEST_CASE("lgc ring: a run is deterministic for a seed, and the simd policy gives the same bits") {
  const lgc_options o = small_options(1, 3, 0.9f);
  auto g = [](int r, std::uint64_t s, const auto& sizes) { return gradient(r, s, sizes); };
  const auto a = run_ring(2, o, 6, g), b = run_ring(2, o, 6, g);
  const auto c = run_ring<execution::simd>(2, o, 6, g);
  for (std::size_t s = 0; s < 6; ++s) {
    CHECK(flatten(a[0].outputs[s]) == flatten(b[0].outputs[s]));
    CHECK(flatten(a[0].outputs[s]) == flatten(c[0].outputs[s]));
  }
  CHECK(a[0].weights == b[0].weights);
  CHECK(a[0].weights == c[0].weights);
}

TEST_CASE("lgc ring: after online training the decoded average approaches the true average of the top-k vectors") {
  const int ranks = 3;
  auto trained_opts = small_options(1, 120, 0.0f);
  trained_opts.optimizer = lgc_optimizer::adam;
  trained_opts.learning_rate = 3e-3f;
  auto untrained_opts = trained_opts;
  untrained_opts.schedule = {1, 0};
  auto g = [](int r, std::uint64_t s, const auto& sizes) { return hot_gradient(r, s, sizes); };
  const std::uint64_t steps = 126;
  const auto trained = run_ring(ranks, trained_opts, steps, g);
  const auto untrained = run_ring(ranks, untrained_opts, steps, g);
  auto error = [&](const std::vector<ring_record>& rec, std::size_t s) {
    // True mean of the nodes' own top-k vectors vs the decoded values at the index set.
    std::vector<float> mean(rec[0].own_values[s].size(), 0.0f);
    for (int r = 0; r < ranks; ++r)
      for (std::size_t i = 0; i < mean.size(); ++i) mean[i] += rec[std::size_t(r)].own_values[s][i] / float(ranks);
    std::vector<float> decoded;
    const auto& ix = rec[0].index_sets[s];
    for (std::size_t l = 1; l + 1 < model.size(); ++l)
      for (std::uint32_t i : ix.indices[l - 1]) decoded.push_back(rec[0].outputs[s][l][i]);
    double num = 0, den = 0;
    for (std::size_t i = 0; i < mean.size(); ++i) {
      num += (double(decoded[i]) - mean[i]) * (double(decoded[i]) - mean[i]);
      den += double(mean[i]) * mean[i];
    }
    return std::sqrt(num / den);
  };
  double e_trained = 0, e_untrained = 0;
  for (std::size_t s = 121; s < steps; ++s) {
    CHECK(trained[0].phases[s] == lgc_phase::compressed);
    e_trained += error(trained, s) / double(steps - 121);
    e_untrained += error(untrained, s) / double(steps - 121);
  }
  MESSAGE("ring protocol relative error of the decoded average: untrained " << e_untrained << ", trained " << e_trained);
  CHECK(e_trained < 0.3);
  CHECK(e_trained < 0.5 * e_untrained);
}

TEST_CASE("lgc ring: with error feedback, what was applied plus the residual is what went in (conservation)") {
  // One node, momentum 0: the output of a step is what the node applied
  // (dense, its top-k values, or the decode of its own code), and the
  // residual is what it still owes. With feedback_reconstruction_error the
  // autoencoder's error goes back into the residual, so for every layer
  //   sum of inputs == sum of outputs + residual;
  // without it that error is lost, which the same check must detect.
  auto defect = [](bool feedback) {
    auto o = small_options(1, 20, 0.0f);
    o.optimizer = lgc_optimizer::adam;
    o.learning_rate = 3e-3f;
    o.feedback_reconstruction_error = feedback;
    std::vector<double> worst(model.size(), 0.0);
    transport::run_workers(1, [&](transport::inproc_endpoint& ep) {
      lgc_ring_node<> node(0, 1, model, o);
      std::vector<std::vector<double>> in(model.size()), out(model.size());
      for (std::size_t l = 0; l < model.size(); ++l) in[l].assign(model[l], 0.0), out[l].assign(model[l], 0.0);
      for (std::uint64_t s = 0; s < 31; ++s) {
        auto g = hot_gradient(0, s, model);
        for (std::size_t l = 0; l < model.size(); ++l)
          for (std::size_t i = 0; i < model[l]; ++i) in[l][i] += g[l][i];
        node.step(ep, spans(g));
        for (std::size_t l = 0; l < model.size(); ++l)
          for (std::size_t i = 0; i < model[l]; ++i) out[l][i] += g[l][i];
      }
      REQUIRE(node.phase() == lgc_phase::compressed);
      for (std::size_t l = 0; l < model.size(); ++l) {
        const auto r = node.residual(l);
        double num = 0, den = 0;
        for (std::size_t i = 0; i < model[l]; ++i) {
          const double d = in[l][i] - out[l][i] - (r.empty() ? 0.0 : double(r[i]));
          num += d * d;
          den += in[l][i] * in[l][i];
        }
        worst[l] = std::sqrt(num / den);
      }
    });
    return worst;
  };
  const auto with = defect(true), without = defect(false);
  for (std::size_t l = 0; l < model.size(); ++l) {
    CAPTURE(l);
    CHECK(with[l] < 1e-5);
  }
  // Layers 1 and 2 go through the autoencoder: there the error is lost without feedback.
  CHECK(without[1] > 1e-3);
  CHECK(without[2] > 1e-3);
  CHECK(without[3] < 1e-5);  // the top-k-only layer conserves either way
  CHECK_THROWS_AS(lgc_ring_node<>(0, 1, model, small_options(1, 1, 0.0f)).residual(model.size()), invalid_argument_error);
}

namespace {
struct ps_record {
  std::vector<std::vector<std::vector<float>>> inputs, outputs;
  std::vector<lgc_traffic> traffic;
  lgc_traffic total;
};
}  // namespace

TEST_CASE("lgc parameter server: schedule, exact averages, common worker and byte accounting") {
  const int workers = 2;
  const lgc_options o = small_options(2, 3, 0.0f);
  std::vector<ps_record> rec(workers);
  lgc_traffic server_total;
  std::uint64_t server_training = 0;
  std::size_t encoder_bytes = 0;
  const std::uint64_t steps = 8;
  transport::run_workers(workers + 1, [&](transport::inproc_endpoint& ep) {
    if (ep.rank() == workers) {
      lgc_ps_server<> server(workers, model, o);
      for (std::uint64_t s = 0; s < steps; ++s) server.step(ep);
      server_total = server.total_traffic();
      server_training = server.training_steps();
      encoder_bytes = const_cast<lgc_network&>(server.network()).save(true).size();
      return;
    }
    const int k = ep.rank();
    lgc_ps_worker<> w(k, workers, model, o);
    CHECK(w.is_common() == (k == 0));
    for (std::uint64_t s = 0; s < steps; ++s) {
      auto g = gradient(k, s, model);
      rec[std::size_t(k)].inputs.push_back(g);
      w.step(ep, spans(g));
      rec[std::size_t(k)].outputs.push_back(g);
      rec[std::size_t(k)].traffic.push_back(w.last_traffic());
    }
    rec[std::size_t(k)].total = w.total_traffic();
  });
  // Every worker gets the same aggregate.
  for (std::size_t s = 0; s < steps; ++s) CHECK(flatten(rec[0].outputs[s]) == flatten(rec[1].outputs[s]));
  // Full phase: the exact mean.
  for (std::size_t s = 0; s < 2; ++s) {
    const auto a = flatten(rec[0].inputs[s]), b = flatten(rec[1].inputs[s]), out = flatten(rec[0].outputs[s]);
    for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(out[i] == doctest::Approx((a[i] + b[i]) / 2).epsilon(1e-5));
  }
  // First top-k step: the mean of every worker's own top-k (Alg. 1: each selects independently).
  {
    const std::size_t s = 2;
    for (std::size_t l = 0; l < model.size(); ++l) {
      std::vector<float> expect(model[l], 0.0f);
      for (int k = 0; k < workers; ++k) {
        const auto& g = rec[std::size_t(k)].inputs[s][l];
        if (l == 0) {
          for (std::size_t i = 0; i < g.size(); ++i) expect[i] += g[i] / 2;
        } else {
          for (std::uint32_t i : reference_topk(g, sparse_selection_count(model[l], 1.0))) expect[i] += g[i] / 2;
        }
      }
      for (std::size_t i = 0; i < model[l]; ++i) REQUIRE(rec[0].outputs[s][l][i] == doctest::Approx(expect[i]).epsilon(1e-5));
    }
  }
  // Compressed phase: finite aggregates; the common worker sends code, index set and innovation, the other only its innovation.
  for (std::size_t s = 5; s < steps; ++s) {
    for (float v : flatten(rec[0].outputs[s])) REQUIRE(std::isfinite(v));
    const auto& common = rec[0].traffic[s];
    const auto& other = rec[1].traffic[s];
    // innovation: 10% of each layer's top-k: ceil(6) + ceil(4) = 10 entries
    sparse_coo_payload inn;
    inn.length = 10000;
    const std::size_t dense_b = 32 + 200, last_b_min = 32 + 1 + 1 + 3 + 12, inn_b_max = 32 + 1 + 1 + 10 * 2 + 40;
    CHECK(other.payload_bytes >= dense_b + last_b_min + 32 + 2 + 10 + 40);
    CHECK(other.payload_bytes <= dense_b + (32 + 2 + 3 * 2 + 12) + inn_b_max);
    CHECK(common.payload_bytes > other.payload_bytes + 32 + 4 + 4 * 64);  // + code (and the index set)
    CHECK(other.compression_ratio() > common.compression_ratio());
  }
  CHECK(server_training == 3);
  CHECK(server_total.payload_bytes == encoder_bytes);  // the encoder, sent once to the common worker
  CHECK(server_total.wire_bytes > encoder_bytes);      // plus the dense downlink
}

TEST_CASE("lgc protocols: bad input is a typed error that changes nothing") {
  const lgc_options o = small_options(0, 1, 0.9f);
  auto big_window = o;
  big_window.window = 128;  // mu = 100 < 128
  CHECK_THROWS_AS(lgc_ring_node<>(0, 1, model, big_window), invalid_argument_error);
  CHECK_THROWS_AS(lgc_ps_worker<>(0, 1, model, big_window), invalid_argument_error);
  CHECK_THROWS_AS(lgc_ring_node<>(0, 1, {}, o), invalid_argument_error);
  CHECK_THROWS_AS(lgc_ring_node<>(0, 1, {10, 0, 10}, o), invalid_argument_error);
  CHECK_THROWS_AS(lgc_ring_node<>(2, 2, model, o), invalid_argument_error);
  auto bad = o;
  bad.alpha_percent = 0;
  CHECK_THROWS_AS(lgc_ring_node<>(0, 1, model, bad), invalid_argument_error);
  bad = o;
  bad.momentum = 1.0f;
  CHECK_THROWS_AS(lgc_ring_node<>(0, 1, model, bad), invalid_argument_error);
  bad = o;
  bad.window = 30;  // not a multiple of 4
  CHECK_THROWS_AS(lgc_ring_node<>(0, 1, model, bad), invalid_argument_error);
  transport::run_workers(1, [&](transport::inproc_endpoint& ep) {
    lgc_ring_node<> node(0, 1, model, o);
    auto g = gradient(0, 0, model);
    g[2][123] = std::numeric_limits<float>::quiet_NaN();
    CHECK(gradcomp::test_support::non_finite_index_of([&] { node.step(ep, spans(g)); }) == 50 + 6000 + 123);
    CHECK(node.steps() == 0);
    auto short_g = gradient(0, 0, model);
    short_g[1].pop_back();
    CHECK_THROWS_AS(node.step(ep, spans(short_g)), size_mismatch_error);
    short_g.pop_back();
    CHECK_THROWS_AS(node.step(ep, spans(short_g)), size_mismatch_error);
    CHECK(node.steps() == 0);
    // A clean step still works afterwards (a one-node ring: the aggregate is the node's own top-k).
    auto ok = gradient(0, 0, model);
    node.step(ep, spans(ok));
    CHECK(node.steps() == 1);
  });
}
