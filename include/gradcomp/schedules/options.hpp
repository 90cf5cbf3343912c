#pragma once
/// \file schedules/options.hpp
/// The all-reduce schedules' names (schedule_kind), their options (tags from
/// the registry's `schedules` range, chunk size, group size) and the
/// addition a dense schedule makes (float_adder, or any callable).
/// Part of <gradcomp/schedules.hpp>.

#include <any>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring/schedule.hpp>
#include <gradcomp/tags.hpp>

namespace gradcomp {

/// The all-reduce schedules (docs/drivers.md, "All-reduce schedules").
/// The values are stable: they are saved in plans and checkpoints.
enum class schedule_kind : std::uint8_t {
  ring = 0,            ///< ring_allreduce: reduce-scatter + all-gather, 2(N-1) steps (seed 002, Algorithm 1)
  pipelined_ring = 1,  ///< the same ring, each hop cut into chunks: receive, add and send overlap
  rabenseifner = 2,    ///< recursive halving reduce-scatter + recursive doubling all-gather (Rabenseifner)
  hierarchical = 3,    ///< two-level ring: ring inside groups, ring across groups, ring inside groups
  library = 4,         ///< the transport's own library all-reduce (MPI_Allreduce)
  direct = 5,          ///< pairwise exchange: each segment straight to its owner, then straight to every rank (2 steps)
};

/// The number of schedule kinds.
inline constexpr std::size_t schedule_kind_count = 6;

/// A schedule's name ("ring", "pipelined_ring", "rabenseifner", "hierarchical", "library", "direct").
inline const char* to_string(schedule_kind k) noexcept {
  switch (k) {
    case schedule_kind::ring: return "ring";
    case schedule_kind::pipelined_ring: return "pipelined_ring";
    case schedule_kind::rabenseifner: return "rabenseifner";
    case schedule_kind::hierarchical: return "hierarchical";
    case schedule_kind::library: return "library";
    case schedule_kind::direct: return "direct";
  }
  return "unknown";
}

/// The schedule named `name` (as to_string writes it); invalid_argument_error otherwise.
inline schedule_kind parse_schedule_kind(std::string_view name) {
  for (std::size_t i = 0; i < schedule_kind_count; ++i) {
    const auto k = static_cast<schedule_kind>(i);
    if (name == to_string(k)) return k;
  }
  throw invalid_argument_error("schedules: unknown schedule '" + std::string(name) +
                               "' (ring, pipelined_ring, rabenseifner, hierarchical, library, direct)");
}

/// First of the two tags a schedule uses by default: the first of the
/// schedules' range in the tag registry (tags.hpp), 24576.
inline constexpr int schedule_default_tag_base = tags::schedules.first;

/// Receive space that the Rabenseifner and direct schedules keep between
/// calls: they receive up to (N-1)/N of the vector into scratch. Without a
/// workspace every call allocates that scratch and frees it, and a large
/// allocation is fresh pages the kernel must fault in and zero at first
/// touch. Under SMPI that cost is charged to gradcomp's computation (about 1.7%
/// of the direct schedule's time on ResNet-50's 32 buckets at 16 x 1 Gbit/s,
/// docs/performance.md). Give every call of one caller the same workspace
/// (schedule_options::workspace; the exchange's collectives own one).
/// One caller at a time: a workspace is not shared between threads or
/// between concurrent calls. Copies and moves start empty (it holds no
/// value, only capacity).
class schedule_workspace {
 public:
  schedule_workspace() = default;
  schedule_workspace(const schedule_workspace&) noexcept {}
  schedule_workspace& operator=(const schedule_workspace&) noexcept { return *this; }

  /// The first n floats, uninitialised (every one is written by a receive
  /// before it is read). Grows, never shrinks; growing drops the contents.
  std::span<float> floats(std::size_t n) {
    if (n > capacity_) {
      floats_.reset();  // free before allocating: never both at once
      floats_.reset(new float[n]);
      capacity_ = n;
    }
    return {floats_.get(), n};
  }
  /// Floats held.
  std::size_t capacity() const noexcept { return capacity_; }
  /// Byte buffer i of the compressed schedules' messages
  /// (rabenseifner_allreduce_linear: what arrives, what is sent), kept with
  /// its capacity across calls: messages of megabytes would otherwise be
  /// fresh pages at every call (under SMPI, 47 of the 74 ms GradiVeQ's
  /// Rabenseifner took on 64 nodes at 100 Gbit/s, docs/performance.md).
  std::vector<std::byte>& bytes(std::size_t i) {
    if (i >= bytes_.size()) bytes_.resize(i + 1);
    return bytes_[i];
  }
  /// The compressed Rabenseifner's complete blocks, in one buffer
  /// (linear_blocks::assemble), kept with its capacity across calls.
  std::vector<std::byte>& assembly() { return assembly_; }
  /// At least n payloads of type P (the compressed schedules' encoded
  /// blocks and the one they parse received blocks into), kept with their
  /// buffers across calls: a codec's encode overwrites its out-payload, and
  /// a buffer that keeps its size is neither zeroed nor faulted in again
  /// (fresh ones were among the memset and page-fault time perf showed in a
  /// 46 MB GradiVeQ all-reduce under SMPI). Payloads of another type replace them.
  template <class P>
  std::vector<P>& payloads(std::size_t n) {
    auto* kept = std::any_cast<std::vector<P>>(&payloads_);
    if (kept == nullptr) kept = &payloads_.emplace<std::vector<P>>();
    if (kept->size() < n) kept->resize(n);
    return *kept;
  }

 private:
  std::unique_ptr<float[]> floats_;
  std::size_t capacity_ = 0;
  std::vector<std::vector<std::byte>> bytes_;
  std::any payloads_;  ///< a std::vector<P> of payloads()
  std::vector<std::byte> assembly_;
};

/// Options of the all-reduce schedules.
struct schedule_options {
  /// Which schedule allreduce() runs.
  schedule_kind kind = schedule_kind::rabenseifner;
  /// Divide the sum by N (the owner of each segment divides before it is distributed).
  bool average = false;
  /// Every schedule uses tags tag_base (reduce phases) and tag_base + 1
  /// (distribution phases), checked with tags::check_tag_base(tag_owner, tag_base, 2, ...).
  int tag_base = schedule_default_tag_base;
  /// The registered range the tags belong to (the exchange names its own).
  tags::tag_range tag_owner = tags::schedules;
  /// Pipelined ring, Rabenseifner, hierarchical and direct: the floats of one message
  /// at most (a hop's segment goes as ceil(size / chunk) messages whose
  /// receive, addition and send overlap). 0: one message per hop. Default
  /// 32768 floats = 128 KiB (at least 64 KiB, where SMPI's bandwidth factors
  /// do not reward small messages).
  std::size_t chunk_elements = 32768;
  /// Rabenseifner and direct: the most messages a range exchanged with one
  /// peer is cut into; chunks grow beyond chunk_elements to keep to it
  /// (Rabenseifner: its first step's half of the vector, one chunk size for
  /// every halving step; an all-gather step of radix r > 2 shares the cap
  /// among its r - 1 peers, at least one message each; in the compressed domain, pieces of whole blocks at every
  /// halving step, the largest power of two within the cap; direct: a
  /// segment). 0: no cap. Every receive of an exchange
  /// is posted at once, so this bounds the concurrent flows a step puts on
  /// the network and the requests a rank holds: under SimGrid SMPI, 64 ranks
  /// of Rabenseifner over 11.5M floats in 128 KiB chunks were 11,000
  /// concurrent flows, which its solver did not get through in 500 s of real
  /// time. A cap, not a window of chunks in flight refilled as they land:
  /// messages between two ranks that share a link progress together and
  /// land together, so such a window drains and pays a latency per round
  /// (104 ms against 87 for whole messages, same platform). Fewer messages
  /// also cost less CPU per call; more hide more of the additions behind
  /// the transfers. 8 was the fastest measured there (88-89 ms; 4: 89, 16:
  /// 94-96, 32: 91; docs/performance.md). Changes no addition: the same bits.
  std::size_t max_chunks = 8;
  /// Rabenseifner (dense): the group size of the all-gather's steps
  /// (rabenseifner_schedule::allgather_radices). 2 (the default): recursive
  /// doubling, log2 p steps of one message per peer; a power of two r:
  /// log_r p steps, each to r - 1 peers at once; 0 (auto): two steps of
  /// about sqrt(p) peers each. Fewer steps pay fewer latencies for more
  /// messages: under SimGrid SMPI at 256 x 25 Gbit/s, where every message of
  /// 64 KB or more pays 245 us of latency, auto saves six of the eight steps.
  /// Not the default because the cost model, fitted on two ranks, cannot
  /// then choose well between this Rabenseifner and the direct schedule at
  /// 64 ranks (docs/performance.md, "The all-gather's radix"). Every rank
  /// must pass the same value (the messages differ otherwise: a
  /// transport_error). Copies only: the same bits with any radix. The
  /// compressed form (rabenseifner_allreduce_linear) always doubles.
  int allgather_radix = 2;
  /// Hierarchical: ranks per group (consecutive ranks, e.g. the ranks under
  /// one switch or on one node). Must divide N; 0 or 1 or N: one level (the
  /// pipelined ring).
  int group_size = 0;
  /// Library: compare a digest of the library's result across ranks and
  /// broadcast rank 0's bits where they differ (see library_allreduce).
  bool check_library_bits = true;
  /// Rabenseifner and direct: the scratch to reuse across calls (not owned;
  /// must outlive the call). nullptr: each call allocates its own.
  schedule_workspace* workspace = nullptr;
};

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// ring_options of the plain ring from schedule_options.
inline ring_options schedule_ring_options(const schedule_options& o) {
  return ring_options{.average = o.average, .tag_base = o.tag_base, .tag_owner = o.tag_owner};
}

/// The group sizes of Rabenseifner's all-gather steps over p = 2^k blocks
/// for schedule_options::allgather_radix (rabenseifner_schedule::allgather_radices
/// explains them; the cost model prices the same steps). Throws
/// invalid_argument_error unless radix is 0 or a power of two >= 2.
inline std::vector<int> schedule_allgather_radices(int p, int radix) {
  if (radix != 0 && (radix < 2 || (radix & (radix - 1)) != 0))
    throw invalid_argument_error("rabenseifner: allgather_radix must be 0 (auto) or a power of two >= 2, got " +
                                 std::to_string(radix));
  std::vector<int> out;
  if (radix == 0) {
    const int k = p > 1 ? static_cast<int>(std::bit_width(static_cast<unsigned>(p))) - 1 : 0;  // floor(log2 p)
    const int first = 1 << ((k + 1) / 2), second = 1 << (k / 2);
    if (first > 1) out.push_back(first);
    if (second > 1) out.push_back(second);
    return out;
  }
  for (int left = p; left > 1;) {
    const int r = left < radix ? left : radix;
    out.push_back(r);
    left /= r;
  }
  return out;
}

/// The largest power of two <= n (1 for n <= 1): Rabenseifner's block count p.
inline int schedule_pof2(int n) noexcept {
  return n > 1 ? static_cast<int>(std::bit_floor(static_cast<unsigned>(n))) : 1;
}

/// The most chunks of one peer's range at an all-gather step of radix r
/// (schedule_options::max_chunks shared by the step's r - 1 peers, at least
/// one each; 0: no cap). Radix 2 keeps max_chunks.
inline std::size_t allgather_step_cap(std::size_t max_chunks, int radix) noexcept {
  if (max_chunks == 0 || radix <= 2) return max_chunks;
  const std::size_t peers = static_cast<std::size_t>(radix - 1);
  return max_chunks > peers ? max_chunks / peers : 1;
}

/// Throws invalid_argument_error unless the options' two tags are allowed.
inline void schedule_check_tags(const schedule_options& o, const char* who) {
  tags::check_tag_base(o.tag_owner, o.tag_base, 2, who);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// The addition of a dense schedule over float32: add_into(Policy{}, acc, in)
/// of the policy's kernels. A schedule takes any callable `add(acc, in)`
/// that computes acc[i] = acc[i] (+) in[i] with a commutative (+): the
/// exchange passes the element type's rounded addition (summable buffers).
/// An addition with a member `element` (a summable_element, as
/// exchange::element_adder) of float16 or bfloat16 sends its cells packed,
/// 2 bytes each, added with summable::add_packed_into (schedules/link.hpp).
template <ExecutionPolicy Policy = execution::seq>
struct float_adder {
  void operator()(std::span<float> acc, std::span<const float> in) const { add_into(Policy{}, acc, in); }
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
