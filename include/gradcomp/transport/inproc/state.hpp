#pragma once
/// \file transport/inproc/state.hpp
/// The state behind the in-process transport (transport/inproc.hpp): the
/// mailboxes, posted receives, queued messages and the zero-copy views
/// (isend_view / irecv_into of inproc_zero_copy). Part of
/// <gradcomp/transport/inproc.hpp>; nothing here is meant to be used directly.
///
/// Locking: everything about a message to rank d (its queue entry, the
/// receive it matched, a view's stage) is guarded by d's mailbox mutex and
/// signalled on d's condition variable. The bytes themselves are copied
/// outside the lock by the call that completed the match (an isend that
/// found a posted receive, or an irecv that found a queued message); the
/// receive (or view) is marked `copying` meanwhile, and a handle destroyed
/// during that copy waits for it to end, so no buffer is freed under it.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>

namespace gradcomp::transport {
namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The sender's memory of one isend_view, queued until a receive matches it.
/// `at` is guarded by the destination's mailbox mutex.
struct inproc_view_state {
  enum class stage : unsigned char { queued, copying, done };
  const std::byte* data = nullptr;
  std::size_t size = 0;
  stage at = stage::queued;
};

/// A posted receive: irecv (into a message) or irecv_into (into `into`).
struct inproc_recv_state {
  int source = any_source;  // requested source (or any_source)
  int tag = 0;
  bool done = false;        // matched, and its bytes are in place
  bool copying = false;     // matched; a call is copying its bytes outside the lock
  message msg;              // irecv: the message; irecv_into: its source and tag
  std::byte* into = nullptr;  // irecv_into: the caller's buffer (nullptr: irecv)
  std::size_t capacity = 0;   // irecv_into: the buffer's size
  bool receives_into = false;
  std::size_t got = 0;      // irecv_into: bytes received
  std::string error;        // irecv_into: why the message did not fit ("" when it did)
};

/// An arrived, unmatched message: moved bytes (isend) or a view of the
/// sender's memory (isend_view; `msg.bytes` is then empty).
struct inproc_queued {
  message msg;
  std::shared_ptr<inproc_view_state> view;
  std::size_t size() const noexcept { return view ? view->size : msg.bytes.size(); }
};

struct inproc_mailbox {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<inproc_queued> queued;                         // arrived, unmatched (arrival order)
  std::list<std::shared_ptr<inproc_recv_state>> posted;     // posted, unmatched (posting order)
};

/// Per-rank traffic counters.
struct inproc_counters {
  std::atomic<std::uint64_t> bytes_sent{0}, bytes_received{0}, messages_sent{0}, messages_received{0};
};

/// State shared by a fabric, its endpoints and every outstanding handle.
struct inproc_shared {
  explicit inproc_shared(int n)
      : size(n), closed(static_cast<std::size_t>(n)), counters(static_cast<std::size_t>(n)) {
    boxes.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) boxes.push_back(std::make_unique<inproc_mailbox>());
  }
  const int size;
  std::vector<std::unique_ptr<inproc_mailbox>> boxes;
  std::vector<std::atomic<bool>> closed;
  std::vector<inproc_counters> counters;

  bool is_closed(int r) const noexcept { return closed[static_cast<std::size_t>(r)].load(); }
  inproc_mailbox& box(int r) const noexcept { return *boxes[static_cast<std::size_t>(r)]; }

  void close(int r) {
    closed[static_cast<std::size_t>(r)].store(true);
    // Wake every waiter so it re-checks its peer; locking first means no waiter
    // can miss the flag between its check and its sleep.
    for (auto& box : boxes) {
      std::lock_guard<std::mutex> lock(box->mutex);
      box->cv.notify_all();
    }
  }

  /// Why a receive posted by `self` for `source` can never complete, or "" if it still can.
  /// Call with self's mailbox locked.
  std::string failure(int self, int source) const {
    if (is_closed(self)) return "rank " + std::to_string(self) + " is closed";
    if (source != any_source) {
      if (is_closed(source)) return "rank " + std::to_string(source) + " is closed";
      return {};
    }
    if (size == 1) return {};
    for (int r = 0; r < size; ++r)
      if (r != self && !is_closed(r)) return {};
    return "every other rank is closed";
  }
};

inline std::string peer_name(int source) {
  return source == any_source ? std::string("any rank") : "rank " + std::to_string(source);
}

/// The error of a message longer than the irecv_into buffer it matched.
inline std::string inproc_too_long(int self, int source, int tag, std::size_t capacity, std::size_t got) {
  return "inproc: rank " + std::to_string(self) + " expected at most " + std::to_string(capacity) +
         " bytes from rank " + std::to_string(source) + " with tag " + std::to_string(tag) +
         " (the size of its receive buffer), got " + std::to_string(got);
}

/// Is posted receive `s` (of rank `self`) a match for a message from `source` with `tag`?
inline bool inproc_matches(const inproc_recv_state& s, int source, int tag) noexcept {
  return (s.source == any_source || s.source == source) && s.tag == tag;
}

/// Fills a claimed receive `s` of rank `self` (removed from `posted`,
/// `copying` set, `box` unlocked) with `n` bytes at `p` from `source` and
/// completes it. Called by the matching call, outside the lock.
inline void inproc_fill(inproc_mailbox& box, inproc_recv_state& s, int self, int source, int tag, const std::byte* p,
                        std::size_t n) {
  std::vector<std::byte> bytes;
  std::string error;
  if (s.receives_into) {
    if (n > s.capacity)
      error = inproc_too_long(self, source, tag, s.capacity, n);
    else if (n > 0)
      std::memcpy(s.into, p, n);
  } else {
    bytes.assign(p, p + n);
  }
  std::lock_guard<std::mutex> lock(box.mutex);
  s.msg = message{source, tag, std::move(bytes)};
  s.got = n;
  s.error = std::move(error);
  s.copying = false;
  s.done = true;
  box.cv.notify_all();
}

/// Removes a queued view from `box` (call with it locked); false if it is not there.
inline bool inproc_withdraw(inproc_mailbox& box, const inproc_view_state* view) {
  for (auto it = box.queued.begin(); it != box.queued.end(); ++it)
    if (it->view.get() == view) {
      box.queued.erase(it);
      return true;
    }
  return false;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail
}  // namespace gradcomp::transport
