#pragma once
/// \file ring/schedule.hpp
/// The ring all-reduce's options (tags from the registry, tags.hpp) and its
/// bookkeeping: segment bounds and who sends which segment at each step.
/// Part of <gradcomp/ring_allreduce.hpp>.

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>

#include <gradcomp/errors.hpp>
#include <gradcomp/tags.hpp>

namespace gradcomp {

/// First of the two tags a ring all-reduce uses by default: the first of the
/// ring's range in the tag registry (tags.hpp), 32000.
inline constexpr int ring_default_tag_base = tags::ring.first;

/// Options of ring_allreduce.
struct ring_options {
  /// Divide the sum by N (the owner of each segment divides before the
  /// all-gather, so the mean is bit-identical on every rank too).
  bool average = false;
  /// The call uses tags tag_base and tag_base + 1. Checked on every call
  /// with tags::check_tag_base(tag_owner, tag_base, 2, ...): both tags in
  /// [0, 32767] and outside every registered range but tag_owner's
  /// (invalid_argument_error otherwise).
  int tag_base = ring_default_tag_base;
  /// The registered range the call's tags belong to: the ring's by default.
  /// A protocol that runs the ring on tags of its own range (the LGC ring,
  /// the whole-model exchange's buckets) names that range here.
  tags::tag_range tag_owner = tags::ring;
  /// Chunks of a hop in the compressed linear ring (ring_allreduce_linear;
  /// the plain ring ignores it): each segment travels as chunks of about
  /// this many elements (rounded up to the codec's granularity, see
  /// ring_segmentation::granularity), and a hop adds, re-encodes and
  /// forwards a chunk as soon as it has arrived, so the receive of chunk
  /// c+1, the work on chunk c and the send of chunk c-1 overlap. The sums
  /// are element by element, so the result is the same as with whole
  /// segments. 0 (the default): automatic, ring_segmentation's
  /// auto_chunk_elements (ring_auto_chunk_elements of the largest segment,
  /// for every codec); ring_whole_segments:
  /// one message per segment.
  std::size_t chunk_elements = 0;
};

/// ring_options::chunk_elements for one message per segment (no chunks).
inline constexpr std::size_t ring_whole_segments = static_cast<std::size_t>(-1);

/// The automatic chunk of ring_options::chunk_elements = 0 for a largest
/// segment of `segment` elements: a 16th of it, but at least 131,072 elements
/// (an fp16 chunk is then at least 256 KB on the wire, a 4-bit one 64 KB, the
/// least message size the SMPI benches allow a schedule to choose):
/// segments of at most 131,072 elements travel whole. The same on every rank.
inline constexpr std::size_t ring_auto_chunk_elements(std::size_t segment) noexcept {
  const std::size_t sixteenth = segment / 16 + (segment % 16 != 0 ? 1 : 0);
  return sixteenth > 131072 ? sixteenth : 131072;
}

GRADCOMP_ABI_NAMESPACE_BEGIN
/// The bookkeeping of a ring over N ranks and a vector of `length` elements:
/// the segment bounds and which segment rank r sends and receives at each step.
/// Shared by the plain ring and the compressed forms (Algorithm 1 of seed 002).
///
/// Segment j is [begin(j), begin(j) + size(j)); the first length % N
/// segments hold one element more than the others, so sizes differ by at most
/// one (and are 0 when length < N for the last ones).
///
/// Reduce-scatter, steps s = 0 .. N-2 (Algorithm 1, lines 3-8): rank r sends
/// segment (r - s) mod N to rank r+1 and receives segment (r - s - 1) mod N
/// from rank r-1, which it combines with its own and sends at step s+1. After
/// the last step rank r holds the complete segment owned_segment() = (r + 1) mod N.
///
/// All-gather, steps s = 0 .. N-2 (lines 10-13): rank r sends segment
/// (r + 1 - s) mod N and receives segment (r - s) mod N, which it forwards at
/// step s+1.
class ring_schedule {
 public:
  ring_schedule(int rank, int size, std::size_t length) : rank_(rank), size_(size), length_(length) {
    if (size < 1) throw invalid_argument_error("ring_schedule: size must be >= 1, got " + std::to_string(size));
    if (rank < 0 || rank >= size)
      throw invalid_argument_error("ring_schedule: rank " + std::to_string(rank) + " outside [0, " +
                                   std::to_string(size) + ")");
    base_ = length / static_cast<std::size_t>(size);
    extra_ = length % static_cast<std::size_t>(size);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  std::size_t length() const noexcept { return length_; }
  /// Successor (receives from this rank) and predecessor (sends to it).
  int next() const noexcept { return (rank_ + 1) % size_; }
  int prev() const noexcept { return (rank_ + size_ - 1) % size_; }
  /// Steps per phase: N - 1.
  int steps() const noexcept { return size_ - 1; }

  /// Segment bounds, j in [0, N).
  std::size_t begin(int j) const noexcept {
    const auto u = static_cast<std::size_t>(j);
    return u * base_ + std::min(u, extra_);
  }
  std::size_t size(int j) const noexcept { return base_ + (static_cast<std::size_t>(j) < extra_ ? 1 : 0); }
  std::size_t end(int j) const noexcept { return begin(j) + size(j); }
  template <class T>
  std::span<T> segment(std::span<T> data, int j) const noexcept {
    return data.subspan(begin(j), size(j));
  }

  /// Reduce-scatter: segment sent / received by this rank at step s.
  int reduce_scatter_send(int s) const noexcept { return mod(rank_ - s); }
  int reduce_scatter_recv(int s) const noexcept { return mod(rank_ - s - 1); }
  /// The segment this rank holds complete after the reduce-scatter.
  int owned_segment() const noexcept { return mod(rank_ + 1); }
  /// All-gather: segment sent / received by this rank at step s.
  int all_gather_send(int s) const noexcept { return mod(rank_ + 1 - s); }
  int all_gather_recv(int s) const noexcept { return mod(rank_ - s); }

 private:
  int mod(int x) const noexcept { return ((x % size_) + size_) % size_; }
  int rank_;
  int size_;
  std::size_t length_;
  std::size_t base_ = 0;
  std::size_t extra_ = 0;
};

GRADCOMP_ABI_NAMESPACE_END
namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Throws invalid_argument_error unless tags tag_base and tag_base + 1 are in
/// [0, 32767] and collide with no registered range but options.tag_owner's.
inline void ring_check_tags(const ring_options& options, const char* who) {
  tags::check_tag_base(options.tag_owner, options.tag_base, 2, who);
}

/// Divides the owned segment by N (options.average) before it is distributed.
inline void ring_average(std::span<float> owned, int n) noexcept {
  const float divisor = static_cast<float>(n);
  for (float& v : owned) v /= divisor;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

}  // namespace gradcomp
