#pragma once
// Shared by the LGC autoencoder tests (tests/unit/test_autoencoder*.cpp).

#include <gradcomp/autoencoder.hpp>
#include <gradcomp/detail/random.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradcomp::test_support {

/// A small architecture for the tests: two stride-2 layers (window / 4),
/// 2 code channels: a window of 32 values becomes 16 code floats.
inline lgc_architecture small_arch() {
  lgc_architecture a;
  a.encoder_channels = {8, 16};
  a.code_channels = 2;
  a.decoder_channels = {4, 16, 8};
  return a;
}

/// Gradient of `rank` at `step` for layers of `sizes` elements: a shared
/// component U(-1, 1) plus `innovation` times a per-rank one, from counter_rng(77).
inline std::vector<std::vector<float>> ranked_gradient(int rank, std::uint64_t step,
                                                       const std::vector<std::size_t>& sizes, double innovation = 0.3) {
  const gradcomp::detail::counter_rng rng(77);
  std::vector<std::vector<float>> g(sizes.size());
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    const auto shared = rng.stream(step * 16 + l), own = rng.stream((step * 16 + l) * 64 + std::uint64_t(rank) + 1);
    g[l].resize(sizes[l]);
    for (std::size_t i = 0; i < sizes[l]; ++i)
      g[l][i] = float((2.0 * shared.uniform_double(i) - 1.0) + innovation * (2.0 * own.uniform_double(i) - 1.0));
  }
  return g;
}

}  // namespace gradcomp::test_support
