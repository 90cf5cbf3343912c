// compile-fail: ring_allreduce_linear (Algorithm 1 of seed 002) sums payloads
// in the compressed domain, so it accepts only a LinearCodec; the two-bit
// quantizer is a Codec but not linear.
// expect-error: ring_allreduce_linear
// expect-error: LinearCodec
// Twin (GRADCOMP_COMPILE_FAIL_TWIN): the same call with dense_codec, a LinearCodec, compiles.
#include <gradcomp/dense.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <gradcomp/two_bit.hpp>

#include <span>
#include <vector>

void run(gradcomp::transport::inproc_endpoint& ep, std::vector<float>& x) {
#if defined(GRADCOMP_COMPILE_FAIL_TWIN)
  gradcomp::dense_codec<> codec;
#else
  gradcomp::two_bit_quantizer<> codec(x.size(), gradcomp::two_bit_options::fixed(0.5f));
#endif
  (void)gradcomp::ring_allreduce_linear(ep, codec, std::span<float>(x));
}
