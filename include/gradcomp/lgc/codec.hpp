#pragma once
/// \file lgc/codec.hpp
/// `autoencoder_codec<Policy>`: the Codec of the LGC autoencoder over one
/// concatenated top-k value vector (seed 004, eqs. 3-4, 17-19).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/lgc/network.hpp>
#include <gradcomp/lgc/payloads.hpp>
#include <gradcomp/lgc/windows.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

/// Codec of the LGC autoencoder over a vector of `value_count` values (the
/// concatenated top-k values of Section V-A): encode = per-window scale, E_c,
/// code payload; decode = D_c, times the scale. value_count must be at least
/// one window; the last window is zero-padded and its padding dropped at decode.
///
/// Not a LinearCodec: E_c is non-linear, so the sum of codes does not decode
/// to the sum of inputs. The ring form's linear step is the average of the
/// code floats (eq. 18), which lgc_ring_node (protocols/lgc_ring.hpp) does
/// with ring_allreduce and `decode` then turns into the aggregate (eq. 19).
/// For the average of codes to be meaningful every node must encode with the
/// same scales (the leader's, carried by lgc_index_payload): use
/// encode(values, scales, out).
///
/// Scratch memory. `decode` is const and neither locks nor keeps scratch in
/// the codec: every decode overload takes an optional `workspace&` (the
/// decoder's buffers), which a caller that decodes often keeps and passes
/// again, so that a warm decode does not allocate. Without one, the call
/// uses a local workspace (allocates; safe from any number of threads). One
/// workspace must not be used by two concurrent decodes.
///
/// Non-finite policy: encode rejects NaN/Inf with non_finite_error naming
/// the first bad index; decode rejects a payload whose window or code length
/// differs from this codec's with size_mismatch_error, non-finite code floats
/// (decode from a span) with non_finite_error naming the first bad code
/// index, and a reconstruction that overflows (codes near the float limit
/// can make D_c or the scale product infinite) with non_finite_error naming
/// the first bad output index. On any error `out` is left unchanged and the
/// codec has no state a decode could change.
template <ExecutionPolicy Policy = execution::seq>
class autoencoder_codec {
 public:
  using payload_type = lgc_code_payload;

  /// The decoder's scratch buffers (code tensor, innovation channel, network
  /// activations), reused across decode calls; caller-owned.
  struct workspace {
    nn1d::tensor<float> code, y;
    nn1d::matrix<float> h;
    typename lgc_network::workspace net;
  };

  /// A codec over `value_count` values with the (shared, read-only) network `net`.
  autoencoder_codec(std::shared_ptr<const lgc_network> net, std::size_t value_count)
      : net_(std::move(net)), n_(value_count) {
    if (!net_) throw invalid_argument_error("autoencoder_codec: no network");
    if (n_ < net_->window())
      throw invalid_argument_error("autoencoder_codec: input of " + std::to_string(n_) +
                                   " values is shorter than one window (" + std::to_string(net_->window()) + ")");
  }

  /// Values per vector (the length encode takes and decode writes).
  [[nodiscard]] std::size_t value_count() const noexcept { return n_; }
  /// Windows per vector: ceil(value_count / window).
  [[nodiscard]] std::size_t windows() const noexcept { return detail::lgc_window_count(n_, net_->window()); }
  /// Floats of a code: windows() * network().code_length().
  [[nodiscard]] std::size_t code_length() const noexcept { return windows() * net_->code_length(); }
  /// The network the codec encodes and decodes with.
  [[nodiscard]] const lgc_network& network() const noexcept { return *net_; }

  /// Encodes with the per-window RMS of `values` as scales (carried in the payload).
  void encode(std::span<const float> values, payload_type& out) {
    check_values(values, "autoencoder_codec::encode");
    detail::lgc_window_scales<float>(values, net_->window(), scales_);
    encode_scaled(values, scales_, out, true);
  }
  /// Encodes with given scales (one per window, finite, > 0); with
  /// `carry_scales` they are written into the payload, else the receiver
  /// must know them (ring form: from the leader's index set).
  void encode(std::span<const float> values, std::span<const float> scales, payload_type& out, bool carry_scales = true) {
    check_values(values, "autoencoder_codec::encode");
    check_scales(scales);
    encode_scaled(values, scales, out, carry_scales);
  }

  /// Decodes (ring decoder, or decoder 0) with the payload's scales (eqs. 4, 19).
  void decode(const payload_type& p, std::span<float> out) const {
    workspace ws;
    decode(p, out, ws);
  }
  /// As above, with the caller's workspace (no allocation once warm).
  void decode(const payload_type& p, std::span<float> out, workspace& ws) const {
    check_payload(p);
    if (p.scales.empty()) throw invalid_argument_error("autoencoder_codec::decode: the payload carries no scales");
    decode_impl(p.codes, p.scales, 0, {}, out, ws);
  }
  /// Decodes code floats (e.g. the ring average of codes, eq. 18) with given scales (eq. 19).
  void decode(std::span<const float> codes, std::span<const float> scales, std::span<float> out) const {
    workspace ws;
    decode(codes, scales, out, ws);
  }
  /// As above, with the caller's workspace (no allocation once warm).
  void decode(std::span<const float> codes, std::span<const float> scales, std::span<float> out, workspace& ws) const {
    if (codes.size() != code_length()) throw size_mismatch_error("autoencoder_codec::decode: codes", code_length(), codes.size());
    if (const auto bad = find_non_finite(Policy{}, codes); bad != codes.size())
      throw non_finite_error("autoencoder_codec::decode: code", bad);
    check_scales(scales);
    decode_impl(codes, scales, 0, {}, out, ws);
  }
  /// Parameter-server decoder D_c^k (eq. 12) with worker k's innovation
  /// vector (value_count values, zeros off the innovation) and the payload's scales.
  void decode(const payload_type& p, std::size_t decoder, std::span<const float> innovation, std::span<float> out) const {
    workspace ws;
    decode(p, decoder, innovation, out, ws);
  }
  /// As above, with the caller's workspace (no allocation once warm).
  void decode(const payload_type& p, std::size_t decoder, std::span<const float> innovation, std::span<float> out,
              workspace& ws) const {
    check_payload(p);
    if (p.scales.empty()) throw invalid_argument_error("autoencoder_codec::decode: the payload carries no scales");
    if (innovation.size() != n_) throw size_mismatch_error("autoencoder_codec::decode: innovation", n_, innovation.size());
    if (const auto bad = find_non_finite(Policy{}, innovation); bad != innovation.size())
      throw non_finite_error("autoencoder_codec::decode: innovation", bad);
    decode_impl(p.codes, p.scales, decoder, innovation, out, ws);
  }

  /// Bytes of `p` on the wire (wire::serialized_size).
  [[nodiscard]] std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }

 private:
  void check_values(std::span<const float> values, const char* who) const {
    if (values.size() != n_) throw size_mismatch_error(who, n_, values.size());
    if (const auto bad = find_non_finite(Policy{}, values); bad != values.size()) throw non_finite_error(who, bad);
  }
  void check_scales(std::span<const float> scales) const {
    if (scales.size() != windows()) throw size_mismatch_error("autoencoder_codec: scales", windows(), scales.size());
    for (float s : scales)
      if (!(s > 0.0f) || !std::isfinite(s)) throw invalid_argument_error("autoencoder_codec: scales must be finite and > 0");
  }
  void check_payload(const payload_type& p) const {
    if (p.value_count != n_) throw size_mismatch_error("autoencoder_codec::decode: payload values", n_, std::size_t(p.value_count));
    if (p.window != net_->window())
      throw size_mismatch_error("autoencoder_codec::decode: payload window", net_->window(), p.window);
    if (p.code_per_window != net_->code_length())
      throw size_mismatch_error("autoencoder_codec::decode: code floats per window", net_->code_length(), p.code_per_window);
    if (p.codes.size() != code_length())
      throw size_mismatch_error("autoencoder_codec::decode: code floats", code_length(), p.codes.size());
    if (!p.scales.empty() && p.scales.size() != windows())
      throw size_mismatch_error("autoencoder_codec::decode: scales", windows(), p.scales.size());
    // A payload built in memory (not parsed) may hold what the parser rejects.
    if (const auto bad = find_non_finite(Policy{}, std::span<const float>(p.codes)); bad != p.codes.size())
      throw non_finite_error("autoencoder_codec::decode: code", bad);
  }
  void encode_scaled(std::span<const float> values, std::span<const float> scales, payload_type& out, bool carry) {
    const std::size_t w = net_->window();
    x_.resize(1, nn1d::index_type(w), nn1d::index_type(windows()));
    detail::lgc_to_windows<float, float>(values, scales, w, x_.data, 0);
    net_->encode(x_, code_, ws_);
    out.value_count = n_;
    out.window = static_cast<std::uint32_t>(w);
    out.code_per_window = static_cast<std::uint32_t>(net_->code_length());
    out.codes.assign(code_.data.data(), code_.data.data() + code_.data.size());
    if (carry)
      out.scales.assign(scales.begin(), scales.end());
    else
      out.scales.clear();
  }
  void decode_impl(std::span<const float> codes, std::span<const float> scales, std::size_t decoder,
                   std::span<const float> innovation, std::span<float> out, workspace& s) const {
    if (out.size() != n_) throw size_mismatch_error("autoencoder_codec::decode: output", n_, out.size());
    const std::size_t w = net_->window(), windows_ = windows();
    s.code.length = nn1d::index_type(net_->code_positions());
    s.code.data = Eigen::Map<const nn1d::matrix<float>>(codes.data(), nn1d::index_type(net_->architecture().code_channels),
                                                        nn1d::index_type(codes.size() / net_->architecture().code_channels));
    if (net_->form() == lgc_form::parameter_server) {
      s.h.resize(1, nn1d::index_type(windows_ * w));
      detail::lgc_to_windows<float, float>(innovation, scales, w, s.h, 0);
      net_->decode(decoder, s.code, &s.h, s.y, s.net);
    } else {
      net_->decode(decoder, s.code, nullptr, s.y, s.net);
    }
    // Check every reconstructed value before writing any: out stays unchanged on error.
    for (std::size_t i = 0; i < n_; ++i)
      if (!std::isfinite(s.y.data(0, nn1d::index_type(i)) * scales[i / w]))
        throw non_finite_error("autoencoder_codec::decode: the reconstruction overflows (output index)", i);
    for (std::size_t i = 0; i < n_; ++i) out[i] = s.y.data(0, nn1d::index_type(i)) * scales[i / w];
  }

  std::shared_ptr<const lgc_network> net_;
  std::size_t n_;
  std::vector<float> scales_;
  nn1d::tensor<float> x_, code_;
  typename lgc_network::workspace ws_;
};

static_assert(Codec<autoencoder_codec<execution::seq>>, "autoencoder_codec must model Codec");
static_assert(!LinearCodec<autoencoder_codec<execution::seq>>, "autoencoder_codec is not linear (E_c is non-linear)");

}  // namespace gradcomp
