#pragma once
/// \file ring/dense.hpp
/// The plain (uncompressed) ring all-reduce of float vectors: reduce-scatter,
/// then all-gather (seed 002, Algorithm 1 without its compression steps), over
/// a Transport that moves byte vectors or a ZeroCopyTransport.
/// Part of <gradcomp/ring_allreduce.hpp>.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/wait_sends.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring/schedule.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The calling thread's spare buffer of the moving ring: every call ends
/// with one received segment that is not forwarded, and the next call on
/// the same thread sends its first segment in it. In a training loop this
/// saves a segment-sized allocation per call, which the allocator would
/// otherwise hand back to the kernel and page-fault in again (a 16 MB
/// segment: 4096 page faults and zero-filled pages per call). It holds at
/// most one segment per thread that ran the ring.
inline std::vector<std::byte>& ring_thread_spare() {
  thread_local std::vector<std::byte> spare;
  return spare;
}

/// Bytes of a float span, copied into the thread's spare buffer (its
/// storage is reused when it is large enough).
inline std::vector<std::byte> ring_bytes_of_reusing(std::span<const float> x) {
  std::vector<std::byte> b = std::move(ring_thread_spare());
  const auto* p = reinterpret_cast<const std::byte*>(x.data());
  b.assign(p, p + x.size_bytes());
  return b;
}

/// Throws transport_error unless a received segment has the expected length.
inline void ring_check_length(std::size_t got_bytes, std::size_t expected_floats, int self, int source, int segment,
                              const char* phase, int step) {
  const std::size_t expected = expected_floats * sizeof(float);
  if (got_bytes != expected)
    throw transport_error("ring_allreduce: rank " + std::to_string(self) + " expected " + std::to_string(expected) +
                          " bytes for segment " + std::to_string(segment) + " from rank " + std::to_string(source) +
                          " (" + phase + " step " + std::to_string(step) + "), got " + std::to_string(got_bytes) +
                          " (do all ranks pass the same length?)");
}

/// True when a byte buffer can be viewed as floats in place. Vector storage
/// comes from operator new, so this holds in practice; callers copy otherwise.
inline bool ring_float_aligned(const std::vector<std::byte>& b) noexcept {
  return reinterpret_cast<std::uintptr_t>(b.data()) % alignof(float) == 0;
}

inline std::span<float> ring_as_floats(std::vector<std::byte>& b) noexcept {
  return {reinterpret_cast<float*>(b.data()), b.size() / sizeof(float)};
}

inline void ring_copy_out(const std::vector<std::byte>& from, std::span<float> to) noexcept {
  if (!to.empty()) std::memcpy(to.data(), from.data(), to.size_bytes());
}

/// The ring over a plain Transport, which moves whole byte vectors (inproc):
/// received buffers are summed into and forwarded, so the only copies are the
/// first send of each phase and the all-gather's copy into `data`.
template <class Policy, class T>
void ring_allreduce_moving(T& t, std::span<float> data, const ring_schedule& ring, const ring_options& options) {
  const int self = ring.rank(), next = ring.next(), prev = ring.prev(), steps = ring.steps();
  const int tag_rs = options.tag_base, tag_ag = options.tag_base + 1;
  using recv_handle = decltype(t.irecv(prev, tag_rs));
  using send_handle = decltype(t.isend(next, tag_rs, std::vector<std::byte>{}));

  // Post every receive up front: they match the predecessor's messages in
  // order, so each arriving segment lands straight in its handle.
  std::vector<recv_handle> rs_recv, ag_recv;
  rs_recv.reserve(static_cast<std::size_t>(steps));
  ag_recv.reserve(static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) rs_recv.push_back(t.irecv(prev, tag_rs));
  for (int s = 0; s < steps; ++s) ag_recv.push_back(t.irecv(prev, tag_ag));
  std::vector<send_handle> sends;
  sends.reserve(static_cast<std::size_t>(2 * steps));

  // Reduce-scatter. Step 0 sends a copy of the own segment; later steps add
  // the own segment into the received buffer and forward that buffer (moved:
  // no copy). The last step adds into `data` instead, completing the owned segment.
  sends.push_back(t.isend(next, tag_rs, ring_bytes_of_reusing(ring.segment<float>(data, ring.reduce_scatter_send(0)))));
  std::vector<std::byte> spare;  // the last received buffer, reused for the all-gather's first send
  std::vector<float> unaligned;  // only used if a buffer is not float-aligned
  for (int s = 0; s < steps; ++s) {
    const int k = ring.reduce_scatter_recv(s);
    message m = rs_recv[static_cast<std::size_t>(s)].wait();
    ring_check_length(m.bytes.size(), ring.size(k), self, m.source, k, "reduce-scatter", s);
    const std::span<float> own = ring.segment<float>(data, k);
    const bool last = s + 1 == steps;
    if (ring_float_aligned(m.bytes)) {
      const std::span<float> received = ring_as_floats(m.bytes);
      if (last)
        add_into(Policy{}, own, std::span<const float>(received));
      else
        add_into(Policy{}, received, std::span<const float>(own));  // IEEE addition commutes: same bits
    } else {
      unaligned.resize(own.size());
      ring_copy_out(m.bytes, unaligned);
      if (last) {
        add_into(Policy{}, own, std::span<const float>(unaligned));
      } else {
        add_into(Policy{}, std::span<float>(unaligned), std::span<const float>(own));
        if (!unaligned.empty()) std::memcpy(m.bytes.data(), unaligned.data(), m.bytes.size());
      }
    }
    if (last)
      spare = std::move(m.bytes);
    else
      sends.push_back(t.isend(next, tag_rs, std::move(m.bytes)));
  }

  const std::span<float> mine = ring.segment<float>(data, ring.owned_segment());
  if (options.average) ring_average(mine, ring.size());

  // All-gather. The first send reuses the last reduce-scatter buffer (same
  // segment, same size); each received segment is copied into `data` and
  // the same buffer forwarded.
  if (!mine.empty()) std::memcpy(spare.data(), mine.data(), mine.size_bytes());
  sends.push_back(t.isend(next, tag_ag, std::move(spare)));
  for (int s = 0; s < steps; ++s) {
    const int k = ring.all_gather_recv(s);
    message m = ag_recv[static_cast<std::size_t>(s)].wait();
    ring_check_length(m.bytes.size(), ring.size(k), self, m.source, k, "all-gather", s);
    ring_copy_out(m.bytes, ring.segment<float>(data, k));
    if (s + 1 < steps)
      sends.push_back(t.isend(next, tag_ag, std::move(m.bytes)));
    else
      ring_thread_spare() = std::move(m.bytes);  // the next call's first send (see ring_thread_spare)
  }
  detail::wait_sends<T>(std::span(sends));
}

/// Floats per message of the ring over a ZeroCopyTransport: each hop's
/// segment goes as chunks of at most this many floats (256 KiB), so that a
/// chunk is added and forwarded while the next ones are on the wire.
inline constexpr std::size_t ring_zero_copy_chunk = std::size_t{1} << 16;
/// Reduce-scatter receives in flight (each into its own chunk of scratch).
inline constexpr std::size_t ring_zero_copy_depth = 4;

/// The all-gather of the zero-copy rings, after the reduce-scatter left the
/// owned segment complete in `data` (and no send pending): averages it if
/// asked, then receives each chunk straight into place and forwards it from
/// there (every receive posted up front).
template <class Policy, class T>
void ring_zero_copy_all_gather(T& t, std::span<float> data, const ring_schedule& ring, const ring_options& options) {
  const int self = ring.rank(), next = ring.next(), prev = ring.prev(), steps = ring.steps();
  const int tag_ag = options.tag_base + 1;
  constexpr std::size_t chunk = ring_zero_copy_chunk;
  auto chunks = [&](std::size_t len) { return len == 0 ? std::size_t{1} : (len + chunk - 1) / chunk; };
  auto piece = [&](std::span<float> seg, std::size_t c) {
    const std::size_t b = std::min(seg.size(), c * chunk);
    return seg.subspan(b, std::min(chunk, seg.size() - b));
  };
  auto bytes = [](std::span<float> x) { return std::as_writable_bytes(x); };
  auto cbytes = [](std::span<float> x) { return std::as_bytes(x); };
  using recv_handle = decltype(t.irecv_into(prev, tag_ag, std::span<std::byte>{}));
  using send_handle = decltype(t.isend_view(next, tag_ag, std::span<const std::byte>{}));
  std::vector<send_handle> sends;
  const std::span<float> mine = ring.segment<float>(data, ring.owned_segment());
  if (options.average) ring_average(mine, ring.size());

  // Receive each chunk into place, forward it from there.
  std::vector<recv_handle> ag;
  for (int s = 0; s < steps; ++s) {
    const std::span<float> seg = ring.segment<float>(data, ring.all_gather_recv(s));
    for (std::size_t c = 0; c < chunks(seg.size()); ++c) ag.push_back(t.irecv_into(prev, tag_ag, bytes(piece(seg, c))));
  }
  for (std::size_t c = 0; c < chunks(mine.size()); ++c) sends.push_back(t.isend_view(next, tag_ag, cbytes(piece(mine, c))));
  std::size_t h = 0;
  for (int s = 0; s < steps; ++s) {
    const int k = ring.all_gather_recv(s);
    const std::span<float> seg = ring.segment<float>(data, k);
    for (std::size_t c = 0; c < chunks(seg.size()); ++c, ++h) {
      const std::span<float> part = piece(seg, c);
      const std::size_t got = ag[h].wait();
      ring_check_length(got, part.size(), self, prev, k, "all-gather", s);
      if (s + 1 < steps) sends.push_back(t.isend_view(next, tag_ag, cbytes(part)));
    }
  }
  detail::wait_sends<T>(std::span(sends));
}

/// The ring over a ZeroCopyTransport (MPI), chunk-pipelined: every hop's
/// segment goes as chunks of ring_zero_copy_chunk floats, sent straight from
/// `data`. The reduce-scatter receives into a few chunk-sized scratch buffers
/// (ring_zero_copy_depth of them, posted ahead; small enough to stay in
/// cache until the addition reads them), adds each chunk into `data` as soon
/// as it is there and forwards it from there; the all-gather receives
/// straight into `data` and forwards each chunk as it arrives. The additions
/// are the plain ring's, element by element in the same order: the result
/// is bit for bit the same as with whole segments.
template <class Policy, class T>
void ring_allreduce_zero_copy(T& t, std::span<float> data, const ring_schedule& ring, const ring_options& options) {
  const int self = ring.rank(), next = ring.next(), prev = ring.prev(), steps = ring.steps();
  const int tag_rs = options.tag_base;
  constexpr std::size_t chunk = ring_zero_copy_chunk, depth = ring_zero_copy_depth;
  auto chunks = [&](std::size_t len) { return len == 0 ? std::size_t{1} : (len + chunk - 1) / chunk; };
  auto piece = [&](std::span<float> seg, std::size_t c) {
    const std::size_t b = std::min(seg.size(), c * chunk);
    return seg.subspan(b, std::min(chunk, seg.size() - b));
  };
  auto bytes = [](std::span<float> x) { return std::as_writable_bytes(x); };
  auto cbytes = [](std::span<float> x) { return std::as_bytes(x); };
  using recv_handle = decltype(t.irecv_into(prev, tag_rs, std::span<std::byte>{}));
  using send_handle = decltype(t.isend_view(next, tag_rs, std::span<const std::byte>{}));

  // The reduce-scatter's receives as one sequence of (step, chunk) messages.
  struct rs_message {
    int step;
    std::size_t chunk;
  };
  std::vector<rs_message> order;
  for (int s = 0; s < steps; ++s)
    for (std::size_t c = 0; c < chunks(ring.size(ring.reduce_scatter_recv(s))); ++c) order.push_back({s, c});
  const std::size_t slot_floats = std::min(chunk, ring.size(0));  // segment 0 is a largest one

  // Declared before the handles: a pending handle may still use them when destroyed.
  std::vector<float> scratch(depth * slot_floats);
  std::vector<send_handle> sends;
  sends.reserve(order.size() + chunks(ring.size(0)));
  std::optional<recv_handle> recvs[depth];  // optional: a handle type need not be default-constructible
  auto slot = [&](std::size_t i) { return std::span<float>(scratch).subspan((i % depth) * slot_floats, slot_floats); };
  auto post_rs = [&](std::size_t i) {
    if (i < order.size()) recvs[i % depth].emplace(t.irecv_into(prev, tag_rs, bytes(slot(i))));
  };

  // Reduce-scatter: data[k] += received, chunk by chunk, then sent on from
  // data[k]. Every segment but the owned one is overwritten by the all-gather.
  for (std::size_t i = 0; i < depth; ++i) post_rs(i);
  const std::span<float> first = ring.segment<float>(data, ring.reduce_scatter_send(0));
  for (std::size_t c = 0; c < chunks(first.size()); ++c) sends.push_back(t.isend_view(next, tag_rs, cbytes(piece(first, c))));
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int s = order[i].step, k = ring.reduce_scatter_recv(s);
    const std::span<float> own = piece(ring.segment<float>(data, k), order[i].chunk);
    const std::size_t got = recvs[i % depth]->wait();
    ring_check_length(got, own.size(), self, prev, k, "reduce-scatter", s);
    add_into(Policy{}, own, std::span<const float>(slot(i).data(), own.size()));
    post_rs(i + depth);  // the slot's chunk has been added: reuse it
    if (s + 1 < steps) sends.push_back(t.isend_view(next, tag_rs, cbytes(own)));
  }
  // The all-gather receives into segments sent above: those sends must be done.
  detail::wait_sends<T>(std::span(sends));
  sends.clear();

  ring_zero_copy_all_gather<Policy>(t, data, ring, options);
}


/// A reduce-scatter message of the wavefront ring: chunk `chunk` of step `step`.
struct ring_wave_message {
  int step;
  std::size_t chunk;
};

/// The messages (s, c), c < count(s), of a reduce-scatter sorted by their
/// tick s + c, then by s: the order of the wavefront ring on every link
/// (a rank's sends and its successor's receives enumerate the same list).
template <class Count>
std::vector<ring_wave_message> ring_wave_order(int steps, Count count) {
  std::size_t longest = 0;
  for (int s = 0; s < steps; ++s) longest = std::max(longest, count(s));
  std::vector<ring_wave_message> out;
  for (std::size_t tick = 0; tick + 1 < longest + static_cast<std::size_t>(steps); ++tick)
    for (int s = 0; s < steps && static_cast<std::size_t>(s) <= tick; ++s)
      if (tick - static_cast<std::size_t>(s) < count(s)) out.push_back({s, tick - static_cast<std::size_t>(s)});
  return out;
}

/// The ring over the zero-copy face of a ZeroCopyCapableTransport (inproc),
/// whose sends are consumed by a copy as soon as the receive is posted.
/// The reduce-scatter runs as a wavefront: chunk c of step s travels at tick
/// s + c, so a chunk received and summed at tick t is forwarded at tick t + 1,
/// out of the chunk-sized scratch slot it was received in (two ticks of
/// slots: 2(N-1) of ring_zero_copy_chunk floats), and the successor copies
/// it out while it is still in cache. A segment that the all-gather
/// overwrites is then only read (own + received, in the slot), never
/// written: per hop one read of a segment of `data` instead of a read and a
/// write. The last step adds into `data` (the owned segment). Receives are
/// posted one tick ahead, so the sender usually finds them and copies its
/// chunk straight into them. The all-gather is the zero-copy one. Each
/// element's additions have the plain ring's operands in the plain ring's
/// order (IEEE addition commutes): bit for bit the same result.
template <class Policy, class T>
void ring_allreduce_wavefront(T& t, std::span<float> data, const ring_schedule& ring, const ring_options& options) {
  const int self = ring.rank(), next = ring.next(), prev = ring.prev(), steps = ring.steps();
  const int tag_rs = options.tag_base;
  constexpr std::size_t chunk = ring_zero_copy_chunk;
  auto chunks = [&](std::size_t len) { return len == 0 ? std::size_t{1} : (len + chunk - 1) / chunk; };
  auto piece = [&](std::span<float> seg, std::size_t c) {
    const std::size_t b = std::min(seg.size(), c * chunk);
    return seg.subspan(b, std::min(chunk, seg.size() - b));
  };
  using recv_handle = decltype(t.irecv_into(prev, tag_rs, std::span<std::byte>{}));
  using send_handle = decltype(t.isend_view(next, tag_rs, std::span<const std::byte>{}));

  const auto recvs = ring_wave_order(steps, [&](int s) { return chunks(ring.size(ring.reduce_scatter_recv(s))); });
  const auto sendl = ring_wave_order(steps, [&](int s) { return chunks(ring.size(ring.reduce_scatter_send(s))); });
  auto tick = [](const ring_wave_message& m) { return static_cast<std::size_t>(m.step) + m.chunk; };
  const std::size_t slots = 2 * static_cast<std::size_t>(steps);
  auto slot_of = [&](const ring_wave_message& m) { return (tick(m) % 2) * static_cast<std::size_t>(steps) + static_cast<std::size_t>(m.step); };
  const std::size_t slot_floats = std::min(chunk, ring.size(0));  // segment 0 is a largest one
  // where[s][c]: the slot holding received (s, c) once it is summed (its forward is send (s + 1, c))
  std::vector<std::vector<std::size_t>> where(static_cast<std::size_t>(steps));
  std::vector<std::vector<bool>> summed(static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) summed[static_cast<std::size_t>(s)].assign(chunks(ring.size(ring.reduce_scatter_recv(s))), false);

  // Declared before the handles: a pending handle may still use them when destroyed.
  std::vector<float> scratch(slots * slot_floats);
  auto slot = [&](std::size_t k) { return std::span<float>(scratch).subspan(k * slot_floats, slot_floats); };
  std::vector<send_handle> sends;  // from `data` (step 0)
  std::vector<std::optional<recv_handle>> posted(slots);
  std::vector<std::optional<send_handle>> forwards(slots);  // the pending forward out of each slot

  std::size_t next_post = 0, next_send = 0;
  auto post_through = [&](std::size_t last_tick) {  // posts every receive of a tick <= last_tick
    for (; next_post < recvs.size() && tick(recvs[next_post]) <= last_tick; ++next_post) {
      const std::size_t k = slot_of(recvs[next_post]);
      if (auto& f = forwards[k]) {  // the slot's chunk of two ticks ago must have left
        f->wait();
        f.reset();
      }
      posted[k].emplace(t.irecv_into(prev, tag_rs, std::as_writable_bytes(slot(k))));
    }
  };
  auto send_ready = [&] {  // sends, in link order, every message whose chunk is summed
    for (; next_send < sendl.size(); ++next_send) {
      const auto [s, c] = sendl[next_send];
      if (s == 0) {
        const std::span<float> first = piece(ring.segment<float>(data, ring.reduce_scatter_send(0)), c);
        sends.push_back(t.isend_view(next, tag_rs, std::as_bytes(first)));
        continue;
      }
      const auto u = static_cast<std::size_t>(s - 1);
      if (!summed[u][c]) break;
      const std::size_t k = where[u][c];
      const std::size_t len = piece(ring.segment<float>(data, ring.reduce_scatter_send(s)), c).size();
      forwards[k].emplace(t.isend_view(next, tag_rs, std::as_bytes(slot(k).first(len))));
    }
  };

  for (int s = 0; s < steps; ++s) where[static_cast<std::size_t>(s)].resize(summed[static_cast<std::size_t>(s)].size());
  for (const auto& m : recvs) {
    send_ready();  // first: a slot is reused only once its chunk was forwarded
    post_through(tick(m) + 1);
    const int s = m.step, k = ring.reduce_scatter_recv(s);
    const std::size_t at = slot_of(m);
    const std::span<float> own = piece(ring.segment<float>(data, k), m.chunk);
    const std::size_t got = posted[at]->wait();
    posted[at].reset();
    ring_check_length(got, own.size(), self, prev, k, "reduce-scatter", s);
    const std::span<float> in = slot(at).first(own.size());
    if (s + 1 < steps) {
      add_into(Policy{}, in, std::span<const float>(own));  // the bits of own + in
      where[static_cast<std::size_t>(s)][m.chunk] = at;
      summed[static_cast<std::size_t>(s)][m.chunk] = true;
    } else {
      add_into(Policy{}, own, std::span<const float>(in));  // the owned segment, complete
    }
  }
  send_ready();
  // The all-gather receives into the segment sent first: those sends must be done.
  detail::wait_sends<T>(std::span(sends));
  for (auto& f : forwards)
    if (f) f->wait();
  sends.clear();

  ring_zero_copy_all_gather<Policy>(t, data, ring, options);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Sums (or averages, options.average) `data` in place across all ranks of `t`
/// with a ring all-reduce; additions use add_into(Policy{}, ...) from the
/// policy's kernels. A ZeroCopyTransport (MPI) sends from and receives into
/// `data` directly; a ZeroCopyCapableTransport (inproc) takes the wavefront
/// form of that path through its zero_copy() face; other transports move
/// byte vectors (see the detail functions). See the file comment for the algorithm, tags and errors.
template <ExecutionPolicy Policy, Transport T>
void ring_allreduce(Policy, T& t, std::span<float> data, const ring_options& options = {}) {
  detail::ring_check_tags(options, "ring_allreduce");
  const ring_schedule ring(static_cast<int>(t.rank()), static_cast<int>(t.size()), data.size());
  if (ring.size() == 1) return;  // the sum (and the mean) of one vector is itself
  if constexpr (ZeroCopyTransport<T>) {
    detail::ring_allreduce_zero_copy<Policy>(t, data, ring, options);
  } else if constexpr (ZeroCopyCapableTransport<T>) {
    auto face = t.zero_copy();  // inproc: one copy per hop, straight between the ranks' memory
    detail::ring_allreduce_wavefront<Policy>(face, data, ring, options);
  } else
    detail::ring_allreduce_moving<Policy>(t, data, ring, options);
}

/// ring_allreduce with the generic (execution::seq) kernels.
template <Transport T>
void ring_allreduce(T& t, std::span<float> data, const ring_options& options = {}) {
  ring_allreduce(execution::seq{}, t, data, options);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
