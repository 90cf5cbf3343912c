#pragma once
/// \file schedules/library.hpp
/// "Hand the sum to the library": an optional capability of a transport to
/// run its communication library's own all-reduce (mpi_transport: MPI's
/// MPI_Allreduce), and the schedule that uses it. The Transport concept
/// stays send / receive; this is a separate concept a transport may satisfy.
/// Part of <gradcomp/schedules.hpp>.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/schedules/agreement.hpp>
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

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// A 64-bit digest of the bits of `x` (multiply-xor over 8-byte words).
inline std::uint64_t schedule_digest(std::span<const float> x) noexcept {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ x.size();
  const auto* p = reinterpret_cast<const unsigned char*>(x.data());
  const std::size_t n = x.size_bytes();
  std::size_t i = 0;
  auto mix = [&h](std::uint64_t w) {
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  };
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + i, 8);
    mix(w);
  }
  if (i < n) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + i, n - i);
    mix(w);
  }
  return h;
}

/// True on every rank iff every rank's `x` has the same digest: one max of
/// 6 floats (the digest's three 22-bit parts and their complements: max
/// and min at once, exact in any order).
template <LibraryMaxTransport T>
bool library_bits_agree(T& t, std::span<const float> x) {
  const std::uint64_t h = schedule_digest(x);
  constexpr std::uint64_t mask = (std::uint64_t(1) << 22) - 1;
  float v[6];
  for (int i = 0; i < 3; ++i) {
    v[i] = static_cast<float>((h >> (22 * i)) & mask);
    v[i + 3] = static_cast<float>(mask - ((h >> (22 * i)) & mask));
  }
  const std::array<float, 6> mine = {v[0], v[1], v[2], v[3], v[4], v[5]};
  t.library_allreduce_max(std::span<float>(v, 6));
  for (int i = 0; i < 6; ++i)
    if (v[i] != mine[std::size_t(i)]) return false;
  return true;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Sums (or averages, options.average: every rank divides the same bits by
/// N) `data` with the transport's library all-reduce. Identical bits on
/// every rank are guaranteed, not assumed: when the transport can also take
/// a max (LibraryMaxTransport) and options.check_library_bits is set, a
/// digest of the result is compared across ranks (one max of 6 floats) and,
/// where the library left different bits on different ranks (its algorithm
/// summed in a rank-dependent order), rank 0's result is broadcast to all
/// (tag options.tag_base; counted in the stats). The library's own bytes and
/// messages are not counted; `seconds` is the call's time.
template <LibraryAllreduceTransport T>
ring_stats library_allreduce(T& t, std::span<float> data, const schedule_options& options = {}) {
  const auto started = detail::ring_clock::now();
  ring_stats st;
  if (t.size() > 1) {
    t.library_allreduce_sum(data);
    if constexpr (LibraryMaxTransport<T>) {
      if (options.check_library_bits && !detail::library_bits_agree(t, data)) {
        const auto* p = reinterpret_cast<const std::byte*>(data.data());
        std::vector<std::byte> bytes(p, p + data.size_bytes());
        broadcast_bytes(t, bytes, options.tag_base);
        if (bytes.size() != data.size_bytes()) throw transport_error("library_allreduce: malformed broadcast from rank 0");
        if (!bytes.empty()) std::memcpy(data.data(), bytes.data(), bytes.size());
        if (t.rank() == 0) {
          st.bytes_sent += data.size_bytes();
          ++st.messages_sent;
        }
      }
    }
  }
  if (options.average) detail::schedule_average(data, static_cast<int>(t.size()));
  st.seconds = detail::ring_seconds_since(started);
  return st;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
