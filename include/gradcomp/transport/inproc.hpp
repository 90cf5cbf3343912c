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
///  - endpoint.zero_copy() is the same endpoint as a ZeroCopyTransport
///    (inproc_zero_copy: isend_view from the caller's memory, irecv_into the
///    caller's buffer, one copy between the two), which drivers with a
///    zero-copy path take (ZeroCopyCapableTransport, concepts.hpp).

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
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/transport/inproc/handles.hpp>
#include <gradcomp/transport/inproc/state.hpp>

namespace gradcomp::transport {

/// Options of an inproc_fabric.
struct inproc_options {
  /// Default deadline of a receive's wait(); std::chrono::nanoseconds::max() waits forever.
  std::chrono::nanoseconds recv_timeout = std::chrono::seconds(60);
};

GRADCOMP_ABI_NAMESPACE_BEGIN
class inproc_zero_copy;

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
    auto& box = shared_->box(dest);
    std::shared_ptr<detail::inproc_recv_state> claimed;
    {
      std::lock_guard<std::mutex> lock(box.mutex);
      if (shared_->is_closed(dest))
        throw transport_error("inproc: send from rank " + std::to_string(rank_) + " to rank " + std::to_string(dest) +
                              " with tag " + std::to_string(tag) + " failed: rank " + std::to_string(dest) +
                              " is closed");
      auto it = std::find_if(box.posted.begin(), box.posted.end(),
                             [&](const auto& s) { return detail::inproc_matches(*s, rank_, tag); });
      if (it == box.posted.end()) {
        box.queued.push_back({message{rank_, tag, std::move(bytes)}, nullptr});
      } else if (!(*it)->receives_into) {
        (*it)->done = true;
        (*it)->msg = message{rank_, tag, std::move(bytes)};
        box.posted.erase(it);
        box.cv.notify_all();
      } else {
        claimed = std::move(*it);  // an irecv_into: copy into its buffer below, outside the lock
        claimed->copying = true;
        box.posted.erase(it);
      }
    }
    if (claimed) detail::inproc_fill(box, *claimed, dest, rank_, tag, bytes.data(), n);
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
    match_queued(state);
    return recv_handle(shared_, rank_, std::move(state), recv_timeout());
  }

  /// The zero-copy face of this endpoint (a ZeroCopyTransport over the same
  /// mailboxes): isend_view / irecv_into; see inproc_zero_copy.
  inproc_zero_copy zero_copy() noexcept;

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
  friend class inproc_zero_copy;
  inproc_endpoint(std::shared_ptr<detail::inproc_shared> shared, int rank, std::chrono::nanoseconds timeout)
      : shared_(std::move(shared)), rank_(rank), timeout_ns_(timeout.count()) {}

  void check_rank(int r, const char* op, const char* what) const {
    if (r < 0 || r >= shared_->size)
      throw invalid_argument_error("inproc: " + std::string(op) + " on rank " + std::to_string(rank_) + ": " + what +
                                   " rank " + std::to_string(r) + " is outside [0, " + std::to_string(shared_->size) +
                                   ")");
  }
  detail::inproc_counters& counters() const noexcept { return shared_->counters[static_cast<std::size_t>(rank_)]; }

  /// Matches a new receive `s` of this rank against the oldest matching
  /// queued message, else posts it. A queued view, or moved bytes for an
  /// irecv_into, are copied here, outside the lock (the view is marked
  /// copying meanwhile, so its sender's handle waits before letting go).
  void match_queued(const std::shared_ptr<detail::inproc_recv_state>& sp) {
    auto& s = *sp;
    auto& box = shared_->box(rank_);
    detail::inproc_queued got;
    {
      std::lock_guard<std::mutex> lock(box.mutex);
      auto it = std::find_if(box.queued.begin(), box.queued.end(), [&](const detail::inproc_queued& q) {
        return (s.source == any_source || q.msg.source == s.source) && q.msg.tag == s.tag;
      });
      if (it == box.queued.end()) {
        box.posted.push_back(sp);
        return;
      }
      if (!it->view && !s.receives_into) {
        s.done = true;
        s.msg = std::move(it->msg);
        box.queued.erase(it);
        return;
      }
      got = std::move(*it);
      box.queued.erase(it);
      if (got.view) got.view->at = detail::inproc_view_state::stage::copying;
      s.copying = true;
    }
    const std::byte* p = got.view ? got.view->data : got.msg.bytes.data();
    detail::inproc_fill(box, s, rank_, got.msg.source, got.msg.tag, p, got.size());
    if (got.view) {
      std::lock_guard<std::mutex> lock(box.mutex);
      got.view->at = detail::inproc_view_state::stage::done;
      box.cv.notify_all();
    }
  }
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

/// The zero-copy face of an inproc_endpoint (`endpoint.zero_copy()`): a
/// ZeroCopyTransport over the same ranks, mailboxes, counters and matching
/// order, so its messages and the endpoint's mix freely. isend_view queues a
/// view of the caller's memory; whichever call completes the match copies
/// the bytes once, straight from the sender's memory into the receiver's
/// (the sender's isend_view when the receive was already posted, the
/// receiver's irecv / irecv_into otherwise). The caller keeps a view's memory
/// alive and unchanged, and an irecv_into buffer untouched, until the
/// handle's wait() returns (or the handle is destroyed: that withdraws a
/// view not yet received, and cancels a receive). A plain irecv may match a
/// view (it gets a copy), and irecv_into a moved vector (copied into the
/// buffer). A copy (not a reference) of the face is cheap: it holds the
/// endpoint's address, and is valid as long as the fabric.
class inproc_zero_copy {
 public:
  using send_handle = inproc_send_handle;
  using recv_handle = inproc_recv_handle;
  using view_send_handle = inproc_view_send_handle;
  using recv_into_handle = inproc_recv_into_handle;

  explicit inproc_zero_copy(inproc_endpoint& ep) noexcept : ep_(&ep) {}

  int rank() const noexcept { return ep_->rank(); }
  int size() const noexcept { return ep_->size(); }
  /// The endpoint this face belongs to.
  inproc_endpoint& endpoint() const noexcept { return *ep_; }

  /// inproc_endpoint::isend.
  send_handle isend(int dest, int tag, std::vector<std::byte>&& bytes) { return ep_->isend(dest, tag, std::move(bytes)); }
  /// inproc_endpoint::irecv.
  recv_handle irecv(int source, int tag) { return ep_->irecv(source, tag); }

  /// Sends `bytes` (the caller's memory, not copied here unless a receive is
  /// already posted) to `dest`. Throws invalid_argument_error for a bad dest
  /// or tag, transport_error if this rank or dest is closed; the handle's
  /// wait() fails if dest closes before it received the bytes, or after the
  /// endpoint's receive timeout.
  view_send_handle isend_view(int dest, int tag, std::span<const std::byte> bytes) {
    auto& ep = *ep_;
    ep.check_rank(dest, "isend_view", "destination");
    ep.check_tag(tag, "isend_view");
    const int self = ep.rank_;
    if (ep.shared_->is_closed(self))
      throw transport_error("inproc: rank " + std::to_string(self) + " is closed and cannot send (to rank " +
                            std::to_string(dest) + ", tag " + std::to_string(tag) + ")");
    auto view = std::make_shared<detail::inproc_view_state>();
    view->data = bytes.data();
    view->size = bytes.size();
    auto& box = ep.shared_->box(dest);
    std::shared_ptr<detail::inproc_recv_state> claimed;
    {
      std::lock_guard<std::mutex> lock(box.mutex);
      if (ep.shared_->is_closed(dest))
        throw transport_error("inproc: send from rank " + std::to_string(self) + " to rank " + std::to_string(dest) +
                              " with tag " + std::to_string(tag) + " failed: rank " + std::to_string(dest) +
                              " is closed");
      auto it = std::find_if(box.posted.begin(), box.posted.end(),
                             [&](const auto& s) { return detail::inproc_matches(*s, self, tag); });
      if (it == box.posted.end()) {
        box.queued.push_back({message{self, tag, {}}, view});
      } else {
        claimed = std::move(*it);
        claimed->copying = true;
        box.posted.erase(it);
      }
    }
    ep.counters().bytes_sent.fetch_add(bytes.size(), std::memory_order_relaxed);
    ep.counters().messages_sent.fetch_add(1, std::memory_order_relaxed);
    if (claimed) {  // the receive was waiting: copy now, the send is complete
      detail::inproc_fill(box, *claimed, dest, self, tag, bytes.data(), bytes.size());
      view.reset();
    }
    return view_send_handle(ep.shared_, std::move(view), self, dest, tag, ep.recv_timeout());
  }

  /// Posts a receive from `source` (or any_source) with `tag` into `buffer`
  /// (the caller's memory). Throws invalid_argument_error for a bad source or
  /// tag; the handle's wait() returns the bytes received, or throws as
  /// inproc_recv_handle::wait() does, and transport_error for a message
  /// longer than the buffer.
  recv_into_handle irecv_into(int source, int tag, std::span<std::byte> buffer) {
    auto& ep = *ep_;
    if (source != any_source) ep.check_rank(source, "irecv_into", "source");
    ep.check_tag(tag, "irecv_into");
    auto state = std::make_shared<detail::inproc_recv_state>();
    state->source = source;
    state->tag = tag;
    state->receives_into = true;
    state->into = buffer.data();
    state->capacity = buffer.size();
    ep.match_queued(state);
    return recv_into_handle(ep.shared_, ep.rank_, std::move(state), ep.recv_timeout());
  }

 private:
  inproc_endpoint* ep_;
};

inline inproc_zero_copy inproc_endpoint::zero_copy() noexcept { return inproc_zero_copy(*this); }

static_assert(ZeroCopyTransport<inproc_zero_copy>);
static_assert(!ZeroCopyTransport<inproc_endpoint>);  // its own isend/irecv move whole vectors

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
