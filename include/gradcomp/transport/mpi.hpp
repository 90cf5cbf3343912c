#pragma once
/// \file transport/mpi.hpp
/// mpi_transport: a gradcomp::Transport over an MPI communicator the user
/// passes in (component gradcomp::mpi). The library never calls MPI_Init
/// unless asked to, through mpi_environment.
///
/// - The communicator is duplicated, so gradcomp's tags never meet the
///   application's own messages, and the duplicate gets MPI_ERRORS_RETURN:
///   every MPI failure becomes a gradcomp::transport_error carrying the MPI
///   error string instead of aborting the job.
/// - isend() moves the buffer into the handle, which keeps it alive until the
///   send completes (MPI_Isend never sees a dangling pointer).
/// - irecv() does not know the size in advance: it matches with
///   MPI_Improbe and receives with MPI_Mrecv, so any message length works.
///   Where the MPI library has no matched probe (SimGrid's SMPI), it probes
///   with MPI_Iprobe and receives that message with MPI_Recv, which is exact
///   while one thread at a time uses the transport (see GRADCOMP_MPI_MATCHED_PROBE).
///   Matching happens when the handle is first tested or waited; receives
///   with the same (source, tag) should be waited in posting order.
/// - isend_view() / irecv_into() (ZeroCopyTransport) send from and receive
///   into caller-owned memory with plain MPI_Isend / MPI_Irecv: no copy, no
///   allocation; the ring all-reduce uses them when the transport has them.
/// - wait() polls with a back-off that spins only for the first 50 us of
///   a wait and then sleeps between polls (2 us doubling to 64 us:
///   detail::poll_backoff), and throws timeout_error after the transport's timeout, so a peer that dies or stops mid-collective gives
///   the survivors an error instead of a hang. Deadlines are measured with
///   MPI_Wtime, so under SMPI they run on simulated time. With no timeout
///   (zero: SMPI's default, where no rank can die and SMPI reports deadlocks
///   itself) waits block in MPI instead of polling, so a simulated run
///   spends no simulated time in MPI_Test calls.
/// - Thread level: gradcomp's drivers call MPI from one thread, so
///   MPI_THREAD_SINGLE is enough when the program's main thread runs them
///   (mpi_environment's default; SMPI provides no more). A program that runs
///   gradcomp on another thread needs FUNNELED, from several threads (one
///   transport per thread) MULTIPLE.
///
/// Configuration macros (define before including to override):
/// - GRADCOMP_MPI_SIMULATED: 1 under SimGrid's SMPI (detected from its mpi.h).
/// - GRADCOMP_MPI_MATCHED_PROBE: 1 to receive with MPI_Improbe/MPI_Mrecv,
///   0 for MPI_Iprobe/MPI_Recv; default 1, except 0 under SMPI.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <ratio>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/transport/mpi_collective.hpp>
#include <gradcomp/transport/mpi_probe.hpp>
#include <gradcomp/transport/mpi_requests.hpp>
#include <gradcomp/transport/mpi_wait.hpp>

namespace gradcomp::transport {

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Owns MPI_Init_thread / MPI_Finalize for programs that want gradcomp to do it.
/// Does nothing if MPI is already initialised (and then does not finalise it).
class mpi_environment {
 public:
  mpi_environment(int* argc, char*** argv, int required = MPI_THREAD_SINGLE) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (initialised) return;
    detail::mpi_check(MPI_Init_thread(argc, argv, required, &provided_), "MPI_Init_thread");
    owns_ = true;
    if (provided_ < required) {
      MPI_Finalize();
      owns_ = false;
      throw transport_error("gradcomp mpi: the MPI library provides thread level " + std::to_string(provided_) +
                            ", below the " + std::to_string(required) + " requested");
    }
  }
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  ~mpi_environment() {
    if (owns_) MPI_Finalize();
  }
  int thread_level() const noexcept { return provided_; }

 private:
  bool owns_ = false;
  int provided_ = MPI_THREAD_MULTIPLE;
};

GRADCOMP_ABI_NAMESPACE_END
/// Options of mpi_transport.
struct mpi_transport_options {
  /// How long wait() may block before throwing timeout_error (measured with
  /// MPI_Wtime). Zero means forever: wait() then blocks in MPI instead of
  /// polling. Under SMPI the default is zero, so a simulated run spends no
  /// simulated time polling; a timeout set there runs on simulated time.
  std::chrono::milliseconds timeout{mpi_simulated ? std::chrono::milliseconds(0) : std::chrono::milliseconds(120000)};
  /// The library all-reduces (library_allreduce_sum / _max) under `timeout`
  /// too: MPI_Iallreduce waited with the deadline instead of MPI_Allreduce.
  /// Off by default: MPI's non-blocking all-reduce is a slower algorithm
  /// (Open MPI's libnbc: 3.7x MPI_Allreduce at 64 MB, bench_mpi_schedules),
  /// and a dead rank inside MPI_Allreduce is MPI's to report.
  bool library_timeout = false;
  /// Most persistent requests the post batches keep (mpi_transport::batch_posts;
  /// a step's working set: every schedule post of every bucket). 0: batches
  /// post plain requests one by one.
  std::size_t persistent_requests = 16384;
};

GRADCOMP_ABI_NAMESPACE_BEGIN
/// A gradcomp::Transport over a duplicate of an MPI communicator.
class mpi_transport {
 public:
  /// The clock of the deadlines (MPI_Wtime).
  using clock = detail::mpi_wtime_clock;

  /// Handle of a pending MPI_Isend; owns the buffer until completion (for
  /// isend_view the caller owns it and keeps it alive until wait()).
  class send_handle {
   public:
    send_handle() = default;
    send_handle(send_handle&& other) noexcept { *this = std::move(other); }
    send_handle& operator=(send_handle&& other) noexcept {
      if (this != &other) {
        finish_quietly();
        state_ = std::move(other.state_);
      }
      return *this;
    }
    send_handle(const send_handle&) = delete;
    send_handle& operator=(const send_handle&) = delete;
    ~send_handle() { finish_quietly(); }

    /// Blocks until the buffer has been handed to MPI (and may be reused).
    void wait() {
      if (!state_) return;
      state_->start();
      if (state_->timeout.count() == 0) {
        const int code = MPI_Wait(&state_->request, MPI_STATUS_IGNORE);
        state_->failed = code != MPI_SUCCESS;
        detail::mpi_check(code, "MPI_Wait (send)");
        state_.reset();
        return;
      }
      detail::poll_backoff backoff;
      while (!test()) {
        if (state_->timeout.count() > 0 && clock::now() - state_->started > state_->timeout)
          throw timeout_error("gradcomp mpi: send to rank " + std::to_string(state_->peer) + " (tag " +
                              std::to_string(state_->tag) + ") did not complete within " +
                              std::to_string(state_->timeout.count()) + " ms");
        backoff.pause();
      }
    }
    /// True once the send has completed.
    bool test() {
      if (!state_) return true;
      state_->start();
      int done = 0;
      const int code = MPI_Test(&state_->request, &done, MPI_STATUS_IGNORE);
      state_->failed = code != MPI_SUCCESS;
      detail::mpi_check(code, "MPI_Test (send)");
      if (done) state_.reset();
      return done != 0;
    }

   private:
    friend class mpi_transport;
    struct state {
      MPI_Request request = MPI_REQUEST_NULL;
      std::vector<std::byte> buffer;
      int peer = 0;
      int tag = 0;
      clock::time_point started;
      std::chrono::milliseconds timeout;
      detail::mpi_request_pool* pool = nullptr;  ///< a batched post: its kept persistent request
      detail::mpi_request_pool::entry* pooled = nullptr;
      bool failed = false;  ///< ended in an error: its kept request is retired
      /// A batched send not started yet starts its batch (a wait inside the batch).
      void start() {
        if (pooled && !pool->ensure_started(pooled))
          throw transport_error("gradcomp mpi: a batched send to rank " + std::to_string(peer) + " was never started");
      }
      state() = default;
      state(const state&) = delete;
      state& operator=(const state&) = delete;
      ~state() {  // completed (or never started): its kept request may be posted again
        if (pooled)
          pooled->st == detail::mpi_request_pool::entry::state::pending ? pool->withdraw(pooled) : pool->release(pooled, !failed);
      }
    };
    void finish_quietly() noexcept {
      // A send must not be abandoned while MPI still reads its buffer.
      if (state_) {
        if (!state_->pooled || state_->pooled->st == detail::mpi_request_pool::entry::state::active)
          MPI_Wait(&state_->request, MPI_STATUS_IGNORE);
        state_.reset();
      }
    }
    std::unique_ptr<state> state_;
  };

  /// Handle of a pending receive of unknown length (matched probe + receive; transport/mpi_probe.hpp).
  using recv_handle = detail::mpi_probe_recv_handle;

  /// Handle of a receive posted with MPI_Irecv into caller-owned memory.
  class recv_into_handle {
   public:
    recv_into_handle() = default;
    recv_into_handle(recv_into_handle&& other) noexcept { *this = std::move(other); }
    recv_into_handle& operator=(recv_into_handle&& other) noexcept {
      if (this != &other) {
        cancel_quietly();
        request_ = std::exchange(other.request_, MPI_REQUEST_NULL);
        pool_ = other.pool_;
        pooled_ = std::exchange(other.pooled_, nullptr);
        received_ = other.received_;
        capacity_ = other.capacity_;
        self_ = other.self_;
        source_ = other.source_;
        tag_ = other.tag_;
        started_ = other.started_;
        timeout_ = other.timeout_;
      }
      return *this;
    }
    recv_into_handle(const recv_into_handle&) = delete;
    recv_into_handle& operator=(const recv_into_handle&) = delete;
    ~recv_into_handle() { cancel_quietly(); }

    /// Blocks until the message is in the buffer; returns its length in bytes.
    std::size_t wait() {
      start();
      if (timeout_.count() == 0 && request_ != MPI_REQUEST_NULL) {
        MPI_Status status{};  // MPI_Wait does not set MPI_ERROR on success: complete() reads it
        const int code = MPI_Wait(&request_, &status);
        if (code == MPI_ERR_TRUNCATE) status.MPI_ERROR = MPI_ERR_TRUNCATE;
        else detail::mpi_check(code, "MPI_Wait (receive)");
        complete(status);
      }
      detail::poll_backoff backoff;
      while (!test()) {
        if (clock::now() - started_ > timeout_)
          throw timeout_error("gradcomp mpi: rank " + std::to_string(self_) + " waited " +
                              std::to_string(timeout_.count()) + " ms for a message from rank " +
                              std::to_string(source_) + " with tag " + std::to_string(tag_));
        backoff.pause();
      }
      return received_;
    }
    /// Polls; true once the message is in the buffer.
    bool test() {
      if (request_ == MPI_REQUEST_NULL) return true;
      start();
      int done = 0;
      MPI_Status status{};  // MPI_Test does not set MPI_ERROR on success: complete() reads it
      const int code = MPI_Test(&request_, &done, &status);
      if (code == MPI_ERR_TRUNCATE) {
        status.MPI_ERROR = MPI_ERR_TRUNCATE;  // completed in error: report it as such
        done = 1;
      } else if (code != MPI_SUCCESS && code != MPI_ERR_IN_STATUS) {
        detail::mpi_check(code, "MPI_Test (receive)");
      }
      if (done) complete(status);
      return done != 0;
    }

   private:
    friend class mpi_transport;
    /// A batched receive not started yet starts its batch (a wait inside the batch).
    void start() {
      if (pooled_ && !pool_->ensure_started(pooled_)) {
        finished();
        throw transport_error("gradcomp mpi: a batched receive from rank " + std::to_string(source_) + " was never started");
      }
    }
    /// No longer posted: a kept request may be posted again (persistent ones keep their MPI handle).
    void finished(bool ok = true) noexcept {
      request_ = MPI_REQUEST_NULL;
      if (auto* e = std::exchange(pooled_, nullptr)) pool_->release(e, ok);
    }
    void complete(const MPI_Status& status) {
      finished(status.MPI_ERROR == MPI_SUCCESS);
      if (status.MPI_ERROR == MPI_ERR_TRUNCATE)
        throw transport_error("gradcomp mpi: message from rank " + std::to_string(source_) + " with tag " +
                              std::to_string(tag_) + " is longer than the " + std::to_string(capacity_) +
                              "-byte buffer posted for it");
      int count = 0;
      detail::mpi_check(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count");
      received_ = static_cast<std::size_t>(count);
    }
    void cancel_quietly() noexcept {
      // The buffer may be freed after this handle: never leave MPI writing to it.
      if (request_ == MPI_REQUEST_NULL) return;
      if (pooled_ && pooled_->st != detail::mpi_request_pool::entry::state::active) {
        pool_->withdraw(std::exchange(pooled_, nullptr));  // never started: nothing to cancel
        request_ = MPI_REQUEST_NULL;
        return;
      }
      MPI_Cancel(&request_);
      MPI_Wait(&request_, MPI_STATUS_IGNORE);
      finished(/*ok=*/false);
    }
    MPI_Request request_ = MPI_REQUEST_NULL;
    detail::mpi_request_pool* pool_ = nullptr;  ///< a batched post: its kept persistent request
    detail::mpi_request_pool::entry* pooled_ = nullptr;
    std::size_t received_ = 0;
    std::size_t capacity_ = 0;
    int self_ = 0;
    int source_ = 0;
    int tag_ = 0;
    clock::time_point started_;
    std::chrono::milliseconds timeout_{0};
  };

  /// Wraps a duplicate of `comm` (collective over comm: every rank must call it).
  explicit mpi_transport(MPI_Comm comm = MPI_COMM_WORLD, mpi_transport_options options = {}) : options_(options) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised)
      throw transport_error("gradcomp mpi: MPI is not initialised (call MPI_Init or use gradcomp::transport::mpi_environment)");
    if (comm == MPI_COMM_NULL) throw invalid_argument_error("gradcomp mpi: communicator is MPI_COMM_NULL");
    detail::mpi_check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    detail::mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    detail::mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    detail::mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    int* tag_ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &flag);
    max_tag_ = (flag && tag_ub) ? *tag_ub : 32767;
    pool_ = std::make_unique<detail::mpi_request_pool>(options_.persistent_requests);
  }
  mpi_transport(const mpi_transport&) = delete;
  mpi_transport& operator=(const mpi_transport&) = delete;
  mpi_transport(mpi_transport&& other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
        pool_(std::move(other.pool_)),
        rank_(other.rank_),
        size_(other.size_),
        max_tag_(other.max_tag_),
        options_(other.options_),
        abandoned_(std::move(other.abandoned_)) {}
  mpi_transport& operator=(mpi_transport&&) = delete;
  ~mpi_transport() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    pool_.reset();  // its requests before their communicator
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// The largest tag this MPI allows (at least 32767).
  int max_tag() const noexcept { return max_tag_; }
  MPI_Comm communicator() const noexcept { return comm_; }
  const mpi_transport_options& options() const noexcept { return options_; }

  /// Starts sending `buffer` to `dest`; the handle owns the buffer until it completes.
  send_handle isend(int dest, int tag, std::vector<std::byte>&& buffer) {
    check_peer(dest, "isend");
    check_tag(tag);
    check_count(buffer.size());
    send_handle h;
    h.state_ = std::make_unique<send_handle::state>();
    auto& s = *h.state_;
    s.buffer = std::move(buffer);
    s.peer = dest;
    s.tag = tag;
    s.started = deadline_start();
    s.timeout = options_.timeout;
    detail::mpi_check(
        MPI_Isend(s.buffer.data(), static_cast<int>(s.buffer.size()), MPI_BYTE, dest, tag, comm_, &s.request),
        "MPI_Isend");
    return h;
  }

  /// Starts receiving from `source` (or any_source) with `tag`.
  recv_handle irecv(int source, int tag) {
    if (source != any_source) check_peer(source, "irecv");
    check_tag(tag);
    return recv_handle(comm_, rank_, source == any_source ? MPI_ANY_SOURCE : source, tag, deadline_start(), options_.timeout);
  }

  /// Starts sending caller-owned bytes without copying them; `bytes` must stay
  /// alive and unchanged until the handle's wait() returns.
  send_handle isend_view(int dest, int tag, std::span<const std::byte> bytes) {
    check_peer(dest, "isend_view");
    check_tag(tag);
    check_count(bytes.size());
    send_handle h;
    h.state_ = std::make_unique<send_handle::state>();
    auto& s = *h.state_;
    s.peer = dest;
    s.tag = tag;
    s.started = deadline_start();
    s.timeout = options_.timeout;
    if (pool_ && pool_->batching() && (s.pooled = pool_->defer(kept::send, bytes.data(), bytes.size(), dest, tag, comm_))) {
      s.pool = pool_.get();
      s.request = s.pooled->request;
      return h;
    }
    detail::mpi_check(MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, dest, tag, comm_, &s.request),
                      "MPI_Isend");
    return h;
  }

  /// Posts a receive from `source` straight into `buffer` (MPI_Irecv): no
  /// allocation, no copy. A message longer than the buffer is a transport_error.
  recv_into_handle irecv_into(int source, int tag, std::span<std::byte> buffer) {
    check_peer(source, "irecv_into");
    check_tag(tag);
    check_count(buffer.size());
    recv_into_handle h;
    h.capacity_ = buffer.size();
    h.self_ = rank_;
    h.source_ = source;
    h.tag_ = tag;
    h.started_ = deadline_start();
    h.timeout_ = options_.timeout;
    if (pool_ && pool_->batching() && (h.pooled_ = pool_->defer(kept::receive, buffer.data(), buffer.size(), source, tag, comm_))) {
      h.pool_ = pool_.get();
      h.request_ = h.pooled_->request;
      return h;
    }
    detail::mpi_check(MPI_Irecv(buffer.data(), static_cast<int>(buffer.size()), MPI_BYTE, source, tag, comm_, &h.request_),
                      "MPI_Irecv");
    return h;
  }

  /// Opens a post batch (gradcomp::BatchPostTransport): the isend_view and
  /// irecv_into calls made while the returned object lives start together,
  /// when it is closed or destroyed or at the first wait on one of them, each
  /// on a persistent request kept for that exact post (transport/mpi_requests.hpp;
  /// options().persistent_requests of them at most, 0: plain posts). Every
  /// handle then works as usual. Other MPI calls inside a batch (a barrier,
  /// a probe receive) must not wait for the batch's messages: close it first.
  [[nodiscard]] detail::mpi_post_batch batch_posts() { return detail::mpi_post_batch(pool_.get()); }
  /// Persistent requests kept by the post batches (tests, statistics).
  std::size_t kept_requests() const noexcept { return pool_ ? pool_->size() : 0; }

  /// Waits for every send of `handles` (gradcomp::BatchWaitTransport): one
  /// MPI_Waitall where no handle has a deadline, else each one's wait().
  static void wait_all(std::span<send_handle> handles) {
    if (std::ranges::any_of(handles, [](const send_handle& h) { return h.state_ && h.state_->timeout.count() != 0; })) {
      for (auto& h : handles) h.wait();
      return;
    }
    std::vector<MPI_Request> requests;
    std::vector<send_handle*> owners;
    for (auto& h : handles)
      if (h.state_) {
        h.state_->start();  // batched posts not started yet: the batch starts now
        requests.push_back(h.state_->request);
        owners.push_back(&h);
      }
    if (requests.empty()) return;
    std::vector<MPI_Status> status(requests.size());
    for (auto& st : status) st.MPI_ERROR = MPI_SUCCESS;  // set by MPI only with MPI_ERR_IN_STATUS
    const int code = MPI_Waitall(static_cast<int>(requests.size()), requests.data(), status.data());
    // A send MPI still reads stays with its handle (whose destructor waits for it). Plain requests
    // are null once done; persistent ones keep their MPI handle, so their statuses tell.
    for (std::size_t i = 0; i < owners.size(); ++i) {
      owners[i]->state_->request = requests[i];
      owners[i]->state_->failed = code != MPI_SUCCESS && status[i].MPI_ERROR != MPI_SUCCESS;
      if (requests[i] == MPI_REQUEST_NULL || code == MPI_SUCCESS ||
          (code == MPI_ERR_IN_STATUS && status[i].MPI_ERROR != MPI_ERR_PENDING))
        owners[i]->state_.reset();
    }
    detail::mpi_check(code, "MPI_Waitall (send)");
  }
  /// Waits for every receive of `handles` (null entries skipped): one
  /// MPI_Waitall where no handle has a deadline, else each one's wait();
  /// each handle's wait() then returns its length at once. Errors as wait().
  static void wait_all(std::span<recv_into_handle* const> handles) {
    auto pending = [](const recv_into_handle* h) { return h != nullptr && h->request_ != MPI_REQUEST_NULL; };
    if (std::ranges::any_of(handles, [&](const recv_into_handle* h) { return pending(h) && h->timeout_.count() != 0; })) {
      for (auto* h : handles)
        if (h != nullptr) h->wait();
      return;
    }
    std::vector<MPI_Request> requests;
    std::vector<recv_into_handle*> owners;
    for (auto* h : handles)
      if (pending(h)) {
        h->start();  // batched posts not started yet: the batch starts now
        requests.push_back(h->request_);
        owners.push_back(h);
      }
    if (requests.empty()) return;
    std::vector<MPI_Status> status(requests.size());
    for (auto& st : status) st.MPI_ERROR = MPI_SUCCESS;  // set by MPI only with MPI_ERR_IN_STATUS
    const int code = MPI_Waitall(static_cast<int>(requests.size()), requests.data(), status.data());
    // Plain requests are null once done (the rest are cancelled by their handle); persistent ones
    // keep their MPI handle, so their statuses tell (MPI_ERR_PENDING: not done, still posted).
    for (std::size_t i = 0; i < owners.size(); ++i) owners[i]->request_ = requests[i];
    if (code != MPI_SUCCESS && code != MPI_ERR_IN_STATUS) detail::mpi_check(code, "MPI_Waitall (receive)");
    std::vector<bool> done(owners.size());
    for (std::size_t i = 0; i < owners.size(); ++i) {
      done[i] = requests[i] == MPI_REQUEST_NULL || code == MPI_SUCCESS || status[i].MPI_ERROR != MPI_ERR_PENDING;
      if (done[i]) owners[i]->finished(status[i].MPI_ERROR == MPI_SUCCESS);  // all first: an error below leaves none posted
    }
    for (std::size_t i = 0; i < owners.size(); ++i) {
      if (!done[i]) continue;
      if (status[i].MPI_ERROR != MPI_SUCCESS && status[i].MPI_ERROR != MPI_ERR_TRUNCATE)
        detail::mpi_check(status[i].MPI_ERROR, "MPI_Waitall (receive)");
      owners[i]->complete(status[i]);  // its length; a truncated message is a transport_error
    }
  }

  /// Blocks until every rank of the communicator has called it.
  void barrier() { detail::mpi_check(MPI_Barrier(comm_), "MPI_Barrier"); }

  /// The MPI library's own all-reduce (gradcomp::LibraryAllreduceTransport,
  /// schedules/library.hpp): sums `x` in place over the communicator with
  /// MPI_Allreduce(MPI_FLOAT, MPI_SUM). With options().library_timeout and a
  /// timeout (not under SMPI) it runs MPI_Iallreduce on copies and waits with
  /// the transport's deadline (timeout_error; the copies are then left to
  /// MPI, never freed under it).
  void library_allreduce_sum(std::span<float> x) { library_allreduce(x.data(), x.size(), sizeof(float), MPI_FLOAT, MPI_SUM); }
  /// The same on 32-bit words summed modulo 2^32 (MPI_UINT32_T, MPI_SUM).
  void library_allreduce_sum(std::span<std::uint32_t> x) {
    library_allreduce(x.data(), x.size(), sizeof(std::uint32_t), MPI_UINT32_T, MPI_SUM);
  }
  /// The element-wise max of `x` over the communicator (MPI_FLOAT, MPI_MAX).
  void library_allreduce_max(std::span<float> x) { library_allreduce(x.data(), x.size(), sizeof(float), MPI_FLOAT, MPI_MAX); }

 private:
  /// Where a handle's deadline counts from: now with a timeout; with none no
  /// clock is read (MPI_Wtime is an MPI call: under SMPI each one lets every
  /// other simulated rank run, and the code around it is charged as computation).
  clock::time_point deadline_start() const noexcept { return options_.timeout.count() > 0 ? clock::now() : clock::time_point{}; }
  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size_)
      throw invalid_argument_error(std::string("gradcomp mpi: ") + what + " to rank " + std::to_string(peer) +
                                   ", communicator has " + std::to_string(size_) + " ranks");
  }
  static void check_count(std::size_t bytes) {
    if (bytes > static_cast<std::size_t>(INT_MAX))
      throw invalid_argument_error("gradcomp mpi: message of " + std::to_string(bytes) +
                                   " bytes exceeds MPI's int count (2 GiB); split it");
  }
  void check_tag(int tag) const {
    if (tag < 0 || tag > max_tag_)
      throw invalid_argument_error("gradcomp mpi: tag " + std::to_string(tag) + " outside [0, " +
                                   std::to_string(max_tag_) + "]");
  }

  void library_allreduce(void* data, std::size_t count, std::size_t elem, MPI_Datatype type, MPI_Op op) {
    const bool deadline = options_.timeout.count() != 0 && options_.library_timeout && !mpi_simulated;
    detail::mpi_library_allreduce(comm_, rank_, data, count, elem, type, op,
                                  deadline ? options_.timeout : std::chrono::milliseconds(0), abandoned_);
  }

  using kept = detail::mpi_request_pool::kind;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::unique_ptr<detail::mpi_request_pool> pool_;  // before comm_ is freed: requests on it
  int rank_ = 0;
  int size_ = 1;
  int max_tag_ = 32767;
  mpi_transport_options options_;
  std::vector<std::shared_ptr<std::vector<std::byte>>> abandoned_;  // buffers of timed-out library all-reduces
};

static_assert(BatchWaitTransport<mpi_transport>);
static_assert(BatchPostTransport<mpi_transport>);

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::transport

namespace gradcomp {
// Every transport lives in gradcomp::transport; these names are the old
// spelling, kept for one release.
using mpi_transport [[deprecated("use gradcomp::transport::mpi_transport")]] = transport::mpi_transport;
using mpi_environment [[deprecated("use gradcomp::transport::mpi_environment")]] = transport::mpi_environment;
using mpi_transport_options [[deprecated("use gradcomp::transport::mpi_transport_options")]] =
    transport::mpi_transport_options;
}  // namespace gradcomp
