// Program for the codec_group block of docs/drivers.md: three buckets'
// GradiVeQ codecs (fitted identically on every rank) and a dense bucket as
// one codec_group, their gradients in one buffer, one compressed
// Rabenseifner on 4 ranks; every rank ends with the same bits, each GradiVeQ
// bucket holds about the sum and the dense bucket the sum itself.
#include <gradcomp/dense.hpp>
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

int main() {
  const int N = 4;
  const std::size_t lengths[] = {256 * 24, 256 * 9 + 17, 256 * 40};
  // Aggregated samples of a smooth gradient: what each bucket's basis is fitted on.
  auto gradient = [](std::size_t length, double phase) {
    std::vector<float> g(length);
    for (std::size_t j = 0; j < length; ++j) g[j] = float(std::cos(0.003 * double(j % 256) * phase + phase));
    return g;
  };
  std::vector<gradcomp::linear_compressor<>> fitted;
  for (std::size_t length : lengths) {
    gradcomp::gradiveq_options o;
    o.slice_size = 256;
    o.summands = N;
    gradcomp::linear_compressor<> c(length, o);
    for (int s = 0; s < 10; ++s) {  // aggregated samples: sums of N nodes' gradients
      auto g = gradient(length, 1.0 + 0.1 * s);
      for (auto& v : g) v *= float(N);
      c.add_sample(g);
    }
    c.fit();
    fitted.push_back(std::move(c));
  }
  const std::size_t fc_length = 1000;
  auto fc_gradient = [](int rank) {
    std::vector<float> g(fc_length);
    for (std::size_t j = 0; j < g.size(); ++j) g[j] = float(j % 7) * 0.25f + float(rank);  // exact in float
    return g;
  };
  std::vector<std::vector<float>> result(N);
  gradcomp::transport::run_workers(N, [&](gradcomp::transport::inproc_endpoint& t) {
    std::vector<gradcomp::linear_compressor<>> bucket_codecs = fitted;  // each rank holds its own
    auto fill_gradients = [&](std::vector<float>& buffer) {
      std::size_t at = 0;
      for (std::size_t i = 0; i < 3; at += lengths[i], ++i) {
        const auto g = gradient(lengths[i], 1.3);
        std::copy(g.begin(), g.end(), buffer.begin() + std::ptrdiff_t(at));
      }
      const auto fc = fc_gradient(t.rank());
      std::copy(fc.begin(), fc.end(), buffer.begin() + std::ptrdiff_t(at));
    };
    // @snippet
    result[std::size_t(t.rank())] = buffer;
  });
  for (int r = 1; r < N; ++r)
    if (result[std::size_t(r)] != result[0]) return 1;
  // Each bucket holds about N times its gradient (the basis spans it closely).
  double err = 0, ref = 0;
  for (std::size_t i = 0, at = 0; i < 3; at += lengths[i], ++i) {
    const auto g = gradient(lengths[i], 1.3);
    for (std::size_t j = 0; j < lengths[i]; ++j) {
      err += std::pow(result[0][at + j] - N * g[j], 2);
      ref += std::pow(N * g[j], 2);
    }
  }
  if (err > 1e-2 * ref) return 2;
  // The dense bucket holds the exact sum (small integers and quarters add exactly).
  const std::size_t fc_at = lengths[0] + lengths[1] + lengths[2];
  for (std::size_t j = 0; j < fc_length; ++j) {
    float want = 0;
    for (int r = 0; r < N; ++r) want += fc_gradient(r)[j];
    if (result[0][fc_at + j] != want) return 3;
  }
  return 0;
}
