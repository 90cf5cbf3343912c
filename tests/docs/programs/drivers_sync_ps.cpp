// Program for the synchronous parameter-server block of docs/drivers.md.
#include <gradcomp/presets/parameter_server_rules.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <vector>

int main() {
  const int N = 3;  // workers; rank 0 is the server
  gradcomp::layer_partition layers({1000, 10});
  std::vector<std::uint32_t> contributors(N + 1, 0);
  gradcomp::transport::run_workers(N + 1, [&](gradcomp::transport::inproc_endpoint& ep) {
    std::vector<float> grad(layers.total(), float(ep.rank()));
    // @snippet
  });
  for (int k = 1; k <= N; ++k)
    if (contributors[k] != std::uint32_t(N)) return 1;
  return 0;
}
