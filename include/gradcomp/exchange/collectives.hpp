#pragma once
/// \file exchange/collectives.hpp
/// The collectives the exchange runs its rounds with over gradcomp's own
/// transports: the sum of a summable buffer on the ring driver
/// (ring_allreduce for float32, ring_allreduce_summable for 16-bit floats
/// and integer words: bit-identical on every rank), an all-gather of byte
/// payloads (a ring of N - 1 forwarding steps, every rank ends with every
/// payload in rank order) and the max of a small float buffer (an
/// all-gather of it, then the element-wise max in rank order).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/exchange/contract.hpp>
#include <gradcomp/payloads/summable.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/tags.hpp>

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// What one rank's collectives did (accumulated over a step).
struct wire_counters {
  std::size_t bytes_sent = 0;
  std::size_t messages_sent = 0;
  double wire_seconds = 0.0;  ///< time inside collectives (moving data, the ring's additions, waiting)
  double wait_seconds = 0.0;  ///< of which blocked on the transport (receives, and sends not yet handed off)
  /// The schedule of the last round, as its collectives name it ("ring",
  /// "rabenseifner", ... as gradcomp::to_string(schedule_kind); "all_gather"
  /// for an all-gather or an all-gather-then-max); nullptr: not reported.
  /// model_exchange records it per round (step_stats::round_log).
  const char* schedule = nullptr;
};

/// A Transport decorator adding the time its callers spend blocked in the
/// handles' wait() to a counter: the wait share of a driver that reports no
/// statistics of its own (the plain ring). Zero-copy operations are forwarded
/// when the wrapped transport has them.
template <Transport T>
class wait_timing_transport {
 public:
  wait_timing_transport(T& t, double& seconds) : t_(&t), seconds_(&seconds) {}
  int rank() const { return static_cast<int>(t_->rank()); }
  int size() const { return static_cast<int>(t_->size()); }

  /// A handle whose wait() is timed.
  template <class H>
  struct timed_handle {
    H h;
    double* seconds;
    auto wait() {
      const auto t0 = std::chrono::steady_clock::now();
      struct add {
        double* s;
        std::chrono::steady_clock::time_point t0;
        ~add() { *s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
      } guard{seconds, t0};
      return h.wait();
    }
    bool test() { return h.test(); }
  };

  auto isend(int peer, int tag, std::vector<std::byte>&& b) {
    return timed_handle<decltype(t_->isend(peer, tag, std::move(b)))>{t_->isend(peer, tag, std::move(b)), seconds_};
  }
  auto irecv(int peer, int tag) { return timed_handle<decltype(t_->irecv(peer, tag))>{t_->irecv(peer, tag), seconds_}; }
  auto isend_view(int peer, int tag, std::span<const std::byte> out)
    requires ZeroCopyTransport<T>
  {
    return timed_handle<decltype(t_->isend_view(peer, tag, out))>{t_->isend_view(peer, tag, out), seconds_};
  }
  auto irecv_into(int peer, int tag, std::span<std::byte> in)
    requires ZeroCopyTransport<T>
  {
    return timed_handle<decltype(t_->irecv_into(peer, tag, in))>{t_->irecv_into(peer, tag, in), seconds_};
  }

 private:
  T* t_;
  double* seconds_;
};

/// Sums `data` in place across the ranks of `t` with the ring driver (tags
/// tag_base and tag_base + 1). Counts the bytes and messages the ring sends,
/// and the time it is blocked on the transport.
template <ExecutionPolicy Policy, Transport T>
void sum_round(T& t, std::span<float> data, int tag_base, wire_counters& c) {
  const auto t0 = std::chrono::steady_clock::now();
  wait_timing_transport<T> timed(t, c.wait_seconds);
  ring_allreduce(Policy{}, timed, data, ring_options{.average = false, .tag_base = tag_base, .tag_owner = tags::exchange});
  const ring_schedule ring(static_cast<int>(t.rank()), static_cast<int>(t.size()), data.size());
  for (int s = 0; s < ring.steps(); ++s)
    c.bytes_sent += sizeof(float) * (ring.size(ring.reduce_scatter_send(s)) + ring.size(ring.all_gather_send(s)));
  c.messages_sent += 2 * static_cast<std::size_t>(ring.steps());
  c.wire_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Every rank's `mine` to every rank, in rank order (a ring: at step s a rank
/// forwards what it received at step s - 1). Uses tag `tag`.
template <Transport T>
std::vector<std::vector<std::byte>> all_gather_round(T& t, std::vector<std::byte> mine, int tag, wire_counters& c) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const int n = static_cast<int>(t.size()), r = static_cast<int>(t.rank());
  std::vector<std::vector<std::byte>> all(static_cast<std::size_t>(n));
  all[static_cast<std::size_t>(r)] = std::move(mine);
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int s = 0; s + 1 < n; ++s) {
    const int send_block = ((r - s) % n + n) % n, recv_block = ((r - s - 1) % n + n) % n;
    auto rh = t.irecv(prev, tag);
    const auto& out = all[static_cast<std::size_t>(send_block)];
    c.bytes_sent += out.size();
    ++c.messages_sent;
    auto sh = t.isend(next, tag, std::vector<std::byte>(out));
    const auto w0 = clock::now();
    message m = rh.wait();
    sh.wait();
    c.wait_seconds += std::chrono::duration<double>(clock::now() - w0).count();
    all[static_cast<std::size_t>(recv_block)] = std::move(m.bytes);
  }
  c.wire_seconds += std::chrono::duration<double>(clock::now() - t0).count();
  return all;
}

/// The element-wise max of `data` across the ranks, in place (an all-gather
/// of the buffer; meant for small buffers: agreed scales, flags).
template <Transport T>
void max_round(T& t, std::span<float> data, int tag, wire_counters& c) {
  std::vector<std::byte> mine(data.size() * sizeof(float));
  if (!data.empty()) std::memcpy(mine.data(), data.data(), mine.size());
  const auto all = all_gather_round(t, std::move(mine), tag, c);
  std::vector<float> one(data.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() != data.size() * sizeof(float))
      throw transport_error("exchange max round: rank " + std::to_string(r) + " sent " +
                            std::to_string(all[r].size()) + " bytes, expected " +
                            std::to_string(data.size() * sizeof(float)));
    if (!one.empty()) std::memcpy(one.data(), all[r].data(), all[r].size());
    for (std::size_t i = 0; i < one.size(); ++i) data[i] = r == 0 ? one[i] : std::max(data[i], one[i]);
  }
}

/// Sums the summable buffer `data` of element `e` in place: float32 on the
/// ring driver (sum_round), the other types on the summable ring
/// (ring_allreduce_summable: 16-bit cells travel as 2 bytes, rounded once
/// per hop; int32_words add as words). Tags tag_base and tag_base + 1.
template <ExecutionPolicy Policy, Transport T>
void sum_round(T& t, std::span<float> data, buffer_element e, int tag_base, wire_counters& c) {
  if (e == buffer_element::float32) {
    sum_round<Policy>(t, data, tag_base, c);
    return;
  }
  wait_timing_transport<T> timed(t, c.wait_seconds);
  const ring_stats st = ring_allreduce_summable(Policy{}, timed, data, e,
                                                ring_options{.average = false, .tag_base = tag_base, .tag_owner = tags::exchange});
  c.bytes_sent += st.bytes_sent;
  c.messages_sent += st.messages_sent;
  c.wire_seconds += st.seconds;
}

/// The element-wise max of the summable buffer `data` of a float element
/// type across the ranks (an all-gather of its packed cells, then the max in
/// rank order). int32_words: invalid_argument_error.
template <Transport T>
void max_round(T& t, std::span<float> data, buffer_element e, int tag, wire_counters& c) {
  if (e == buffer_element::float32) {
    max_round(t, data, tag, c);
    return;
  }
  if (e == buffer_element::int32_words)
    throw invalid_argument_error("exchange max round: int32_words buffers have no element-wise max");
  std::vector<std::byte> mine(data.size() * element_bytes(e));
  summable::pack(e, data, mine);
  const auto all = all_gather_round(t, std::move(mine), tag, c);
  std::vector<float> one(data.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() != data.size() * element_bytes(e))
      throw transport_error("exchange max round: rank " + std::to_string(r) + " sent " +
                            std::to_string(all[r].size()) + " bytes, expected " +
                            std::to_string(data.size() * element_bytes(e)));
    summable::unpack(e, all[r], one);
    if (r == 0)
      std::copy(one.begin(), one.end(), data.begin());
    else
      summable::max_into(e, data, one);
  }
}

/// The collectives a model_exchange runs its rounds with (the plug-in point of
/// other schedules: Rabenseifner, hierarchical rings, the MPI library's own
/// all-reduce). `sum` and `max` reduce a summable buffer of the given element
/// type (payloads/summable.hpp; max for the float types only). Every rank
/// must end with the same bits. model_exchange passes its tag_base to sum
/// and max (which may use tag and tag + 1) and tag_base + 2 to all_gather;
/// rounds run one after the other, never overlapping.
template <class R, class T>
concept RoundCollectives = requires(R& r, T& t, std::span<float> buf, buffer_element e, std::vector<std::byte> bytes,
                                    int tag, wire_counters& c) {
  { r.sum(t, buf, e, tag, c) } -> std::same_as<void>;
  { r.max(t, buf, e, tag, c) } -> std::same_as<void>;
  { r.all_gather(t, std::move(bytes), tag, c) } -> std::same_as<std::vector<std::vector<std::byte>>>;
};

/// gradcomp's ring collectives (the default): sum_round, max_round, all_gather_round.
template <ExecutionPolicy Policy = execution::seq>
struct ring_collectives {
  template <Transport T>
  void sum(T& t, std::span<float> data, buffer_element e, int tag, wire_counters& c) {
    sum_round<Policy>(t, data, e, tag, c);
    c.schedule = "ring";
  }
  template <Transport T>
  void max(T& t, std::span<float> data, buffer_element e, int tag, wire_counters& c) {
    max_round(t, data, e, tag, c);
    c.schedule = "all_gather";
  }
  template <Transport T>
  std::vector<std::vector<std::byte>> all_gather(T& t, std::vector<std::byte> mine, int tag, wire_counters& c) {
    c.schedule = "all_gather";
    return all_gather_round(t, std::move(mine), tag, c);
  }
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
