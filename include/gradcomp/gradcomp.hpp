#pragma once
/// \file gradcomp.hpp
/// Umbrella header: every codec, driver and the in-process transport that
/// needs only Eigen. The LGC autoencoder needs zlib: it comes too when the
/// gradcomp::lgc component is linked (GRADCOMP_HAS_ZLIB). Backend-specific
/// headers (transport/mpi.hpp, system/thrust/...) are included separately,
/// with their CMake component.

#include <gradcomp/concepts.hpp>
#include <gradcomp/dense.hpp>
#include <gradcomp/dgs_server.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/half.hpp>
#include <gradcomp/homomorphic.hpp>
#include <gradcomp/layout.hpp>
#include <gradcomp/model_exchange.hpp>
#include <gradcomp/parameter_server.hpp>
#include <gradcomp/payloads/dense.hpp>
#include <gradcomp/payloads/sparse_coo.hpp>
#include <gradcomp/payloads/summable.hpp>
#include <gradcomp/payloads/topk.hpp>
#include <gradcomp/powersgd.hpp>
#include <gradcomp/presets/parameter_server_rules.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/samomentum.hpp>
#include <gradcomp/schedules/codec_group.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/tags.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <gradcomp/two_bit.hpp>
#include <gradcomp/wire.hpp>
#if defined(GRADCOMP_HAS_ZLIB)
#include <gradcomp/autoencoder.hpp>
#include <gradcomp/protocols/lgc.hpp>
#endif

namespace gradcomp {

/// Calls `f.template operator()<P>()` for every payload type the library
/// defines that needs only Eigen (the fuzzer and the wire tests iterate over
/// them); the LGC payloads, which need zlib, have for_each_lgc_payload_type.
template <class F>
void for_each_payload_type(F&& f) {
  f.template operator()<dense_payload>();
  f.template operator()<sparse_coo_payload>();
  f.template operator()<two_bit_payload>();
  f.template operator()<qsgd_payload>();
  f.template operator()<gradiveq_payload>();
  f.template operator()<codec_group_payload<gradiveq_payload>>();
  f.template operator()<codec_group_payload<gradiveq_payload, dense_payload>>();
  f.template operator()<ps_control>();
}

}  // namespace gradcomp
