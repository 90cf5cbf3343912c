#pragma once
/// \file schedules/cost_model.hpp
/// The cost model that picks an all-reduce schedule (issue 21 item 3): a
/// latency and a rate per link level (alpha, beta; measured with a 2-rank
/// ping-pong or given), the per-element cost of an addition and of a codec's
/// encode and decode (measured), and the textbook alpha-beta-gamma times of
/// each schedule (Thakur, Rabenseifner and Gropp 2005) for a message size,
/// N and codec. One rank (rank 0) decides and broadcasts its choice, so
/// timing noise never makes ranks sum in different orders.
/// Part of <gradcomp/schedules.hpp>.

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
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
#include <gradcomp/schedules/options.hpp>

namespace gradcomp {

/// One level of links: time of a message of b bytes = latency_s + b * seconds_per_byte.
struct link_cost {
  double latency_s = 50e-6;             ///< alpha: one message's latency (s)
  double seconds_per_byte = 8.0 / 1e9;  ///< beta: the inverse rate (s per byte; 1 Gbit/s by default)
};

/// What one all-reduce moves and computes: the problem the model prices.
struct cost_problem {
  std::size_t elements = 0;       ///< floats of the vector (uncompressed)
  int ranks = 1;                  ///< N
  double wire_ratio = 1.0;        ///< cells on the wire per element (1 dense; a codec's compressed bytes / dense bytes)
  double cell_bytes = 4.0;        ///< bytes of one cell on the wire (4: float32; 2: float16, bfloat16 packed)
  double encode_s = 0.0;          ///< a codec's encode time per element of the vector (0: dense)
  double decode_s = 0.0;          ///< a codec's decode time per element of the vector (0: dense)
  bool compressed = false;        ///< a LinearCodec's payloads (no pipelined or hierarchical form)
};

/// The model's parameters: a transport's link levels and the node's compute.
struct cost_model {
  link_cost inter;                     ///< between groups (every link when there are no groups)
  link_cost intra;                     ///< inside a group (hierarchical schedule)
  double add_s = 0.5e-9;               ///< one float addition, memory traffic included (s per element)
  /// CPU time per extra message of a chunked hop (s), used while message_s
  /// is 0 (not measured); a measured message_s replaces it.
  double message_overhead_s = 2e-6;
  /// CPU time of one message on the critical path: posting it, matching and
  /// completing it at the receiver (s; measured with a burst of small
  /// messages: measure_message_seconds; 0: not modelled). Every schedule
  /// pays it per message a rank sends, which is what grows with N in the
  /// direct schedule (2(N-1) messages per rank) and not in Rabenseifner
  /// (2 log2 N). When it is > 0 it replaces message_overhead_s (one
  /// per-message cost, never both).
  double message_s = 0.0;
  int group_size = 0;                  ///< hierarchical groups (0: none, the hierarchical schedule is not priced)
  std::size_t chunk_elements = 32768;  ///< chunk of the pipelined schedules (floats)
  /// Rabenseifner and direct: the most messages per exchange
  /// (schedule_options::max_chunks; 0: no cap): chunks grow to keep to it.
  std::size_t max_chunks = 8;
  /// Dense Rabenseifner: the all-gather's radix (schedule_options::allgather_radix;
  /// 2: doubling, the default; 0: auto, two steps). The compressed form is
  /// priced with doubling, as it runs.
  int allgather_radix = 2;
  /// Price the direct schedule (N-1 concurrent flows into each port): only
  /// on a non-blocking switch whose ports share their rate fairly among
  /// flows (a flat cluster; off by default: incast and oversubscription
  /// are not in the model).
  bool price_direct = false;
};

/// A schedule's predicted time, or +inf where the schedule does not apply.
/// The library schedule is never priced (its algorithm is the library's): force it.
struct schedule_prediction {
  std::array<double, schedule_kind_count> seconds{};
  schedule_kind best = schedule_kind::ring;
};

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The chunks `elems` floats go as: ceil(elems / chunk_elements), at least
/// one (chunk_elements 0: one); `capped`: at most m.max_chunks (they grow instead).
inline double cost_chunks(double elems, const cost_model& m, bool capped, std::size_t cap) {
  double k = m.chunk_elements > 0 ? std::max(1.0, std::ceil(elems / double(m.chunk_elements))) : 1.0;
  if (capped && cap > 0) k = std::min(k, double(cap));
  return k;
}
inline double cost_chunks(double elems, const cost_model& m, bool capped) {
  return cost_chunks(elems, m, capped, m.max_chunks);
}

/// The CPU cost of sending `peers` messages of k chunks each: every one of
/// the peers x k messages' message_s when measured, else the (k-1) extra
/// chunks' message_overhead_s (the unmeasured model prices chunking only).
inline double cost_messages(double k, const cost_model& m, double peers = 1.0) {
  return m.message_s > 0.0 ? peers * k * m.message_s : (k - 1.0) * m.message_overhead_s;
}

/// A hop moving `bytes` and adding `adds` elements, in chunks (receive, add
/// and send overlap: the slower of the two plus one chunk of the other).
/// `capped`: at most m.max_chunks chunks (cost_chunks).
inline double cost_hop(const link_cost& l, double bytes, double adds, const cost_model& m, bool pipelined,
                       bool capped = false) {
  const double wire = bytes * l.seconds_per_byte, add = adds * m.add_s;
  const double k = pipelined ? cost_chunks(std::max(adds, bytes / 4.0), m, capped) : 1.0;
  if (k <= 1.0) return l.latency_s + wire + add + cost_messages(1.0, m);
  return l.latency_s + std::max(wire, add) + std::min(wire, add) / k + cost_messages(k, m);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Predicted seconds of `kind` on problem p (+inf where it does not apply):
///  ring            2(N-1) hops of s = m/N floats (m = elements x wire_ratio): (N-1)(alpha + 4s beta + s gamma) + (N-1)(alpha + 4s beta)
///  pipelined_ring  the same hops in chunks: max(4s beta, s gamma) + min(...)/k + (k-1) overhead (dense only)
///  rabenseifner    log2 p halving hops of m/2, m/4, ... (added), the all-gather's steps (radix r, stride s:
///                  alpha + (r-1) s m/p beta, (r-1) x chunks messages; doubling: log2 p hops), and for N != p
///                  the fold (alpha + 4m beta + m gamma) and unfold (alpha + 4m beta); dense hops in at most
///                  max_chunks chunks
///  hierarchical    (g-1) ring hops of m/g inside the group (intra link) and 2(G-1) hops of m/(gG)
///                  across groups, then (g-1) all-gather hops inside (dense; 1 < g < N, g | N)
///  direct          two phases of N-1 concurrent messages of m/N (one link's worth: (N-1)/N m, wire w):
///                  alpha + w, then the additions A = (N-1)/N m gamma in k = ceil((m/N) / chunk) chunks,
///                  each chunk's all-gather sent as soon as it is summed: alpha + A/k + max(w, A (k-1)/k)
///                  (the copies share the port fairly and arrive together, so only the all-gather can hide
///                  the additions, and not the first chunk's; a codec's blocks whole: k = 1)
/// plus, for a codec, (encode_s + decode_s) x elements, and message_s per message a rank sends (a hop's
/// chunks; direct: (N-1)(1 + k)). gamma = add_s. The 4 bytes of a cell are p.cell_bytes (2 for
/// packed 16-bit cells).
inline double predict_seconds(const cost_model& m, schedule_kind kind, const cost_problem& p) {
  const double inf = std::numeric_limits<double>::infinity();
  const int n = std::max(1, p.ranks);
  const double codec = (p.encode_s + p.decode_s) * double(p.elements);
  if (n == 1) return kind == schedule_kind::library || kind == schedule_kind::hierarchical ? inf : codec;
  const double mfl = double(p.elements) * p.wire_ratio, bytes = p.cell_bytes * mfl;
  const auto hops = [&](const link_cost& l, int count, double floats, bool add, bool pipelined) {
    return double(count) * detail::cost_hop(l, p.cell_bytes * floats, add ? floats : 0.0, m, pipelined);
  };
  switch (kind) {
    case schedule_kind::ring:
    case schedule_kind::pipelined_ring: {
      const bool piped = kind == schedule_kind::pipelined_ring;
      if (piped && p.compressed) return inf;
      const double s = mfl / n;
      return hops(m.inter, n - 1, s, true, piped) + hops(m.inter, n - 1, s, false, piped) + codec;
    }
    case schedule_kind::rabenseifner: {
      const int q = detail::schedule_pof2(n);
      const bool piped = !p.compressed;
      double t = codec;
      if (q != n)
        t += detail::cost_hop(m.inter, bytes, mfl, m, piped, piped) + detail::cost_hop(m.inter, bytes, 0, m, piped, piped);
      for (int d = q / 2; d >= 1; d /= 2) {
        const double part = mfl * double(d) / double(q);
        t += detail::cost_hop(m.inter, p.cell_bytes * part, part, m, piped, piped);
      }
      // The all-gather: at a step of radix r and stride s, r - 1 concurrent copies of s blocks.
      double stride = 1.0;
      for (const int r : detail::schedule_allgather_radices(q, p.compressed ? 2 : m.allgather_radix)) {
        const double per_peer = mfl * stride / double(q), peers = double(r - 1);
        const double k = piped ? detail::cost_chunks(per_peer, m, true, detail::allgather_step_cap(m.max_chunks, r)) : 1.0;
        t += m.inter.latency_s + p.cell_bytes * per_peer * peers * m.inter.seconds_per_byte + detail::cost_messages(k, m, peers);
        stride *= double(r);
      }
      return t;
    }
    case schedule_kind::hierarchical: {
      const int g = m.group_size;
      if (p.compressed || !(g > 1 && g < n && n % g == 0)) return inf;
      const int groups = n / g;
      const double s = mfl / g, b = s / groups;
      return hops(m.intra, g - 1, s, true, true) + hops(m.inter, groups - 1, b, true, true) +
             hops(m.inter, groups - 1, b, false, true) + hops(m.intra, g - 1, s, false, true);
    }
    case schedule_kind::direct: {
      if (!m.price_direct) return inf;
      const double moved = mfl * double(n - 1) / double(n);  // floats each rank sends (and receives) per phase
      const double wire = p.cell_bytes * moved * m.inter.seconds_per_byte, add = moved * m.add_s;
      // A codec's blocks go whole (direct_allreduce_linear): its sums (eq. 4) before the all-gather.
      const double k = p.compressed ? 1.0 : detail::cost_chunks(mfl / n, m, true);
      // The N-1 copies share the owner's port fairly and arrive together at the end of the first phase;
      // chunk c's all-gather then travels while chunk c + 1 is summed (schedules/direct.hpp).
      // the messages: one copy to each of the N-1 peers, then k all-gather chunks to each
      return (m.inter.latency_s + wire) + (m.inter.latency_s + add / k + std::max(wire, add * (k - 1.0) / k)) +
             detail::cost_messages(1.0, m, double(n - 1)) + detail::cost_messages(k, m, double(n - 1)) + codec;
    }
    case schedule_kind::library: return inf;
  }
  return inf;
}

/// Every schedule's prediction and the fastest (ties to the lower schedule_kind value).
inline schedule_prediction predict(const cost_model& m, const cost_problem& p) {
  schedule_prediction out;
  double best = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < schedule_kind_count; ++i) {
    const auto k = static_cast<schedule_kind>(i);
    out.seconds[i] = predict_seconds(m, k, p);
    if (out.seconds[i] < best) {
      best = out.seconds[i];
      out.best = k;
    }
  }
  return out;
}

/// Seconds per element of add_into(Policy{}, ...) on `elements` floats (best of 5).
template <ExecutionPolicy Policy = execution::seq>
double measure_add_seconds(std::size_t elements = std::size_t(1) << 20) {
  std::vector<float> a(elements, 1.0f), b(elements, 0.5f);
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    add_into(Policy{}, std::span<float>(a), std::span<const float>(b));
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best / double(std::max<std::size_t>(1, elements));
}

/// A codec's measured encode and decode time per element and its wire ratio
/// on `sample` (best of 3), as a cost_problem's codec fields.
template <Codec C>
cost_problem measure_codec(C& codec, std::span<const float> sample, bool linear = true) {
  cost_problem p;
  typename C::payload_type q;
  std::vector<float> out(sample.size());
  double enc = std::numeric_limits<double>::infinity(), dec = enc;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    codec.encode(sample, q);
    const auto t1 = std::chrono::steady_clock::now();
    codec.decode(q, std::span<float>(out));
    const auto t2 = std::chrono::steady_clock::now();
    enc = std::min(enc, std::chrono::duration<double>(t1 - t0).count());
    dec = std::min(dec, std::chrono::duration<double>(t2 - t1).count());
  }
  const double n = double(std::max<std::size_t>(1, sample.size()));
  p.elements = sample.size();
  p.encode_s = enc / n;
  p.decode_s = dec / n;
  p.wire_ratio = double(codec.encoded_bytes(q)) / (4.0 * n);
  p.compressed = linear;
  return p;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
