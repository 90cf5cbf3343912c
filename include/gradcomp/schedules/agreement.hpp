#pragma once
/// \file schedules/agreement.hpp
/// The measured parts of the cost model and the agreed choice: a broadcast
/// from rank 0 (binomial tree), the 2-rank ping-pong that measures a link's
/// latency and rate, `calibrate` (ping-pong plus the addition's cost,
/// rank 0's values broadcast to every rank) and `agree_schedule` (rank 0
/// predicts and decides, every rank receives its choice).
/// Part of <gradcomp/schedules.hpp>.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/schedules/cost_model.hpp>
#include <gradcomp/schedules/options.hpp>
#include <gradcomp/tags.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN
/// The clock a transport's measurements run on: its own `clock` where it has
/// one (mpi_transport: MPI_Wtime, the simulated time under SMPI), else
/// std::chrono::steady_clock.
template <class T>
struct transport_clock {
  using type = std::chrono::steady_clock;
};
template <class T>
  requires requires { typename T::clock; }
struct transport_clock<T> {
  using type = typename T::clock;
};
GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

/// Default tag of the cost model's messages (ping-pong, broadcasts): the third
/// of the schedules' range (the schedules use the first two).
inline constexpr int schedule_agreement_tag = tags::schedules.first + 2;

/// An agreed choice: the schedule every rank runs, and rank 0's predictions.
struct schedule_decision {
  schedule_kind kind = schedule_kind::ring;
  bool forced = false;                                ///< the user's choice, not the model's
  std::array<double, schedule_kind_count> predicted{};  ///< rank 0's predicted seconds per schedule (+inf: not applicable)
};

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Rank 0's `bytes` to every rank (a binomial tree: ceil(log2 N) rounds);
/// other ranks' `bytes` are replaced. Every rank must call it with the same tag.
template <Transport T>
void broadcast_bytes(T& t, std::vector<std::byte>& bytes, int tag = schedule_agreement_tag) {
  const int n = static_cast<int>(t.size()), r = static_cast<int>(t.rank());
  if (n == 1) return;
  int mask = 1;
  while (mask < n) {  // receive from the parent: r minus its lowest set bit
    if (r & mask) {
      bytes = t.irecv(r - mask, tag).wait().bytes;
      break;
    }
    mask <<= 1;
  }
  using send_handle = decltype(t.isend(0, 0, std::vector<std::byte>{}));
  std::vector<send_handle> sends;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (r + mask < n) sends.push_back(t.isend(r + mask, tag, std::vector<std::byte>(bytes)));
  for (auto& h : sends) h.wait();
}

/// Measures the link between ranks 0 and 1 with a ping-pong (`repeats`
/// round trips of 4 bytes and of `large_bytes`, best of each):
/// latency = small round trip / 2, seconds_per_byte = (large one-way -
/// latency) / large_bytes. Collective: every rank calls it; ranks 0's result
/// is broadcast, so every rank returns the same values. N = 1: `fallback`.
template <Transport T>
link_cost measure_link(T& t, std::size_t large_bytes = std::size_t(1) << 20, int repeats = 5,
                       int tag = schedule_agreement_tag, link_cost fallback = {}) {
  const int n = static_cast<int>(t.size()), r = static_cast<int>(t.rank());
  if (n == 1) return fallback;
  link_cost l = fallback;
  if (r < 2) {
    const int peer = 1 - r;
    using clock = typename detail::transport_clock<T>::type;
    auto round_trip = [&](std::size_t bytes) {
      double best = std::numeric_limits<double>::infinity();
      for (int i = -1; i < repeats; ++i) {  // one warm-up
        const auto t0 = clock::now();
        if (r == 0) {
          t.isend(peer, tag, std::vector<std::byte>(bytes)).wait();
          (void)t.irecv(peer, tag).wait();
        } else {
          auto m = t.irecv(peer, tag).wait();
          t.isend(peer, tag, std::move(m.bytes)).wait();
        }
        if (i >= 0) best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
      }
      return best;
    };
    const double small = round_trip(4), large = round_trip(large_bytes);
    l.latency_s = small / 2;
    l.seconds_per_byte = std::max(0.0, large / 2 - l.latency_s) / double(std::max<std::size_t>(1, large_bytes));
  }
  std::vector<std::byte> b(2 * sizeof(double));
  std::memcpy(b.data(), &l.latency_s, sizeof(double));
  std::memcpy(b.data() + sizeof(double), &l.seconds_per_byte, sizeof(double));
  broadcast_bytes(t, b, tag);
  if (b.size() != 2 * sizeof(double)) throw transport_error("measure_link: malformed broadcast");
  std::memcpy(&l.latency_s, b.data(), sizeof(double));
  std::memcpy(&l.seconds_per_byte, b.data() + sizeof(double), sizeof(double));
  return l;
}

/// Measures the CPU time of one message (the cost model's message_s) the
/// way the schedules move theirs (a ZeroCopyTransport through isend_view /
/// irecv_into, every receive posted before the first wait): a burst of
/// `burst` 4-byte messages each way against one message each way (best of
/// `repeats` after a warm-up), (T_burst - T_one) / (2 (burst - 1)). Every
/// rank takes part at once, in pairs (2i, 2i+1; the last of an odd N
/// idles), so the cost is the one of a node while all N are at work (in a
/// simulation of N ranks on one host that includes what the others leave
/// in the caches). Collective; rank 0's value (its pair's) is broadcast;
/// N = 1: 0.
template <Transport T>
double measure_message_seconds(T& t, int burst = 32, int repeats = 5, int tag = schedule_agreement_tag) {
  const int n = static_cast<int>(t.size()), r = static_cast<int>(t.rank());
  if (n == 1) return 0.0;
  double per_message = 0.0;
  if ((r ^ 1) < n) {
    const int peer = r ^ 1;
    using clock = typename detail::transport_clock<T>::type;
    const int b = std::max(2, burst);
    std::vector<std::uint32_t> words_out(static_cast<std::size_t>(b), 1u), words_in(static_cast<std::size_t>(b));
    auto send_all = [&](int count) {
      if constexpr (ZeroCopyTransport<T>) {
        std::vector<decltype(t.isend_view(0, 0, std::span<const std::byte>{}))> sends;
        for (int k = 0; k < count; ++k)
          sends.push_back(t.isend_view(peer, tag, std::as_bytes(std::span<const std::uint32_t>(&words_out[std::size_t(k)], 1))));
        for (auto& h : sends) h.wait();
      } else {
        std::vector<decltype(t.isend(0, 0, std::vector<std::byte>{}))> sends;
        for (int k = 0; k < count; ++k) sends.push_back(t.isend(peer, tag, std::vector<std::byte>(4)));
        for (auto& h : sends) h.wait();
      }
    };
    auto receive_all = [&](int count) {
      if constexpr (ZeroCopyTransport<T>) {
        std::vector<decltype(t.irecv_into(0, 0, std::span<std::byte>{}))> recvs;
        for (int k = 0; k < count; ++k)
          recvs.push_back(t.irecv_into(peer, tag, std::as_writable_bytes(std::span<std::uint32_t>(&words_in[std::size_t(k)], 1))));
        for (auto& h : recvs) (void)h.wait();
      } else {
        std::vector<decltype(t.irecv(0, 0))> recvs;
        for (int k = 0; k < count; ++k) recvs.push_back(t.irecv(peer, tag));
        for (auto& h : recvs) (void)h.wait();
      }
    };
    auto exchange = [&](int count) {
      double best = std::numeric_limits<double>::infinity();
      for (int i = -1; i < repeats; ++i) {
        const auto t0 = clock::now();
        if (r % 2 == 0) send_all(count), receive_all(count);
        else receive_all(count), send_all(count);
        if (i >= 0) best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
      }
      return best;
    };
    const double one = exchange(1), many = exchange(b);
    per_message = std::max(0.0, many - one) / (2.0 * double(b - 1));
  }
  std::vector<std::byte> buf(sizeof(double));
  std::memcpy(buf.data(), &per_message, sizeof(double));
  broadcast_bytes(t, buf, tag);
  if (buf.size() != sizeof(double)) throw transport_error("measure_message_seconds: malformed broadcast");
  std::memcpy(&per_message, buf.data(), sizeof(double));
  return per_message;
}

/// A cost model of transport `t`: the ping-pong's link (both levels, unless
/// `base` has a group size: then only `inter` is measured and `intra` is
/// kept as given), the per-message cost of a burst (message_s) and the
/// policy's measured addition cost, rank 0's values broadcast. Collective.
template <ExecutionPolicy Policy = execution::seq, Transport T>
cost_model calibrate(T& t, cost_model base = {}, int tag = schedule_agreement_tag) {
  cost_model m = base;
  m.inter = measure_link(t, std::size_t(1) << 20, 5, tag, base.inter);
  if (m.group_size <= 1) m.intra = m.inter;
  m.message_s = measure_message_seconds(t, 32, 5, tag);
  double add = measure_add_seconds<Policy>();
  std::vector<std::byte> b(sizeof(double));
  std::memcpy(b.data(), &add, sizeof add);
  broadcast_bytes(t, b, tag);
  std::memcpy(&add, b.data(), sizeof add);
  m.add_s = add;
  return m;
}

/// The agreed schedule for problem p: rank 0 predicts with ITS model (or
/// takes `forced`) and broadcasts the choice and its predictions; every rank
/// returns the same decision, whatever its own timings. Collective.
template <Transport T>
schedule_decision agree_schedule(T& t, const cost_model& m, const cost_problem& p,
                                 std::optional<schedule_kind> forced = std::nullopt, int tag = schedule_agreement_tag) {
  schedule_decision d;
  constexpr std::size_t size = 2 + sizeof(double) * schedule_kind_count;
  std::vector<std::byte> b(size);
  if (t.rank() == 0) {
    const schedule_prediction pr = predict(m, p);
    d.kind = forced ? *forced : pr.best;
    d.forced = forced.has_value();
    d.predicted = pr.seconds;
    b[0] = static_cast<std::byte>(d.kind);
    b[1] = static_cast<std::byte>(d.forced ? 1 : 0);
    std::memcpy(b.data() + 2, d.predicted.data(), sizeof(double) * schedule_kind_count);
  }
  broadcast_bytes(t, b, tag);
  if (b.size() != size || static_cast<std::size_t>(b[0]) >= schedule_kind_count)
    throw transport_error("agree_schedule: malformed decision from rank 0");
  d.kind = static_cast<schedule_kind>(b[0]);
  d.forced = b[1] != std::byte{0};
  std::memcpy(d.predicted.data(), b.data() + 2, sizeof(double) * schedule_kind_count);
  return d;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
