#pragma once
/// \file schedules/library.hpp
/// "Hand the sum to the library": an optional capability of a transport to
/// run its communication library's own all-reduce (mpi_transport: MPI's
/// MPI_Allreduce), and the schedule that uses it. The Transport concept
/// stays send / receive; this is a separate concept a transport may satisfy.
/// Part of <gradcomp/schedules.hpp>.

#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/concepts.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/schedules/options.hpp>
#include <gradcomp/schedules/pipelined_ring.hpp>

namespace gradcomp {

/// A transport that can sum a float32 buffer in place over all its ranks
/// with its library's own all-reduce (`library_allreduce_sum(span<float>)`:
/// mpi_transport runs MPI_Allreduce with MPI_SUM on MPI_FLOAT). The library
/// chooses the algorithm and the order of the additions; it must leave the
/// same bits on every rank (MPI recommends it, Open MPI's and MPICH's
/// algorithms do; SMPI's too).
template <class T>
concept LibraryAllreduceTransport = Transport<T> && requires(T& t, std::span<float> x) {
  { t.library_allreduce_sum(x) } -> std::same_as<void>;
};

/// A LibraryAllreduceTransport that can also take the element-wise max of floats.
template <class T>
concept LibraryMaxTransport = LibraryAllreduceTransport<T> && requires(T& t, std::span<float> x) {
  { t.library_allreduce_max(x) } -> std::same_as<void>;
};

/// A LibraryAllreduceTransport that can also sum 32-bit unsigned words modulo
/// 2^32 (packed integer lanes: summable buffers of int32_words).
template <class T>
concept LibraryWordsTransport = LibraryAllreduceTransport<T> && requires(T& t, std::span<std::uint32_t> x) {
  { t.library_allreduce_sum(x) } -> std::same_as<void>;
};

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Sums (or averages, options.average: every rank divides the library's same
/// bits by N) `data` with the transport's library all-reduce. Only the
/// options' `average` matters (the library uses its own tags). Bytes and
/// messages are the library's and not counted; `seconds` is the call's time.
template <LibraryAllreduceTransport T>
ring_stats library_allreduce(T& t, std::span<float> data, const schedule_options& options = {}) {
  const auto started = detail::ring_clock::now();
  ring_stats st;
  if (t.size() > 1) t.library_allreduce_sum(data);
  if (options.average) detail::schedule_average(data, static_cast<int>(t.size()));
  st.seconds = detail::ring_seconds_since(started);
  return st;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
