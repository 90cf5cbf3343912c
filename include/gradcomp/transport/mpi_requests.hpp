#pragma once
/// \file transport/mpi_requests.hpp
/// Persistent MPI requests for mpi_transport's post batches (part of
/// <gradcomp/transport/mpi.hpp>, component gradcomp::mpi).
///
/// A training step posts the same receives and sends every step: the same
/// buffers (the gradient's buckets, the schedules' kept workspace), peers,
/// tags and lengths. Inside a post batch (mpi_transport::batch_posts) a
/// receive or send takes a persistent request for exactly that (buffer,
/// bytes, peer, tag), made once with MPI_Recv_init / MPI_Send_init and kept,
/// and is started with the batch's others by MPI_Startall when the batch
/// ends (or at the first wait inside it): a rank that sends to N-1 peers
/// makes one MPI call instead of N-1. Under SimGrid's SMPI every MPI call
/// costs the caller's CPU time around it, so at 64 simulated ranks the
/// direct schedule's 126 posts per rank cost more than its additions
/// (docs/performance.md); on a real MPI a start also skips the request's setup.
///
/// MPI_Startall starts its requests "in some arbitrary order", and two
/// messages with the same (peer, tag) must start in posting order to match in
/// it: the pending starts go in waves, the i-th of each (kind, peer, tag) in
/// wave i, one MPI_Startall per wave, waves in order.

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <unordered_map>
#include <vector>

#include <gradcomp/transport/mpi_wait.hpp>

namespace gradcomp::transport::detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The persistent requests of one mpi_transport (its communicator) and the
/// starts deferred by its open post batches.
class mpi_request_pool {
 public:
  enum class kind : std::uint8_t { receive, send };
  /// One persistent request; its address is stable while the pool lives.
  struct entry {
    MPI_Request request = MPI_REQUEST_NULL;
    /// retired: ended in error or cancelled, never started or freed again (below)
    enum class state : std::uint8_t { idle, pending, active, retired } st = state::idle;
    kind k = kind::receive;
    int peer = 0;
    int tag = 0;
  };

  /// `capacity`: most requests kept (0: none, every post is a plain one).
  explicit mpi_request_pool(std::size_t capacity) noexcept : capacity_(capacity) {}
  mpi_request_pool(const mpi_request_pool&) = delete;
  mpi_request_pool& operator=(const mpi_request_pool&) = delete;
  ~mpi_request_pool() { free_idle(); }

  /// Requests kept (idle, pending or active).
  std::size_t size() const noexcept { return count_; }
  /// True inside a post batch.
  bool batching() const noexcept { return depth_ > 0; }

  /// The pending request for a post of `bytes` at `buffer` (receive into it
  /// or send from it) to/from `peer` with `tag`: an idle kept one of that
  /// exact post, else a new one; nullptr when the pool keeps none (capacity
  /// 0), and then the caller posts a plain request.
  entry* defer(kind k, const void* buffer, std::size_t bytes, int peer, int tag, MPI_Comm comm) {
    if (capacity_ == 0) return nullptr;
    auto& same = map_[post_key{k, buffer, bytes, peer, tag}];
    entry* e = nullptr;
    for (auto& x : same)
      if (x.st == entry::state::idle) {
        e = &x;
        break;
      }
    if (e == nullptr) {
      if (count_ >= capacity_) free_idle();  // a working set larger than the pool: start again from it
      entry made{MPI_REQUEST_NULL, entry::state::idle, k, peer, tag};
      const int count = static_cast<int>(bytes);
      if (k == kind::receive)
        mpi_check(MPI_Recv_init(const_cast<void*>(buffer), count, MPI_BYTE, peer, tag, comm, &made.request), "MPI_Recv_init");
      else
        mpi_check(MPI_Send_init(buffer, count, MPI_BYTE, peer, tag, comm, &made.request), "MPI_Send_init");
      auto& list = map_[post_key{k, buffer, bytes, peer, tag}];  // free_idle may have erased `same`
      e = &list.emplace_back(made);
      ++count_;
    }
    e->st = entry::state::pending;
    pending_.push_back(e);
    return e;
  }

  /// Starts every pending request, in waves (see the file comment).
  void start_pending() {
    if (pending_.empty()) return;
    std::vector<entry*> todo;
    todo.swap(pending_);
    std::unordered_map<std::uint64_t, std::size_t> seen;  // (kind, peer, tag) -> requests of it so far
    std::vector<std::size_t> wave(todo.size());
    std::size_t waves = 0;
    for (std::size_t i = 0; i < todo.size(); ++i) {
      const std::uint64_t id = (std::uint64_t(std::uint32_t(todo[i]->peer)) << 33) |
                               (std::uint64_t(std::uint32_t(todo[i]->tag)) << 1) | std::uint64_t(todo[i]->k == kind::send);
      wave[i] = seen[id]++;
      waves = std::max(waves, wave[i] + 1);
    }
    std::vector<MPI_Request> batch;
    batch.reserve(todo.size());
    for (std::size_t w = 0; w < waves; ++w) {
      batch.clear();
      for (std::size_t i = 0; i < todo.size(); ++i)
        if (wave[i] == w) batch.push_back(todo[i]->request);
      const int code = MPI_Startall(static_cast<int>(batch.size()), batch.data());
      if (code != MPI_SUCCESS) {
        // Not started: back to idle, so their handles neither wait nor cancel them.
        for (std::size_t i = 0; i < todo.size(); ++i)
          if (wave[i] >= w) todo[i]->st = entry::state::idle;
        mpi_check(code, "MPI_Startall");
      }
      for (std::size_t i = 0; i < todo.size(); ++i)
        if (wave[i] == w) todo[i]->st = entry::state::active;
    }
  }

  /// A handle is about to wait on or test `e`: a pending one starts its
  /// batch now (a wait inside the batch). False when `e` was never started
  /// (MPI_Startall failed for it): there is nothing to wait on.
  [[nodiscard]] bool ensure_started(entry* e) {
    if (e->st == entry::state::pending) start_pending();
    return e->st != entry::state::idle;
  }

  /// `e` completed: it may be started again; `ok` false (it ended in an
  /// error, or was cancelled): it is retired instead, never started again
  /// and never freed (Open MPI 4.1 crashes in MPI_Finalize after
  /// MPI_Request_free of a persistent receive that was truncated; an error
  /// path, so the few bytes stay).
  void release(entry* e, bool ok = true) noexcept { e->st = ok ? entry::state::idle : entry::state::retired; }
  /// `e` will not be started (its handle is gone before the batch started it).
  void withdraw(entry* e) noexcept {
    std::erase(pending_, e);
    e->st = entry::state::idle;
  }

  void begin_batch() noexcept { ++depth_; }
  /// Closes a batch; the outermost starts what is pending.
  void end_batch() {
    if (depth_ > 0 && --depth_ == 0) start_pending();
  }

 private:
  struct post_key {
    kind k;
    const void* buffer;
    std::size_t bytes;
    int peer;
    int tag;
    bool operator==(const post_key&) const = default;
  };
  struct post_hash {
    std::size_t operator()(const post_key& p) const noexcept {
      std::size_t h = std::hash<const void*>{}(p.buffer);
      for (std::size_t v : {p.bytes, std::size_t(p.peer), std::size_t(p.tag), std::size_t(p.k)})
        h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      return h;
    }
  };

  /// Frees every idle request (MPI_Request_free) and forgets the retired
  /// ones; pending and active ones stay.
  void free_idle() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    for (auto it = map_.begin(); it != map_.end();) {
      auto& list = it->second;
      for (auto e = list.begin(); e != list.end();) {
        if (e->st == entry::state::idle || e->st == entry::state::retired) {
          if (e->st == entry::state::idle && !finalized && e->request != MPI_REQUEST_NULL) MPI_Request_free(&e->request);
          e = list.erase(e);
          --count_;
        } else {
          ++e;
        }
      }
      it = list.empty() ? map_.erase(it) : std::next(it);
    }
  }

  std::size_t capacity_;
  std::size_t count_ = 0;
  int depth_ = 0;
  std::unordered_map<post_key, std::list<entry>, post_hash> map_;
  std::vector<entry*> pending_;
};

/// A post batch of mpi_transport (mpi_transport::batch_posts): the posts made
/// while it is open start together when it closes (close() or the
/// destructor) or at the first wait on one of them. Movable, not copyable.
class mpi_post_batch {
 public:
  mpi_post_batch() noexcept = default;
  explicit mpi_post_batch(mpi_request_pool* pool) noexcept : pool_(pool) {
    if (pool_) pool_->begin_batch();
  }
  mpi_post_batch(mpi_post_batch&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)) {}
  mpi_post_batch& operator=(mpi_post_batch&&) = delete;
  mpi_post_batch(const mpi_post_batch&) = delete;
  mpi_post_batch& operator=(const mpi_post_batch&) = delete;
  /// Closes the batch and starts its posts (errors: transport_error).
  void close() {
    if (auto* p = std::exchange(pool_, nullptr)) p->end_batch();
  }
  ~mpi_post_batch() {
    try {
      close();
    } catch (...) {  // a destructor must not throw: the failed starts are idle, their waits return at once
    }
  }

 private:
  mpi_request_pool* pool_ = nullptr;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::transport::detail
