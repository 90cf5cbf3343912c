#pragma once
// The LGC layout of bench_lgc (seed 004 at ResNet-50 scale: conv weights and
// fc weight, alpha 0.1%, window 1024, Tables I-II), computed on the host by
// g++ so the nvcc unit includes only lgc/cuda.hpp.
#include <cstddef>

#include <gradcomp/lgc/architecture.hpp>

namespace gradcomp::bench {

struct lgc_bench_shape {
  std::size_t weights = 0;  ///< conv + fc weights of ResNet-50
  std::size_t mu = 0;       ///< values through the autoencoder per iteration
  std::size_t window = 0;   ///< values per window
  std::size_t windows = 0;  ///< windows per iteration (mu padded up)
  lgc_architecture architecture;
};

lgc_bench_shape lgc_resnet50_shape();

/// CPU encode and decode of `windows` windows of the same network (seconds,
/// best thread CPU time of interleaved rounds): the same-run baseline.
struct lgc_cpu_times {
  double encode = 0, decode = 0;
};
lgc_cpu_times lgc_cpu_encode_decode(const lgc_bench_shape& s, std::size_t rounds);

}  // namespace gradcomp::bench
