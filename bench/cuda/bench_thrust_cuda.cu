// The Thrust kernels on a GPU (execution::thrust_cuda: thrust::cuda::par with
// the CUDA toolkit's CCCL; cuBLAS for the GradiVeQ products) against the same
// codecs under execution::seq on one core of the host, in the same run.
//
// Codec state lives in host std::vectors (docs/backends.md, "CUDA status"),
// so every thrust_cuda kernel copies its operands to the device and its
// results back. The figure a user gets is therefore host-to-host wall time,
// and the honest floor of such a call is the PCIe round trip of the gradient
// (n floats host->device, n floats device->host, pageable memory as the codec
// uses), measured here too: `vs_pcie_floor` says how far a codec is from it.
//
// Wall time, best of `repeats` after a warm-up; results are checked against
// seq once (bit for bit for the element-wise codecs and top-k; GradiVeQ
// within float rounding) so a fast wrong kernel cannot pass unnoticed.
//
//   build/bench/cuda/bench_thrust_cuda [n]     n floats (default 2^23)
//
// Without a CUDA device it prints why and exits with 77 ("skipped").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include <gradcomp/qsgd.hpp>
#include <gradcomp/samomentum.hpp>
#include <gradcomp/two_bit.hpp>
#include <gradcomp/wire.hpp>

#include "../common.hpp"
#include "gradiveq_cuda_bench.hpp"

using namespace gradcomp;
namespace ex = gradcomp::execution;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_thrust_cuda: %s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

// The PCIe round trip of n floats from and to pageable host memory: what
// every thrust_cuda call on host-resident state pays at least.
double pcie_round_trip_seconds(std::size_t n, int repeats) {
  std::vector<float> host(n, 1.0f), back(n);
  float* dev = nullptr;
  check(cudaMalloc(&dev, n * sizeof(float)), "cudaMalloc");
  const double t = gradcomp::bench::best_seconds(repeats, [&] {
    check(cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(back.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  });
  cudaFree(dev);
  return t;
}

struct row {
  const char* codec;
  double seq = 0.0, cuda = 0.0;
  bool same = false;
};

template <class Seq, class Cuda>
row time_encode(const char* name, Seq a, Cuda b, const std::vector<float>& g, int repeats) {
  typename Seq::payload_type pa;
  typename Cuda::payload_type pb;
  row r{name};
  // One encode each from the same (fresh) state: the payloads must agree.
  a.encode(g, pa);
  b.encode(g, pb);
  r.same = wire::serialize(pa) == wire::serialize(pb);
  r.seq = gradcomp::bench::best_seconds(repeats, [&] { a.encode(g, pa); });
  r.cuda = gradcomp::bench::best_seconds(repeats, [&] { b.encode(g, pb); });
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("bench_thrust_cuda: no CUDA device (%s): compiled, nothing measured\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{1} << 23;
  const int repeats = 7;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s; %zu floats (%.1f MB); seq on one host core\n", prop.name, n, 4e-6 * double(n));
  const auto g = gradcomp::bench::normal_floats(n, 1, 1e-3f);

  const double floor = pcie_round_trip_seconds(n, repeats);
  std::printf("baseline: PCIe round trip of the gradient (pageable) %.3f ms (%.1f GB/s each way)\n", floor * 1e3,
              8e-9 * double(n) / floor);

  std::vector<row> rows;
  rows.push_back(time_encode("two-bit encode (threshold 1e-3)", two_bit_quantizer<ex::seq>(n, two_bit_options::fixed(1e-3f)),
                             two_bit_quantizer<ex::thrust_cuda>(n, two_bit_options::fixed(1e-3f)), g, repeats));
  rows.push_back(time_encode("QSGD encode (4 bits, buckets of 512)", qsgd<ex::seq>(qsgd_options{4, 0, 512, 7}),
                             qsgd<ex::thrust_cuda>(qsgd_options{4, 0, 512, 7}), g, repeats));
  sa_momentum_options so;
  so.ratio_percent = 1.0;
  so.momentum = 0.7f;
  so.learning_rate = 0.1f;
  rows.push_back(time_encode("SAMomentum step (R = 1%)", sa_momentum<ex::seq>(n, so), sa_momentum<ex::thrust_cuda>(n, so),
                             g, repeats));
  const gradcomp_bench::gradiveq_times gq = gradcomp_bench::time_gradiveq(g, repeats);

  std::printf("%-38s %10s %10s %9s %12s  %s\n", "codec", "seq ms", "cuda ms", "speedup", "vs PCIe", "payload");
  for (const auto& r : rows)
    std::printf("%-38s %10.3f %10.3f %8.2fx %11.2fx  %s\n", r.codec, r.seq * 1e3, r.cuda * 1e3, r.seq / r.cuda,
                r.cuda / floor, r.same ? "equal to seq" : "DIFFERS FROM SEQ");
  std::printf("%-38s %10.3f %10.3f %8.2fx %11.2fx  %s\n", "GradiVeQ encode (slices of 64, d <= 8)", gq.seq_encode * 1e3,
              gq.cuda_encode * 1e3, gq.seq_encode / gq.cuda_encode, gq.cuda_encode / floor,
              gq.close ? "within float rounding of seq" : "DIFFERS FROM SEQ");
  std::printf("%-38s %10.3f %10.3f %8.2fx %11.2fx\n", "GradiVeQ decode", gq.seq_decode * 1e3, gq.cuda_decode * 1e3,
              gq.seq_decode / gq.cuda_decode, gq.cuda_decode / floor);

  bool all_same = gq.close;
  for (const auto& r : rows) all_same = all_same && r.same;
  std::printf("RESULT thrust_cuda_two_bit_vs_seq %.3f x\n", rows[0].seq / rows[0].cuda);
  std::printf("RESULT thrust_cuda_qsgd_vs_seq %.3f x\n", rows[1].seq / rows[1].cuda);
  std::printf("RESULT thrust_cuda_samomentum_vs_seq %.3f x\n", rows[2].seq / rows[2].cuda);
  std::printf("RESULT thrust_cuda_gradiveq_encode_vs_seq %.3f x\n", gq.seq_encode / gq.cuda_encode);
  std::printf("RESULT thrust_cuda_two_bit_vs_pcie_floor %.3f x\n", rows[0].cuda / floor);
  return all_same ? 0 : 1;
}
