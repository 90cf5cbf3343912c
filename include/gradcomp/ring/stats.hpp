#pragma once
/// \file ring/stats.hpp
/// ring_stats, what one rank did in one call of a compressed ring form, and
/// the timers that fill it.
/// Part of <gradcomp/ring_allreduce.hpp>.

#include <chrono>
#include <cstddef>
#include <utility>

#include <gradcomp/abi.hpp>

namespace gradcomp {

/// What one rank did in one call of a compressed ring form. Bytes count the
/// serialized messages (wire headers included) this rank handed to isend,
/// i.e. what its outgoing link carries.
struct ring_stats {
  std::size_t bytes_sent = 0;         ///< bytes this rank sent
  /// messages this rank sent (2(N-1) in the ring forms with whole segments,
  /// one per chunk with chunks; N-1 in the all-gather)
  std::size_t messages_sent = 0;
  std::size_t bytes_received = 0;     ///< bytes this rank received
  std::size_t own_encoded_bytes = 0;  ///< encoded_bytes() of the encodes of this rank's own input: its compressed vector
  std::size_t encodes = 0;            ///< codec encode calls
  std::size_t decodes = 0;            ///< codec decode / decode_add calls
  double encode_seconds = 0.0;        ///< time in encode
  double decode_seconds = 0.0;        ///< time in decode / decode_add (and options.average's division)
  double combine_seconds = 0.0;       ///< time in accumulate / additions, serialize and parse
  double wait_seconds = 0.0;          ///< time blocked on receives, and on the last sends at the end
  double seconds = 0.0;               ///< the whole call
};

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

using ring_clock = std::chrono::steady_clock;

/// Runs f, adding the seconds it takes to `acc`.
template <class F>
void ring_timed(double& acc, F&& f) {
  const auto t0 = ring_clock::now();
  std::forward<F>(f)();
  acc += std::chrono::duration<double>(ring_clock::now() - t0).count();
}

inline double ring_seconds_since(ring_clock::time_point t0) {
  return std::chrono::duration<double>(ring_clock::now() - t0).count();
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

}  // namespace gradcomp
