#pragma once
/// \file schedules.hpp
/// All-reduce schedules beyond the ring (issue 21), over any
/// gradcomp::Transport, for float vectors and, through the customization
/// point of Algorithm 1 (ring_segmentation), for LinearCodecs:
///
///     gradcomp::allreduce(t, grad, {.kind = gradcomp::schedule_kind::rabenseifner});
///     gradcomp::allreduce(gradcomp::execution::simd{}, t, grad, options);
///     gradcomp::allreduce_linear(t, gradiveq_codec, grad, {.kind = schedule_kind::rabenseifner});
///
/// | schedule        | header                          | latency steps | bytes per rank (of the vector) |
/// |-----------------|---------------------------------|---------------|--------------------------------|
/// | ring            | ring_allreduce.hpp              | 2(N-1)        | 2(N-1)/N                       |
/// | pipelined_ring  | schedules/pipelined_ring.hpp    | 2(N-1)        | 2(N-1)/N, chunked              |
/// | rabenseifner    | schedules/rabenseifner.hpp      | 2 log2 p (+2) | 2(p-1)/p (+1 for folded pairs) |
/// | hierarchical    | schedules/hierarchical.hpp      | 2(g-1)+2(G-1) | 2(g-1)/g + 2(G-1)/(gG)         |
/// | library         | schedules/library.hpp           | the library's | the library's                  |
/// | direct          | schedules/direct.hpp            | 2             | 2(N-1)/N, N-1 messages at once |
///
/// In a LinearCodec's compressed domain (allreduce_linear): ring_allreduce_linear
/// (ring/linear.hpp), rabenseifner_linear.hpp, hierarchical_linear.hpp, direct_linear.hpp.
///
/// Several buckets' LinearCodecs summed in one compressed all-reduce:
/// codec_group (schedules/codec_group.hpp), a LinearCodec over their
/// concatenated vectors.
///
/// Every schedule leaves bit-identical values on every rank: each element
/// is summed by one rank and its bits copied to the others. The cost model
/// A driver: no codec header; codecs are seen through the concepts.

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/schedules/agreement.hpp>
#include <gradcomp/schedules/codec_group.hpp>
#include <gradcomp/schedules/cost_model.hpp>
#include <gradcomp/schedules/direct.hpp>
#include <gradcomp/schedules/direct_linear.hpp>
#include <gradcomp/schedules/hierarchical.hpp>
#include <gradcomp/schedules/hierarchical_linear.hpp>
#include <gradcomp/schedules/library.hpp>
#include <gradcomp/schedules/link.hpp>
#include <gradcomp/schedules/options.hpp>
#include <gradcomp/schedules/pipelined_ring.hpp>
#include <gradcomp/schedules/rabenseifner.hpp>
#include <gradcomp/schedules/rabenseifner_linear.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The dense schedules with an explicit addition: the plain ring only with
/// the policy's float addition (float_adder), the others with any `add`.
template <class Policy, class T, class Add>
ring_stats allreduce_with(T& t, std::span<float> data, const schedule_options& o, Add& add) {
  switch (o.kind) {
    case schedule_kind::ring:
      if constexpr (std::is_same_v<std::remove_cvref_t<Add>, float_adder<Policy>>) {
        const auto started = ring_clock::now();
        ring_allreduce(Policy{}, t, data, schedule_ring_options(o));
        ring_stats st;
        const ring_schedule ring(static_cast<int>(t.rank()), static_cast<int>(t.size()), data.size());
        for (int s = 0; s < ring.steps(); ++s)
          st.bytes_sent += sizeof(float) * (ring.size(ring.reduce_scatter_send(s)) + ring.size(ring.all_gather_send(s)));
        st.messages_sent = 2 * static_cast<std::size_t>(ring.steps());
        st.seconds = ring_seconds_since(started);
        return st;
      } else {
        // Another addition: the pipelined ring without chunks is the same ring.
        schedule_options one = o;
        one.chunk_elements = 0;
        return pipelined_ring_impl(t, data, one, add);
      }
    case schedule_kind::pipelined_ring: return pipelined_ring_impl(t, data, o, add);
    case schedule_kind::rabenseifner: return rabenseifner_impl(t, data, o, add);
    case schedule_kind::hierarchical: return hierarchical_impl(t, data, o, add);
    case schedule_kind::direct: return direct_impl(t, data, o, add);
    case schedule_kind::library:
      if constexpr (LibraryAllreduceTransport<T>) {
        if constexpr (std::is_same_v<std::remove_cvref_t<Add>, float_adder<Policy>>) return library_allreduce(t, data, o);
      }
      throw invalid_argument_error(
          "allreduce: the library schedule needs a LibraryAllreduceTransport (mpi_transport) and float32 sums");
  }
  throw invalid_argument_error("allreduce: unknown schedule_kind " + std::to_string(static_cast<int>(o.kind)));
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Sums (or averages, options.average) `data` in place over the ranks of `t`
/// with the schedule options.kind; additions with the policy's add_into.
/// Every rank must pass the same length and options. Returns what this rank
/// sent and how long it waited and added (ring_stats; the library schedule
/// reports its time only). The library schedule needs a
/// LibraryAllreduceTransport (invalid_argument_error otherwise).
template <ExecutionPolicy Policy, Transport T>
ring_stats allreduce(Policy, T& t, std::span<float> data, const schedule_options& options = {}) {
  float_adder<Policy> add;
  return detail::allreduce_with<Policy>(t, data, options, add);
}

/// allreduce with the generic (execution::seq) kernels.
template <Transport T>
ring_stats allreduce(T& t, std::span<float> data, const schedule_options& options = {}) {
  return allreduce(execution::seq{}, t, data, options);
}

/// The all-reduce of a LinearCodec's compressed vector on a schedule:
/// ring and pipelined_ring run Algorithm 1 of seed 002
/// (ring_allreduce_linear, which already overlaps encoding and transfer),
/// rabenseifner runs rabenseifner_allreduce_linear, hierarchical
/// hierarchical_allreduce_linear, direct direct_allreduce_linear. The
/// library schedule has no compressed form here (invalid_argument_error:
/// MPI cannot add a codec's payloads; the whole-model exchange hands a
/// LinearCodec's summable float32 buffer to the library).
template <ExecutionPolicy Policy, Transport T, class C>
  requires LinearCodec<std::remove_const_t<C>>
ring_stats allreduce_linear(Policy, T& t, C& codec, std::span<float> data, const schedule_options& options = {}) {
  switch (options.kind) {
    case schedule_kind::ring:
    case schedule_kind::pipelined_ring:
      return ring_allreduce_linear(Policy{}, t, codec, data, detail::schedule_ring_options(options));
    case schedule_kind::rabenseifner: return rabenseifner_allreduce_linear(t, codec, data, options);
    case schedule_kind::hierarchical: return hierarchical_allreduce_linear(Policy{}, t, codec, data, options);
    case schedule_kind::direct: return direct_allreduce_linear(t, codec, data, options);
    default:
      throw invalid_argument_error(std::string("allreduce_linear: no compressed form of the ") + to_string(options.kind) +
                                   " schedule (use ring, rabenseifner, hierarchical or direct; the whole-model exchange "
                                   "hands a codec's summable buffer to the library)");
  }
}

/// allreduce_linear with the generic (execution::seq) kernels.
template <Transport T, class C>
  requires LinearCodec<std::remove_const_t<C>>
ring_stats allreduce_linear(T& t, C& codec, std::span<float> data, const schedule_options& options = {}) {
  return allreduce_linear(execution::seq{}, t, codec, data, options);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
