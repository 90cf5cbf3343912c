// compile-fail: a Codec-constrained driver (ring_allgather_decode) given a
// type that encodes but has no decode: the Codec concept names the missing
// expression.
// expect-error: ring_allgather_decode
// expect-error: Codec
// expect-error: decode\(cp, out\)
// Twin (GRADCOMP_COMPILE_FAIL_TWIN): the same type with a decode compiles.
#include <gradcomp/payloads/dense.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <cstddef>
#include <span>
#include <vector>

struct encode_only_codec {
  using payload_type = gradcomp::dense_payload;
  void encode(std::span<const float> in, payload_type& p) { p.values.assign(in.begin(), in.end()); }
#if defined(GRADCOMP_COMPILE_FAIL_TWIN)
  void decode(const payload_type& p, std::span<float> out) const {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = p.values[i];
  }
#endif
  std::size_t encoded_bytes(const payload_type& p) const { return gradcomp::wire::serialized_size(p); }
};

void run(gradcomp::transport::inproc_endpoint& ep, std::vector<float>& x) {
  encode_only_codec codec;
  (void)gradcomp::ring_allgather_decode(ep, codec, std::span<float>(x));
}
