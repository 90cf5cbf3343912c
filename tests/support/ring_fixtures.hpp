#pragma once
// Inputs and references for the ring all-reduce tests, in-process
// (tests/unit/test_ring_compressed.cpp) and under mpirun
// (tests/mpi/test_mpi_ring.cpp): per-rank Gaussian inputs, the exact sum,
// low-rank gradients with the linear correlation GradiVeQ exploits, and a
// GradiVeQ codec fitted on them. All deterministic: every rank rebuilds every input.

#include "random_vectors.hpp"

#include <gradcomp/detail/random.hpp>
#include <gradcomp/gradiveq.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace gradcomp::test_support {

/// Rank r of n gets counter_gaussian(len, seed * 131 + r, scale).
inline std::vector<std::vector<float>> inputs(int n, std::size_t len, std::uint64_t seed, float scale = 1.0f) {
  std::vector<std::vector<float>> v;
  for (int r = 0; r < n; ++r) v.push_back(counter_gaussian(len, seed * 131 + std::uint64_t(r), scale));
  return v;
}

/// The element-wise sum of the inputs, accumulated in double, rounded once.
inline std::vector<float> exact_sum(const std::vector<std::vector<float>>& x) {
  std::vector<double> acc(x.front().size(), 0.0);
  for (const auto& v : x)
    for (std::size_t i = 0; i < v.size(); ++i) acc[i] += v[i];
  std::vector<float> s(acc.size());
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>(acc[i]);
  return s;
}

/// ||got - want|| / ||want|| (the absolute norm when want is zero).
inline double rel_error(std::span<const float> got, std::span<const float> want) {
  double e = 0, w = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    e += (double(got[i]) - double(want[i])) * (double(got[i]) - double(want[i]));
    w += double(want[i]) * double(want[i]);
  }
  return w > 0 ? std::sqrt(e / w) : std::sqrt(e);
}

/// Low-rank slices of length K around a mean plus small noise, as gradients
/// with the linear correlation GradiVeQ exploits (seed 002, Sec. 1).
struct low_rank_layer {
  std::size_t K, rank, length;
  std::vector<float> basis, mean;  // K x rank column-major, K
  low_rank_layer(std::size_t k, std::size_t r, std::size_t len, std::uint64_t seed)
      : K(k), rank(r), length(len), basis(counter_gaussian(k * r, seed)), mean(counter_gaussian(k, seed + 7, 0.3f)) {}
  std::vector<float> sample(std::uint64_t seed, float noise = 1e-3f) const {
    std::vector<float> out(length);
    const auto s = gradcomp::detail::counter_rng(seed).stream(1);
    const std::vector<float> eps = counter_gaussian(length, seed + 99, noise);
    for (std::size_t m = 0; m * K < length; ++m) {
      for (std::size_t i = 0; i < K && m * K + i < length; ++i) {
        double x = mean[i];
        for (std::size_t j = 0; j < rank; ++j)
          x += basis[j * K + i] * (2.0 * s.uniform_double(m * rank + j) - 1.0) / (1.0 + double(j));
        out[m * K + i] = static_cast<float>(x) + eps[m * K + i];
      }
    }
    return out;
  }
};

/// A GradiVeQ codec for `layer` and a ring of n, fitted (as in training) on
/// aggregated samples: sums of n nodes' gradients. Every rank fits from the
/// same samples, so every rank holds the same basis.
inline linear_compressor<> fitted_codec(const low_rank_layer& layer, std::size_t n, std::size_t samples = 12) {
  gradiveq_options o;
  o.slice_size = layer.K;
  o.summands = n;
  o.lambda = 0.001;
  linear_compressor<> c(layer.length, o);
  for (std::size_t t = 0; t < samples; ++t) {
    std::vector<float> sum(layer.length, 0.0f);
    for (std::size_t r = 0; r < n; ++r) {
      const std::vector<float> g = layer.sample(1000 + 64 * t + r);
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += g[i];
    }
    c.add_sample(sum);
  }
  c.fit();
  return c;
}

/// One sample of `layer` per rank: rank r's is layer.sample(seed + r).
inline std::vector<std::vector<float>> rank_samples(const low_rank_layer& layer, int n, std::uint64_t seed) {
  std::vector<std::vector<float>> x;
  for (int r = 0; r < n; ++r) x.push_back(layer.sample(seed + std::uint64_t(r)));
  return x;
}

/// What Algorithm 1 approximates: every input encoded whole, the payloads
/// summed in the compressed domain, decoded once. The summed payload goes to
/// `*summed` when given.
inline std::vector<float> compressed_domain_sum(const linear_compressor<>& codec,
                                                const std::vector<std::vector<float>>& x,
                                                gradiveq_payload* summed = nullptr) {
  gradiveq_payload acc, tmp;
  codec.encode(x[0], acc);
  for (std::size_t r = 1; r < x.size(); ++r) {
    codec.encode(x[r], tmp);
    codec.accumulate(acc, tmp);
  }
  std::vector<float> out(x[0].size());
  codec.decode(acc, out);
  if (summed) *summed = std::move(acc);
  return out;
}

}  // namespace gradcomp::test_support
