#pragma once
/// \file transport/fault_injection.hpp
/// fault_injecting<T>: a Transport decorator that breaks the messages one
/// rank sends, following a fault_plan, so tests can check that every layer
/// above turns a bad network into a clear error (never a hang, never UB).
///
///     fault_plan plan(/*seed=*/42);
///     plan.drop(faults::nth_send(3))                      // lose the 4th send
///         .flip_bits(faults::sends_to(1), {0, 17})         // corrupt bits 0 and 17 of messages to rank 1
///         .flip_random_bits(faults::every_send(), 2, 1)    // 2 random bits of the first send
///         .truncate(faults::with_tag(7), 16)               // keep only 16 bytes of tag-7 messages
///         .delay(faults::every_send(), 5ms, 2)             // hold the first two sends 5 ms
///         .kill_after_sends(10);                           // the rank dies after 10 sends
///     run_workers(4, [&](inproc_endpoint& ep) {
///       fault_injecting t(ep, ep.rank() == 2 ? plan : fault_plan{});
///       ring_allreduce(t, grads[ep.rank()]);               // throws transport_error
///     });
///
/// Rules act on sends only (the receiving side passes through), in the order
/// they were added; every rule whose filter matches fires, up to `times`
/// times, except that a dropped message is gone (later rules do not see it).
/// Filters see a send_info: source, destination, tag, the 0-based index of the
/// send on this decorator, and the byte count.
///
///  - drop: the message is never delivered; the sender's handle still completes.
///  - drop_randomly: each matching send is dropped with a probability.
///  - flip_bits: flips the given bit offsets (bit i is bit i%8 of byte i/8);
///    offsets beyond the message are ignored.
///  - flip_random_bits: flips `count` bits at random offsets.
///  - truncate: keeps the first `keep_bytes` bytes.
///  - delay: the sending thread sleeps before handing the message over (it
///    holds up that rank as well as the message).
///  - kill_after_sends(k): right after the k-th send (k = 0: at construction)
///    the rank is dead: the wrapped transport's close() is called when it has
///    one (inproc: peers' sends to it and receives from it fail), and every
///    later isend/irecv on this decorator throws transport_error.
///
/// Deterministic for a seed: random choices are a hash of (seed, rank, send
/// index, rule), independent of thread timing.
///
/// Put it above emulated_link (fault_injecting<emulated_link<inproc_endpoint>>)
/// when both are used; see emulated_link.hpp.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>

namespace gradcomp::transport {

/// What a fault rule's filter sees of one send.
struct send_info {
  int source = 0;
  int dest = 0;
  int tag = 0;
  std::uint64_t index = 0;  ///< 0-based number of the send on this decorator
  std::size_t bytes = 0;
};

/// Selects the sends a rule applies to.
using send_filter = std::function<bool(const send_info&)>;

/// Ready-made filters; combine them with lambdas.
namespace faults {
GRADCOMP_ABI_NAMESPACE_BEGIN
inline send_filter every_send() {
  return [](const send_info&) { return true; };
}
inline send_filter nth_send(std::uint64_t index) {
  return [index](const send_info& s) { return s.index == index; };
}
inline send_filter sends_to(int dest) {
  return [dest](const send_info& s) { return s.dest == dest; };
}
inline send_filter with_tag(int tag) {
  return [tag](const send_info& s) { return s.tag == tag; };
}
GRADCOMP_ABI_NAMESPACE_END
}  // namespace faults

/// Counts of the faults a fault_injecting decorator has applied.
struct fault_stats {
  std::uint64_t sends = 0;  ///< isend calls that got past the kill check
  std::uint64_t dropped = 0;
  std::uint64_t corrupted = 0;  ///< messages with at least one flipped bit
  std::uint64_t truncated = 0;
  std::uint64_t delayed = 0;
  bool killed = false;
};

GRADCOMP_ABI_NAMESPACE_BEGIN
/// The faults one rank's fault_injecting applies: a list of rules plus an
/// optional kill point. Copyable; each decorator works on its own copy.
class fault_plan {
 public:
  static constexpr std::uint64_t unlimited = std::numeric_limits<std::uint64_t>::max();

  explicit fault_plan(std::uint64_t seed = 0) : seed_(seed) {}

  /// Drops matching sends (at most `times` of them).
  fault_plan& drop(send_filter which, std::uint64_t times = unlimited) {
    return add(rule(kind::drop, std::move(which), times));
  }
  /// Drops each matching send with `probability` in [0, 1].
  fault_plan& drop_randomly(double probability, send_filter which = faults::every_send(),
                            std::uint64_t times = unlimited) {
    if (!(probability >= 0.0 && probability <= 1.0))
      throw invalid_argument_error("fault_plan::drop_randomly: probability must be in [0, 1]");
    rule r(kind::drop_random, std::move(which), times);
    r.probability = probability;
    return add(std::move(r));
  }
  /// Flips the given bit offsets of matching sends.
  fault_plan& flip_bits(send_filter which, std::vector<std::size_t> bit_offsets, std::uint64_t times = unlimited) {
    rule r(kind::flip, std::move(which), times);
    r.bits = std::move(bit_offsets);
    return add(std::move(r));
  }
  /// Flips `count` bits at seeded random offsets of matching (non-empty) sends.
  fault_plan& flip_random_bits(send_filter which, std::size_t count, std::uint64_t times = unlimited) {
    rule r(kind::flip_random, std::move(which), times);
    r.count = count;
    return add(std::move(r));
  }
  /// Keeps only the first `keep_bytes` bytes of matching sends.
  fault_plan& truncate(send_filter which, std::size_t keep_bytes, std::uint64_t times = unlimited) {
    rule r(kind::truncate, std::move(which), times);
    r.count = keep_bytes;
    return add(std::move(r));
  }
  /// Sleeps `d` before handing matching sends over.
  fault_plan& delay(send_filter which, std::chrono::nanoseconds d, std::uint64_t times = unlimited) {
    if (d < std::chrono::nanoseconds::zero()) throw invalid_argument_error("fault_plan::delay: negative delay");
    rule r(kind::delay, std::move(which), times);
    r.delay = d;
    return add(std::move(r));
  }
  /// The rank dies right after its k-th send (k = 0: before any).
  fault_plan& kill_after_sends(std::uint64_t k) {
    kill_after_ = k;
    return *this;
  }

  std::uint64_t seed() const noexcept { return seed_; }
  bool empty() const noexcept { return rules_.empty() && !kill_after_; }

 private:
  template <class T>
  friend class fault_injecting;

  enum class kind { drop, drop_random, flip, flip_random, truncate, delay };
  struct rule {
    rule(kind k, send_filter f, std::uint64_t n) : what(k), which(std::move(f)), times(n) {}
    kind what;
    send_filter which;
    std::uint64_t times;
    double probability = 0.0;
    std::vector<std::size_t> bits;
    std::size_t count = 0;
    std::chrono::nanoseconds delay{0};
  };
  fault_plan& add(rule r) {
    if (!r.which) throw invalid_argument_error("fault_plan: empty send filter");
    rules_.push_back(std::move(r));
    return *this;
  }

  std::uint64_t seed_;
  std::vector<rule> rules_;
  std::optional<std::uint64_t> kill_after_;
};

GRADCOMP_ABI_NAMESPACE_END
namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN
/// SplitMix64 step: a well-mixed 64-bit hash.
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Transport decorator applying a fault_plan to the sends of one rank.
/// Satisfies Transport; see the file comment.
template <class T>
class fault_injecting {
 public:
  using inner_send_handle = decltype(std::declval<T&>().isend(0, 0, std::vector<std::byte>{}));
  using recv_handle = decltype(std::declval<T&>().irecv(0, 0));

  /// A send handle; a dropped message's handle is complete at once.
  class send_handle {
   public:
    send_handle() = default;
    explicit send_handle(inner_send_handle h) : inner_(std::move(h)) {}
    void wait() {
      if (inner_) inner_->wait();
    }
    bool test() { return inner_ ? inner_->test() : true; }

   private:
    std::optional<inner_send_handle> inner_;
  };

  /// Wraps `inner` (not owned; must outlive the decorator).
  fault_injecting(T& inner, fault_plan plan) : inner_(&inner), plan_(std::move(plan)) {
    if (plan_.kill_after_ && *plan_.kill_after_ == 0) kill();
  }

  int rank() const { return static_cast<int>(inner_->rank()); }
  int size() const { return static_cast<int>(inner_->size()); }

  send_handle isend(int dest, int tag, std::vector<std::byte>&& bytes) {
    check_alive("isend");
    send_info info{rank(), dest, tag, stats_.sends, bytes.size()};
    ++stats_.sends;
    std::optional<send_handle> result;
    std::size_t rule_no = 0;
    bool dropped = false;
    for (auto& r : plan_.rules_) {
      ++rule_no;
      if (r.times == 0 || !r.which(info)) continue;
      if (r.what == fault_plan::kind::drop_random && !(uniform(info.index, rule_no) < r.probability)) continue;
      --r.times;
      if (apply(r, rule_no, info, bytes)) {
        dropped = true;
        break;
      }
    }
    if (dropped) {
      ++stats_.dropped;
      result.emplace();
    } else {
      result.emplace(inner_->isend(dest, tag, std::move(bytes)));
    }
    if (plan_.kill_after_ && stats_.sends >= *plan_.kill_after_) kill();
    return std::move(*result);
  }

  recv_handle irecv(int source, int tag) {
    check_alive("irecv");
    return inner_->irecv(source, tag);
  }

  const fault_stats& stats() const noexcept { return stats_; }
  bool killed() const noexcept { return stats_.killed; }
  T& inner() noexcept { return *inner_; }

 private:
  // Applies one rule; true if the message is dropped.
  bool apply(const typename fault_plan::rule& r, std::size_t rule_no, const send_info& info,
             std::vector<std::byte>& bytes) {
    using kind = fault_plan::kind;
    switch (r.what) {
      case kind::drop:
      case kind::drop_random:
        return true;
      case kind::flip: {
        bool any = false;
        for (std::size_t bit : r.bits)
          if (bit / 8 < bytes.size()) {
            bytes[bit / 8] ^= std::byte(1u << (bit % 8));
            any = true;
          }
        if (any) ++stats_.corrupted;
        return false;
      }
      case kind::flip_random: {
        if (bytes.empty() || r.count == 0) return false;
        std::uint64_t state = mix(info.index, rule_no) ^ 0xF11Bu;
        for (std::size_t i = 0; i < r.count; ++i) {
          state = detail::splitmix64(state);
          const std::size_t bit = static_cast<std::size_t>(state % (std::uint64_t(bytes.size()) * 8));
          bytes[bit / 8] ^= std::byte(1u << (bit % 8));
        }
        ++stats_.corrupted;
        return false;
      }
      case kind::truncate:
        if (bytes.size() > r.count) {
          bytes.resize(r.count);
          ++stats_.truncated;
        }
        return false;
      case kind::delay:
        ++stats_.delayed;
        std::this_thread::sleep_for(r.delay);
        return false;
    }
    return false;
  }

  std::uint64_t mix(std::uint64_t index, std::size_t rule_no) const noexcept {
    std::uint64_t h = detail::splitmix64(plan_.seed_);
    h = detail::splitmix64(h ^ static_cast<std::uint64_t>(rank()));
    h = detail::splitmix64(h ^ index);
    return detail::splitmix64(h ^ rule_no);
  }
  double uniform(std::uint64_t index, std::size_t rule_no) const noexcept {
    return double(mix(index, rule_no) >> 11) * 0x1.0p-53;
  }

  void kill() {
    if (stats_.killed) return;
    stats_.killed = true;
    if constexpr (requires(T& t) { t.close(); }) inner_->close();
  }
  void check_alive(const char* op) const {
    if (stats_.killed)
      throw transport_error("fault_injecting: rank " + std::to_string(rank()) + " was killed after " +
                            std::to_string(plan_.kill_after_.value_or(0)) + " sends (" + op + " refused)");
  }

  T* inner_;
  fault_plan plan_;
  fault_stats stats_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::transport
