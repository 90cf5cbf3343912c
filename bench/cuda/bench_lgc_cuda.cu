// LGC's autoencoder on a GPU (seed 004; the paper reports 0.007 ms for the
// encoder and 1 ms for the decoder on an RTX 2080 Ti): encode (E_c) and
// decode (D_c) of one iteration's values at ResNet-50 scale (the layout of
// bench_lgc: mu values through the autoencoder, windows of 1024, Tables
// I-II) with lgc_device_network (lgc/cuda.hpp: im2col + cuBLAS per
// convolution), timed with CUDA events on device-resident data (in training
// the gradients are on the GPU already), best of 20 after a warm-up.
//
// Baselines of the same run: the time to send the values uncompressed (a
// dense float32 payload, header included) at 10 Gbit/s, computed from its
// bytes, and the same windows through the CPU network (one core, Eigen).
// The per-window scale pass of autoencoder_codec (a few thousand values) is
// not on the device and not counted. Without a CUDA device the bench prints
// why and exits with 77.
#include <algorithm>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include <gradcomp/lgc/cuda.hpp>
#include <gradcomp/wire.hpp>

#include "lgc_bench_layout.hpp"

using namespace gradcomp;

namespace {

void check(cudaError_t e, const char* what) { execution::cuda_detail::check_cuda(e, what); }

// Best elapsed device time (seconds) of fn over `repeats` runs after one warm-up.
template <class Fn>
double best_device_seconds(int repeats, Fn&& fn) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  fn();
  float best = 1e30f;
  for (int r = 0; r < repeats; ++r) {
    check(cudaEventRecord(start), "cudaEventRecord");
    fn();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    best = std::min(best, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(best) * 1e-3;
}

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("bench_lgc_cuda: no CUDA device (%s): compiled, nothing measured\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const bench::lgc_bench_shape s = bench::lgc_resnet50_shape();
  std::printf("device: %s; ResNet-50 weights %zu, mu = %zu values through the autoencoder, %zu windows of %zu\n",
              prop.name, s.weights, s.mu, s.windows, s.window);

  const lgc_network net(lgc_form::ring, 1, s.window, s.architecture, 1);
  const lgc_device_network dev(net);
  nn1d::tensor<float> x;
  x.resize(1, nn1d::index_type(s.window), nn1d::index_type(s.windows));
  const auto stream = gradcomp::detail::counter_rng(7).stream(0);
  for (nn1d::index_type i = 0; i < x.data.size(); ++i) x.data.data()[i] = 2.0f * stream.uniform_float(std::uint64_t(i)) - 1.0f;
  nn1d::cuda::device_tensor dx, code, y;
  dx.upload(x);
  lgc_device_network::workspace ws;
  const double enc = best_device_seconds(20, [&] { dev.encode(dx.ptr(), s.windows, code, ws); });
  const double dec = best_device_seconds(20, [&] { dev.decode(0, code, nullptr, y, ws); });

  const double wire_10g = double(wire::header_size + 4 * s.mu) * 8.0 / 10e9;
  const bench::lgc_cpu_times cpu = bench::lgc_cpu_encode_decode(s, 5);
  std::printf("%-44s %10.4f ms\n", "encode (E_c) on the GPU", enc * 1e3);
  std::printf("%-44s %10.4f ms\n", "decode (D_c) on the GPU", dec * 1e3);
  std::printf("%-44s %10.4f ms\n", "send the values at 10 Gbit/s", wire_10g * 1e3);
  std::printf("%-44s %10.4f ms (encode %.3f, decode %.3f)\n", "the same windows on one CPU core", (cpu.encode + cpu.decode) * 1e3,
              cpu.encode * 1e3, cpu.decode * 1e3);
  std::printf("RESULT lgc_cuda_encode_ms %.4f ms\n", enc * 1e3);
  std::printf("RESULT lgc_cuda_decode_ms %.4f ms\n", dec * 1e3);
  std::printf("RESULT lgc_cuda_vs_cpu %.2f x\n", (cpu.encode + cpu.decode) / (enc + dec));
  std::printf("RESULT lgc_encode_vs_wire_10gbit %.3f x\n", (enc + dec) / wire_10g);
  return 0;
}
