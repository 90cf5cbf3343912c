// test_package: a dense payload goes through the wire format and back, and
// each linked component is exercised (TEST_PACKAGE_WITH_<NAME>).
#include <gradcomp/gradcomp.hpp>

#include <cstdio>
#include <vector>

#if defined(TEST_PACKAGE_WITH_SIMD) && !defined(GRADCOMP_HAS_XSIMD)
#error "gradcomp::simd must define GRADCOMP_HAS_XSIMD"
#endif
#if defined(TEST_PACKAGE_WITH_THRUST)
#if !defined(GRADCOMP_HAS_THRUST)
#error "gradcomp::thrust must define GRADCOMP_HAS_THRUST"
#endif
#include <thrust/device_vector.h>
#include <thrust/reduce.h>
#endif
#if defined(TEST_PACKAGE_WITH_MPI)
#if !defined(GRADCOMP_HAS_MPI)
#error "gradcomp::mpi must define GRADCOMP_HAS_MPI"
#endif
#include <mpi.h>
#endif

int main() {
  using namespace gradcomp;
  int failures = 0;
  const std::vector<float> gradient = {1.0f, -2.0f, 0.5f, 4.0f, -0.25f, 8.0f, 0.0f};

#if defined(TEST_PACKAGE_WITH_SIMD)
  using policy = execution::simd;
  static_assert(execution::simd_available);
#else
  using policy = execution::seq;
#endif
  dense_codec<policy> codec;
  dense_payload payload;
  codec.encode(gradient, payload);
  const auto bytes = wire::serialize(payload);
  const auto parsed = wire::parse<dense_payload>(bytes);
  std::vector<float> sum(gradient.size(), 1.0f);
  codec.decode_add(parsed, sum);
  for (std::size_t i = 0; i < gradient.size(); ++i)
    if (sum[i] != gradient[i] + 1.0f) ++failures;
  std::printf("gradcomp: %zu floats, %zu bytes on the wire, decode_add %s\n", gradient.size(), bytes.size(),
              failures == 0 ? "ok" : "WRONG");

#if defined(TEST_PACKAGE_WITH_THRUST)
  thrust::device_vector<float> d(gradient.begin(), gradient.end());
  const float total = thrust::reduce(d.begin(), d.end(), 0.0f);
  std::printf("thrust (device system %d): sum %g\n", THRUST_DEVICE_SYSTEM, static_cast<double>(total));
  if (total != 11.25f) ++failures;
#endif
#if defined(TEST_PACKAGE_WITH_MPI)
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  std::printf("MPI %d.%d\n", major, minor);
  if (major < 3) ++failures;
#endif
  return failures == 0 ? 0 : 1;
}
