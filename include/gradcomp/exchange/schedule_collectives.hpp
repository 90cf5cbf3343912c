#pragma once
/// \file exchange/schedule_collectives.hpp
/// RoundCollectives on the schedules of <gradcomp/schedules.hpp> (issue 21
/// item 2): the exchange's sum rounds on Rabenseifner, the hierarchical
/// ring, the pipelined ring or the MPI library's own all-reduce
/// (schedule_collectives and its named forms), or on the schedule the cost
/// model picks per buffer length, agreed by rank 0 and saved with the
/// exchange's checkpoint (auto_collectives). Max rounds are the ring's
/// all-gather-then-max (or the library's max); all-gathers the ring's.
///
/// The element type of a summable buffer goes through one function,
/// element_adder: float32 with the policy's add_into; int32_words with
/// gradcomp::summable::add_into (payloads/summable.hpp), as 4-byte words;
/// float16 and bfloat16 cells travel packed, 2 bytes each, and are added
/// with summable::add_packed_into (the schedules' links see the adder's
/// `element`, schedules/link.hpp): rounded once per addition, as
/// ring_allreduce_summable does.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/exchange/collectives.hpp>
#include <gradcomp/exchange/contract.hpp>
#include <gradcomp/schedules.hpp>
#include <gradcomp/tags.hpp>

#if __has_include(<gradcomp/payloads/summable.hpp>)
#include <gradcomp/payloads/summable.hpp>
#define GRADCOMP_EXCHANGE_SUMMABLE 1
#else
#define GRADCOMP_EXCHANGE_SUMMABLE 0
#endif

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The addition of a summable buffer's cells: float32 with the policy's
/// add_into, other elements with summable::add_into (rounded once to the
/// element; int32_words modulo 2^32). Commutative, as the schedules need.
/// Its `element` tells the schedules' links the cells' type: 16-bit cells
/// travel packed and are added by the link with summable::add_packed_into
/// (the same bits as this operator on the unpacked cells).
template <ExecutionPolicy Policy = execution::seq>
struct element_adder {
  buffer_element element = buffer_element::float32;
  /// Throws invalid_argument_error (before any message, identically on
  /// every rank: the element comes from the plan) for an element this build cannot add.
  void check() const {
    if (element == buffer_element::float32) return;
    if (!GRADCOMP_EXCHANGE_SUMMABLE)
      throw invalid_argument_error("exchange schedules: summing buffers of element " +
                                   std::to_string(static_cast<int>(element)) +
                                   " needs gradcomp/payloads/summable.hpp (float32 only in this build)");
  }
  void operator()(std::span<float> acc, std::span<const float> in) const {
    if (element == buffer_element::float32) {
      add_into(Policy{}, acc, in);
      return;
    }
#if GRADCOMP_EXCHANGE_SUMMABLE
    summable::add_into(element, acc, in);
#else
    check();
#endif
  }
};

namespace detail {

/// Runs the sum of `buf` on schedule o.kind (tags from the round) and adds what it did to `c`.
template <class Policy, Transport T>
void schedule_sum(T& t, std::span<float> buf, buffer_element e, int tag, wire_counters& c, schedule_options o) {
  const auto t0 = std::chrono::steady_clock::now();
  const element_adder<Policy> add{e};
  add.check();
  o.tag_base = tag;
  o.tag_owner = tags::exchange;
  o.average = false;
  ring_stats st;
  bool done = false;
  if (o.kind == schedule_kind::library) {
    if constexpr (LibraryAllreduceTransport<T>) {
      if (e == buffer_element::float32) {
        st = library_allreduce(t, buf, o);
        done = true;
      } else if constexpr (LibraryWordsTransport<T>) {
        if (e == buffer_element::int32_words && t.size() > 1) {
          // The cells hold uint32 bit patterns: MPI sums them as words.
          t.library_allreduce_sum(std::span<std::uint32_t>(reinterpret_cast<std::uint32_t*>(buf.data()), buf.size()));
          done = true;
        }
      }
    }
    // The library cannot reduce this element (16-bit floats) or the transport has no library: Rabenseifner.
    o.kind = schedule_kind::rabenseifner;
  }
  if (!done) {
    if (o.kind == schedule_kind::ring && e == buffer_element::float32) {
      wait_timing_transport<T> timed(t, c.wait_seconds);
      float_adder<Policy> fadd;
      st = gradcomp::detail::allreduce_with<Policy>(timed, buf, o, fadd);
    } else {
      auto a = add;
      st = gradcomp::detail::allreduce_with<Policy>(t, buf, o, a);
      c.wait_seconds += st.wait_seconds;
    }
  }
  c.bytes_sent += st.bytes_sent;
  c.messages_sent += st.messages_sent;
  c.wire_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// The max round: the library's max for float32 on the library schedule, else max_round.
template <Transport T>
void schedule_max(T& t, std::span<float> buf, buffer_element e, int tag, wire_counters& c, schedule_kind kind) {
  if (e == buffer_element::int32_words)
    throw invalid_argument_error("exchange schedules: a max round of int32_words has no meaning");
  if constexpr (LibraryMaxTransport<T>) {
    if (kind == schedule_kind::library && e == buffer_element::float32) {
      const auto t0 = std::chrono::steady_clock::now();
      if (t.size() > 1) t.library_allreduce_max(buf);
      c.wire_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return;
    }
  }
  max_round(t, buf, e, tag, c);
}

}  // namespace detail

/// The exchange's rounds on one fixed schedule (options.kind; its
/// chunk_elements and group_size apply; tags come from the exchange).
template <ExecutionPolicy Policy = execution::seq>
class schedule_collectives {
 public:
  explicit schedule_collectives(schedule_options options = {}) : o_(options) {}
  const schedule_options& options() const noexcept { return o_; }

  template <Transport T>
  void sum(T& t, std::span<float> data, buffer_element e, int tag, wire_counters& c) {
    schedule_options o = o_;
    o.workspace = &workspace_;  // one scratch for every round of this exchange
    detail::schedule_sum<Policy>(t, data, e, tag, c, o);
  }
  template <Transport T>
  void sum(T& t, std::span<float> data, int tag, wire_counters& c) {
    sum(t, data, buffer_element::float32, tag, c);
  }
  template <Transport T>
  void max(T& t, std::span<float> data, buffer_element e, int tag, wire_counters& c) {
    detail::schedule_max(t, data, e, tag, c, o_.kind);
  }
  template <Transport T>
  void max(T& t, std::span<float> data, int tag, wire_counters& c) {
    max(t, data, buffer_element::float32, tag, c);
  }
  template <Transport T>
  std::vector<std::vector<std::byte>> all_gather(T& t, std::vector<std::byte> mine, int tag, wire_counters& c) {
    return all_gather_round(t, std::move(mine), tag, c);
  }

 private:
  schedule_options o_;
  schedule_workspace workspace_;
};

/// Sum rounds on Rabenseifner's halving and doubling.
template <ExecutionPolicy Policy = execution::seq>
struct rabenseifner_collectives : schedule_collectives<Policy> {
  explicit rabenseifner_collectives(std::size_t chunk_elements = 32768)
      : schedule_collectives<Policy>({.kind = schedule_kind::rabenseifner, .chunk_elements = chunk_elements}) {}
};

/// Sum rounds on the hierarchical two-level ring (groups of `group_size` consecutive ranks).
template <ExecutionPolicy Policy = execution::seq>
struct hierarchical_collectives : schedule_collectives<Policy> {
  explicit hierarchical_collectives(int group_size, std::size_t chunk_elements = 32768)
      : schedule_collectives<Policy>(
            {.kind = schedule_kind::hierarchical, .chunk_elements = chunk_elements, .group_size = group_size}) {}
};

/// Sum and max rounds on the transport's library all-reduce (MPI_Allreduce)
/// for the elements the library can reduce (float32, int32_words); 16-bit
/// elements, and transports without the capability, on Rabenseifner.
template <ExecutionPolicy Policy = execution::seq>
struct library_collectives : schedule_collectives<Policy> {
  library_collectives() : schedule_collectives<Policy>({.kind = schedule_kind::library}) {}
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
