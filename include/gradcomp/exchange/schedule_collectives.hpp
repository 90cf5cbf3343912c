#pragma once
/// \file exchange/schedule_collectives.hpp
/// RoundCollectives on the schedules of <gradcomp/schedules.hpp> (issue 21
/// item 2): the exchange's sum rounds on Rabenseifner, the hierarchical
/// ring, the pipelined ring or the MPI library's own all-reduce
/// (schedule_collectives and its named forms), or on the schedule the cost
/// model picks per buffer length, agreed by rank 0 and saved with the
/// exchange's checkpoint (auto_collectives). Max rounds run on the same
/// schedules with the element-wise max in place of the addition
/// (max_combiner: float32 cells; a 16-bit buffer is rounded to its element
/// first, so the result is the max of the rounded cells, as max_round's),
/// or on the library's max; all-gathers are the ring's.
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

/// The element-wise max as a schedule's combine step (the max rounds): NaN
/// wins whatever the order (summable::max_into), and every element is
/// combined on one rank and copied to the others, so every rank ends with
/// the same bits on every schedule. No `element` member: the cells travel
/// as float32.
struct max_combiner {
  void operator()(std::span<float> acc, std::span<const float> in) const {
    summable::max_into(summable_element::float32, acc, in);
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
    if (!done) o.kind = schedule_kind::rabenseifner;
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
  c.schedule = to_string(o.kind);
}

/// The max round of `buf` on schedule o.kind (tags `tag` and `tag` + 1, as
/// a sum round's): the library's max for float32 on the library schedule
/// (Rabenseifner where the library cannot reduce the element or the
/// transport has none), else the schedule with max_combiner. float16 and
/// bfloat16 cells are rounded to their element first and travel as float32
/// (the max of rounded values is a rounded value: no rounding on the way).
template <class Policy, Transport T>
void schedule_max(T& t, std::span<float> buf, buffer_element e, int tag, wire_counters& c, schedule_options o) {
  if (e == buffer_element::int32_words)
    throw invalid_argument_error("exchange schedules: a max round of int32_words has no meaning");
  const auto t0 = std::chrono::steady_clock::now();
  if (o.kind == schedule_kind::library) {
    if constexpr (LibraryMaxTransport<T>) {
      if (e == buffer_element::float32) {
        if (t.size() > 1) t.library_allreduce_max(buf);
        c.wire_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        c.schedule = to_string(schedule_kind::library);
        return;
      }
    }
    o.kind = schedule_kind::rabenseifner;
  }
  if (e != buffer_element::float32) summable::round_cells(e, buf);
  o.tag_base = tag;
  o.tag_owner = tags::exchange;
  o.average = false;
  max_combiner combine;
  const ring_stats st = gradcomp::detail::allreduce_with<Policy>(t, buf, o, combine);
  c.wait_seconds += st.wait_seconds;
  c.bytes_sent += st.bytes_sent;
  c.messages_sent += st.messages_sent;
  c.wire_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  c.schedule = to_string(o.kind);
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
    schedule_options o = o_;
    o.workspace = &workspace_;
    detail::schedule_max<Policy>(t, data, e, tag, c, o);
  }
  template <Transport T>
  void max(T& t, std::span<float> data, int tag, wire_counters& c) {
    max(t, data, buffer_element::float32, tag, c);
  }
  template <Transport T>
  std::vector<std::vector<std::byte>> all_gather(T& t, std::vector<std::byte> mine, int tag, wire_counters& c) {
    c.schedule = "all_gather";
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
