// Built by the consumer tests for every optional component they link
// (GRADCOMP_CONSUMER_WANT_<NAME> is set per linked gradcomp::<name>): checks
// that the component target brings its macro, include paths, flags and libraries.
// (dense.hpp rather than the umbrella: quickstart.cpp already compiles that.)
#include <gradcomp/dense.hpp>

#include <cstdio>
#include <vector>

#if defined(GRADCOMP_CONSUMER_WANT_SIMD)
#if !defined(GRADCOMP_HAS_XSIMD)
#error "gradcomp::simd is linked but GRADCOMP_HAS_XSIMD is not defined"
#endif
#include <xsimd/xsimd.hpp>
#endif

#if defined(GRADCOMP_CONSUMER_WANT_THRUST)
#if !defined(GRADCOMP_HAS_THRUST)
#error "gradcomp::thrust is linked but GRADCOMP_HAS_THRUST is not defined"
#endif
#include <thrust/device_vector.h>
#include <thrust/reduce.h>
#if THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_OMP
#error "gradcomp::thrust should select the OpenMP device system"
#endif
#endif

#if defined(GRADCOMP_CONSUMER_WANT_MPI)
#if !defined(GRADCOMP_HAS_MPI)
#error "gradcomp::mpi is linked but GRADCOMP_HAS_MPI is not defined"
#endif
#include <mpi.h>
#endif

int main() {
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    std::printf("%-50s %s\n", what, ok ? "ok" : "FAILED");
    if (!ok) ++failures;
  };
  std::vector<float> a(1000), b(1000);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = 0.25f * static_cast<float>(i % 13);
    b[i] = -0.5f * static_cast<float>(i % 7);
  }

#if defined(GRADCOMP_CONSUMER_WANT_SIMD)
  static_assert(gradcomp::execution::simd_available, "xsimd kernels must be compiled in");
  {
    // decode_add through the xsimd kernel equals the scalar sum.
    gradcomp::dense_codec<gradcomp::execution::simd> codec;
    gradcomp::dense_payload p;
    codec.encode(b, p);
    std::vector<float> sum = a;
    codec.decode_add(p, sum);
    bool ok = true;
    for (std::size_t i = 0; i < a.size(); ++i) ok = ok && sum[i] == a[i] + b[i];
    check(ok, "simd: dense_codec<simd>::decode_add");
  }
#endif

#if defined(GRADCOMP_CONSUMER_WANT_THRUST)
  {
    thrust::device_vector<float> d(a.begin(), a.end());  // OpenMP device system: host memory
    const float sum = thrust::reduce(d.begin(), d.end(), 0.0f);
    float expected = 0.0f;
    for (float v : a) expected += v;
    check(sum == expected, "thrust: thrust::reduce on the OpenMP device system");
  }
#endif

#if defined(GRADCOMP_CONSUMER_WANT_MPI)
  {
    int major = 0, minor = 0;
    MPI_Get_version(&major, &minor);  // callable before MPI_Init
    std::printf("MPI standard %d.%d\n", major, minor);
    check(major >= 3, "mpi: MPI headers and library link");
  }
#endif

  return failures == 0 ? 0 : 1;
}
