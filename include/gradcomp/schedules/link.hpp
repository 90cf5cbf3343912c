#pragma once
/// \file schedules/link.hpp
/// float_link: what every dense schedule sends and receives, over a Transport
/// that moves byte vectors (inproc: received buffers are summed into and
/// forwarded, no copy) or a ZeroCopyTransport (MPI: sends from and receives
/// into the caller's floats), with byte and message counts; and the chunked
/// exchanges the schedules are built of. A link over summable cells of a
/// 16-bit element (float16, bfloat16: payloads/summable.hpp) sends them
/// packed, 2 bytes per cell, as ring_allreduce_summable does.
/// Part of <gradcomp/schedules.hpp>.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/wait_sends.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/payloads/summable.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/schedules/options.hpp>

namespace gradcomp::detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

template <class T, bool ZeroCopy = ZeroCopyTransport<T>>
struct link_handles {
  using recv = decltype(std::declval<T&>().irecv(0, 0));
  using send = decltype(std::declval<T&>().isend(0, 0, std::vector<std::byte>{}));
};
template <class T>
struct link_handles<T, true> {
  using recv = decltype(std::declval<T&>().irecv_into(0, 0, std::span<std::byte>{}));
  using send = decltype(std::declval<T&>().isend_view(0, 0, std::span<const std::byte>{}));
};

/// Receive space of a schedule call: the caller's workspace
/// (schedule_options::workspace) when it gives one, else the call's own.
/// Floats are left uninitialised (every one is written by a receive before
/// it is read), so a call does not pay for zeroing scratch as large as the vector.
class scratch_floats {
 public:
  explicit scratch_floats(schedule_workspace* shared) noexcept : shared_(shared) {}
  /// The first n floats.
  std::span<float> first(std::size_t n) { return (shared_ != nullptr ? *shared_ : own_).floats(n); }

 private:
  schedule_workspace* shared_;
  schedule_workspace own_;
};

/// Number of messages a range of `elements` floats goes as with chunks of
/// `chunk` floats (0: one message): none for an empty range. Sender and
/// receiver count from the same range size, so they agree.
inline std::size_t link_chunks(std::size_t elements, std::size_t chunk) noexcept {
  if (elements == 0) return 0;
  if (chunk == 0 || elements <= chunk) return 1;
  return (elements + chunk - 1) / chunk;
}
/// Chunk c of `x` cut into link_chunks(x.size(), chunk) pieces.
template <class F>
std::span<F> link_chunk(std::span<F> x, std::size_t chunk, std::size_t c) noexcept {
  if (chunk == 0) return x;
  const std::size_t b = std::min(x.size(), c * chunk);
  return x.subspan(b, std::min(chunk, x.size() - b));
}

/// The element type of the cells a schedule's addition sums: `add.element`
/// when the addition has such a member (exchange::element_adder), else
/// float32 (float_adder, any other callable).
template <class Add>
constexpr summable_element link_element(const Add& add) noexcept {
  if constexpr (requires { { add.element } -> std::convertible_to<summable_element>; })
    return add.element;
  else
    return summable_element::float32;
}

template <class T, bool = BatchPostTransport<T>>
struct link_batch_type {
  struct type {};  // no batches: nothing to hold
};
template <class T>
struct link_batch_type<T, true> {
  using type = std::optional<decltype(std::declval<T&>().batch_posts())>;
};

/// A post batch of a link (float_link::batch): the transport's own where it
/// is a BatchPostTransport, else nothing. close() (or the destructor) starts
/// the posts made while it was open.
template <class T>
class link_post_batch {
 public:
  link_post_batch() = default;
  explicit link_post_batch(typename link_batch_type<T>::type&& b) : batch_(std::move(b)) {}
  void close() {
    if constexpr (BatchPostTransport<T>)
      if (batch_) batch_->close();
  }

 private:
  typename link_batch_type<T>::type batch_{};
};

/// Sends and receives float ranges for one schedule call (see the file comment).
/// A ZeroCopyTransport's sends read the caller's floats until finish():
/// keep them unchanged until then.
///
/// A link built with a 16-bit element (float16, bfloat16) is packed: every
/// range travels as summable::pack's 2-byte cells (the cells are values of
/// that type, so packing is exact), a received range is unpacked into its
/// destination, and an addition is summable::add_packed_into (the float32
/// sum rounded once to the element: the same bits as summable::add_into on
/// the unpacked floats). Sends are then packed copies, so the caller's
/// floats may change at once; wait_add_forward leaves the sum in `own` on
/// every transport. Other elements (float32, int32_words) travel as 4-byte
/// cells added with the schedule's `add`.
template <class T>
class float_link {
 public:
  static constexpr bool zero_copy = ZeroCopyTransport<T>;
  using recv_handle = typename link_handles<T>::recv;
  using send_handle = typename link_handles<T>::send;

  /// A posted receive of exactly `into.size()` floats from `peer`.
  struct slot {
    /// Zero-copy transports, packed links: where the 2-byte cells land
    /// (declared first: destroyed after `h`, which withdraws the receive).
    std::vector<std::byte> packed;
    recv_handle h;
    std::span<float> into;  ///< the destination (zero-copy: where MPI writes; else where wait_into copies)
    int peer = 0;
    message msg;  ///< moving transports: the received buffer
    bool arrived = false;  ///< received, counted and checked (arrive_all, receive)
  };

  /// A link for the calls of one schedule run; `element`: the cells' type (16-bit: packed, see the class comment).
  float_link(T& t, ring_stats& st, const char* who, summable_element element = summable_element::float32)
      : t_(t), st_(st), who_(who), element_(element), packed_(summable::wire_bytes(element) == 2) {}

  /// True when cells travel packed (2 bytes each).
  bool packed() const noexcept { return packed_; }

  /// Opens a post batch (BatchPostTransport): the posts and sends made while
  /// it is open start together when it closes, each on a request the
  /// transport keeps for that exact post (MPI: persistent requests, one
  /// MPI_Startall per wave of distinct peers). Open one around each phase's
  /// posts. Packed links post none: their buffers are new every call, so no
  /// request could be kept.
  link_post_batch<T> batch() {
    if constexpr (BatchPostTransport<T>)
      if (!packed_) return link_post_batch<T>(typename link_batch_type<T>::type(std::in_place, t_.batch_posts()));
    return link_post_batch<T>();
  }

  int rank() const { return static_cast<int>(t_.rank()); }
  int size() const { return static_cast<int>(t_.size()); }

  /// Posts a receive of `into.size()` floats from `peer` with `tag`.
  slot post(int peer, int tag, std::span<float> into) {
    if constexpr (zero_copy) {
      if (packed_) {
        std::vector<std::byte> b(wire_size(into.size()));
        auto h = t_.irecv_into(peer, tag, std::span<std::byte>(b));
        return slot{std::move(b), std::move(h), into, peer, {}};  // the bytes move, their address stays
      }
      return slot{{}, t_.irecv_into(peer, tag, std::as_writable_bytes(into)), into, peer, {}};
    } else {
      return slot{{}, t_.irecv(peer, tag), into, peer, {}};
    }
  }
  /// Sends `x` to `peer` (zero-copy: x must stay unchanged until finish()).
  void send(int peer, int tag, std::span<const float> x) {
    if (packed_) {
      std::vector<std::byte> b(wire_size(x.size()));
      summable::pack(element_, x, b);
      send_bytes(peer, tag, std::move(b));
      return;
    }
    st_.bytes_sent += x.size_bytes();
    ++st_.messages_sent;
    if constexpr (zero_copy) {
      sends_.push_back(t_.isend_view(peer, tag, std::as_bytes(x)));
    } else {
      const auto* p = reinterpret_cast<const std::byte*>(x.data());
      sends_.push_back(t_.isend(peer, tag, std::vector<std::byte>(p, p + x.size_bytes())));
    }
  }
  /// Waits for `s` and leaves the floats in s.into.
  void wait_into(slot& s) {
    receive(s);
    if (packed_) {
      summable::unpack(element_, bytes(s), s.into);
      return;
    }
    if constexpr (!zero_copy)
      if (!s.into.empty()) std::memcpy(s.into.data(), s.msg.bytes.data(), s.into.size_bytes());
  }
  /// Waits for `s`, copies it into s.into and forwards the same floats to `peer`.
  void wait_into_forward(slot& s, int peer, int tag) {
    wait_into(s);
    if (packed_) {
      send_bytes(peer, tag, std::move(bytes(s)));
      return;
    }
    if constexpr (zero_copy) {
      send(peer, tag, std::span<const float>(s.into));
    } else {
      forward(s, peer, tag);
    }
  }
  /// Waits for `s` and adds it into `acc` (acc = acc + received).
  template <class Add>
  void wait_add(slot& s, std::span<float> acc, Add& add) {
    arrive(s);
    add_arrived(s, acc, add);
  }
  /// Waits for `s` and keeps what arrived in the slot for add_arrived (a
  /// schedule that lets every message land before it adds any).
  void arrive(slot& s) { receive(s); }
  /// arrive() for every slot of `groups` (a range of ranges of slots), in
  /// one wait where the transport can (BatchWaitTransport: MPI_Waitall
  /// instead of a call per message).
  template <class Groups>
  void arrive_all(Groups& groups) {
    if constexpr (BatchWaitTransport<T>) {
      std::vector<recv_handle*> handles;
      for (auto& g : groups)
        for (auto& s : g)
          if (!s.arrived) handles.push_back(&s.h);
      ring_timed(st_.wait_seconds, [&] { T::wait_all(std::span<recv_handle* const>(handles)); });
    }
    for (auto& g : groups)
      for (auto& s : g) receive(s);
  }
  /// wait_into() for every slot of `groups`, after one arrive_all (the
  /// all-gathers' receives: every copy lands, then each is unpacked or
  /// copied into its destination).
  template <class Groups>
  void wait_all_into(Groups& groups) {
    arrive_all(groups);
    for (auto& g : groups)
      for (auto& s : g) wait_into(s);
  }
  /// Adds floats [offset, offset + acc.size()) of an arrived slot into `acc`
  /// (acc = acc + received): all of it by default, or one piece of a message
  /// that is added in several (the direct schedule's all-gather chunks).
  template <class Add>
  void add_arrived(slot& s, std::span<float> acc, Add& add, std::size_t offset = 0) {
    if (offset > s.into.size() || acc.size() > s.into.size() - offset)
      throw size_mismatch_error(std::string(who_) + ": a piece at float " + std::to_string(offset) +
                                    " of a received message (floats after it)",
                                acc.size(), offset > s.into.size() ? 0 : s.into.size() - offset);
    if (packed_) {
      const std::size_t w = summable::wire_bytes(element_);
      const auto piece = std::span<const std::byte>(bytes(s)).subspan(offset * w, acc.size() * w);
      ring_timed(st_.combine_seconds, [&] { summable::add_packed_into(element_, acc, piece); });
      return;
    }
    ring_timed(st_.combine_seconds, [&] { add(acc, received(s, offset, acc.size())); });
  }
  /// Waits for `s`, adds `own` to it and sends the sum to `peer`. Zero-copy:
  /// the sum is left in `own` and sent from there; moving transports add
  /// into the received buffer and forward it (`own` unchanged). The same
  /// bits either way: the addition commutes.
  template <class Add>
  void wait_add_forward(slot& s, std::span<float> own, int peer, int tag, Add& add) {
    receive(s);
    if (packed_) {
      // own = own + received, rounded once; its packed cells go on in the received buffer.
      std::vector<std::byte>& b = bytes(s);
      ring_timed(st_.combine_seconds, [&] {
        summable::add_packed_into(element_, own, b);
        summable::pack(element_, own, b);
      });
      send_bytes(peer, tag, std::move(b));
      return;
    }
    if constexpr (zero_copy) {
      ring_timed(st_.combine_seconds, [&] { add(own, std::span<const float>(s.into)); });
      send(peer, tag, std::span<const float>(own));
    } else {
      ring_timed(st_.combine_seconds, [&] {
        if (aligned(s.msg.bytes)) {
          add(as_floats(s.msg.bytes), std::span<const float>(own));
        } else {
          fallback_.resize(own.size());
          if (!own.empty()) std::memcpy(fallback_.data(), s.msg.bytes.data(), s.msg.bytes.size());
          add(std::span<float>(fallback_), std::span<const float>(own));
          if (!own.empty()) std::memcpy(s.msg.bytes.data(), fallback_.data(), s.msg.bytes.size());
        }
      });
      forward(s, peer, tag);
    }
  }
  /// Waits for every send so far (their buffers may then be written).
  void finish() {
    ring_timed(st_.wait_seconds, [&] {
      detail::wait_sends<T>(std::span(sends_));
    });
    sends_.clear();
    held_.clear();
  }

 private:
  static bool aligned(const std::vector<std::byte>& b) noexcept {
    return reinterpret_cast<std::uintptr_t>(b.data()) % alignof(float) == 0;
  }
  static std::span<float> as_floats(std::vector<std::byte>& b) noexcept {
    return {reinterpret_cast<float*>(b.data()), b.size() / sizeof(float)};
  }
  void forward(slot& s, int peer, int tag) { send_bytes(peer, tag, std::move(s.msg.bytes)); }
  /// Bytes on the wire of `cells` cells.
  std::size_t wire_size(std::size_t cells) const noexcept { return cells * summable::wire_bytes(element_); }
  /// Sends a byte buffer (zero-copy: held until finish()).
  void send_bytes(int peer, int tag, std::vector<std::byte>&& b) {
    st_.bytes_sent += b.size();
    ++st_.messages_sent;
    if constexpr (zero_copy) {
      held_.push_back(std::move(b));
      sends_.push_back(t_.isend_view(peer, tag, std::span<const std::byte>(held_.back())));
    } else {
      sends_.push_back(t_.isend(peer, tag, std::move(b)));
    }
  }
  /// The received bytes of a packed slot.
  static std::vector<std::byte>& bytes(slot& s) noexcept {
    if constexpr (zero_copy)
      return s.packed;
    else
      return s.msg.bytes;
  }
  void receive(slot& s) {
    if (s.arrived) return;
    std::size_t got = 0;
    ring_timed(st_.wait_seconds, [&] {
      if constexpr (zero_copy) {
        got = s.h.wait();
      } else {
        s.msg = s.h.wait();
        got = s.msg.bytes.size();
      }
    });
    st_.bytes_received += got;
    if (got != wire_size(s.into.size()))
      throw transport_error(std::string(who_) + ": rank " + std::to_string(rank()) + " expected " +
                            std::to_string(wire_size(s.into.size())) + " bytes from rank " + std::to_string(s.peer) +
                            ", got " + std::to_string(got) + " (do all ranks pass the same length and options?)");
    s.arrived = true;
  }
  /// Floats [offset, offset + count) of an arrived slot (within it: add_arrived checks).
  std::span<const float> received(slot& s, std::size_t offset, std::size_t count) {
    if constexpr (zero_copy) {
      return std::span<const float>(s.into).subspan(offset, count);
    } else {
      if (aligned(s.msg.bytes)) return as_floats(s.msg.bytes).subspan(offset, count);
      fallback_.resize(count);
      if (count != 0) std::memcpy(fallback_.data(), s.msg.bytes.data() + offset * sizeof(float), count * sizeof(float));
      return fallback_;
    }
  }

  T& t_;
  ring_stats& st_;
  const char* who_;
  summable_element element_;
  bool packed_;
  std::vector<std::vector<std::byte>> held_;  ///< zero-copy: packed sends' buffers until finish() (outlive sends_)
  std::vector<send_handle> sends_;
  std::vector<float> fallback_;
};

/// The chunk size of a range of `elements` floats exchanged with one peer:
/// `chunk` floats (0: one message), grown so that the range goes as at most
/// `max_chunks` messages (schedule_options::max_chunks; 0: no cap). Sender
/// and receiver compute it from the same range size, so they agree.
inline std::size_t link_chunk_size(std::size_t elements, std::size_t chunk, std::size_t max_chunks) noexcept {
  if (chunk == 0 || max_chunks == 0) return chunk;
  return std::max(chunk, (elements + max_chunks - 1) / max_chunks);
}

/// Posts the receives of `into` from `peer`, one per chunk of `chunk` floats.
template <class T>
std::vector<typename float_link<T>::slot> link_post_chunks(float_link<T>& link, int peer, int tag, std::span<float> into,
                                                           std::size_t chunk) {
  std::vector<typename float_link<T>::slot> slots;
  const std::size_t n = link_chunks(into.size(), chunk);
  slots.reserve(n);  // never reallocated while posted: a slot's buffers stay where the transport writes
  for (std::size_t c = 0; c < n; ++c) slots.push_back(link.post(peer, tag, link_chunk(into, chunk, c)));
  return slots;
}

/// Sends `x` to `peer` as chunks of `chunk` floats.
template <class T>
void link_send_chunks(float_link<T>& link, int peer, int tag, std::span<const float> x, std::size_t chunk) {
  for (std::size_t c = 0; c < link_chunks(x.size(), chunk); ++c) link.send(peer, tag, link_chunk(x, chunk, c));
}

/// Exchanges with `peer`: sends `give` and receives as many floats as `keep`
/// holds, adding them into `keep` (keep = keep + received), in chunks of
/// link_chunk_size(size, chunk, max_chunks) floats (at most max_chunks
/// messages each way), every receive posted at once; chunk c is added while
/// later chunks travel. `scratch` holds at least keep.size() floats
/// (zero-copy receives land there).
template <class T, class Add>
void link_exchange_add(float_link<T>& link, int peer, int tag, std::span<const float> give, std::span<float> keep,
                       std::span<float> scratch, std::size_t chunk, std::size_t max_chunks, Add& add) {
  const std::size_t kc = link_chunk_size(keep.size(), chunk, max_chunks);
  auto batch = link.batch();  // the receives and sends start together (one call per chunk pair on MPI)
  auto slots = link_post_chunks(link, peer, tag, scratch.first(keep.size()), kc);
  link_send_chunks(link, peer, tag, give, link_chunk_size(give.size(), chunk, max_chunks));
  batch.close();
  for (std::size_t c = 0; c < slots.size(); ++c) link.wait_add(slots[c], link_chunk(keep, kc, c), add);
}

/// Exchanges with `peer`: sends `give`, receives `take` (in place), in
/// chunks as link_exchange_add.
template <class T>
void link_exchange_copy(float_link<T>& link, int peer, int tag, std::span<const float> give, std::span<float> take,
                        std::size_t chunk, std::size_t max_chunks) {
  auto batch = link.batch();
  auto slots = link_post_chunks(link, peer, tag, take, link_chunk_size(take.size(), chunk, max_chunks));
  link_send_chunks(link, peer, tag, give, link_chunk_size(give.size(), chunk, max_chunks));
  batch.close();
  for (auto& s : slots) link.wait_into(s);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::detail
