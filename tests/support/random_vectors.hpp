#pragma once
// Deterministic random inputs for the unit and MPI tests. Each generator
// reproduces, draw for draw, the one the tests defined locally before they
// shared it, so expected values tied to a seed are unchanged.

#include <gradcomp/detail/random.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <random>
#include <vector>

namespace gradcomp::test_support {

/// splitmix64 step: the golden-ratio increment then the Mix13 finaliser.
inline std::uint64_t splitmix(std::uint64_t z) { return gradcomp::detail::mix64(z + 0x9E3779B97F4A7C15ull); }

/// Uniform in [-1, 1) from the counters (a, b, c).
inline float noise(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  const std::uint64_t h = splitmix(splitmix(splitmix(a) ^ b) ^ c);
  return float(double(h >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/// `scale` * Normal(0, 1) floats from stream 0 of counter_rng(seed) (Box-Muller
/// in double on draws 2i, 2i+1, the first clamped away from 0), rounded to float
/// before the scale. The ring tests rebuild any rank's input from its seed.
inline std::vector<float> counter_gaussian(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  const auto s = gradcomp::detail::counter_rng(seed).stream(0);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double u1 = std::max(s.uniform_double(2 * i), 1e-300), u2 = s.uniform_double(2 * i + 1);
    v[i] = scale * static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return v;
}

/// Normal(0, sigma) floats from stream `stream` of counter_rng(seed) (Box-Muller
/// in double on 1 - draw 2i and draw 2i+1, sigma applied in double): the codec tests' inputs.
inline std::vector<float> normal_floats(std::size_t n, std::uint64_t seed, double sigma = 1.0,
                                        std::uint64_t stream = 0) {
  const auto s = gradcomp::detail::counter_rng(seed).stream(stream);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double u1 = 1.0 - s.uniform_double(2 * i), u2 = s.uniform_double(2 * i + 1);
    v[i] = static_cast<float>(sigma * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
  }
  return v;
}

/// n draws of std::normal_distribution<float>(0, scale) from `gen` (advances it).
inline std::vector<float> mt_normal(std::mt19937& gen, std::size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

/// The same from a fresh std::mt19937(seed).
inline std::vector<float> mt_normal(std::uint32_t seed, std::size_t n, float scale = 1.0f) {
  std::mt19937 gen(seed);
  return mt_normal(gen, n, scale);
}

}  // namespace gradcomp::test_support
