#pragma once
/// \file transport/inproc.hpp
/// The in-process transport: N ranks in one process, one thread per rank,
/// exchanging byte buffers through mailboxes. It is the embedded default
/// transport (tests, benches, the quickstart) and the model the other
/// transports follow.
///
///     gradcomp::transport::run_workers(4, [&](gradcomp::transport::inproc_endpoint& ep) {
///       gradcomp::ring_allreduce(ep, gradients[ep.rank()]);
///     });
///
/// Semantics (those of MPI point-to-point):
///  - isend(dest, tag, bytes) MOVES the buffer into dest's mailbox: no copy,
///    and it never blocks. The send handle is complete at once.
///  - irecv(source, tag) posts a receive; `source` may be gradcomp::any_source.
///    Messages from one source with one tag arrive in the order they were sent,
///    and receives are matched in the order they were posted: an arriving
///    message satisfies the oldest matching posted receive, else it queues; a
///    new receive takes the oldest matching queued message, else it is posted.
///  - A receive handle's wait() returns the message or throws: timeout_error
///    after the endpoint's receive timeout (so a dead peer is an error, never a
///    hang), transport_error when the peer (or this rank) is closed and nothing
///    more from it is queued. wait_for(d) returns std::nullopt on timeout.
///  - close(rank) marks a rank failed: sends to it or from it throw
///    transport_error; receives from it fail once its queued messages are used.
///    run_workers closes a rank whose function threw, so its peers fail fast.
///  - Invalid ranks or tags (tag < 0) throw invalid_argument_error.
///  - A receive handle destroyed before completion cancels the receive; a
///    message already matched to it is discarded.
///  - Everything is thread-safe. Handles keep the fabric's state alive.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>

namespace gradcomp::transport {

/// Options of an inproc_fabric.
struct inproc_options {
  /// Default deadline of a receive's wait(); std::chrono::nanoseconds::max() waits forever.
  std::chrono::nanoseconds recv_timeout = std::chrono::seconds(60);
};

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

struct inproc_recv_state {
  int source = any_source;  // requested source (or any_source)
  int tag = 0;
  bool done = false;        // a message was matched to this receive
  message msg;
};

struct inproc_mailbox {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<message> queued;                               // arrived, unmatched (arrival order)
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

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Handle of an inproc send. The buffer is in the destination's mailbox by the
/// time isend returns, so the handle is always complete.
class inproc_send_handle {
 public:
  void wait() noexcept {}
  bool test() noexcept { return true; }
};

class inproc_endpoint;

/// Handle of an inproc receive: wait(), test(), wait_for(duration).
class inproc_recv_handle {
 public:
  inproc_recv_handle() = default;
  inproc_recv_handle(const inproc_recv_handle&) = delete;
  inproc_recv_handle& operator=(const inproc_recv_handle&) = delete;
  inproc_recv_handle(inproc_recv_handle&& o) noexcept { swap(o); }
  inproc_recv_handle& operator=(inproc_recv_handle&& o) noexcept {
    if (this != &o) {
      cancel();
      swap(o);
    }
    return *this;
  }
  ~inproc_recv_handle() { cancel(); }

  /// Blocks until the message arrives; throws timeout_error after the
  /// endpoint's receive timeout, transport_error if the peer is closed.
  message wait() {
    auto m = wait_impl(timeout_, /*throw_on_timeout=*/true);
    return std::move(*m);
  }

  /// Waits at most `d`: the message, or std::nullopt if it has not arrived
  /// (the receive stays posted). Throws transport_error if the peer is closed.
  std::optional<message> wait_for(std::chrono::nanoseconds d) { return wait_impl(d, /*throw_on_timeout=*/false); }

  /// True when wait() would not block (the message is there, or the receive failed).
  bool test() {
    check_usable();
    auto& box = *shared_->boxes[static_cast<std::size_t>(self_)];
    std::lock_guard<std::mutex> lock(box.mutex);
    return state_->done || !shared_->failure(self_, state_->source).empty();
  }

  /// True until wait() (or a successful wait_for) has returned the message.
  bool valid() const noexcept { return state_ != nullptr; }

 private:
  friend class inproc_endpoint;
  inproc_recv_handle(std::shared_ptr<detail::inproc_shared> shared, int self,
                     std::shared_ptr<detail::inproc_recv_state> state, std::chrono::nanoseconds timeout)
      : shared_(std::move(shared)), state_(std::move(state)), self_(self), timeout_(timeout) {}

  void swap(inproc_recv_handle& o) noexcept {
    std::swap(shared_, o.shared_);
    std::swap(state_, o.state_);
    std::swap(self_, o.self_);
    std::swap(timeout_, o.timeout_);
  }

  void check_usable() const {
    if (!state_) throw state_error("inproc: receive handle is empty (moved from, or its message was already taken)");
  }

  std::optional<message> wait_impl(std::chrono::nanoseconds d, bool throw_on_timeout) {
    check_usable();
    auto& box = *shared_->boxes[static_cast<std::size_t>(self_)];
    std::unique_lock<std::mutex> lock(box.mutex);
    std::string why;
    auto ready = [&] {
      if (state_->done) return true;
      why = shared_->failure(self_, state_->source);
      return !why.empty();
    };
    const auto now = std::chrono::steady_clock::now();
    if (d >= std::chrono::steady_clock::time_point::max() - now) {
      box.cv.wait(lock, ready);
    } else if (!box.cv.wait_until(lock, now + d, ready)) {
      if (!throw_on_timeout) return std::nullopt;
      throw timeout_error("inproc: rank " + std::to_string(self_) + " timed out after " +
                          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) +
                          " ms waiting for a message from " + detail::peer_name(state_->source) + " with tag " +
                          std::to_string(state_->tag));
    }
    if (!state_->done) {
      const int source = state_->source, tag = state_->tag;
      box.posted.remove(state_);
      lock.unlock();
      state_.reset();
      throw transport_error("inproc: rank " + std::to_string(self_) + " cannot receive from " +
                            detail::peer_name(source) + " with tag " + std::to_string(tag) + ": " + why);
    }
    message m = std::move(state_->msg);
    lock.unlock();
    state_.reset();
    auto& c = shared_->counters[static_cast<std::size_t>(self_)];
    c.bytes_received.fetch_add(m.bytes.size(), std::memory_order_relaxed);
    c.messages_received.fetch_add(1, std::memory_order_relaxed);
    return m;
  }

  void cancel() noexcept {
    if (!state_) return;
    auto& box = *shared_->boxes[static_cast<std::size_t>(self_)];
    std::lock_guard<std::mutex> lock(box.mutex);
    if (!state_->done) box.posted.remove(state_);
    state_.reset();
  }

  std::shared_ptr<detail::inproc_shared> shared_;
  std::shared_ptr<detail::inproc_recv_state> state_;
  int self_ = -1;
  std::chrono::nanoseconds timeout_{0};
};

/// Rank r's view of an inproc_fabric; satisfies gradcomp::Transport.
/// Owned by the fabric (not copyable); one thread per endpoint is the intended use.
class inproc_endpoint {
 public:
  using send_handle = inproc_send_handle;
  using recv_handle = inproc_recv_handle;

  inproc_endpoint(const inproc_endpoint&) = delete;
  inproc_endpoint& operator=(const inproc_endpoint&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return shared_->size; }

  /// Moves `bytes` into `dest`'s mailbox (dest may be this rank).
  /// Throws invalid_argument_error for a bad dest or tag, transport_error if
  /// this rank or dest is closed.
  send_handle isend(int dest, int tag, std::vector<std::byte>&& bytes) {
    check_rank(dest, "isend", "destination");
    check_tag(tag, "isend");
    if (shared_->is_closed(rank_))
      throw transport_error("inproc: rank " + std::to_string(rank_) + " is closed and cannot send (to rank " +
                            std::to_string(dest) + ", tag " + std::to_string(tag) + ")");
    const std::size_t n = bytes.size();
    auto& box = *shared_->boxes[static_cast<std::size_t>(dest)];
    {
      std::lock_guard<std::mutex> lock(box.mutex);
      if (shared_->is_closed(dest))
        throw transport_error("inproc: send from rank " + std::to_string(rank_) + " to rank " + std::to_string(dest) +
                              " with tag " + std::to_string(tag) + " failed: rank " + std::to_string(dest) +
                              " is closed");
      auto it = std::find_if(box.posted.begin(), box.posted.end(), [&](const auto& s) {
        return (s->source == any_source || s->source == rank_) && s->tag == tag;
      });
      if (it != box.posted.end()) {
        (*it)->done = true;
        (*it)->msg = message{rank_, tag, std::move(bytes)};
        box.posted.erase(it);
        box.cv.notify_all();
      } else {
        box.queued.push_back(message{rank_, tag, std::move(bytes)});
      }
    }
    counters().bytes_sent.fetch_add(n, std::memory_order_relaxed);
    counters().messages_sent.fetch_add(1, std::memory_order_relaxed);
    return {};
  }

  /// Posts a receive from `source` (or any_source) with `tag`.
  /// Throws invalid_argument_error for a bad source or tag; failures of the
  /// peer are reported by the handle's wait().
  recv_handle irecv(int source, int tag) {
    if (source != any_source) check_rank(source, "irecv", "source");
    check_tag(tag, "irecv");
    auto state = std::make_shared<detail::inproc_recv_state>();
    state->source = source;
    state->tag = tag;
    auto& box = *shared_->boxes[static_cast<std::size_t>(rank_)];
    {
      std::lock_guard<std::mutex> lock(box.mutex);
      auto it = std::find_if(box.queued.begin(), box.queued.end(), [&](const message& m) {
        return (source == any_source || m.source == source) && m.tag == tag;
      });
      if (it != box.queued.end()) {
        state->done = true;
        state->msg = std::move(*it);
        box.queued.erase(it);
      } else {
        box.posted.push_back(state);
      }
    }
    return recv_handle(shared_, rank_, std::move(state), recv_timeout());
  }

  /// Marks this rank closed (failed); see the file comment.
  void close() { shared_->close(rank_); }
  bool closed() const noexcept { return shared_->is_closed(rank_); }

  /// Deadline of wait() for receives posted from now on.
  void set_recv_timeout(std::chrono::nanoseconds d) noexcept { timeout_ns_.store(d.count()); }
  std::chrono::nanoseconds recv_timeout() const noexcept { return std::chrono::nanoseconds(timeout_ns_.load()); }

  /// Payload bytes and messages this rank has sent / received (taken out of wait()).
  std::uint64_t bytes_sent() const noexcept { return counters().bytes_sent.load(std::memory_order_relaxed); }
  std::uint64_t bytes_received() const noexcept { return counters().bytes_received.load(std::memory_order_relaxed); }
  std::uint64_t messages_sent() const noexcept { return counters().messages_sent.load(std::memory_order_relaxed); }
  std::uint64_t messages_received() const noexcept {
    return counters().messages_received.load(std::memory_order_relaxed);
  }
  void reset_counters() noexcept {
    counters().bytes_sent.store(0);
    counters().bytes_received.store(0);
    counters().messages_sent.store(0);
    counters().messages_received.store(0);
  }

 private:
  friend class inproc_fabric;
  inproc_endpoint(std::shared_ptr<detail::inproc_shared> shared, int rank, std::chrono::nanoseconds timeout)
      : shared_(std::move(shared)), rank_(rank), timeout_ns_(timeout.count()) {}

  void check_rank(int r, const char* op, const char* what) const {
    if (r < 0 || r >= shared_->size)
      throw invalid_argument_error("inproc: " + std::string(op) + " on rank " + std::to_string(rank_) + ": " + what +
                                   " rank " + std::to_string(r) + " is outside [0, " + std::to_string(shared_->size) +
                                   ")");
  }
  detail::inproc_counters& counters() const noexcept { return shared_->counters[static_cast<std::size_t>(rank_)]; }
  void check_tag(int tag, const char* op) const {
    if (tag < 0)
      throw invalid_argument_error("inproc: " + std::string(op) + " on rank " + std::to_string(rank_) + ": tag " +
                                   std::to_string(tag) + " is negative");
  }

  std::shared_ptr<detail::inproc_shared> shared_;
  int rank_;
  std::atomic<std::chrono::nanoseconds::rep> timeout_ns_;
};

static_assert(Transport<inproc_endpoint>);

/// N in-process ranks. endpoint(r) is rank r's Transport; run(fn) runs fn on
/// every endpoint, one thread each.
class inproc_fabric {
 public:
  explicit inproc_fabric(int size, inproc_options options = {}) : options_(options) {
    if (size < 1) throw invalid_argument_error("inproc_fabric: size must be >= 1, got " + std::to_string(size));
    if (options.recv_timeout <= std::chrono::nanoseconds::zero())
      throw invalid_argument_error("inproc_fabric: recv_timeout must be positive");
    shared_ = std::make_shared<detail::inproc_shared>(size);
    endpoints_.reserve(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r)
      endpoints_.emplace_back(new inproc_endpoint(shared_, r, options.recv_timeout));
  }
  inproc_fabric(const inproc_fabric&) = delete;
  inproc_fabric& operator=(const inproc_fabric&) = delete;

  int size() const noexcept { return shared_->size; }

  /// Rank r's endpoint; valid as long as the fabric lives.
  inproc_endpoint& endpoint(int r) {
    if (r < 0 || r >= size())
      throw invalid_argument_error("inproc_fabric::endpoint: rank " + std::to_string(r) + " outside [0, " +
                                   std::to_string(size()) + ")");
    return *endpoints_[static_cast<std::size_t>(r)];
  }

  /// Marks rank r closed (failed): see the file comment.
  void close(int r) { endpoint(r).close(); }
  bool closed(int r) { return endpoint(r).closed(); }

  /// Sets the receive timeout of every endpoint.
  void set_recv_timeout(std::chrono::nanoseconds d) {
    for (auto& e : endpoints_) e->set_recv_timeout(d);
  }

  /// Calls fn(endpoint(r)) on one new thread per rank and joins them all.
  /// A rank whose fn throws is closed, so peers waiting on it fail instead of
  /// waiting for their timeout. Rethrows the first exception (in time).
  template <class Fn>
  void run(Fn&& fn) {
    std::mutex first_mutex;
    std::exception_ptr first;
    std::vector<std::thread> threads;
    threads.reserve(endpoints_.size());
    auto body = [&fn, &first_mutex, &first](inproc_endpoint* ep) {
      try {
        fn(*ep);
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(first_mutex);
          if (!first) first = std::current_exception();
        }
        ep->close();
      }
    };
    try {
      for (auto& e : endpoints_) threads.emplace_back(body, e.get());
    } catch (...) {
      // Could not start every thread: fail the ranks that never ran, join the rest.
      for (std::size_t r = threads.size(); r < endpoints_.size(); ++r) endpoints_[r]->close();
      for (auto& t : threads) t.join();
      throw;
    }
    for (auto& t : threads) t.join();
    if (first) std::rethrow_exception(first);
  }

 private:
  inproc_options options_;
  std::shared_ptr<detail::inproc_shared> shared_;
  std::vector<std::unique_ptr<inproc_endpoint>> endpoints_;
};

/// Creates an inproc_fabric of n ranks and runs fn(inproc_endpoint&) on one
/// thread per rank; joins them and rethrows the first exception.
template <class Fn>
void run_workers(int n, Fn&& fn, inproc_options options = {}) {
  inproc_fabric fabric(n, options);
  fabric.run(std::forward<Fn>(fn));
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::transport
