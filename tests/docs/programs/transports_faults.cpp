// Program for the fault_injecting block of docs/transports.md.
#include <gradcomp/dense.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/fault_injection.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <vector>

int main() {
  std::vector<std::vector<float>> gradients(4, std::vector<float>(1000, 1.0f));
  const gradcomp::dense_codec<> codec;
  // @snippet
  return rejected ? 0 : 1;
}
