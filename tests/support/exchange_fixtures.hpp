#pragma once
// Fixtures of the whole-model exchange tests (unit and MPI): plan options with
// a short GradiVeQ schedule, and a small model with one layer per codec.

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include <gradcomp/model_exchange.hpp>

namespace gradcomp::test_support {

/// Plan options with a short GradiVeQ schedule (warm-up 2, L_t 3, L_c 3),
/// layers under 64 values dense, top-k 10%, 4 KiB buckets.
inline exchange::plan_options short_exchange_options(std::uint64_t seed) {
  exchange::plan_options o;
  o.rules.small_below = 64;
  o.gradiveq_schedule.warmup_iterations = 2;
  o.gradiveq_schedule.sampling_iterations = 3;
  o.gradiveq_schedule.compressed_iterations = 3;
  o.gradiveq.lambda = 0.05;
  o.top_k.ratio_percent = 10.0;
  o.bucket_bytes = 1 << 12;
  o.seed = seed;
  return o;
}

/// A plan with every codec of the library: GradiVeQ on the two convs, `fc1`
/// (two-bit by default), QSGD and top-k on the fully connected layers, dense on
/// the biases; short_exchange_options(seed) otherwise.
inline exchange::plan every_codec_plan(std::uint64_t seed, exchange::codec_kind fc1 = exchange::codec_kind::two_bit) {
  exchange::model_description m;
  m.add_conv("conv1", 8, 4, 3, 3).add_dense("conv1.bias", 8, 1).add_conv("conv2", 8, 8, 3, 3);
  m.add_dense("fc1", 500).add_dense("fc2", 700).add_dense("fc3", 900).add_dense("fc3.bias", 10, 1);
  exchange::plan_options o = short_exchange_options(seed);
  o.rules.explicit_choices = {{"fc1", fc1}, {"fc2", exchange::codec_kind::qsgd}, {"fc3", exchange::codec_kind::top_k}};
  return exchange::plan(std::move(m), o);
}

/// How exchange_gradients shapes a layer: a * sin(freq * (i % period)) +
/// b * (i % ramp) + noise * u, with a, b, u uniform in [-0.5, 0.5) from a
/// counter keyed by (rank_key, step_key).
struct gradient_recipe {
  std::uint64_t rank_key = 0x9E3779B97F4A7C15ull;
  std::uint64_t step_key = 0xBF58476D1CE4E5B9ull;
  float freq = 0.1f;
  unsigned period = 37;
  unsigned ramp = 5;
  float noise = 0.05f;
};

/// Deterministic gradients of (rank, step) for every layer of `m`: low-rank
/// structure (a wave and a ramp per layer) plus noise.
inline std::vector<std::vector<float>> exchange_gradients(const exchange::model_description& m, int rank,
                                                          std::uint64_t step, const gradient_recipe& r = {}) {
  std::vector<std::vector<float>> g;
  std::uint64_t x = r.rank_key * (std::uint64_t(rank) + 1) ^ (step * r.step_key);
  auto next = [&x] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return float((x >> 40) & 0xFFFFFF) / float(1 << 24) - 0.5f;
  };
  for (const auto& l : m.layers()) {
    std::vector<float> v(l.shape.size());
    const float a = next(), b = next();
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = a * std::sin(r.freq * float(i % r.period)) + b * float(i % r.ramp) + r.noise * next();
    g.push_back(std::move(v));
  }
  return g;
}

}  // namespace gradcomp::test_support
