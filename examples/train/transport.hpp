#pragma once
/// \file transport.hpp
/// A type-erased gradcomp::Transport that counts the bytes it moves.
///
/// The training program runs the same worker code over the in-process
/// transport (one thread per worker) or over MPI (one process per rank).
/// Erasing the transport type lets the drivers (ring all-reduce, parameter
/// server) be instantiated once, keeping the number of heavy template
/// instantiations (and the build time) small. Every isend adds the buffer's
/// size to bytes_sent(): these are the bytes measured on the wire.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>

namespace train {

/// Handle of a send through counted_transport.
class any_send_handle {
 public:
  struct concept_t {
    virtual ~concept_t() = default;
    virtual void wait() = 0;
    virtual bool test() = 0;
  };
  any_send_handle() = default;
  explicit any_send_handle(std::unique_ptr<concept_t> p) : p_(std::move(p)) {}
  void wait() {
    if (p_) p_->wait();
  }
  bool test() { return p_ ? p_->test() : true; }

 private:
  std::unique_ptr<concept_t> p_;
};

/// Handle of a receive through counted_transport.
class any_recv_handle {
 public:
  struct concept_t {
    virtual ~concept_t() = default;
    virtual gradcomp::message wait() = 0;
    virtual bool test() = 0;
  };
  any_recv_handle() = default;
  explicit any_recv_handle(std::unique_ptr<concept_t> p) : p_(std::move(p)) {}
  gradcomp::message wait() {
    if (!p_) throw gradcomp::state_error("train: empty receive handle");
    return p_->wait();
  }
  bool test() { return p_ ? p_->test() : false; }

 private:
  std::unique_ptr<concept_t> p_;
};

/// Wraps any gradcomp::Transport by reference; counts bytes and messages sent.
class counted_transport {
 public:
  template <gradcomp::Transport T>
  explicit counted_transport(T& t) : impl_(std::make_unique<model<T>>(t)) {}

  int rank() const { return impl_->rank(); }
  int size() const { return impl_->size(); }
  any_send_handle isend(int peer, int tag, std::vector<std::byte>&& buffer) {
    const std::size_t n = buffer.size();
    auto h = impl_->isend(peer, tag, std::move(buffer));
    bytes_sent_ += n;
    ++messages_sent_;
    return h;
  }
  any_recv_handle irecv(int peer, int tag) { return impl_->irecv(peer, tag); }

  /// Bytes handed to the underlying transport since construction.
  std::uint64_t bytes_sent() const noexcept { return bytes_sent_; }
  std::uint64_t messages_sent() const noexcept { return messages_sent_; }

 private:
  struct concept_t {
    virtual ~concept_t() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual any_send_handle isend(int, int, std::vector<std::byte>&&) = 0;
    virtual any_recv_handle irecv(int, int) = 0;
  };
  template <class T>
  struct model final : concept_t {
    explicit model(T& t) : t_(&t) {}
    int rank() const override { return static_cast<int>(t_->rank()); }
    int size() const override { return static_cast<int>(t_->size()); }
    any_send_handle isend(int peer, int tag, std::vector<std::byte>&& b) override {
      using H = decltype(t_->isend(peer, tag, std::move(b)));
      struct holder final : any_send_handle::concept_t {
        explicit holder(H&& h) : h_(std::move(h)) {}
        void wait() override { h_.wait(); }
        bool test() override { return h_.test(); }
        H h_;
      };
      return any_send_handle(std::make_unique<holder>(t_->isend(peer, tag, std::move(b))));
    }
    any_recv_handle irecv(int peer, int tag) override {
      using H = decltype(t_->irecv(peer, tag));
      struct holder final : any_recv_handle::concept_t {
        explicit holder(H&& h) : h_(std::move(h)) {}
        gradcomp::message wait() override { return h_.wait(); }
        bool test() override { return h_.test(); }
        H h_;
      };
      return any_recv_handle(std::make_unique<holder>(t_->irecv(peer, tag)));
    }
    T* t_;
  };
  std::unique_ptr<concept_t> impl_;
  std::uint64_t bytes_sent_ = 0;
  std::uint64_t messages_sent_ = 0;
};

static_assert(gradcomp::Transport<counted_transport>);

/// A receive handle of an underlying transport whose messages' `source` is
/// translated back to the view's rank numbering (a parameter server reads
/// the sender from message::source).
/// view rank = physical - shift, modulo `modulus` when it is not 0.
struct rank_back_map {
  int shift = 0;
  int modulus = 0;
  int operator()(int physical) const noexcept {
    const int r = physical - shift;
    return modulus ? ((r % modulus) + modulus) % modulus : r;
  }
};

template <class H>
class mapped_recv_handle {
 public:
  mapped_recv_handle(H h, rank_back_map map) : h_(std::move(h)), map_(map) {}
  gradcomp::message wait() {
    gradcomp::message m = h_.wait();
    m.source = map_(m.source);
    return m;
  }
  bool test() { return h_.test(); }

 private:
  H h_;
  rank_back_map map_;
};

/// A transport with its ranks rotated: logical rank r is physical rank
/// (r + shift) mod size. Under MPI the parameter server (which must be
/// logical rank 0) then runs on the last process and worker 0 on process 0,
/// the one that prints.
template <gradcomp::Transport T>
class rotated_view {
 public:
  rotated_view(T& t, int shift) : t_(&t), n_(static_cast<int>(t.size())), shift_(((shift % n_) + n_) % n_) {}
  int rank() const { return (static_cast<int>(t_->rank()) - shift_ + n_) % n_; }
  int size() const { return n_; }
  auto isend(int peer, int tag, std::vector<std::byte>&& b) { return t_->isend(map(peer), tag, std::move(b)); }
  auto irecv(int peer, int tag) {
    return mapped_recv_handle<decltype(t_->irecv(0, 0))>(t_->irecv(peer == gradcomp::any_source ? peer : map(peer), tag),
                                                         rank_back_map{shift_, n_});
  }

 private:
  int map(int peer) const {
    if (peer < 0 || peer >= n_)
      throw gradcomp::invalid_argument_error("rotated_view: peer " + std::to_string(peer) + " outside [0, " +
                                             std::to_string(n_) + ")");
    return (peer + shift_) % n_;
  }
  T* t_;
  int n_, shift_;
};

/// Ranks [first, first + count) of a transport seen as ranks [0, count): the
/// workers of a parameter-server run (server = rank 0, worker k = rank k+1)
/// use it for their own collectives (evaluation, checksums, barriers).
template <gradcomp::Transport T>
class rank_offset_view {
 public:
  rank_offset_view(T& t, int first, int count) : t_(&t), first_(first), count_(count) {
    if (first < 0 || count < 1 || first + count > static_cast<int>(t.size()) || static_cast<int>(t.rank()) < first ||
        static_cast<int>(t.rank()) >= first + count)
      throw gradcomp::invalid_argument_error("rank_offset_view: rank range outside the transport or this rank");
  }
  int rank() const { return static_cast<int>(t_->rank()) - first_; }
  int size() const { return count_; }
  auto isend(int peer, int tag, std::vector<std::byte>&& b) { return t_->isend(map(peer), tag, std::move(b)); }
  /// any_source may match a rank outside the view: use explicit peers.
  auto irecv(int peer, int tag) {
    return mapped_recv_handle<decltype(t_->irecv(0, 0))>(t_->irecv(peer == gradcomp::any_source ? peer : map(peer), tag),
                                                         rank_back_map{first_, 0});
  }

 private:
  int map(int peer) const {
    if (peer < 0 || peer >= count_)
      throw gradcomp::invalid_argument_error("rank_offset_view: peer " + std::to_string(peer) + " outside [0, " +
                                             std::to_string(count_) + ")");
    return peer + first_;
  }
  T* t_;
  int first_, count_;
};

}  // namespace train
