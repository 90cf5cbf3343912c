// Program for the Algorithm 1 block of docs/drivers.md: a fitted GradiVeQ
// codec summed round a 4-rank ring; every rank ends with the same sum.
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <cmath>
#include <span>
#include <vector>

int main() {
  const int N = 4;
  const std::size_t layer_length = 256 * 32;
  std::vector<std::vector<float>> aggregated_samples(10, std::vector<float>(layer_length));
  for (std::size_t s = 0; s < aggregated_samples.size(); ++s)
    for (std::size_t j = 0; j < layer_length; ++j)
      aggregated_samples[s][j] = float(std::cos(0.003 * double(j) * double(s + 1)));
  std::vector<std::vector<float>> result(N);
  gradcomp::transport::run_workers(N, [&](gradcomp::transport::inproc_endpoint& transport) {
    std::vector<float> grad = aggregated_samples[3];
    // @snippet
    result[transport.rank()] = grad;
  });
  for (int r = 1; r < N; ++r)
    if (result[r] != result[0]) return 1;
  return 0;
}
