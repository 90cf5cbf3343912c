// compile-fail: the policy argument of a driver must be an ExecutionPolicy
// (execution::seq, simd, thrust_host, ...: an empty tag derived from seq);
// a plain struct is not one.
// expect-error: ring_allreduce
// expect-error: ExecutionPolicy
// Twin (GRADCOMP_COMPILE_FAIL_TWIN): the same call with execution::seq compiles.
#include <gradcomp/execution.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <span>
#include <vector>

struct not_a_policy {
  int threads = 4;
};

void run(gradcomp::transport::inproc_endpoint& ep, std::vector<float>& x) {
#if defined(GRADCOMP_COMPILE_FAIL_TWIN)
  gradcomp::execution::seq policy;
#else
  not_a_policy policy;
#endif
  gradcomp::ring_allreduce(policy, ep, std::span<float>(x));
}
