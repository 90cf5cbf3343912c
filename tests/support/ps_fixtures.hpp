#pragma once
// Inputs for the parameter-server tests (tests/unit/test_parameter_server*.cpp
// and tests/mpi/test_mpi_parameter_server.cpp): initial models, gradients of a
// toy loss, exactly summable gradients and worker schedules, all pure
// functions of their arguments so every rank and every test rebuilds them.

#include "random_vectors.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace gradcomp::test_support {

/// An initial model of n values uniform in [-1, 1).
inline std::vector<float> make_theta0(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = noise(seed, 0, i);
  return v;
}

/// Worker k's gradient at its `step`-th push: the gradient of the toy quadratic
/// loss 0.5 |theta - target|^2 at `model`, plus noise.
inline std::vector<float> toy_gradient(std::span<const float> model, int k, int step) {
  std::vector<float> g(model.size());
  for (std::size_t i = 0; i < model.size(); ++i) {
    const float target = 0.5f * noise(99, 0, i);
    g[i] = (model[i] - target) + 0.3f * noise(7, std::uint64_t(k) * 100003 + std::uint64_t(step), i);
  }
  return g;
}

/// Multiples of 2^-10 in [-8, 8), a fifth of them zero: sums of a few hundred are exact in float.
inline std::vector<float> dyadic_gradient(std::size_t n, int k, int step) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto h = splitmix(splitmix(std::uint64_t(k) * 7919 + std::uint64_t(step)) ^ i);
    g[i] = h % 5 == 0 ? 0.0f : float(static_cast<std::int64_t>(h % 16384) - 8192) / 1024.0f;
  }
  return g;
}

/// Multiples of 1/64 in [-1, 1]: an initial model that dyadic updates keep exact.
inline std::vector<float> dyadic_theta0(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(int(splitmix(i) % 129) - 64) / 64.0f;
  return v;
}

/// A fixed pseudo-random order of `steps` pushes by `workers` workers.
inline std::vector<int> schedule_of(int workers, int steps, std::uint64_t seed) {
  std::vector<int> s;
  for (int t = 0; t < steps; ++t) s.push_back(int(splitmix(seed + std::uint64_t(t)) % std::uint64_t(workers)));
  return s;
}

/// How many pushes of worker k the schedule holds.
inline int count_of(const std::vector<int>& s, int k) { return int(std::count(s.begin(), s.end(), k)); }

}  // namespace gradcomp::test_support
