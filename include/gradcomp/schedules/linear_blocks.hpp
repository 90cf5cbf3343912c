#pragma once
/// \file schedules/linear_blocks.hpp
/// What the compressed schedules (rabenseifner_linear.hpp,
/// hierarchical_linear.hpp) share: schedule_pack's layout of a list of
/// block payloads in one message, linear_mailbox (their messages, whose
/// length the receiver may not know, over moving and zero-copy transports)
/// and linear_blocks (a LinearCodec's blocks of the vector: encoded once,
/// eq. 3; summed in from received bytes, eq. 4; kept and decoded, eq. 5).
/// Part of <gradcomp/schedules.hpp>.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/wait_sends.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring/linear.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/schedules/link.hpp>
#include <gradcomp/schedules/options.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Appends the length prefix of one part of schedule_pack's layout (a
/// native uint64: the part's bytes follow it).
inline void schedule_pack_length(std::vector<std::byte>& out, std::uint64_t len) {
  const std::size_t at = out.size();
  out.resize(at + sizeof len);
  std::memcpy(out.data() + at, &len, sizeof len);
}

/// Concatenates serialized payloads, each preceded by its length (a native
/// uint64), into `out` (replaced; its capacity is reused).
inline void schedule_pack(std::span<const std::span<const std::byte>> parts, std::vector<std::byte>& out) {
  std::size_t total = 0;
  for (const auto& p : parts) total += sizeof(std::uint64_t) + p.size();
  out.clear();
  out.reserve(total);
  for (const auto& p : parts) {
    schedule_pack_length(out, p.size());
    out.insert(out.end(), p.begin(), p.end());
  }
}

/// Views of schedule_pack's bytes as exactly `count` parts (no copy); transport_error if malformed.
inline std::vector<std::span<const std::byte>> schedule_unpack(std::span<const std::byte> in, std::size_t count,
                                                               const std::string& where) {
  std::vector<std::span<const std::byte>> parts(count);
  std::size_t at = 0;
  for (auto& p : parts) {
    std::uint64_t len = 0;
    if (in.size() - at < sizeof len) throw transport_error(where + ": truncated list of block payloads");
    std::memcpy(&len, in.data() + at, sizeof len);
    at += sizeof len;
    if (len > in.size() - at) throw transport_error(where + ": truncated list of block payloads");
    p = in.subspan(at, static_cast<std::size_t>(len));
    at += static_cast<std::size_t>(len);
  }
  if (at != in.size()) throw transport_error(where + ": trailing bytes after the block payloads");
  return parts;
}

/// The messages of the compressed schedules, whose length the receiver
/// may not know in advance. A moving transport receives them whole
/// (irecv). A ZeroCopyTransport (MPI) gets each as two: its length (8
/// bytes, a native uint64) and then the bytes, each message into a buffer
/// of its own kept for the call, with receives posted before the data is
/// due: an MPI that must probe for an unknown length instead (SimGrid's
/// SMPI, without a matched probe) charges simulated time per probe that
/// grows while it waits, and a receive posted only after the probe holds a
/// large message back until then. A message whose length the receiver knows
/// (expect_exact) travels without the length message, received straight
/// into its buffer.
template <class T>
class linear_mailbox {
 public:
  static constexpr bool zero_copy = ZeroCopyTransport<T>;
  using send_handle = std::conditional_t<zero_copy, typename link_handles<T>::send,
                                         decltype(std::declval<T&>().isend(0, 0, std::vector<std::byte>{}))>;
  using recv_handle = std::conditional_t<zero_copy, typename link_handles<T>::recv,
                                         decltype(std::declval<T&>().irecv(0, 0))>;

  /// A message on its way in: post it with expect(), then arm() (zero-copy:
  /// waits for the length and posts the receive of the bytes), then collect().
  struct incoming {
    int peer = 0, tag = 0;
    std::size_t slot = 0;  ///< zero-copy: the buffer its bytes land in
    std::unique_ptr<std::uint64_t> length = std::make_unique<std::uint64_t>(0);  ///< where the length lands (stable)
    std::optional<recv_handle> head;  ///< zero-copy: the length; else the whole message
    std::optional<recv_handle> body;  ///< zero-copy: the bytes
    bool armed = false;
    std::span<std::byte> into;  ///< zero-copy: the caller's buffer (expect_into), else empty: the slot's
  };

  /// `workspace`: where the message buffers live (schedule_options::workspace; nullptr: the call's own).
  linear_mailbox(T& t, ring_stats& st, const char* who, schedule_workspace* workspace)
      : t_(t), st_(st), who_(who), ws_(workspace != nullptr ? *workspace : own_) {}
  /// The workspace the buffers live in (the caller's, or this mailbox's own).
  schedule_workspace& workspace() noexcept { return ws_; }

  /// Posts the receive of the next message from `peer` with `tag`.
  incoming expect(int peer, int tag) {
    incoming in = next_incoming(peer, tag);
    if constexpr (zero_copy)
      in.head.emplace(t_.irecv_into(peer, tag, std::as_writable_bytes(std::span<std::uint64_t>(in.length.get(), 1))));
    else
      in.head.emplace(t_.irecv(peer, tag));
    return in;
  }
  /// Posts the receive of the next message from `peer` with `tag`, which is
  /// exactly `bytes` long. Zero-copy: straight into its buffer, with no
  /// length message (the sender calls send(peer, tag, false)); a message of
  /// another length is a transport_error at collect(). Moving: as expect().
  incoming expect_exact(int peer, int tag, std::size_t bytes) {
    if constexpr (!zero_copy) {
      (void)bytes;
      return expect(peer, tag);
    } else {
      incoming in = next_incoming(peer, tag);
      *in.length = bytes;
      in.armed = true;
      std::vector<std::byte>& inbox = inbox_of(in.slot);
      if (inbox.size() < bytes) inbox.resize(bytes);
      in.body.emplace(t_.irecv_into(peer, tag, std::span<std::byte>(inbox.data(), bytes)));
      return in;
    }
  }
  /// Zero-copy only: posts the receive of the next message from `peer`
  /// straight into `into` (the caller's, unchanged until collect()), which it
  /// must fill exactly, with no length message (the sender calls
  /// send_view(peer, tag, bytes, false)).
  incoming expect_into(int peer, int tag, std::span<std::byte> into)
    requires zero_copy
  {
    incoming in = next_incoming(peer, tag);
    *in.length = into.size();
    in.armed = true;
    in.into = into;
    in.body.emplace(t_.irecv_into(peer, tag, into));
    return in;
  }
  /// Zero-copy: waits for the length and posts the receive of the bytes into
  /// the message's buffer (which must stay as it is until collect()). Moving: nothing.
  void arm(incoming& in) {
    if (in.armed) return;
    in.armed = true;
    if constexpr (zero_copy) {
      std::size_t got = 0;
      ring_timed(st_.wait_seconds, [&] { got = in.head->wait(); });
      if (got != sizeof(std::uint64_t) || *in.length > max_message)
        throw transport_error(std::string(who_) + ": rank " + std::to_string(t_.rank()) + ": malformed message length from rank " +
                              std::to_string(in.peer));
      std::vector<std::byte>& inbox = inbox_of(in.slot);
      if (inbox.size() < *in.length) inbox.resize(static_cast<std::size_t>(*in.length));
      in.body.emplace(t_.irecv_into(in.peer, in.tag, std::span<std::byte>(inbox.data(), static_cast<std::size_t>(*in.length))));
    }
  }
  /// Waits for the message and returns its bytes (valid until finish()).
  std::span<const std::byte> collect(incoming& in) {
    arm(in);
    std::size_t got = 0;
    std::span<const std::byte> out;
    ring_timed(st_.wait_seconds, [&] {
      if constexpr (zero_copy) {
        got = in.body->wait();
        out = std::span<const std::byte>(in.into.empty() ? inbox_of(in.slot).data() : in.into.data(), got);
      } else {
        // kept until finish(), as the zero-copy buffers are (moved, not copied)
        received_.push_back(in.head->wait().bytes);
        got = received_.back().size();
        out = received_.back();
      }
    });
    if constexpr (zero_copy)
      if (got != *in.length)
        throw transport_error(std::string(who_) + ": rank " + std::to_string(t_.rank()) + " expected " +
                              std::to_string(*in.length) + " bytes from rank " + std::to_string(in.peer) + ", got " +
                              std::to_string(got));
    st_.bytes_received += got;
    return out;
  }
  /// The buffer to fill for the next send() (the workspace's: it keeps its capacity).
  std::vector<std::byte>& outgoing() { return ws_.bytes(2 * sent_ + 1); }
  /// Sends the buffer outgoing() returned to `peer` (zero-copy: its length
  /// first unless `with_length` is false, for a receiver that posted
  /// expect_exact; read until finish()).
  void send(int peer, int tag, bool with_length = true) {
    std::vector<std::byte>& m = ws_.bytes(2 * sent_++ + 1);
    if constexpr (zero_copy) {
      send_view(peer, tag, m, with_length);
    } else {
      (void)with_length;
      st_.bytes_sent += m.size();
      ++st_.messages_sent;
      sends_.push_back(t_.isend(peer, tag, std::move(m)));  // the transport takes the bytes
    }
  }
  /// Zero-copy only: sends `bytes` (the caller's, unchanged until finish())
  /// to `peer` without copying them; with their length first unless
  /// `with_length` is false (the receiver posted expect_exact or expect_into).
  void send_view(int peer, int tag, std::span<const std::byte> bytes, bool with_length)
    requires zero_copy
  {
    st_.bytes_sent += bytes.size();
    ++st_.messages_sent;
    if (with_length) {
      lengths_.push_back(std::make_unique<std::uint64_t>(bytes.size()));
      sends_.push_back(t_.isend_view(peer, tag, std::as_bytes(std::span<const std::uint64_t>(lengths_.back().get(), 1))));
    }
    sends_.push_back(t_.isend_view(peer, tag, bytes));
  }
  /// Waits for every send posted so far (their buffers stay until finish()).
  void wait_sends() {
    ring_timed(st_.wait_seconds, [&] {
      detail::wait_sends<T>(std::span(sends_));
    });
  }
  /// Waits for every send and starts the next call afresh.
  void finish() {
    wait_sends();
    sends_.clear();
    lengths_.clear();
    received_.clear();
    sent_ = 0;
    slots_ = 0;
  }

 private:
  static constexpr std::uint64_t max_message = std::uint64_t(1) << 40;  ///< a length beyond this is malformed
  T& t_;
  ring_stats& st_;
  const char* who_;
  schedule_workspace own_;
  /// The workspace's buffer of the i-th message received in a call.
  std::vector<std::byte>& inbox_of(std::size_t slot) { return ws_.bytes(2 * slot); }
  /// The next message of the call from `peer` with `tag`, with a buffer of its own.
  incoming next_incoming(int peer, int tag) {
    incoming in;
    in.peer = peer;
    in.tag = tag;
    in.slot = slots_++;
    return in;
  }

  schedule_workspace& ws_;  ///< bytes(2 i): the i-th message received; bytes(2 i + 1): the i-th sent
  std::size_t sent_ = 0;
  std::size_t slots_ = 0;  ///< messages expected so far in the call
  std::vector<std::unique_ptr<std::uint64_t>> lengths_;
  std::vector<send_handle> sends_;
  std::vector<std::vector<std::byte>> received_;  ///< moving transports: the call's messages, until finish()
};

/// The blocks of a compressed schedule's vector and what it does with
/// them: each block encoded once (eq. 3), received payloads parsed with
/// limits and summed in (eq. 4), complete blocks kept as bytes and decoded
/// (eq. 5), lists of blocks sent as one message through a linear_mailbox.
/// Shared by the compressed Rabenseifner and hierarchical ring.
template <class T, class C>
class linear_blocks {
 public:
  using codec_type = std::remove_const_t<C>;
  using payload = typename codec_type::payload_type;
  using seg = ring_segmentation<codec_type>;

  /// `bounds`: parts + 1 offsets of the blocks (ring_checked_bounds').
  linear_blocks(T& t, C& codec, std::span<float> data, std::vector<std::size_t> bounds, const schedule_options& o,
                ring_stats& st, const char* who)
      : codec_(codec), data_(data), b_(std::move(bounds)), o_(o), st_(st), who_(who),
        self_(static_cast<int>(t.rank())), n_(static_cast<int>(t.size())), mail_(t, st, who, o.workspace),
        enc_(mail_.workspace().template payloads<payload>(b_.size())), body_(b_.size() - 1), held_(b_.size() - 1),
        own_bytes_(b_.size() - 1), encoded_(b_.size() - 1, false) {}

  int blocks() const noexcept { return static_cast<int>(b_.size()) - 1; }
  /// The vector's elements in blocks [lo, hi).
  std::size_t elements(int lo, int hi) const { return b_[std::size_t(hi)] - b_[std::size_t(lo)]; }
  std::span<float> block(int j) const { return data_.subspan(b_[std::size_t(j)], b_[std::size_t(j) + 1] - b_[std::size_t(j)]); }
  linear_mailbox<T>& mail() noexcept { return mail_; }
  /// This rank's payload of block j (its encoding, then the sums added into it).
  payload& own(int j) { return enc_[std::size_t(j)]; }

  /// Eq. 3 on every block of [lo, hi) not encoded yet: each block once.
  void encode(int lo, int hi) {
    for (int j = lo; j < hi; ++j) {
      if (encoded_[std::size_t(j)]) continue;
      ring_timed(st_.encode_seconds,
                 [&] { seg::encode(codec_, b_[std::size_t(j)], std::span<const float>(block(j)), enc_[std::size_t(j)]); });
      ++st_.encodes;
      encoded_[std::size_t(j)] = true;
      body_[std::size_t(j)] = enc_[std::size_t(j)].body_size();
      st_.own_encoded_bytes += codec_.encoded_bytes(enc_[std::size_t(j)]);
    }
  }
  /// Eq. 5 into block j (then the mean: the same operation on the same bits everywhere).
  void decode(const payload& q, int j) {
    ring_timed(st_.decode_seconds, [&] {
      codec_.decode(q, block(j));
      if (o_.average) schedule_average(block(j), n_);
    });
    ++st_.decodes;
  }
  /// Decodes block j from its kept bytes (received from `source`).
  void decode_kept(int j, int source) { decode(parse(held_[std::size_t(j)], j, source), j); }
  /// Eq. 5 on blocks [lo, hi): from this rank's own payloads when `from` is
  /// its rank, else from the bytes kept from rank `from`.
  void decode_run(int lo, int hi, int from) {
    for (int j = lo; j < hi; ++j) {
      if (from == self_) decode(own(j), j);
      else decode_kept(j, from);
    }
  }
  /// A received payload of block j, parsed with limits from this rank's own
  /// (a linear sum has the shape of one payload, eq. 4), into the one kept
  /// payload after the blocks' (valid until the next parse).
  const payload& parse(std::span<const std::byte> bytes, int j, int source) {
    const std::string where = std::string(who_) + ": rank " + std::to_string(self_) + ", block " + std::to_string(j) +
                              " from rank " + std::to_string(source);
    wire::parse_limits limits;
    limits.max_element_count = b_[std::size_t(j) + 1] - b_[std::size_t(j)];
    limits.max_body_length = body_[std::size_t(j)];
    payload& q = enc_[std::size_t(blocks())];
    ring_timed(st_.combine_seconds, [&] {
      try {
        wire::parse_into(bytes, q, limits);
      } catch (const wire::wire_error& e) {
        throw wire::wire_error(e.code(), where + ": " + e.what());
      }
      if (static_cast<std::uint64_t>(q.element_count()) != static_cast<std::uint64_t>(limits.max_element_count))
        throw size_mismatch_error(where + ": payload length", limits.max_element_count,
                                  static_cast<std::size_t>(q.element_count()));
      seg::check(q, b_[std::size_t(j)], where);
    });
    return q;
  }
  /// Serializes this rank's payload of block j into its kept bytes.
  void serialize(int j) {
    auto& bytes = own_bytes_[std::size_t(j)];
    ring_timed(st_.combine_seconds, [&] { wire::serialize_into(enc_[std::size_t(j)], bytes); });
    held_[std::size_t(j)] = bytes;
    if (assembling()) {  // and into its place among the complete blocks, in schedule_pack's layout
      const std::size_t at = at_[std::size_t(j)];
      if (sizeof(std::uint64_t) + bytes.size() != at_[std::size_t(j) + 1] - at)
        throw state_error(std::string(who_) + ": block " + std::to_string(j) +
                          " serialized to another size than the codec's segment_body_size said");
      const std::uint64_t len = bytes.size();
      std::memcpy(assembly_.data() + at, &len, sizeof len);
      std::memcpy(assembly_.data() + at + sizeof len, bytes.data(), bytes.size());
      held_[std::size_t(j)] = std::span<const std::byte>(assembly_.data() + at + sizeof len, bytes.size());
    }
  }
  /// From here on, the complete blocks live in one buffer of the workspace
  /// (schedule_workspace::assembly), each at its place in schedule_pack's
  /// layout of all blocks: a message of blocks [lo, hi) is then sent from
  /// that buffer as it is, and received straight into it (zero-copy
  /// transports and codecs that know their payload sizes; elsewhere
  /// nothing changes: messages are packed from the kept bytes).
  void assemble() {
    if constexpr (linear_mailbox<T>::zero_copy && KnowsBodySize<codec_type>) {
      at_.assign(std::size_t(blocks()) + 1, 0);
      for (int j = 0; j < blocks(); ++j) at_[std::size_t(j) + 1] = at_[std::size_t(j)] + packed_bytes(j, j + 1);
      auto& buffer = mail_.workspace().assembly();
      if (buffer.size() < at_.back()) buffer.resize(at_.back());
      assembly_ = std::span<std::byte>(buffer.data(), at_.back());
    }
  }
  bool assembling() const noexcept { return !at_.empty(); }
  /// Sends blocks [lo, hi) to `peer` as one message (schedule_pack's
  /// layout): this rank's payloads, serialized straight into the message
  /// (`serialize_own`), or the kept bytes; zero-copy: without a length
  /// message when !with_length (the receiver posted expect_exact).
  void send(int peer, int tag, int lo, int hi, bool serialize_own, bool with_length = true) {
    if constexpr (linear_mailbox<T>::zero_copy)
      if (!serialize_own && assembling()) return mail_.send_view(peer, tag, assembled(lo, hi), with_length);
    std::vector<std::byte>& out = mail_.outgoing();
    if (serialize_own) {
      ring_timed(st_.combine_seconds, [&] {
        std::size_t total = 0;
        for (int j = lo; j < hi; ++j) total += sizeof(std::uint64_t) + wire::serialized_size(enc_[std::size_t(j)]);
        out.clear();
        out.reserve(total);
        for (int j = lo; j < hi; ++j) {
          schedule_pack_length(out, wire::serialized_size(enc_[std::size_t(j)]));
          wire::serialize_append(enc_[std::size_t(j)], out);
        }
      });
    } else {
      schedule_pack(std::span<const std::span<const std::byte>>(held_).subspan(std::size_t(lo), std::size_t(hi - lo)), out);
    }
    mail_.send(peer, tag, with_length);
  }
  /// Posts the receive of the next message of blocks [lo, hi) from `peer`:
  /// exact (its size from packed_bytes, for a sender that sends it without
  /// a length) or, without `exact`, of a length the message says.
  typename linear_mailbox<T>::incoming expect(int peer, int tag, int lo, int hi, bool exact) {
    if constexpr (linear_mailbox<T>::zero_copy)
      if (exact && assembling()) return mail_.expect_into(peer, tag, assembled(lo, hi));
    return exact ? mail_.expect_exact(peer, tag, packed_bytes(lo, hi)) : mail_.expect(peer, tag);
  }
  /// Eq. 4 on each block of [lo, hi): the message's payloads summed into this rank's.
  void add_in(std::span<const std::byte> bytes, int peer, int lo, int hi) { add_in(bytes, peer, lo, hi, lo, hi); }
  /// Eq. 4 on the blocks of [from, to) that a message of blocks [lo, hi) holds.
  void add_in(std::span<const std::byte> bytes, int peer, int lo, int hi, int from, int to) {
    const auto parts = parts_of(bytes, peer, lo, hi);
    for (int j = std::max(lo, from); j < std::min(hi, to); ++j) {
      const payload& q = parse(parts[std::size_t(j - lo)], j, peer);
      ring_timed(st_.combine_seconds, [&] { codec_.accumulate(enc_[std::size_t(j)], q); });
    }
  }
  /// Complete blocks [lo, hi), kept as the bytes they arrived in (views of
  /// the message, which the mailbox keeps until finish(): no copy).
  void keep_bytes(std::span<const std::byte> bytes, int peer, int lo, int hi) {
    const auto parts = parts_of(bytes, peer, lo, hi);
    for (int j = lo; j < hi; ++j) held_[std::size_t(j)] = parts[std::size_t(j - lo)];
  }
  /// Eq. 5 on each block of [lo, hi) straight from a message of complete blocks.
  void decode_message(std::span<const std::byte> bytes, int peer, int lo, int hi) {
    const auto parts = parts_of(bytes, peer, lo, hi);
    for (int j = lo; j < hi; ++j) decode(parse(parts[std::size_t(j - lo)], j, peer), j);
  }
  /// schedule_pack's bytes of blocks [lo, hi), known before they are encoded
  /// (KnowsBodySize; 0 otherwise).
  std::size_t packed_bytes(int lo, int hi) const {
    std::size_t bytes = 0;
    if constexpr (KnowsBodySize<codec_type>)
      for (int j = lo; j < hi; ++j)
        bytes += sizeof(std::uint64_t) + wire::header_size +
                 seg::body_size(codec_, b_[std::size_t(j)], b_[std::size_t(j) + 1] - b_[std::size_t(j)]);
    return bytes;
  }
  /// size_digest over the block count, the vector's length and every block's
  /// packed bytes (what exact receives are sized by): equal on two ranks
  /// that size each other's messages alike.
  std::uint64_t sizes_digest() const {
    size_digest d;
    d.mix(std::uint64_t(blocks()));
    d.mix(std::uint64_t(data_.size()));
    for (int j = 0; j < blocks(); ++j) d.mix(std::uint64_t(packed_bytes(j, j + 1)));
    return d.value;
  }

 private:
  std::vector<std::span<const std::byte>> parts_of(std::span<const std::byte> bytes, int peer, int lo, int hi) const {
    return schedule_unpack(bytes, std::size_t(hi - lo),
                           std::string(who_) + ": rank " + std::to_string(self_) + " from rank " + std::to_string(peer));
  }

  C& codec_;
  std::span<float> data_;
  std::vector<std::size_t> b_;
  const schedule_options& o_;
  ring_stats& st_;
  const char* who_;
  int self_, n_;
  linear_mailbox<T> mail_;
  std::vector<payload>& enc_;  ///< the workspace's: block j's at j, the parsed one at blocks()
  std::vector<std::size_t> body_;
  std::vector<std::span<const std::byte>> held_;     ///< complete blocks' bytes: own_bytes_ or a received message's
  std::vector<std::vector<std::byte>> own_bytes_;  ///< the blocks this rank completes, serialized
  std::vector<bool> encoded_;
  std::vector<std::size_t> at_;      ///< assembling: where block j's part of the assembly starts (blocks() + 1)
  std::span<std::byte> assembly_;  ///< assembling: every block's part, in block order
  std::span<std::byte> assembled(int lo, int hi) const {
    return assembly_.subspan(at_[std::size_t(lo)], at_[std::size_t(hi)] - at_[std::size_t(lo)]);
  }
};

/// What every compressed schedule does first: the codec's summands checked
/// against N, an AgreedScaleCodec's scales agreed (a max ring: exact in any
/// policy), and the vector cut into `parts` blocks on the codec's boundaries
/// (ring_segmentation<C>::bounds, checked).
template <class T, class C>
linear_blocks<T, C> make_linear_blocks(T& t, C& codec, std::span<float> data, int parts, const schedule_options& o,
                                       ring_stats& st, const char* who) {
  using seg = ring_segmentation<std::remove_const_t<C>>;
  ring_check_summands(codec, static_cast<int>(t.size()), who);
  ring_agree_scales<execution::seq>(t, codec, std::span<const float>(data), schedule_ring_options(o), st);
  return linear_blocks<T, C>(t, codec, data,
                             ring_checked_bounds(seg::bounds(std::as_const(codec), data.size(), parts), data.size(), parts, who),
                             o, st, who);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail
}  // namespace gradcomp
