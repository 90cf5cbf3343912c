#pragma once
/// \file schedules/rabenseifner_linear.hpp
/// Rabenseifner's all-reduce in the compressed domain of a LinearCodec
/// (GradiVeQ eq. 4 holds for any order of summation, not only a ring): the
/// vector is cut into p blocks by the same customization point Algorithm 1
/// uses (ring_segmentation<C>: GradiVeQ's slice boundaries), every rank
/// encodes its p blocks once (eq. 3), each halving step sends the encoded
/// half it gives away and the receiver sums in the compressed domain
/// (codec.accumulate, eq. 4); the doubling distributes the complete
/// compressed blocks byte for byte, and every rank decodes them (eq. 5).
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
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring/linear.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/schedules/link.hpp>
#include <gradcomp/schedules/options.hpp>
#include <gradcomp/schedules/rabenseifner.hpp>
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
        out = std::span<const std::byte>(inbox_of(in.slot).data(), got);
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
    st_.bytes_sent += m.size();
    ++st_.messages_sent;
    if constexpr (zero_copy) {
      if (with_length) {
        lengths_.push_back(std::make_unique<std::uint64_t>(m.size()));
        sends_.push_back(
            t_.isend_view(peer, tag, std::as_bytes(std::span<const std::uint64_t>(lengths_.back().get(), 1))));
      }
      sends_.push_back(t_.isend_view(peer, tag, std::span<const std::byte>(m)));
    } else {
      (void)with_length;
      sends_.push_back(t_.isend(peer, tag, std::move(m)));  // the transport takes the bytes
    }
  }
  /// Waits for every send posted so far (their buffers stay until finish()).
  void wait_sends() {
    ring_timed(st_.wait_seconds, [&] {
      for (auto& h : sends_) h.wait();
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
  }
  /// Sends blocks [lo, hi) to `peer` as one message (schedule_pack's
  /// layout): this rank's payloads, serialized straight into the message
  /// (`serialize_own`), or the kept bytes; zero-copy: without a length
  /// message when !with_length (the receiver posted expect_exact).
  void send(int peer, int tag, int lo, int hi, bool serialize_own, bool with_length = true) {
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
    return exact ? mail_.expect_exact(peer, tag, packed_bytes(lo, hi)) : mail_.expect(peer, tag);
  }
  /// Eq. 4 on each block of [lo, hi): the message's payloads summed into this rank's.
  void add_in(std::span<const std::byte> bytes, int peer, int lo, int hi) {
    const auto parts = parts_of(bytes, peer, lo, hi);
    for (int j = lo; j < hi; ++j) {
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
  /// FNV-1a over the block count, the vector's length and every block's
  /// packed bytes (what exact receives are sized by): equal on two ranks
  /// that size each other's messages alike.
  std::uint64_t sizes_digest() const {
    std::uint64_t h = 14695981039346656037ull;
    auto mix = [&](std::uint64_t x) {
      for (int i = 0; i < 8; ++i) {
        h ^= (x >> (8 * i)) & 0xFFu;
        h *= 1099511628211ull;
      }
    };
    mix(std::uint64_t(blocks()));
    mix(std::uint64_t(data_.size()));
    for (int j = 0; j < blocks(); ++j) mix(std::uint64_t(packed_bytes(j, j + 1)));
    return h;
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
};

/// Rabenseifner in the compressed domain (see rabenseifner_allreduce_linear).
template <class T, class C>
ring_stats rabenseifner_linear_impl(T& t, C& codec, std::span<float> data, const schedule_options& o) {
  using seg = ring_segmentation<std::remove_const_t<C>>;
  constexpr const char* who = "rabenseifner_allreduce_linear";
  const auto started = ring_clock::now();
  ring_stats st;
  schedule_check_tags(o, who);
  const rabenseifner_schedule rs(static_cast<int>(t.rank()), static_cast<int>(t.size()));
  const int n = rs.size(), p = rs.blocks(), self = rs.rank();
  ring_check_summands(codec, n, who);
  ring_agree_scales<execution::seq>(t, codec, std::span<const float>(data), schedule_ring_options(o), st);  // a max: exact in any policy
  linear_blocks<T, C> blk(t, codec, data, ring_checked_bounds(seg::bounds(std::as_const(codec), data.size(), p), data.size(), p, who),
                          o, st, who);
  // Folded pairs and a single rank encode everything now; the others encode
  // the half they give away first and the half they keep while it travels.
  if (n == 1 || rs.folded_out() || rs.folds_in()) blk.encode(0, p);
  if (n == 1) {
    for (int j = 0; j < p; ++j) blk.decode(blk.own(j), j);
    st.seconds = ring_seconds_since(started);
    return st;
  }
  auto& mail = blk.mail();
  const int tag = o.tag_base, tag2 = o.tag_base + 1;

  // Fold: the even rank of a pair sends all its encoded blocks; the odd one sums them in.
  if (rs.folded_out()) {
    blk.send(rs.fold_partner(), tag, 0, p, true);
  } else if (rs.folds_in()) {
    auto in = mail.expect(rs.fold_partner(), tag);
    blk.add_in(mail.collect(in), rs.fold_partner(), 0, p);
  }
  // The first step's halves travel in pieces of whole blocks (at most
  // max_chunks; none with chunk_elements 0), cut the same way on both sides
  // (the peer's given half is this rank's kept half): each piece of the given
  // half is sent as soon as it is encoded, so the wire starts after one
  // piece's encode instead of the half's. Over a zero-copy transport only
  // where the codec knows its payload sizes in advance: the receives are then
  // exact and posted before the data is due, with no length messages (with
  // them, a piece's receive could be posted only once its length had
  // arrived, which holds a large message back under SMPI).
  constexpr bool exact_sizes = linear_mailbox<T>::zero_copy && KnowsBodySize<std::remove_const_t<C>>;
  constexpr bool may_cut = !linear_mailbox<T>::zero_copy || exact_sizes;
  // Every choice below depends on p, the options and the length only, so
  // both peers of every exchange make the same one.
  const int half = p / 2;  // blocks each side gives away at the first step and sends at the last
  const int m0 = !may_cut || o.chunk_elements == 0 || half < 2
                     ? 1
                     : (o.max_chunks == 0 ? half : static_cast<int>(std::min<std::size_t>(o.max_chunks, std::size_t(half))));
  // The last doubling step carries half of the blocks, and their decode
  // could only follow the transfer. Where the vector is large it goes as two
  // messages, the second sent once the first has left: the first half's
  // blocks are then decoded while the second travels, for one more latency.
  const bool split_last = m0 > 1 && o.max_chunks != 1 && data.size() > 4 * o.chunk_elements;
  const bool exact = exact_sizes && m0 > 1;  // exact receives, no length messages
  const int v = rs.virtual_rank();
  if (v >= 0) {
    int lo = 0, hi = p;
    for (int k = 0; k < rs.steps(); ++k) {  // recursive halving in the compressed domain
      const int d = rs.halving_distance(k), mid = lo + (hi - lo) / 2, peer = rs.real_rank(v ^ d);
      const bool lower = (v & d) == 0;
      const int klo = lower ? lo : mid, khi = lower ? mid : hi;
      const int glo = lower ? mid : lo, ghi = lower ? hi : mid;
      const int m = k == 0 ? m0 : 1;
      auto cut = [m](int from, int to, int i) { return from + static_cast<int>(static_cast<long long>(to - from) * i / m); };
      if (k == 0 && exact) {
        // Exact receives trust this rank's own idea of the peer's payload
        // sizes, and some MPI libraries write past a receive that is too small
        // instead of failing. So this step's peer (also the last doubling
        // step's) first swaps a digest of every block's size with this rank:
        // a rank with another length or codec configuration (another
        // GradiVeQ basis) is an error on both sides before any data is sent.
        auto theirs = mail.expect_exact(peer, tag, sizeof(std::uint64_t));
        const std::uint64_t mine = blk.sizes_digest();
        std::vector<std::byte>& out = mail.outgoing();
        out.resize(sizeof mine);
        std::memcpy(out.data(), &mine, sizeof mine);
        mail.send(peer, tag, false);
        blk.encode(cut(glo, ghi, 0), cut(glo, ghi, 1));  // the first piece while the digests travel
        const auto got = mail.collect(theirs);
        std::uint64_t other = 0;
        std::memcpy(&other, got.data(), sizeof other);
        if (other != mine)
          throw transport_error(std::string(who) + ": rank " + std::to_string(self) + " and rank " + std::to_string(peer) +
                                " disagree on the sizes of their blocks' payloads (another vector length or codec "
                                "configuration, e.g. another GradiVeQ basis)");
      }
      std::vector<typename linear_mailbox<T>::incoming> ins;  // posted before the sends: the peer's bytes are never held back
      ins.reserve(std::size_t(m));
      const bool exact_here = exact && k == 0;  // exact implies pieces (m0 > 1)
      for (int i = 0; i < m; ++i) ins.push_back(blk.expect(peer, tag, cut(klo, khi, i), cut(klo, khi, i + 1), exact_here));
      for (int i = 0; i < m; ++i) {
        const int a = cut(glo, ghi, i), z = cut(glo, ghi, i + 1);
        blk.encode(a, z);
        blk.send(peer, tag, a, z, true, !exact_here);
      }
      if (m == 1) mail.arm(ins[0]);
      blk.encode(klo, khi);  // first step only: the kept half is encoded while both halves travel
      for (int i = 0; i < m; ++i) blk.add_in(mail.collect(ins[std::size_t(i)]), peer, cut(klo, khi, i), cut(klo, khi, i + 1));
      lo = klo;
      hi = khi;
    }
    // Block v is complete: serialize it once; from here on the bytes travel as they are.
    blk.serialize(v);
    // Recursive doubling of the complete compressed blocks. Each step's
    // blocks are decoded (eq. 5) during the next step's transfer: only the
    // last step's blocks are decoded after the wire is done.
    int dlo = v, dhi = v + 1, from = self;  // blocks to decode, from whom (block v first, from its payload)
    for (int d = 1; d < p; d *= 2) {
      const int width = hi - lo, peer = rs.real_rank(v ^ d);
      const bool lower = (v & d) == 0;
      const int plo = lower ? hi : lo - width, phi = plo + width;
      if (2 * d >= p && split_last) {
        const int pmid = plo + width / 2, mid = lo + width / 2;  // split_last implies pieces: exact where sizes are known
        auto first = blk.expect(peer, tag2, plo, pmid, exact);
        auto second = blk.expect(peer, tag2, pmid, phi, exact);
        blk.send(peer, tag2, lo, mid, false, !exact);
        blk.decode_run(dlo, dhi, from);
        mail.wait_sends();  // the first message has left: the second has the link to itself
        blk.send(peer, tag2, mid, hi, false, !exact);
        blk.keep_bytes(mail.collect(first), peer, plo, pmid);
        blk.decode_run(plo, pmid, peer);  // while the second message travels
        blk.keep_bytes(mail.collect(second), peer, pmid, phi);
        dlo = pmid;
        dhi = phi;
      } else {
        auto in = mail.expect(peer, tag2);
        blk.send(peer, tag2, lo, hi, false);
        mail.arm(in);
        blk.decode_run(dlo, dhi, from);
        blk.keep_bytes(mail.collect(in), peer, plo, phi);
        dlo = plo;
        dhi = phi;
      }
      from = peer;
      lo = lower ? lo : plo;
      hi = lower ? phi : hi;
    }
    blk.decode_run(dlo, dhi, from);
  }
  // Unfold: the odd rank of a pair sends the complete compressed blocks.
  if (rs.folds_in()) {
    blk.send(rs.fold_partner(), tag2, 0, p, false);
  } else if (rs.folded_out()) {
    auto in = mail.expect(rs.fold_partner(), tag2);
    blk.decode_message(mail.collect(in), rs.fold_partner(), 0, p);
  }
  mail.finish();
  st.seconds = ring_seconds_since(started);
  return st;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Rabenseifner's all-reduce in the compressed domain of a LinearCodec, in
/// place on `data` (every rank passes the same length and an identically
/// configured codec: same basis; GradiVeQ's summands() must equal N).
/// Blocks: ring_segmentation<C>::bounds(codec, length, p), p the largest
/// power of two <= N. Result: data = decode(sum over ranks of encode(block)),
/// block by block, divided by N with options.average: bit-identical on every
/// rank (each block's compressed sum is computed by one rank and its bytes
/// are decoded everywhere). Each rank encodes its vector once and decodes it
/// once; messages carry whole encoded half-ranges (log2 p of them each way,
/// plus the fold for N not a power of two). Tags options.tag_base and + 1.
/// Errors as ring_allreduce_linear's.
template <Transport T, class C>
  requires LinearCodec<std::remove_const_t<C>>
ring_stats rabenseifner_allreduce_linear(T& t, C& codec, std::span<float> data, const schedule_options& options = {}) {
  return detail::rabenseifner_linear_impl(t, codec, data, options);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
