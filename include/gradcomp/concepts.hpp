#pragma once
/// \file concepts.hpp
/// The concepts every piece plugs into: Codec, LinearCodec, StatefulCodec,
/// Transport (and its handles), ExecutionPolicy (detail/policy_tags.hpp, with the
/// tags; the kernels are in execution.hpp), WirePayload (wire.hpp).
///
/// Only the policy tags are included, never a kernel: the transport headers
/// include this one, and must not pull in xsimd or Thrust.
///
/// A codec instance compresses one tensor (one layer's gradient, or one
/// flattened vector): per-layer behaviour comes from holding one codec per layer.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

// ---------------------------------------------------------------------------
// Codecs

/// A gradient codec: `encode` a span of floats into a payload, `decode` a
/// payload back into a span of the same length, and report the exact number
/// of bytes the payload takes on the wire (header, indices and scales included).
template <class C>
concept Codec = std::movable<C> && requires { typename C::payload_type; } &&
                wire::WirePayload<typename C::payload_type> &&
                std::default_initializable<typename C::payload_type> &&
                requires(C& c, const C& cc, std::span<const float> in, std::span<float> out,
                         typename C::payload_type& p, const typename C::payload_type& cp) {
                  { c.encode(in, p) } -> std::same_as<void>;
                  { cc.decode(cp, out) } -> std::same_as<void>;
                  { cc.encoded_bytes(cp) } -> std::same_as<std::size_t>;
                };

/// A codec that can also decode a payload straight into a running sum
/// (out += decode(p)), saving a buffer in decode-and-sum aggregation.
template <class C>
concept DecodeAddCodec = Codec<C> && requires(const C& cc, const typename C::payload_type& cp, std::span<float> out) {
  { cc.decode_add(cp, out) } -> std::same_as<void>;
};

/// The opt-in tag of a linear codec: `using codec_concept = linear_codec_tag;`.
struct linear_codec_tag {};

/// Linearity cannot be checked by a compiler, so a codec opts in, either with
/// the member alias above or by specialising this variable template to true.
template <class C>
inline constexpr bool enable_linear_codec = [] {
  if constexpr (requires { typename C::codec_concept; })
    return std::derived_from<typename C::codec_concept, linear_codec_tag>;
  else
    return false;
}();

/// A codec whose compression commutes with summation (GradiVeQ eq. 4):
/// sum_i encode(g_i) == encode(sum_i g_i), up to an offset the codec knows
/// (GradiVeQ's mu/N). Payloads are summed in the compressed domain with
/// `accumulate(into, from)`, and the sum decodes to the sum of the inputs.
/// Drivers branch on this concept with `if constexpr`.
template <class C>
concept LinearCodec = Codec<C> && enable_linear_codec<C> &&
                      requires(const C& cc, typename C::payload_type& p, const typename C::payload_type& cp) {
                        { cc.accumulate(p, cp) } -> std::same_as<void>;
                      };

/// A linear codec whose workers first agree on its scales (the homomorphic
/// quantizer: the max over the workers of per-block scales, then codes
/// against the agreed scales, which sum as integers). `local_scales(x, s)`
/// writes scale_count(x.size()) local scales (and rejects non-finite input,
/// before anything is sent); a max reduction over the workers gives the
/// agreed ones, which `set_agreed_scales(s, n)` installs before encoding a
/// vector of n values. Drivers and the exchange run the max round first
/// when they see this concept (ring_allreduce_linear does).
template <class C>
concept AgreedScaleCodec = LinearCodec<C> && requires(const C& cc, C& c, std::span<const float> x, std::span<float> s,
                                                      std::size_t n) {
  { cc.scale_count(n) } -> std::convertible_to<std::size_t>;
  cc.local_scales(x, s);
  c.set_agreed_scales(std::span<const float>(s), n);
};

/// A codec holding per-worker memory (residual, velocity, basis) that can be
/// saved to bytes and restored exactly: a restored codec continues bit-for-bit.
/// The bytes use the wire container with the codec-state flag (wire.hpp).
template <class C>
concept StatefulCodec = Codec<C> && requires(C& c, const C& cc, std::span<const std::byte> bytes) {
  { cc.save_state() } -> std::same_as<std::vector<std::byte>>;
  { c.restore_state(bytes) } -> std::same_as<void>;
};

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Numeric check of a LinearCodec's claim (the property tests use it):
/// returns max_i |decode(sum_k encode_N(x_k)) - decode(encode_1(sum_k x_k))|_i
/// divided by max(1, max_i |sum_k x_k|_i).
/// `per_summand` is configured for inputs.size() summands (GradiVeQ subtracts
/// mu/N from each), `whole` for a single summand; for codecs without an
/// offset they may be the same object.
template <LinearCodec C>
double linearity_defect(C& per_summand, C& whole, std::span<const std::vector<float>> inputs) {
  if (inputs.empty()) return 0.0;
  const std::size_t n = inputs.front().size();
  std::vector<float> sum(n, 0.0f);
  typename C::payload_type acc, tmp;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k].size() != n) throw size_mismatch_error("linearity_defect: input", n, inputs[k].size());
    for (std::size_t i = 0; i < n; ++i) sum[i] += inputs[k][i];
    if (k == 0) {
      per_summand.encode(inputs[k], acc);
    } else {
      per_summand.encode(inputs[k], tmp);
      per_summand.accumulate(acc, tmp);
    }
  }
  std::vector<float> from_sum_of_codes(n), from_code_of_sum(n);
  per_summand.decode(acc, from_sum_of_codes);
  whole.encode(sum, tmp);
  whole.decode(tmp, from_code_of_sum);
  double worst = 0.0, scale = 1.0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(double(from_sum_of_codes[i]) - double(from_code_of_sum[i])));
    scale = std::max(scale, std::abs(double(sum[i])));
  }
  return worst / scale;
}

GRADCOMP_ABI_NAMESPACE_END
// ---------------------------------------------------------------------------
// Transports

/// A received message: who sent it, with which tag, and its bytes.
struct message {
  int source = -1;
  int tag = 0;
  std::vector<std::byte> bytes;
};

/// Receive from whichever peer sends first (parameter servers).
inline constexpr int any_source = -1;

/// Handle of an asynchronous send: wait() blocks until the buffer is handed
/// off (and throws transport_error if the peer is gone); test() polls.
template <class H>
concept SendHandle = std::movable<H> && requires(H& h) {
  { h.wait() } -> std::same_as<void>;
  { h.test() } -> std::same_as<bool>;
};

/// Handle of an asynchronous receive: wait() returns the message (or throws
/// transport_error / timeout_error); test() polls without blocking.
template <class H>
concept RecvHandle = std::movable<H> && requires(H& h) {
  { h.wait() } -> std::same_as<message>;
  { h.test() } -> std::same_as<bool>;
};

/// Moves byte buffers between `size()` ranks. Messages between one pair of
/// ranks with the same tag arrive in the order they were sent; receives are
/// matched in the order they were posted (MPI semantics).
template <class T>
concept Transport = requires(T& t, const T& ct, int peer, int tag, std::vector<std::byte>&& buffer) {
  { ct.rank() } -> std::convertible_to<int>;
  { ct.size() } -> std::convertible_to<int>;
  { t.isend(peer, tag, std::move(buffer)) } -> SendHandle;
  { t.irecv(peer, tag) } -> RecvHandle;
};

/// Handle of a receive into caller-owned memory: wait() returns the number
/// of bytes received (a longer message is a transport_error, never truncated).
template <class H>
concept RecvIntoHandle = std::movable<H> && requires(H& h) {
  { h.wait() } -> std::same_as<std::size_t>;
  { h.test() } -> std::same_as<bool>;
};

/// A transport that can also send from and receive into memory the caller
/// owns, without copying (MPI does; the in-process transport moves whole
/// vectors instead). The caller keeps `out` alive and unchanged, and does not
/// touch `in`, until the handle's wait() returns. Drivers use these with
/// `if constexpr (ZeroCopyTransport<T>)` to avoid a copy and an allocation
/// per message.
template <class T>
concept ZeroCopyTransport = Transport<T> && requires(T& t, int peer, int tag, std::span<const std::byte> out,
                                                     std::span<std::byte> in) {
  { t.isend_view(peer, tag, out) } -> SendHandle;
  { t.irecv_into(peer, tag, in) } -> RecvIntoHandle;
};

/// A ZeroCopyTransport that waits for many of its handles in one call
/// (mpi_transport: one MPI_Waitall instead of a call per message), an
/// optional capability: `T::wait_all(std::span<send handle>)` and
/// `T::wait_all(std::span<receive handle* const>)`, after which each
/// handle's wait() returns at once. The schedules' links use it to wait for
/// a batch of messages (schedules/link.hpp).
template <class T>
concept BatchWaitTransport =
    ZeroCopyTransport<T> && requires(T& t, std::span<const std::byte> out, std::span<std::byte> in) {
      T::wait_all(std::span<decltype(t.isend_view(0, 0, out))>{});
      T::wait_all(std::span<decltype(t.irecv_into(0, 0, in))* const>{});
    };

/// A ZeroCopyTransport that can start a batch of posts together
/// (mpi_transport: `t.batch_posts()` opens a batch; the isend_view and
/// irecv_into calls made while it lives start when it closes, with one
/// MPI_Startall per wave of distinct peers and tags). The schedules open one
/// around each phase's posts (schedules/link.hpp: float_link::batch).
template <class T>
concept BatchPostTransport = ZeroCopyTransport<T> && requires(T& t) {
  { t.batch_posts() } -> std::move_constructible;
  t.batch_posts().close();
};

/// A transport whose own isend/irecv move whole vectors but which offers a
/// ZeroCopyTransport over the same ranks and messages, `t.zero_copy()` (the
/// in-process transport: inproc_endpoint::zero_copy()). A driver with a
/// zero-copy path takes it through that face when it has the transport
/// itself (not a decorator around it: decorators count or delay the moving calls).
template <class T>
concept ZeroCopyCapableTransport = Transport<T> && requires(T& t) {
  { t.zero_copy() } -> ZeroCopyTransport;
};

}  // namespace gradcomp
