#pragma once
/// \file transport/emulated_link.hpp
/// emulated_link<T>: a Transport decorator that makes a fast transport (the
/// in-process one) behave like a network of given bandwidth and latency, for
/// benchmarks, and counts the bytes each rank puts on the wire.
///
/// Model: every rank has one outgoing link of `bits_per_second` with a
/// one-way `latency`. A message of b bytes from rank r starts when both the
/// send is called and r's previous message has finished (messages from one
/// sender are serialised), finishes b*8/rate later, and is delivered
/// `latency` after it finishes:
///
///     start   = max(now, link_free[r])
///     finish  = start + b * 8 / bits_per_second     (link_free[r] = finish)
///     deliver = finish + latency
///
/// The receiver cannot obtain the message before `deliver` (its wait() sleeps
/// until then); the sender's send handle completes at `finish`. Waiting is
/// done by sleeping until the deadline: no CPU is burnt spinning. Incoming
/// links are not modelled (receivers have unlimited capacity).
///
///     emulated_network net(4, {.bits_per_second = 10e9, .latency = std::chrono::microseconds(25)});
///     run_workers(4, [&](inproc_endpoint& ep) {
///       emulated_link link(ep, net);
///       ring_allreduce(link, grads[ep.rank()]);
///     });
///     net.bytes_sent(2);   // payload bytes rank 2 put on the wire
///
/// The delivery times travel beside the messages in the emulated_network
/// shared by all ranks (one FIFO per (source, destination, tag), matching the
/// wrapped transport's per-(source, tag) ordering), so the bytes are never
/// copied or prefixed. Consequences: every rank must use the same
/// emulated_network, all ranks live in one process, and the decorator must sit
/// directly on the transport that delivers (put fault_injecting above it, not
/// below: a message dropped below would shift the delivery times). With
/// any_source receives, the wrapped transport's arrival order decides which
/// message is taken, not the emulated delivery time.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>

namespace gradcomp::transport {

/// Bandwidth and latency of every rank's outgoing link.
struct link_model {
  double bits_per_second = 10e9;                         ///< e.g. 1e9 (1 Gbit/s), 10e9 (10 Gbit/s)
  std::chrono::nanoseconds latency = std::chrono::microseconds(0);  ///< one-way, added after the last bit
};

GRADCOMP_ABI_NAMESPACE_BEGIN
/// The state shared by the emulated links of all ranks: the model, each
/// rank's link schedule, the delivery times of messages in flight, and the
/// per-rank byte counters.
class emulated_network {
 public:
  using clock = std::chrono::steady_clock;

  emulated_network(int size, link_model model) : model_(model), ranks_(static_cast<std::size_t>(size)) {
    if (size < 1) throw invalid_argument_error("emulated_network: size must be >= 1, got " + std::to_string(size));
    if (!(model.bits_per_second > 0) || !std::isfinite(model.bits_per_second))
      throw invalid_argument_error("emulated_network: bits_per_second must be positive and finite");
    if (model.latency < std::chrono::nanoseconds::zero())
      throw invalid_argument_error("emulated_network: latency must not be negative");
  }
  emulated_network(const emulated_network&) = delete;
  emulated_network& operator=(const emulated_network&) = delete;

  int size() const noexcept { return static_cast<int>(ranks_.size()); }
  const link_model& model() const noexcept { return model_; }

  /// Time to push `bytes` through one link (without latency).
  std::chrono::nanoseconds transfer_time(std::size_t bytes) const noexcept {
    return std::chrono::nanoseconds(
        static_cast<std::int64_t>(std::ceil(double(bytes) * 8.0 * 1e9 / model_.bits_per_second)));
  }

  /// Payload bytes / messages rank r has sent, and has received (counted at delivery).
  std::uint64_t bytes_sent(int r) const { return at(r).bytes_sent.load(std::memory_order_relaxed); }
  std::uint64_t bytes_received(int r) const { return at(r).bytes_received.load(std::memory_order_relaxed); }
  std::uint64_t messages_sent(int r) const { return at(r).messages_sent.load(std::memory_order_relaxed); }
  std::uint64_t messages_received(int r) const { return at(r).messages_received.load(std::memory_order_relaxed); }
  /// Sum of bytes_sent over all ranks.
  std::uint64_t total_bytes_sent() const {
    std::uint64_t s = 0;
    for (int r = 0; r < size(); ++r) s += bytes_sent(r);
    return s;
  }
  void reset_counters() noexcept {
    for (auto& r : ranks_) {
      r.bytes_sent.store(0);
      r.bytes_received.store(0);
      r.messages_sent.store(0);
      r.messages_received.store(0);
    }
  }

 private:
  template <class T>
  friend class emulated_link;

  struct per_rank {
    clock::time_point link_free{};  // guarded by mutex_
    std::atomic<std::uint64_t> bytes_sent{0}, bytes_received{0}, messages_sent{0}, messages_received{0};
  };
  struct schedule {
    clock::time_point finish, deliver;
  };
  using key = std::tuple<int, int, int>;  // source, destination, tag

  const per_rank& at(int r) const {
    if (r < 0 || r >= size())
      throw invalid_argument_error("emulated_network: rank " + std::to_string(r) + " outside [0, " +
                                   std::to_string(size()) + ")");
    return ranks_[static_cast<std::size_t>(r)];
  }
  per_rank& at(int r) { return const_cast<per_rank&>(std::as_const(*this).at(r)); }

  /// Books `bytes` on rank `src`'s link now; records the delivery time.
  schedule book(int src, int dst, int tag, std::size_t bytes) {
    const auto now = clock::now();
    std::lock_guard<std::mutex> lock(mutex_);
    auto& link = at(src);
    const auto start = std::max(now, link.link_free);
    schedule s;
    s.finish = start + transfer_time(bytes);
    s.deliver = s.finish + model_.latency;
    link.link_free = s.finish;
    in_flight_[key{src, dst, tag}].push_back(s.deliver);
    return s;
  }
  /// Forgets the most recent booking (the wrapped send threw).
  void unbook(int src, int dst, int tag) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = in_flight_.find(key{src, dst, tag});
    if (it != in_flight_.end() && !it->second.empty()) it->second.pop_back();
  }
  /// Delivery time of the oldest message in flight from src to dst with tag
  /// (now, if the message did not go through an emulated link).
  clock::time_point take_delivery(int src, int dst, int tag) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = in_flight_.find(key{src, dst, tag});
    if (it == in_flight_.end() || it->second.empty()) return clock::now();
    const auto t = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) in_flight_.erase(it);
    return t;
  }

  link_model model_;
  std::vector<per_rank> ranks_;
  std::mutex mutex_;
  std::map<key, std::deque<clock::time_point>> in_flight_;
};

/// Transport decorator emulating the outgoing link of rank() of an emulated_network
/// over any Transport T (see the file comment). Satisfies Transport.
template <class T>
class emulated_link {
 public:
  using clock = emulated_network::clock;
  using inner_send_handle = decltype(std::declval<T&>().isend(0, 0, std::vector<std::byte>{}));
  using inner_recv_handle = decltype(std::declval<T&>().irecv(0, 0));

  /// Completes when the message has left the sender's link (at `finish`).
  class send_handle {
   public:
    send_handle(inner_send_handle inner, clock::time_point finish) : inner_(std::move(inner)), finish_(finish) {}
    void wait() {
      inner_.wait();
      std::this_thread::sleep_until(finish_);
    }
    bool test() { return inner_.test() && clock::now() >= finish_; }

   private:
    inner_send_handle inner_;
    clock::time_point finish_;
  };

  /// Yields the message no earlier than its emulated delivery time.
  class recv_handle {
   public:
    recv_handle(inner_recv_handle inner, emulated_network* net, int self)
        : inner_(std::move(inner)), net_(net), self_(self) {}
    recv_handle(recv_handle&& o) noexcept
        : inner_(std::move(o.inner_)),
          net_(std::exchange(o.net_, nullptr)),
          self_(o.self_),
          pending_(std::move(o.pending_)),
          deliver_(o.deliver_),
          failure_(std::move(o.failure_)) {}
    recv_handle& operator=(recv_handle&& o) noexcept {
      if (this != &o) {
        settle();
        inner_ = std::move(o.inner_);
        net_ = std::exchange(o.net_, nullptr);
        self_ = o.self_;
        pending_ = std::move(o.pending_);
        deliver_ = o.deliver_;
        failure_ = std::move(o.failure_);
      }
      return *this;
    }
    /// A handle dropped after its message arrived still consumes the
    /// message's delivery time, so later messages keep theirs.
    ~recv_handle() { settle(); }

    message wait() {
      if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
      if (!pending_) take(inner_.wait());
      std::this_thread::sleep_until(deliver_);
      return release();
    }
    /// True when wait() would not block: delivered, or failed (wait() throws).
    bool test() {
      if (failure_) return true;
      if (!pending_) {
        if (!inner_.test()) return false;
        try {
          take(inner_.wait());  // does not block: the inner test() said it is done
        } catch (...) {
          failure_ = std::current_exception();
          return true;
        }
      }
      return clock::now() >= deliver_;
    }
    /// Waits at most d; std::nullopt if the message is not delivered by then.
    /// Needs T's receive handle to have wait_for (inproc's does).
    std::optional<message> wait_for(std::chrono::nanoseconds d) {
      if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
      const auto now = clock::now();
      const auto deadline = d >= clock::time_point::max() - now ? clock::time_point::max() : now + d;
      if (!pending_) {
        std::optional<message> m = inner_.wait_for(d);
        if (!m) return std::nullopt;
        take(std::move(*m));
      }
      std::this_thread::sleep_until(std::min(deliver_, deadline));
      if (clock::now() < deliver_) return std::nullopt;
      return release();
    }

   private:
    void settle() noexcept {
      if (!net_ || pending_ || failure_) return;
      try {
        if (inner_.test()) take(inner_.wait());
      } catch (...) {
      }
      net_ = nullptr;
    }
    void take(message m) {
      deliver_ = net_->take_delivery(m.source, self_, m.tag);
      pending_ = std::move(m);
    }
    message release() {
      message m = std::move(*pending_);
      pending_.reset();
      auto& me = net_->at(self_);
      me.bytes_received.fetch_add(m.bytes.size(), std::memory_order_relaxed);
      me.messages_received.fetch_add(1, std::memory_order_relaxed);
      return m;
    }

    inner_recv_handle inner_;
    emulated_network* net_;
    int self_;
    std::optional<message> pending_;
    clock::time_point deliver_{};
    std::exception_ptr failure_;
  };

  /// Wraps `inner` (not owned; must outlive the link) as one rank of `net`.
  emulated_link(T& inner, emulated_network& net) : inner_(&inner), net_(&net) {
    if (net.size() != static_cast<int>(inner.size()))
      throw invalid_argument_error("emulated_link: network has " + std::to_string(net.size()) +
                                   " ranks, transport has " + std::to_string(inner.size()));
  }

  int rank() const { return static_cast<int>(inner_->rank()); }
  int size() const { return static_cast<int>(inner_->size()); }

  send_handle isend(int dest, int tag, std::vector<std::byte>&& bytes) {
    const int self = rank();
    if (dest < 0 || dest >= size())  // checked here so no booking is made for it
      throw invalid_argument_error("emulated_link: isend from rank " + std::to_string(self) + ": destination rank " +
                                   std::to_string(dest) + " is outside [0, " + std::to_string(size()) + ")");
    const std::size_t n = bytes.size();
    const auto s = net_->book(self, dest, tag, n);
    try {
      auto h = inner_->isend(dest, tag, std::move(bytes));
      auto& me = net_->at(self);
      me.bytes_sent.fetch_add(n, std::memory_order_relaxed);
      me.messages_sent.fetch_add(1, std::memory_order_relaxed);
      return send_handle(std::move(h), s.finish);
    } catch (...) {
      net_->unbook(self, dest, tag);
      throw;
    }
  }

  recv_handle irecv(int source, int tag) { return recv_handle(inner_->irecv(source, tag), net_, rank()); }

  /// This rank's counters (the network's bytes_sent(rank()), ...).
  std::uint64_t bytes_sent() const { return net_->bytes_sent(rank()); }
  std::uint64_t bytes_received() const { return net_->bytes_received(rank()); }

  T& inner() noexcept { return *inner_; }
  emulated_network& network() noexcept { return *net_; }

  /// Closes the wrapped transport's rank, when it can be closed.
  void close()
    requires requires(T& t) { t.close(); }
  {
    inner_->close();
  }

 private:
  T* inner_;
  emulated_network* net_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::transport
