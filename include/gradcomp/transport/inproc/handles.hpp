#pragma once
/// \file transport/inproc/handles.hpp
/// The handles of the in-process transport: sends and receives of moved
/// byte vectors (inproc_endpoint) and the zero-copy ones (inproc_zero_copy:
/// a send of a view of the caller's memory, a receive into the caller's
/// buffer). Part of <gradcomp/transport/inproc.hpp>.

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/transport/inproc/state.hpp>

namespace gradcomp::transport {

GRADCOMP_ABI_NAMESPACE_BEGIN
class inproc_endpoint;
class inproc_zero_copy;
GRADCOMP_ABI_NAMESPACE_END

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Waits until `ready()` (with `lock` held on `box`), at most `d` from now
/// (nanoseconds::max(): forever). False on timeout.
template <class Ready>
bool inproc_wait(inproc_mailbox& box, std::unique_lock<std::mutex>& lock, std::chrono::nanoseconds d, Ready ready) {
  const auto now = std::chrono::steady_clock::now();
  if (d >= std::chrono::steady_clock::time_point::max() - now) {
    box.cv.wait(lock, ready);
    return true;
  }
  return box.cv.wait_until(lock, now + d, ready);
}

/// What the two receive handles share: the posted state, its wait and its cancellation.
class inproc_recv_base {
 public:
  inproc_recv_base(const inproc_recv_base&) = delete;
  inproc_recv_base& operator=(const inproc_recv_base&) = delete;

  /// True when wait() would not block (the message is there, or the receive failed).
  bool test() {
    check_usable();
    std::lock_guard<std::mutex> lock(shared_->box(self_).mutex);
    return state_->done || (!state_->copying && !shared_->failure(self_, state_->source).empty());
  }

  /// True until wait() (or a successful wait_for) has returned the message.
  bool valid() const noexcept { return state_ != nullptr; }

 protected:
  inproc_recv_base() = default;
  inproc_recv_base(std::shared_ptr<inproc_shared> shared, int self, std::shared_ptr<inproc_recv_state> state,
                   std::chrono::nanoseconds timeout)
      : shared_(std::move(shared)), state_(std::move(state)), self_(self), timeout_(timeout) {}
  inproc_recv_base(inproc_recv_base&& o) noexcept { swap(o); }
  inproc_recv_base& operator=(inproc_recv_base&& o) noexcept {
    if (this != &o) {
      cancel();
      swap(o);
    }
    return *this;
  }
  ~inproc_recv_base() { cancel(); }

  void swap(inproc_recv_base& o) noexcept {
    std::swap(shared_, o.shared_);
    std::swap(state_, o.state_);
    std::swap(self_, o.self_);
    std::swap(timeout_, o.timeout_);
  }

  void check_usable() const {
    if (!state_) throw state_error("inproc: receive handle is empty (moved from, or its message was already taken)");
  }

  /// Waits at most `d` for the match. The completed state (taken out of the
  /// handle), or nullptr on timeout when !throw_on_timeout; throws
  /// timeout_error on timeout otherwise, transport_error if it can never come.
  std::shared_ptr<inproc_recv_state> wait_state(std::chrono::nanoseconds d, bool throw_on_timeout) {
    check_usable();
    auto& box = shared_->box(self_);
    std::unique_lock<std::mutex> lock(box.mutex);
    std::string why;
    auto ready = [&] {
      if (state_->done) return true;
      if (state_->copying) return false;  // matched: the bytes are on their way
      why = shared_->failure(self_, state_->source);
      return !why.empty();
    };
    if (!inproc_wait(box, lock, d, ready)) {
      if (state_->copying) {
        box.cv.wait(lock, [&] { return state_->done; });  // a copy in progress ends soon
      } else {
        if (!throw_on_timeout) return nullptr;
        throw timeout_error("inproc: rank " + std::to_string(self_) + " timed out after " +
                            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) +
                            " ms waiting for a message from " + peer_name(state_->source) + " with tag " +
                            std::to_string(state_->tag));
      }
    }
    if (!state_->done) {
      const int source = state_->source, tag = state_->tag;
      box.posted.remove(state_);
      lock.unlock();
      state_.reset();
      throw transport_error("inproc: rank " + std::to_string(self_) + " cannot receive from " + peer_name(source) +
                            " with tag " + std::to_string(tag) + ": " + why);
    }
    lock.unlock();
    auto s = std::move(state_);
    state_.reset();
    return s;
  }

  void count_received(std::size_t bytes) noexcept {
    auto& c = shared_->counters[static_cast<std::size_t>(self_)];
    c.bytes_received.fetch_add(bytes, std::memory_order_relaxed);
    c.messages_received.fetch_add(1, std::memory_order_relaxed);
  }

  /// Cancels a pending receive; waits for a copy into its buffer in progress.
  void cancel() noexcept {
    if (!state_) return;
    auto& box = shared_->box(self_);
    std::unique_lock<std::mutex> lock(box.mutex);
    if (state_->copying) box.cv.wait(lock, [&] { return state_->done; });
    if (!state_->done) box.posted.remove(state_);
    lock.unlock();
    state_.reset();
  }

  std::shared_ptr<inproc_shared> shared_;
  std::shared_ptr<inproc_recv_state> state_;
  int self_ = -1;
  std::chrono::nanoseconds timeout_{0};
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Handle of an inproc send of a moved vector. The buffer is in the
/// destination's mailbox (or in its receive) by the time isend returns, so
/// the handle is always complete.
class inproc_send_handle {
 public:
  void wait() noexcept {}
  bool test() noexcept { return true; }
};

/// Handle of an inproc receive: wait(), test(), wait_for(duration).
class inproc_recv_handle : public detail::inproc_recv_base {
 public:
  inproc_recv_handle() = default;
  inproc_recv_handle(inproc_recv_handle&&) noexcept = default;
  inproc_recv_handle& operator=(inproc_recv_handle&&) noexcept = default;

  /// Blocks until the message arrives; throws timeout_error after the
  /// endpoint's receive timeout, transport_error if the peer is closed.
  message wait() { return std::move(*wait_impl(timeout_, /*throw_on_timeout=*/true)); }

  /// Waits at most `d`: the message, or std::nullopt if it has not arrived
  /// (the receive stays posted). Throws transport_error if the peer is closed.
  std::optional<message> wait_for(std::chrono::nanoseconds d) { return wait_impl(d, /*throw_on_timeout=*/false); }

 private:
  friend class inproc_endpoint;
  friend class inproc_zero_copy;
  inproc_recv_handle(std::shared_ptr<detail::inproc_shared> shared, int self,
                     std::shared_ptr<detail::inproc_recv_state> state, std::chrono::nanoseconds timeout)
      : inproc_recv_base(std::move(shared), self, std::move(state), timeout) {}

  std::optional<message> wait_impl(std::chrono::nanoseconds d, bool throw_on_timeout) {
    auto s = wait_state(d, throw_on_timeout);
    if (!s) return std::nullopt;
    message m = std::move(s->msg);
    count_received(m.bytes.size());
    return m;
  }
};

/// Handle of an inproc receive into the caller's buffer (inproc_zero_copy::irecv_into):
/// wait() returns the number of bytes received; a message longer than the
/// buffer is a transport_error (the message is consumed, the buffer untouched).
class inproc_recv_into_handle : public detail::inproc_recv_base {
 public:
  inproc_recv_into_handle() = default;
  inproc_recv_into_handle(inproc_recv_into_handle&&) noexcept = default;
  inproc_recv_into_handle& operator=(inproc_recv_into_handle&&) noexcept = default;

  /// Blocks until the bytes are in the buffer; throws timeout_error after the
  /// endpoint's receive timeout, transport_error if the peer is closed or the
  /// message is longer than the buffer.
  std::size_t wait() { return *wait_impl(timeout_, /*throw_on_timeout=*/true); }

  /// Waits at most `d`: the bytes received, or std::nullopt if the message has
  /// not arrived (the receive stays posted, the buffer stays in use).
  std::optional<std::size_t> wait_for(std::chrono::nanoseconds d) { return wait_impl(d, /*throw_on_timeout=*/false); }

 private:
  friend class inproc_zero_copy;
  inproc_recv_into_handle(std::shared_ptr<detail::inproc_shared> shared, int self,
                          std::shared_ptr<detail::inproc_recv_state> state, std::chrono::nanoseconds timeout)
      : inproc_recv_base(std::move(shared), self, std::move(state), timeout) {}

  std::optional<std::size_t> wait_impl(std::chrono::nanoseconds d, bool throw_on_timeout) {
    auto s = wait_state(d, throw_on_timeout);
    if (!s) return std::nullopt;
    if (!s->error.empty()) throw transport_error(s->error);
    count_received(s->got);
    return s->got;
  }
};

/// Handle of an inproc send of a view of the caller's memory
/// (inproc_zero_copy::isend_view): complete once a receive has copied the
/// bytes out (at once if a receive was already posted). wait() throws
/// transport_error if the destination is closed before that, timeout_error
/// after the endpoint's receive timeout; either way the view is withdrawn,
/// as it is when the handle is destroyed unwaited (a copy in progress is
/// waited for), so the memory may then be reused.
class inproc_view_send_handle {
 public:
  inproc_view_send_handle() = default;
  inproc_view_send_handle(const inproc_view_send_handle&) = delete;
  inproc_view_send_handle& operator=(const inproc_view_send_handle&) = delete;
  inproc_view_send_handle(inproc_view_send_handle&& o) noexcept { swap(o); }
  inproc_view_send_handle& operator=(inproc_view_send_handle&& o) noexcept {
    if (this != &o) {
      withdraw();
      swap(o);
    }
    return *this;
  }
  ~inproc_view_send_handle() { withdraw(); }

  /// Blocks until the bytes have been copied out (the memory may be reused).
  void wait() {
    if (!view_) return;
    auto& box = shared_->box(dest_);
    std::unique_lock<std::mutex> lock(box.mutex);
    using stage = detail::inproc_view_state::stage;
    auto ready = [&] { return view_->at == stage::done || (view_->at == stage::queued && shared_->is_closed(dest_)); };
    const bool in_time = detail::inproc_wait(box, lock, timeout_, ready);
    if (view_->at == stage::copying) box.cv.wait(lock, [&] { return view_->at == stage::done; });
    if (view_->at == stage::done) {
      lock.unlock();
      view_.reset();
      return;
    }
    detail::inproc_withdraw(box, view_.get());
    lock.unlock();
    view_.reset();
    const std::string what = "inproc: send of " + std::to_string(bytes_) + " bytes from rank " +
                             std::to_string(self_) + " to rank " + std::to_string(dest_) + " with tag " +
                             std::to_string(tag_);
    if (!in_time)
      throw timeout_error(what + " was not received within " +
                          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count()) +
                          " ms");
    throw transport_error(what + " failed: rank " + std::to_string(dest_) + " is closed");
  }

  /// True when wait() would not block.
  bool test() {
    if (!view_) return true;
    std::lock_guard<std::mutex> lock(shared_->box(dest_).mutex);
    using stage = detail::inproc_view_state::stage;
    return view_->at == stage::done || (view_->at == stage::queued && shared_->is_closed(dest_));
  }

 private:
  friend class inproc_zero_copy;
  inproc_view_send_handle(std::shared_ptr<detail::inproc_shared> shared, std::shared_ptr<detail::inproc_view_state> view,
                          int self, int dest, int tag, std::chrono::nanoseconds timeout)
      : shared_(std::move(shared)), view_(std::move(view)), self_(self), dest_(dest), tag_(tag),
        bytes_(view_ ? view_->size : 0), timeout_(timeout) {}

  void swap(inproc_view_send_handle& o) noexcept {
    std::swap(shared_, o.shared_);
    std::swap(view_, o.view_);
    std::swap(self_, o.self_);
    std::swap(dest_, o.dest_);
    std::swap(tag_, o.tag_);
    std::swap(bytes_, o.bytes_);
    std::swap(timeout_, o.timeout_);
  }

  /// Takes a queued view back; waits for a copy out of it in progress.
  void withdraw() noexcept {
    if (!view_) return;
    auto& box = shared_->box(dest_);
    std::unique_lock<std::mutex> lock(box.mutex);
    using stage = detail::inproc_view_state::stage;
    if (view_->at == stage::copying) box.cv.wait(lock, [&] { return view_->at == stage::done; });
    if (view_->at == stage::queued) detail::inproc_withdraw(box, view_.get());
    lock.unlock();
    view_.reset();
  }

  std::shared_ptr<detail::inproc_shared> shared_;
  std::shared_ptr<detail::inproc_view_state> view_;  // nullptr: complete
  int self_ = -1, dest_ = -1, tag_ = 0;
  std::size_t bytes_ = 0;
  std::chrono::nanoseconds timeout_{0};
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::transport
