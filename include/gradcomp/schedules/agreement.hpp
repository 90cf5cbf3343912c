#pragma once
/// \file schedules/agreement.hpp
/// The measured parts of the cost model and the agreed choice: a broadcast
/// from rank 0 (binomial tree), the 2-rank ping-pong that measures a link's
/// latency and rate, the burst that measures a message's CPU time,
/// `calibrate` (all of them plus the addition's cost, rank 0's values
/// broadcast to every rank) and `agree_schedule` (rank 0
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
#include <gradcomp/detail/wait_sends.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/schedules/cost_model.hpp>
#include <gradcomp/schedules/link.hpp>
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

/// Best (least) seconds of `fn` over `repeats` runs after one warm-up, on
/// transport T's clock (the measurements of the cost model).
template <class T, class Fn>
double best_transport_seconds(int repeats, Fn&& fn) {
  using clock = typename transport_clock<T>::type;
  double best = std::numeric_limits<double>::infinity();
  for (int i = -1; i < repeats; ++i) {
    const auto t0 = clock::now();
    fn();
    if (i >= 0) best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
  }
  return best;
}
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
  detail::wait_sends<T>(std::span(sends));
}

/// Rank 0's `values` to every rank (broadcast_bytes); transport_error naming
/// `who` when the bytes that arrive are not values.size() doubles.
template <Transport T>
void broadcast_doubles(T& t, std::span<double> values, const char* who, int tag = schedule_agreement_tag) {
  std::vector<std::byte> b(values.size_bytes());
  if (!values.empty()) std::memcpy(b.data(), values.data(), b.size());
  broadcast_bytes(t, b, tag);
  if (b.size() != values.size_bytes()) throw transport_error(std::string(who) + ": malformed broadcast");
  if (!values.empty()) std::memcpy(values.data(), b.data(), b.size());
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
    auto round_trip = [&](std::size_t bytes) {
      return detail::best_transport_seconds<T>(repeats, [&] {
        if (r == 0) {
          t.isend(peer, tag, std::vector<std::byte>(bytes)).wait();
          (void)t.irecv(peer, tag).wait();
        } else {
          auto m = t.irecv(peer, tag).wait();
          t.isend(peer, tag, std::move(m.bytes)).wait();
        }
      });
    };
    const double small = round_trip(4), large = round_trip(large_bytes);
    l.latency_s = small / 2;
    l.seconds_per_byte = std::max(0.0, large / 2 - l.latency_s) / double(std::max<std::size_t>(1, large_bytes));
  }
  double v[2] = {l.latency_s, l.seconds_per_byte};
  broadcast_doubles(t, std::span<double>(v), "measure_link", tag);
  l.latency_s = v[0];
  l.seconds_per_byte = v[1];
  return l;
}

/// Measures the CPU time of one message (the cost model's message_s)
/// through the schedules' own float_link (schedules/link.hpp: a
/// ZeroCopyTransport's isend_view / irecv_into, every receive posted before
/// the first wait): a burst of `burst` one-float messages each way against
/// one message each way (best of `repeats` after a warm-up), (T_burst -
/// T_one) / (2 (burst - 1)). Every rank takes part at once, in pairs (2i,
/// 2i+1; the last of an odd N idles), so the cost is the one of a node
/// while all N are at work. Collective; rank 0's value (its pair's) is
/// broadcast; N = 1: 0.
template <Transport T>
double measure_message_seconds(T& t, int burst = 32, int repeats = 5, int tag = schedule_agreement_tag) {
  const int n = static_cast<int>(t.size()), r = static_cast<int>(t.rank());
  if (n == 1) return 0.0;
  double per_message = 0.0;
  if ((r ^ 1) < n) {
    const int peer = r ^ 1;
    const int b = std::max(2, burst);
    std::vector<float> out(static_cast<std::size_t>(b), 1.0f), in(static_cast<std::size_t>(b));
    ring_stats st;
    detail::float_link<T> link(t, st, "measure_message_seconds");
    auto send_all = [&](int count) {
      for (int k = 0; k < count; ++k) link.send(peer, tag, std::span<const float>(out).subspan(std::size_t(k), 1));
      link.finish();
    };
    auto receive_all = [&](int count) {
      std::vector<typename detail::float_link<T>::slot> slots;
      for (int k = 0; k < count; ++k) slots.push_back(link.post(peer, tag, std::span<float>(in).subspan(std::size_t(k), 1)));
      for (auto& s : slots) link.wait_into(s);
    };
    auto exchange = [&](int count) {
      return detail::best_transport_seconds<T>(repeats, [&] {
        if (r % 2 == 0) send_all(count), receive_all(count);
        else receive_all(count), send_all(count);
      });
    };
    const double one = exchange(1), many = exchange(b);
    per_message = std::max(0.0, many - one) / (2.0 * double(b - 1));
  }
  broadcast_doubles(t, std::span<double>(&per_message, 1), "measure_message_seconds", tag);
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
  broadcast_doubles(t, std::span<double>(&add, 1), "calibrate", tag);
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
