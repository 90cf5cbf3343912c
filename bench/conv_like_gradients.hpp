#pragma once
// Synthetic conv-like gradients for the GradiVeQ ring benches
// (bench_gradiveq_ring.cpp over emulated links, bench_mpi_netns.cpp over real
// ones): every slice of K adjacent values is mean + U a + noise with one
// K x r basis U for the layer (the linear correlation of seed 002, Sec. 1),
// coefficients a drawn per slice. Counter-based: any rank rebuilds any slice.

#include <gradcomp/detail/random.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradcomp::bench {

/// Slices of length K around one mean on a rank-r basis, plus 1e-3 uniform noise.
struct conv_like_gradients {
  using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  std::size_t K, rank;
  Eigen::MatrixXf basis;  // K x rank
  Eigen::RowVectorXf mean;
  conv_like_gradients(std::size_t k, std::size_t r)
      : K(k), rank(r), basis(static_cast<Eigen::Index>(k), static_cast<Eigen::Index>(r)),
        mean(static_cast<Eigen::Index>(k)) {
    const auto s = gradcomp::detail::counter_rng(2024).stream(0);
    for (Eigen::Index i = 0; i < basis.size(); ++i) basis.data()[i] = 2.0f * s.uniform_float(std::uint64_t(i)) - 1.0f;
    for (Eigen::Index i = 0; i < mean.size(); ++i)
      mean(i) = 0.1f * (s.uniform_float(std::uint64_t(1 << 20) + std::uint64_t(i)) - 0.5f);
  }
  /// `slices` slices of stream `seed` into out (slices x K, row-major).
  void fill(float* out, std::size_t slices, std::uint64_t seed) const {
    const auto s = gradcomp::detail::counter_rng(seed).stream(1);
    row_major a(static_cast<Eigen::Index>(slices), static_cast<Eigen::Index>(rank));
    for (Eigen::Index i = 0; i < a.size(); ++i) {
      const Eigen::Index col = i % a.cols();
      a.data()[i] = (2.0f * s.uniform_float(std::uint64_t(i)) - 1.0f) / (1.0f + 0.1f * float(col));
    }
    Eigen::Map<row_major> x(out, static_cast<Eigen::Index>(slices), static_cast<Eigen::Index>(K));
    x.noalias() = a * basis.transpose();
    x.rowwise() += mean;
    const auto noise = gradcomp::detail::counter_rng(seed).stream(2);
    for (std::size_t i = 0; i < slices * K; ++i) out[i] += 1e-3f * (noise.uniform_float(i) - 0.5f);
  }
};

/// Fits the GradiVeQ basis of `codec` (a layer of `length` values) on L_t = 48
/// aggregated samples: sample t's first slice is the sum of `workers` slices
/// of `source` (seeds 5000 + t * workers + r), the rest of the layer zero
/// (with s = infinity only slice 0 of each sample is read). Every rank that
/// calls it fits on the same samples.
template <class Codec>
void fit_on_aggregated_samples(Codec& codec, const conv_like_gradients& source, std::size_t length, int workers) {
  const std::size_t K = source.K;
  std::vector<float> sample(length, 0.0f), one(K);
  for (int t = 0; t < 48; ++t) {
    std::fill(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(K), 0.0f);
    for (int r = 0; r < workers; ++r) {
      source.fill(one.data(), 1, 5000 + std::uint64_t(t * workers + r));
      for (std::size_t i = 0; i < K; ++i) sample[i] += one[i];
    }
    codec.add_sample(sample);
  }
  codec.fit();
}

}  // namespace gradcomp::bench
