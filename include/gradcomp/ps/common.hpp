#pragma once
/// \file ps/common.hpp
/// Pieces the parameter-server drivers share: worker status, counters,
/// worker options, the stateless decoders of self-describing payloads (dense,
/// sparse COO), the default dense downlink, and the frame helpers of
/// ps_detail (control messages, the asynchronous downlink's serialisation,
/// rejects, blocking sends).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/dgs_server.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/payloads/dense.hpp>
#include <gradcomp/payloads/sparse_coo.hpp>
#include <gradcomp/ps/frames.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

/// Status of a worker as the server sees it.
enum class ps_worker_status : std::uint8_t {
  active = 1,  ///< started from theta_0 or joined; its copy w_k is exact
  left = 2,    ///< said leave
  gone = 3,    ///< a reply to it could not be delivered, or it fell silent; a dense resync awaits it
};

/// Counters of a parameter server.
struct ps_server_stats {
  std::uint64_t pushes = 0;    ///< pushes applied
  std::uint64_t rejected = 0;  ///< frames rejected (state unchanged)
  std::uint64_t joins = 0;
  std::uint64_t leaves = 0;
  std::uint64_t resyncs = 0;   ///< dense resyncs sent (joins and pushes from workers marked gone)
  std::uint64_t send_failures = 0;
  std::vector<std::uint64_t> bytes_up;    ///< per worker: frame bytes received
  std::vector<std::uint64_t> bytes_down;  ///< per worker: frame bytes sent
  std::vector<std::uint64_t> pushes_per_worker;
  std::string last_error;
};

/// Options of a worker's transport calls (asynchronous and synchronous workers).
struct async_ps_worker_options {
  int server_rank = 0;
  int tag_up = ps_default_tag_up;      ///< worker-to-server tag (checked against the registry, tags.hpp)
  int tag_down = ps_default_tag_down;  ///< server-to-worker tag
  /// Rejoins (dense resyncs) a request may trigger after a reply timed out or
  /// was malformed, before the error is thrown.
  int max_rejoins = 1;
};

/// Counters of a worker.
struct ps_worker_stats {
  std::uint64_t pushes = 0, rejected = 0, resyncs = 0, stale = 0, rejoins = 0;
  std::uint64_t bytes_up = 0, bytes_down = 0;
};

/// A default factory for a downlink codec that is default-constructible.
template <class D>
struct default_codec_factory {
  D operator()(std::size_t, std::size_t) const { return D{}; }
};

namespace ps_detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// A decode-only stand-in for the sparse codecs: sparse_coo_payload describes
/// itself, so the server needs no codec state (a sparsifier would hold a
/// model-sized residual per layer for nothing).
struct coo_decoder {
  using payload_type = sparse_coo_payload;
  void decode(const payload_type& p, std::span<float> out) const {
    detail::sparse_scatter<false>(p, out, "parameter server: sparse layer");
  }
  void decode_add(const payload_type& p, std::span<float> out) const {
    detail::sparse_scatter<true>(p, out, "parameter server: sparse layer");
  }
};

/// A decode-only stand-in for codecs whose payload is dense_payload: the
/// floats themselves (decode copies, decode_add adds with Policy's kernel).
template <ExecutionPolicy Policy>
struct dense_decoder {
  using payload_type = dense_payload;
  void decode(const payload_type& p, std::span<float> out) const {
    if (out.size() != p.values.size()) throw size_mismatch_error("parameter server: dense layer", p.values.size(), out.size());
    std::copy(p.values.begin(), p.values.end(), out.begin());
  }
  void decode_add(const payload_type& p, std::span<float> out) const {
    if (out.size() != p.values.size()) throw size_mismatch_error("parameter server: dense layer", p.values.size(), out.size());
    add_into(Policy{}, out, std::span<const float>(p.values));
  }
};

/// What a server decodes C's payloads with: a stateless stand-in for the
/// self-describing payloads (dense, sparse COO), else C itself.
template <class C, class Policy>
using decoder_t =
    std::conditional_t<std::is_same_v<typename C::payload_type, sparse_coo_payload>, coo_decoder,
                       std::conditional_t<std::is_same_v<typename C::payload_type, dense_payload>,
                                          dense_decoder<Policy>, C>>;

/// True when a downlink codec's payload is dense_payload: the aggregate is
/// sent as it is, with no codec instance (dense_codec, ps_dense_downlink).
template <class D>
inline constexpr bool is_dense_downlink = std::is_same_v<typename D::payload_type, dense_payload>;

template <class C, class Policy>
inline constexpr bool needs_codec_instances = std::is_same_v<decoder_t<C, Policy>, C>;

/// One decoder per layer (built by `make` only when C's payload does not describe itself).
template <class C, class Policy, class MakeCodec>
std::vector<decoder_t<C, Policy>> make_decoders(const layer_partition& layers, MakeCodec& make) {
  std::vector<decoder_t<C, Policy>> d;
  d.reserve(layers.layers());
  for (std::size_t j = 0; j < layers.layers(); ++j) {
    if constexpr (needs_codec_instances<C, Policy>)
      d.push_back(make(j, layers.size(j)));
    else
      d.emplace_back();
  }
  return d;
}

inline ps_control make_control(ps_kind kind, std::uint64_t sequence, std::uint64_t timestamp = 0) {
  ps_control c;
  c.kind = kind;
  c.sequence = sequence;
  c.timestamp = timestamp;
  return c;
}

/// A worker's push frame for request `sequence`: the control message, then
/// one wire message per layer (the uplink's payloads).
template <class Payloads>
std::vector<std::byte> push_frame(ps_frame_builder& builder, const layer_partition& layers, std::uint64_t sequence,
                                  const Payloads& payloads) {
  ps_control c = make_control(ps_kind::push, sequence);
  c.layers = static_cast<std::uint32_t>(layers.layers());
  c.elements = layers.total();
  builder.start(c);
  for (const auto& p : payloads) builder.append(p);
  return builder.take();
}

/// Serialises a model update (async downlink): each sparse layer as a
/// sparse_coo_payload of the server's values, or dense (`dense_layer(j)`) when
/// that is no larger; dense layers as dense_payload.
template <class DenseLayer>
std::vector<std::byte> serialize_update(ps_frame_builder& b, const layer_partition& layers, model_update& u,
                                        std::uint64_t sequence, DenseLayer&& dense_layer) {
  ps_control c = make_control(u.resync ? ps_kind::resync : ps_kind::update, sequence, u.timestamp);
  c.layers = static_cast<std::uint32_t>(layers.layers());
  c.elements = layers.total();
  b.start(c);
  for (std::size_t j = 0; j < layers.layers(); ++j) {
    auto& l = u.layers[j];
    const std::size_t n = layers.size(j);
    if (!l.dense) {
      sparse_coo_payload p;
      p.length = n;
      p.indices = std::move(l.indices);
      p.values = std::move(l.values);
      if (wire::serialized_size(p) < wire::header_size + n * sizeof(float)) {
        b.append(p);
        continue;
      }
      auto src = dense_layer(j);  // the worker's whole layer after this update
      b.append(dense_payload{std::vector<float>(src.begin(), src.end())});
      continue;
    }
    b.append(dense_payload{std::move(l.values)});
  }
  return b.take();
}

inline std::vector<std::byte> serialize_reject(std::uint64_t sequence, ps_reject_reason why) {
  ps_control c = make_control(ps_kind::reject, sequence);
  c.detail = static_cast<std::uint8_t>(why);
  return wire::serialize(c);
}

template <Transport T>
void send(T& t, int dest, int tag, std::vector<std::byte>&& bytes) {
  auto h = t.isend(dest, tag, std::move(bytes));
  h.wait();
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace ps_detail

/// The default downlink of the synchronous server (sync_ps_server,
/// sync_ps_worker): the aggregate travels as dense float32 (dense_payload),
/// bit for bit what dense_codec sends, without the drivers naming a codec.
/// Any downlink codec whose payload is dense_payload is treated the same way.
template <ExecutionPolicy Policy = execution::seq>
struct ps_dense_downlink : ps_detail::dense_decoder<Policy> {
  using payload_type = dense_payload;
  /// out = the gradient itself; NaN/Inf rejected with non_finite_error.
  void encode(std::span<const float> gradient, payload_type& out) const {
    if (auto bad = find_non_finite(Policy{}, gradient); bad != gradient.size())
      throw non_finite_error("ps_dense_downlink::encode", bad);
    out.values.assign(gradient.begin(), gradient.end());
  }
  /// Exact bytes on the wire.
  std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }
};
static_assert(Codec<ps_dense_downlink<>>, "the default downlink is a codec");

}  // namespace gradcomp
