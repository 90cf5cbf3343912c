// Program for the eq. 7 block of docs/drivers.md: ring_allreduce_linear with
// an observer of the rank's own encodes (GradiVeQ's local loss).
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <cmath>
#include <span>
#include <vector>

int main() {
  using policy = gradcomp::execution::seq;
  const int N = 2, tag_linear = 100;
  const std::size_t length = 256 * 16;
  gradcomp::linear_compressor<> fitted(length, {.slice_size = 256, .summands = std::size_t(N)});
  std::vector<float> sample(length);
  for (int s = 0; s < 6; ++s) {
    for (std::size_t j = 0; j < length; ++j) sample[j] = float(std::sin(0.002 * double(j) * double(s + 1)));
    fitted.add_sample(sample);
  }
  fitted.fit();
  const gradcomp::linear_compressor<>& codec = fitted;
  std::vector<double> energy(N);
  gradcomp::transport::run_workers(N, [&](gradcomp::transport::inproc_endpoint& t) {
    std::vector<float> flat = sample;
    std::size_t encoded = 0;
    // @snippet
    energy[t.rank()] = loss.energy;
    if (encoded == 0 || !(loss.loss >= 0.0)) energy[t.rank()] = -1.0;
  });
  return energy[0] > 0.0 && energy[1] > 0.0 ? 0 : 1;
}
