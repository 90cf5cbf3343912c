#pragma once
/// \file tags.hpp
/// The one registry of the message tags gradcomp's drivers and protocols use.
///
/// Every piece that sends messages owns one range of tags below 32767 (the
/// smallest MPI_TAG_UB the MPI standard guarantees), and no two ranges
/// overlap, so two pieces running over the same transport never receive each
/// other's messages. A piece's `tag_base` option moves its tags; the
/// run-time check `check_tag_base` keeps what the piece then uses inside
/// [0, 32767] and out of every *other* piece's range (moving a piece into the
/// user range, or elsewhere inside its own range, is fine).
///
/// | range            | owner                                               |
/// |------------------|-----------------------------------------------------|
/// | [0, 16384)       | the user: free for the application's own messages   |
/// | [16384, 24576)   | the whole-model exchange's buckets                  |
/// | [24576, 26624)   | all-reduce schedules other than the ring            |
/// | [26624, 26880)   | agreements: failure flags, votes, agreed scales     |
/// | [26880, 27136)   | PowerSGD's two rounds (P, then Q)                   |
/// | [30000, 30032)   | LGC's ring and parameter-server forms               |
/// | [31000, 31016)   | the parameter servers (synchronous and DGS)         |
/// | [32000, 32064)   | the ring all-reduce (dense and compressed forms)    |
///
/// The gaps ([27136, 30000) and the ones between the last three) are
/// reserved for pieces to come; `static_assert`s below and
/// tests/unit/test_tags.cpp check that the ranges are disjoint.

#include <array>
#include <string>

#include <gradcomp/errors.hpp>

namespace gradcomp::tags {

/// The largest tag every MPI implementation must accept (MPI_TAG_UB >= 32767).
inline constexpr int mpi_tag_upper_bound = 32767;

/// A half-open range of tags [first, first + count) owned by one piece.
struct tag_range {
  const char* owner;
  int first;
  int count;

  constexpr int end() const noexcept { return first + count; }
  constexpr bool contains(int tag) const noexcept { return tag >= first && tag < end(); }
  /// True when [begin, begin + width) shares a tag with this range.
  constexpr bool overlaps(int begin, int width) const noexcept { return begin < end() && first < begin + width; }
};

inline constexpr tag_range user{"the user", 0, 16384};
inline constexpr tag_range exchange{"the model exchange", 16384, 8192};
inline constexpr tag_range schedules{"the all-reduce schedules", 24576, 2048};
inline constexpr tag_range agreement{"the agreements (failure flags, votes, scales)", 26624, 256};
inline constexpr tag_range powersgd{"PowerSGD", 26880, 256};
inline constexpr tag_range lgc{"the LGC protocols", 30000, 32};
inline constexpr tag_range parameter_server{"the parameter servers", 31000, 16};
inline constexpr tag_range ring{"the ring all-reduce", 32000, 64};

/// Every registered range, in increasing order of `first`.
inline constexpr std::array<tag_range, 8> registry = {user,     exchange, schedules,        agreement,
                                                       powersgd, lgc,      parameter_server, ring};

/// True when the registry's ranges are increasing, disjoint and inside [0, 32767].
constexpr bool registry_is_valid() noexcept {
  for (std::size_t i = 0; i < registry.size(); ++i) {
    if (registry[i].first < 0 || registry[i].count <= 0 || registry[i].end() > mpi_tag_upper_bound + 1) return false;
    for (std::size_t j = 0; j < registry.size(); ++j)
      if (i != j && registry[i].overlaps(registry[j].first, registry[j].count)) return false;
    if (i > 0 && registry[i - 1].end() > registry[i].first) return false;
  }
  return true;
}
static_assert(registry_is_valid(), "gradcomp's tag ranges must be disjoint and below 32767");

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Checks that a piece owning `own`, moved to `tag_base` and using tags
/// [tag_base, tag_base + width), stays inside [0, 32767] and out of every
/// other piece's range. Throws invalid_argument_error naming `who` and the
/// range it would collide with.
inline void check_tag_base(const tag_range& own, int tag_base, int width, const char* who) {
  if (width <= 0) throw invalid_argument_error(std::string(who) + ": tag width must be positive");
  if (tag_base < 0 || tag_base > mpi_tag_upper_bound - (width - 1))
    throw invalid_argument_error(std::string(who) + ": tag_base " + std::to_string(tag_base) + " with " +
                                 std::to_string(width) + " tags leaves [0, " + std::to_string(mpi_tag_upper_bound) +
                                 "], the tags every MPI accepts");
  for (const tag_range& r : registry) {
    if (r.first == own.first || r.first == user.first) continue;
    if (r.overlaps(tag_base, width))
      throw invalid_argument_error(std::string(who) + ": tags [" + std::to_string(tag_base) + ", " +
                                   std::to_string(tag_base + width) + ") collide with the tags [" +
                                   std::to_string(r.first) + ", " + std::to_string(r.end()) + ") of " + r.owner +
                                   " (include/gradcomp/tags.hpp)");
  }
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::tags
