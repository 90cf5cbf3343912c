// The Thrust kernels under execution::thrust_cuda (thrust::cuda::par with
// the CUDA toolkit's CCCL Thrust; cuBLAS for the GradiVeQ products, in
// cuda_gradiveq.cu), compiled by nvcc: every codec is explicitly instantiated
// whole, so every kernel it calls is compiled for the device.
//
// With a CUDA device the program also runs each codec next to its seq twin
// and fails on any difference (element-wise codecs and top-k: bit for bit;
// GradiVeQ: within float rounding). Without one it exits with 77, which ctest
// reports as skipped. The machine this repository is developed on has no
// GPU: the program is compiled and linked there, never run (docs/backends.md).
#include <gradcomp/qsgd.hpp>
#include <gradcomp/samomentum.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/two_bit.hpp>
#include <gradcomp/wire.hpp>

#include <cuda_runtime.h>

#include "cuda_check.hpp"

using namespace gradcomp;
using namespace cuda_check;
namespace ex = gradcomp::execution;

static_assert(ExecutionPolicy<ex::thrust_cuda>);
static_assert(!ex::thrust_system_uses_host_memory<ex::thrust_cuda::thrust_policy_type>);

// Every member of every codec, hence every kernel, compiled for thrust_cuda.
template class gradcomp::two_bit_quantizer<ex::thrust_cuda>;
template class gradcomp::qsgd<ex::thrust_cuda>;
template class gradcomp::sparsifier_with_memory<ex::thrust_cuda>;
template class gradcomp::sa_momentum<ex::thrust_cuda>;

namespace {

// Encodes the same gradients with both codecs; payload bytes, decodes and
// saved states must be identical.
template <class A, class B>
void compare(const char* name, A& a, B& b, std::size_t n, int steps) {
  typename A::payload_type pa;
  typename B::payload_type pb;
  for (int t = 0; t < steps; ++t) {
    const auto g = normal_floats(n, 100 + t);
    a.encode(g, pa);
    b.encode(g, pb);
    std::vector<float> da(n), db(n);
    a.decode(pa, da);
    b.decode(pb, db);
    const bool same_payload = wire::serialize(pa) == wire::serialize(pb), same_decode = same_bits(da, db);
    std::printf("%-24s step %d: payload %s, decode %s\n", name, t, same_payload ? "equal" : "DIFFERENT",
                same_decode ? "equal" : "DIFFERENT");
    expect(same_payload, name);
    expect(same_decode, name);
  }
  expect(a.save_state() == b.save_state(), name);
}

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("no CUDA device (%s): the thrust_cuda kernels were compiled and linked, nothing was run\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  const std::size_t n = 100003;
  {
    two_bit_quantizer<ex::seq> a(n, two_bit_options::automatic());
    two_bit_quantizer<ex::thrust_cuda> b(n, two_bit_options::automatic());
    compare("two_bit", a, b, n, 3);
  }
  {
    qsgd<ex::seq> a(qsgd_options{4, 0, 512, 7});
    qsgd<ex::thrust_cuda> b(qsgd_options{4, 0, 512, 7});
    compare("qsgd", a, b, n, 3);
  }
  {
    const qsgd_options o{4, 0, 512, 7, ex::qsgd_norm::max};
    qsgd<ex::seq> a(o);
    qsgd<ex::thrust_cuda> b(o);
    compare("qsgd (max norm)", a, b, n, 3);
  }
  {
    sparsifier_options o;
    o.dgc_momentum = true;
    sparsifier_with_memory<ex::seq> a(n, o);
    sparsifier_with_memory<ex::thrust_cuda> b(n, o);
    compare("sparsifier_with_memory", a, b, n, 3);
  }
  for (threshold_mode mode : {threshold_mode::exact, threshold_mode::sampled}) {
    sa_momentum_options o;
    o.mode = mode;
    sa_momentum<ex::seq> a(n, o);
    sa_momentum<ex::thrust_cuda> b(n, o);
    compare(mode == threshold_mode::exact ? "sa_momentum (exact)" : "sa_momentum (sampled)", a, b, n, 3);
  }
  compare_gradiveq();
  compare_powersgd();
  compare_nn1d();
  compare_lgc();
  std::printf("%s\n", failures == 0 ? "thrust_cuda: all codecs agree with seq" : "thrust_cuda: MISMATCHES");
  return failures == 0 ? 0 : 1;
}
