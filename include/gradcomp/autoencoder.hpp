#pragma once
/// \file autoencoder.hpp
/// Learned Gradient Compression (LGC, Abrahamyan et al., seed 004): top-k
/// sparsification with DGC-style accumulation, followed by a 1-D
/// convolutional autoencoder trained online during the run.
///
/// Pieces, from the inside out:
///  - `lgc_architecture`, `basic_lgc_network<T>`: the encoder E_c of Table I
///    and the decoder(s) D_c of Table II (nn1d.hpp), with the losses of
///    eqs. (5)-(7) (parameter server) and (9)-(11) (ring).
///  - `basic_lgc_trainer<T>`: online training, one transactional step per
///    iteration (SGD lr 1e-3, batch 1 by default, Section VI-A); a step whose
///    loss, gradients or new weights are not finite is rolled back.
///  - `lgc_code_payload`, `lgc_index_payload`: what goes on the wire (codes;
///    the leader's top-k index set, DEFLATE-compressed with zlib).
///  - `autoencoder_codec<Policy>`: a Codec over the concatenated top-k value
///    vector (values -> code payload -> values).
///  - `lgc_ring_node<Policy>` (Section IV-B, Algorithm 2) and
///    `lgc_ps_worker<Policy>` / `lgc_ps_server<Policy>` (Section IV-A,
///    Algorithm 1): the whole protocol over any Transport, with the three-phase
///    schedule of Section V-B and exact byte accounting (`lgc_traffic`).
///
/// docs/codecs.md ("LGC autoencoder") documents the shapes, the stride
/// choice, the windows, the payload layouts and the schedule.
///
/// Link zlib (CMake: gradcomp::lgc).

#include <zlib.h>

// nn1d.hpp first: its diagnostic pragma must be active when Eigen is first included.
#include <gradcomp/nn1d.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/concepts.hpp>
#include <gradcomp/dense.hpp>
#include <gradcomp/detail/random.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

// ===========================================================================
// Architecture and network

/// Hyper-parameters of the LGC autoencoder (seed 004, Tables I-II).
///
/// Encoder: one conv1d(kernel, stride 2, padding kernel/2) + leaky ReLU per
/// entry of `encoder_channels` (Table I conv1-conv4: 64, 128, 256, 64), then a
/// pointwise conv1d to `code_channels` (conv5: 4 filters, 1x1, linear output).
///
/// Decoder: conv_transpose1d(code_channels -> decoder_channels[0], stride 1)
/// + leaky ReLU, then one conv_transpose1d(stride 2, padding kernel/2,
/// output padding 1) + leaky ReLU per further entry (Table II deconv1-deconv5:
/// 4, 32, 64, 128, 32), then a pointwise conv1d to one channel (linear). In
/// the parameter-server form the innovation component is concatenated as one
/// extra channel before that last conv (Section IV-C).
///
/// Stride choice. Table I has four stride-2 layers (length / 16) but Table II
/// five (length x 32), which cannot give back the input length. gradcomp
/// makes deconv1 stride 1: it keeps Table II's filter counts, its 4 filters
/// equal the code's 4 channels (a refinement of the code at its own
/// resolution), and the remaining four stride-2 layers mirror the encoder's
/// four. So decoder_channels.size() must be encoder_channels.size() + 1, and
/// a window of W values (a multiple of 2^depth) becomes
/// code_channels * W / 2^depth code floats: W / 4 with the defaults.
struct lgc_architecture {
  std::vector<std::size_t> encoder_channels = {64, 128, 256, 64};
  std::size_t code_channels = 4;
  std::vector<std::size_t> decoder_channels = {4, 32, 64, 128, 32};
  std::size_t kernel = 3;     ///< odd (padding kernel/2 keeps lengths exact)
  float leaky_slope = 0.01f;  ///< in [0, 1)

  /// Number of stride-2 layers (each halves the length in the encoder).
  std::size_t depth() const noexcept { return encoder_channels.size(); }
  /// 2^depth: the factor between a window and its code positions.
  std::size_t reduction() const noexcept { return std::size_t{1} << depth(); }

  /// Throws invalid_argument_error unless the shapes are consistent.
  void validate() const {
    if (encoder_channels.empty() || encoder_channels.size() > 16)
      throw invalid_argument_error("lgc_architecture: 1 to 16 stride-2 encoder layers required");
    if (decoder_channels.size() != encoder_channels.size() + 1)
      throw invalid_argument_error("lgc_architecture: the decoder needs one stride-1 layer plus one stride-2 layer per "
                                   "encoder layer (decoder_channels.size() == encoder_channels.size() + 1), got " +
                                   std::to_string(decoder_channels.size()) + " and " +
                                   std::to_string(encoder_channels.size()));
    for (auto c : encoder_channels)
      if (c == 0) throw invalid_argument_error("lgc_architecture: zero encoder channels");
    for (auto c : decoder_channels)
      if (c == 0) throw invalid_argument_error("lgc_architecture: zero decoder channels");
    if (code_channels == 0) throw invalid_argument_error("lgc_architecture: zero code channels");
    if (kernel == 0 || kernel % 2 == 0) throw invalid_argument_error("lgc_architecture: the kernel must be odd");
    if (!(leaky_slope >= 0.0f && leaky_slope < 1.0f))
      throw invalid_argument_error("lgc_architecture: leaky slope must be in [0, 1)");
  }
  bool operator==(const lgc_architecture&) const = default;
};

/// Which LGC instance a network belongs to.
enum class lgc_form : std::uint8_t {
  ring = 1,              ///< Section IV-B: one encoder, one decoder fed the average of codes
  parameter_server = 2,  ///< Section IV-A: one encoder, one decoder per worker with the innovation channel
};

/// Version of the network weights body (after the wire container header).
inline constexpr std::uint16_t lgc_weights_version = 1;

namespace detail {
inline constexpr std::uint8_t lgc_kind_index = 1;
inline constexpr std::uint8_t lgc_kind_code = 2;
inline constexpr std::uint8_t lgc_kind_weights = 3;
}  // namespace detail

/// The LGC autoencoder: encoder E_c and 1 (ring) or K (parameter server)
/// decoders D_c^k. T is float in use; double for the gradient checks.
/// Signals are windows of `window` values (nn1d::tensor, 1 channel); a
/// batch of B windows is one 1 x (B*window) tensor.
template <class T>
class basic_lgc_network {
 public:
  using tensor = nn1d::tensor<T>;
  using matrix = nn1d::matrix<T>;
  using index_type = nn1d::index_type;

  /// Scratch of encode/decode (reused across calls).
  struct workspace {
    typename nn1d::sequential<T>::workspace encoder, body_layers, head;
    tensor body, cat;
  };

  /// A network for windows of `window` values (a positive multiple of
  /// 2^depth), initialised deterministically from `seed`.
  basic_lgc_network(lgc_form form, std::size_t decoders, std::size_t window, lgc_architecture arch,
                    std::uint64_t seed)
      : form_(form), window_(window), arch_(std::move(arch)) {
    arch_.validate();
    if (form != lgc_form::ring && form != lgc_form::parameter_server)
      throw invalid_argument_error("lgc network: unknown form");
    if (form == lgc_form::ring && decoders != 1)
      throw invalid_argument_error("lgc network: the ring form has exactly one decoder");
    if (decoders == 0 || decoders > 65536) throw invalid_argument_error("lgc network: 1 to 65536 decoders");
    if (window == 0 || window % arch_.reduction() != 0 || window > (std::size_t{1} << 30))
      throw invalid_argument_error("lgc network: the window (" + std::to_string(window) +
                                   ") must be a positive multiple of 2^depth = " + std::to_string(arch_.reduction()));
    using nn1d::index_type;
    const auto k = index_type(arch_.kernel), pad = index_type(arch_.kernel / 2);
    const T slope = T(arch_.leaky_slope);
    index_type prev = 1;
    for (auto c : arch_.encoder_channels) {
      encoder_.add(nn1d::conv1d<T>(prev, index_type(c), k, 2, pad));
      encoder_.add(nn1d::leaky_relu<T>(slope));
      prev = index_type(c);
    }
    encoder_.add(nn1d::conv1d<T>(prev, index_type(arch_.code_channels), 1, 1, 0));
    encoder_.initialize(seed, 0);
    for (std::size_t d = 0; d < decoders; ++d) {
      nn1d::sequential<T> body;
      prev = index_type(arch_.code_channels);
      for (std::size_t i = 0; i < arch_.decoder_channels.size(); ++i) {
        const auto c = index_type(arch_.decoder_channels[i]);
        if (i == 0)
          body.add(nn1d::conv_transpose1d<T>(prev, c, k, 1, pad, 0));
        else
          body.add(nn1d::conv_transpose1d<T>(prev, c, k, 2, pad, 1));
        body.add(nn1d::leaky_relu<T>(slope));
        prev = c;
      }
      body.initialize(seed, 1000 * (d + 1));
      nn1d::sequential<T> head;
      head.add(nn1d::conv1d<T>(prev + (form == lgc_form::parameter_server ? 1 : 0), 1, 1, 1, 0));
      head.initialize(seed, 1000 * (d + 1) + 500);
      bodies_.push_back(std::move(body));
      heads_.push_back(std::move(head));
    }
    if (encoder_.output_length(index_type(window)) != index_type(window / arch_.reduction()) ||
        bodies_[0].output_length(index_type(window / arch_.reduction())) != index_type(window))
      throw state_error("lgc network: internal shape error");  // guarded by the checks above
  }

  lgc_form form() const noexcept { return form_; }
  std::size_t decoders() const noexcept { return bodies_.size(); }
  std::size_t window() const noexcept { return window_; }
  const lgc_architecture& architecture() const noexcept { return arch_; }
  /// Code positions per window (window / 2^depth).
  std::size_t code_positions() const noexcept { return window_ / arch_.reduction(); }
  /// Code floats per window (code_channels * window / 2^depth).
  std::size_t code_length() const noexcept { return arch_.code_channels * code_positions(); }

  /// Encoder E_c (eqs. 3, 8, 17): x is 1 x (B*window), code is code_channels x (B*code_positions).
  void encode(const tensor& x, tensor& code, workspace& ws) const {
    check_windows(x, 1, index_type(window_), "encode");
    encoder_.infer(x, code, ws.encoder);
  }

  /// Decoder D_c^k (eqs. 4, 10, 12, 19). `innovation` (1 x (B*window)) is
  /// required in the parameter-server form and must be null in the ring form.
  void decode(std::size_t k, const tensor& code, const matrix* innovation, tensor& y, workspace& ws) const {
    if (k >= bodies_.size()) throw invalid_argument_error("lgc network: decoder " + std::to_string(k) + " does not exist");
    check_windows(code, index_type(arch_.code_channels), index_type(code_positions()), "decode");
    bodies_[k].infer(code, ws.body, ws.body_layers);
    if (form_ == lgc_form::parameter_server) {
      if (!innovation || innovation->rows() != 1 || innovation->cols() != ws.body.data.cols())
        throw size_mismatch_error("lgc network: innovation channel", std::size_t(ws.body.data.cols()),
                                  innovation ? std::size_t(innovation->size()) : 0);
      concat(ws.body, *innovation, ws.cat);
      heads_[k].infer(ws.cat, y, ws.head);
    } else {
      if (innovation) throw invalid_argument_error("lgc network: the ring form takes no innovation");
      heads_[k].infer(ws.body, y, ws.head);
    }
  }

  /// Ring loss (eqs. 9-11, per element): x holds `nodes` equal blocks of B
  /// windows (node k's vector g_k); the decoder reconstructs
  /// D(1/K sum_k E(g_k)) and is compared with 1/K sum_k g_k over the first
  /// `valid` columns of a block (the rest is padding). Zeroes the gradients,
  /// runs forward and backward, returns the loss.
  T ring_loss_backward(const tensor& x, std::size_t nodes, index_type valid) {
    if (form_ != lgc_form::ring) throw state_error("lgc network: ring loss on a parameter-server network");
    const index_type cols = block_cols(x, nodes, "ring_loss_backward");
    zero_grad();
    const tensor& code = encoder_.forward(x);
    const index_type ccols = code.data.cols() / index_type(nodes);
    tensor avg;
    avg.length = code.length;
    avg.data = code.data.leftCols(ccols);
    for (std::size_t k = 1; k < nodes; ++k) avg.data += code.data.middleCols(index_type(k) * ccols, ccols);
    avg.data /= T(nodes);
    matrix target = x.data.leftCols(cols);
    for (std::size_t k = 1; k < nodes; ++k) target += x.data.middleCols(index_type(k) * cols, cols);
    target /= T(nodes);
    const tensor& body = bodies_[0].forward(avg);
    const tensor& y = heads_[0].forward(body);
    tensor dy;
    dy.length = y.length;
    const T loss = nn1d::mse_loss<T>(y.data, target, &dy.data, valid_columns(valid, cols));
    tensor dbody, davg;
    heads_[0].backward(dy, &dbody);
    bodies_[0].backward(dbody, &davg);
    tensor dcode;
    dcode.length = code.length;
    dcode.data.resize(code.data.rows(), code.data.cols());
    for (std::size_t k = 0; k < nodes; ++k) dcode.data.middleCols(index_type(k) * ccols, ccols) = davg.data / T(nodes);
    encoder_.backward(dcode, nullptr);
    return loss;
  }

  /// Parameter-server loss (eq. 7 = lambda1 L_rec (eq. 6) + lambda2 L_sim
  /// (eq. 5), per element): x holds `nodes` blocks (g_k), h the matching
  /// innovation blocks (g_k^I); every decoder k reconstructs g_k from the code
  /// of node r and its own innovation (Fig. 6). Returns the loss.
  T ps_loss_backward(const tensor& x, const matrix& h, std::size_t nodes, std::size_t r, index_type valid, T lambda1,
                     T lambda2) {
    if (form_ != lgc_form::parameter_server) throw state_error("lgc network: parameter-server loss on a ring network");
    if (nodes != bodies_.size())
      throw size_mismatch_error("lgc network: nodes (one decoder each)", bodies_.size(), nodes);
    if (r >= nodes) throw invalid_argument_error("lgc network: common node out of range");
    const index_type cols = block_cols(x, nodes, "ps_loss_backward");
    if (h.rows() != 1 || h.cols() != x.data.cols())
      throw size_mismatch_error("lgc network: innovation", std::size_t(x.data.cols()), std::size_t(h.size()));
    zero_grad();
    const tensor& code = encoder_.forward(x);
    const index_type ccols = code.data.cols() / index_type(nodes);
    tensor dcode;
    dcode.length = code.length;
    const T sim = nn1d::similarity_loss<T>(code.data, index_type(nodes), &dcode.data);
    dcode.data *= lambda2;
    tensor common;
    common.length = code.length;
    common.data = code.data.middleCols(index_type(r) * ccols, ccols);
    T rec = T(0);
    for (std::size_t k = 0; k < nodes; ++k) {
      const tensor& body = bodies_[k].forward(common);
      tensor cat;
      concat(body, h.middleCols(index_type(k) * cols, cols), cat);
      const tensor& y = heads_[k].forward(cat);
      tensor dy;
      dy.length = y.length;
      rec += nn1d::mse_loss<T>(y.data, x.data.middleCols(index_type(k) * cols, cols), &dy.data,
                               valid_columns(valid, cols));
      dy.data *= lambda1;
      tensor dcat, dbody, dcommon;
      heads_[k].backward(dy, &dcat);
      dbody.length = dcat.length;
      dbody.data = dcat.data.topRows(dcat.data.rows() - 1);
      bodies_[k].backward(dbody, &dcommon);
      dcode.data.middleCols(index_type(r) * ccols, ccols) += dcommon.data;
    }
    encoder_.backward(dcode, nullptr);
    return lambda1 * rec + lambda2 * sim;
  }

  /// Every weight with its gradient: encoder, then each decoder (body, head).
  std::vector<nn1d::parameter_ref<T>> parameters() {
    auto out = encoder_.parameters();
    for (std::size_t d = 0; d < bodies_.size(); ++d) {
      for (auto& p : bodies_[d].parameters()) out.push_back(p);
      for (auto& p : heads_[d].parameters()) out.push_back(p);
    }
    return out;
  }
  std::size_t parameter_count() {
    std::size_t n = 0;
    for (auto& p : parameters()) n += p.value.size();
    return n;
  }
  void zero_grad() {
    encoder_.zero_grad();
    for (auto& b : bodies_) b.zero_grad();
    for (auto& h : heads_) h.zero_grad();
  }

  /// The weights as a message (wire container, codec autoencoder, state
  /// flag). Body: u8 kind 3, u16 lgc_weights_version, u8 form, u8
  /// encoder_only, varint window, varint decoders, then nn1d weight blocks
  /// (encoder, then body and head of each decoder unless encoder_only).
  /// The parameter-server form sends only the encoder to the common worker.
  std::vector<std::byte> save(bool encoder_only = false) {
    std::size_t count = encoder_.parameter_count();
    if (!encoder_only)
      for (std::size_t d = 0; d < bodies_.size(); ++d) count += bodies_[d].parameter_count() + heads_[d].parameter_count();
    return wire::serialize_state(wire::codec_id::autoencoder, count, [&](wire::writer& w) {
      w.put<std::uint8_t>(detail::lgc_kind_weights);
      w.put<std::uint16_t>(lgc_weights_version);
      w.put<std::uint8_t>(static_cast<std::uint8_t>(form_));
      w.put<std::uint8_t>(encoder_only ? 1 : 0);
      w.put_varint(window_);
      w.put_varint(bodies_.size());
      nn1d::write_weights(w, encoder_);
      if (!encoder_only)
        for (std::size_t d = 0; d < bodies_.size(); ++d) {
          nn1d::write_weights(w, bodies_[d]);
          nn1d::write_weights(w, heads_[d]);
        }
    });
  }

  /// Loads weights written by save() with the same `encoder_only`. Throws
  /// wire_error (broken bytes; unsupported_version for another weights
  /// version) or invalid_argument_error (another form, window, decoder count
  /// or layer shape). The network is unchanged on any error.
  void load(std::span<const std::byte> bytes, bool encoder_only = false) {
    wire::header h;
    wire::reader r = wire::parse_state(bytes, wire::codec_id::autoencoder, &h);
    if (r.get<std::uint8_t>() != detail::lgc_kind_weights)
      wire::reader::fail(wire::wire_errc::malformed_body, "lgc: not a weights message");
    const auto version = r.get<std::uint16_t>();
    if (version != lgc_weights_version)
      wire::reader::fail(wire::wire_errc::unsupported_version, "lgc weights version " + std::to_string(version) +
                                                                   ", this build reads " +
                                                                   std::to_string(lgc_weights_version));
    const auto form = r.get<std::uint8_t>();
    const auto enc_only = r.get<std::uint8_t>();
    if (enc_only > 1) wire::reader::fail(wire::wire_errc::malformed_body, "lgc weights: bad encoder-only flag");
    if (form != static_cast<std::uint8_t>(form_))
      throw invalid_argument_error("lgc weights: saved for another form (" + std::to_string(form) + ")");
    if ((enc_only == 1) != encoder_only)
      throw invalid_argument_error(encoder_only ? "lgc weights: expected encoder-only weights"
                                                : "lgc weights: expected the whole network, got the encoder only");
    const auto window = r.get_varint();
    const auto decoders = r.get_varint();
    if (window != window_)
      throw invalid_argument_error("lgc weights: window " + std::to_string(window) + ", this network uses " +
                                   std::to_string(window_));
    if (decoders != bodies_.size())
      throw invalid_argument_error("lgc weights: " + std::to_string(decoders) + " decoders, this network has " +
                                   std::to_string(bodies_.size()));
    basic_lgc_network copy = *this;
    nn1d::read_weights(r, copy.encoder_);
    if (!encoder_only)
      for (std::size_t d = 0; d < copy.bodies_.size(); ++d) {
        nn1d::read_weights(r, copy.bodies_[d]);
        nn1d::read_weights(r, copy.heads_[d]);
      }
    r.expect_end();
    std::size_t count = copy.encoder_.parameter_count();
    if (!encoder_only)
      for (std::size_t d = 0; d < copy.bodies_.size(); ++d)
        count += copy.bodies_[d].parameter_count() + copy.heads_[d].parameter_count();
    if (h.element_count != count)
      wire::reader::fail(wire::wire_errc::malformed_body, "lgc weights: header element count disagrees with the body");
    *this = std::move(copy);
  }

 private:
  void check_windows(const tensor& x, index_type channels, index_type length, const char* what) const {
    if (x.channels() != channels || x.length != length || x.data.cols() == 0 || x.data.cols() % length != 0)
      throw size_mismatch_error(std::string("lgc network ") + what + ": expected " + std::to_string(channels) +
                                    " channel(s) of windows of length " + std::to_string(length) + " (elements)",
                                std::size_t(channels * length), std::size_t(x.data.rows() * x.length));
  }
  index_type block_cols(const tensor& x, std::size_t nodes, const char* what) const {
    check_windows(x, 1, index_type(window_), what);
    if (nodes == 0 || x.batch() % index_type(nodes) != 0)
      throw invalid_argument_error(std::string("lgc network ") + what + ": windows are not " + std::to_string(nodes) +
                                   " equal blocks");
    return x.data.cols() / index_type(nodes);
  }
  static index_type valid_columns(index_type valid, index_type cols) { return valid < 0 ? cols : std::min(valid, cols); }
  template <class Derived>
  static void concat(const tensor& body, const Eigen::MatrixBase<Derived>& innovation, tensor& out) {
    out.length = body.length;
    out.data.resize(body.data.rows() + 1, body.data.cols());
    out.data.topRows(body.data.rows()) = body.data;
    out.data.bottomRows(1) = innovation;
  }

  lgc_form form_;
  std::size_t window_;
  lgc_architecture arch_;
  nn1d::sequential<T> encoder_;
  std::vector<nn1d::sequential<T>> bodies_, heads_;
};

/// The network in use (float).
using lgc_network = basic_lgc_network<float>;

// ===========================================================================
// Windows and scales

namespace detail {

/// Number of windows for n values: ceil(n / w).
inline std::size_t lgc_window_count(std::size_t n, std::size_t w) noexcept { return (n + w - 1) / w; }

/// Per-window scale: the RMS of the window's values (the last window's real
/// values only), 1 when that is zero or subnormal. Dividing by it makes every
/// window of unit RMS, so one learning rate suits layers and iterations whose
/// gradient magnitudes differ by orders of magnitude.
template <class T>
void lgc_window_scales(std::span<const T> values, std::size_t window, std::vector<float>& scales) {
  const std::size_t windows = lgc_window_count(values.size(), window);
  scales.resize(windows);
  for (std::size_t w = 0; w < windows; ++w) {
    const std::size_t b = w * window, e = std::min(values.size(), b + window);
    double sq = 0.0;
    for (std::size_t i = b; i < e; ++i) sq += double(values[i]) * double(values[i]);
    const double rms = std::sqrt(sq / double(e - b));
    scales[w] = (rms >= double(std::numeric_limits<float>::min()) && rms <= double(std::numeric_limits<float>::max()))
                    ? static_cast<float>(rms)
                    : 1.0f;
  }
}

/// Writes values / scale (per window) into columns [col, col + windows*window)
/// of a 1-row matrix, zero-padding the last window.
template <class T, class V>
void lgc_to_windows(std::span<const V> values, std::span<const float> scales, std::size_t window, nn1d::matrix<T>& m,
                    nn1d::index_type col) {
  const std::size_t windows = lgc_window_count(values.size(), window);
  for (std::size_t w = 0; w < windows; ++w) {
    const T inv = T(1) / T(scales[w]);
    const std::size_t b = w * window;
    for (std::size_t i = 0; i < window; ++i) {
      const std::size_t at = b + i;
      m(0, col + nn1d::index_type(at)) = at < values.size() ? T(values[at]) * inv : T(0);
    }
  }
}

/// raw DEFLATE (zlib, windowBits -15) of `raw`.
inline std::vector<std::byte> lgc_deflate(std::span<const std::byte> raw, int level) {
  z_stream s{};
  if (deflateInit2(&s, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw invalid_argument_error("lgc: zlib rejected DEFLATE level " + std::to_string(level));
  std::vector<std::byte> out(deflateBound(&s, static_cast<uLong>(raw.size())));
  s.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(raw.data()));
  s.avail_in = static_cast<uInt>(raw.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&s, Z_FINISH);
  const std::size_t produced = out.size() - s.avail_out;
  deflateEnd(&s);
  if (rc != Z_STREAM_END) throw state_error("lgc: zlib deflate did not finish");
  out.resize(produced);
  return out;
}

/// Inflates raw DEFLATE into exactly `raw_length` bytes; anything else
/// (a corrupt stream, more or less output, unused input) is malformed_body.
inline std::vector<std::byte> lgc_inflate(std::span<const std::byte> packed, std::size_t raw_length) {
  // One spare byte: a stream that would inflate to more than raw_length fills it.
  std::vector<std::byte> out(raw_length + 1);
  z_stream s{};
  if (inflateInit2(&s, -15) != Z_OK) throw state_error("lgc: zlib inflateInit failed");
  s.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(packed.data()));
  s.avail_in = static_cast<uInt>(packed.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  const int rc = inflate(&s, Z_FINISH);
  const bool ok = rc == Z_STREAM_END && s.total_out == raw_length && s.avail_in == 0;
  inflateEnd(&s);
  if (!ok)
    wire::reader::fail(wire::wire_errc::malformed_body,
                       "lgc index set: DEFLATE stream does not inflate to exactly the declared length");
  out.resize(raw_length);
  return out;
}

/// DEFLATE cannot expand data by more than this factor (1032:1) plus a constant.
inline constexpr std::uint64_t lgc_max_inflate_ratio = 1032;

}  // namespace detail

// ===========================================================================
// Payloads

/// The code of a vector of `value_count` values cut into windows (Section
/// IV, eqs. 8 and 17): for each window, code_per_window floats (the encoder's
/// code_channels x positions output, column-major), and optionally one scale
/// per window. Body layout (after the wire header; element_count = value_count):
///     u8      kind = 2
///     varint  window
///     varint  code_per_window
///     varint  scale count (0, or the number of windows ceil(value_count / window))
///     f32     scales[scale count]   finite, > 0
///     f32     codes[windows * code_per_window]   finite
struct lgc_code_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::autoencoder;

  std::uint64_t value_count = 0;
  std::uint32_t window = 0;
  std::uint32_t code_per_window = 0;
  std::vector<float> scales;
  std::vector<float> codes;

  std::size_t windows() const noexcept { return window ? detail::lgc_window_count(value_count, window) : 0; }
  std::uint64_t element_count() const noexcept { return value_count; }
  std::size_t body_size() const noexcept {
    return 1 + wire::varint_size(window) + wire::varint_size(code_per_window) + wire::varint_size(scales.size()) +
           4 * (scales.size() + codes.size());
  }
  /// Throws invalid_argument_error unless the fields agree.
  void validate() const {
    if (value_count == 0 || window == 0 || code_per_window == 0)
      throw invalid_argument_error("lgc_code_payload: empty value count, window or code");
    if (codes.size() != windows() * code_per_window)
      throw invalid_argument_error("lgc_code_payload: " + std::to_string(codes.size()) + " code floats for " +
                                   std::to_string(windows()) + " windows of " + std::to_string(code_per_window));
    if (!scales.empty() && scales.size() != windows())
      throw invalid_argument_error("lgc_code_payload: one scale per window required");
  }
  void write_body(wire::writer& w) const {
    validate();
    w.put<std::uint8_t>(detail::lgc_kind_code);
    w.put_varint(window);
    w.put_varint(code_per_window);
    w.put_varint(scales.size());
    w.put_array<float>(scales);
    w.put_array<float>(codes);
  }
  static lgc_code_payload read_body(wire::reader& r, const wire::header& h) {
    using wire::reader;
    using wire::wire_errc;
    if (r.get<std::uint8_t>() != detail::lgc_kind_code)
      reader::fail(wire_errc::malformed_body, "lgc: not a code payload (another LGC message kind)");
    lgc_code_payload p;
    p.value_count = h.element_count;
    const auto window = r.get_varint(), cpw = r.get_varint(), nscales = r.get_varint();
    if (p.value_count == 0) reader::fail(wire_errc::malformed_body, "lgc code: zero values");
    if (window == 0 || window > std::numeric_limits<std::uint32_t>::max())
      reader::fail(wire_errc::malformed_body, "lgc code: window out of range");
    if (cpw == 0 || cpw > std::numeric_limits<std::uint32_t>::max())
      reader::fail(wire_errc::malformed_body, "lgc code: code length out of range");
    p.window = static_cast<std::uint32_t>(window);
    p.code_per_window = static_cast<std::uint32_t>(cpw);
    const std::uint64_t windows = (p.value_count - 1) / window + 1;
    if (nscales != 0 && nscales != windows)
      reader::fail(wire_errc::malformed_body, "lgc code: scale count is neither 0 nor the window count");
    p.scales = r.get_vector<float>(nscales);
    for (float s : p.scales)
      if (!(s > 0.0f) || !std::isfinite(s)) reader::fail(wire_errc::malformed_body, "lgc code: scale not finite and > 0");
    if (cpw > r.remaining() / 4 / windows)
      reader::fail(wire_errc::truncated, "lgc code: " + std::to_string(windows) + " windows of " + std::to_string(cpw) +
                                             " floats do not fit the body");
    p.codes = r.get_vector<float>(windows * cpw);
    for (float c : p.codes)
      if (!std::isfinite(c)) reader::fail(wire_errc::malformed_body, "lgc code: non-finite code value");
    return p;
  }
};

/// The leader's top-k index set (ring form, Section V-A; also the common
/// worker's in the parameter-server form): per layer, strictly increasing
/// indices; plus the per-window scales of the leader's values (empty when
/// not used). Indices travel as DEFLATE (zlib, raw) of their LEB128 delta
/// varints (first index, then differences), layer after layer, as the paper
/// entropy-codes them [54]. Body layout (element_count = sum of layer lengths):
///     u8      kind = 1
///     varint  layers
///     per layer: varint length (<= 2^32-1), varint count (<= length)
///     varint  scale count; f32 scales[scale count]   finite, > 0
///     varint  raw length (bytes of the varint stream; count <= raw <= 5 count)
///     varint  packed length; packed bytes (raw DEFLATE)
/// Call pack() after filling layer_lengths/indices (it computes `packed`).
struct lgc_index_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::autoencoder;

  std::vector<std::uint64_t> layer_lengths;
  std::vector<std::vector<std::uint32_t>> indices;
  std::vector<float> scales;
  std::vector<std::byte> packed;  ///< filled by pack() or read_body
  std::uint64_t raw_length = 0;   ///< filled by pack() or read_body
  bool is_packed = false;

  /// Total number of indices.
  std::size_t count() const noexcept {
    std::size_t n = 0;
    for (const auto& v : indices) n += v.size();
    return n;
  }
  std::uint64_t element_count() const noexcept {
    return std::accumulate(layer_lengths.begin(), layer_lengths.end(), std::uint64_t{0});
  }

  /// Throws invalid_argument_error unless the index lists are well formed.
  void validate() const {
    if (indices.size() != layer_lengths.size())
      throw invalid_argument_error("lgc_index_payload: one index list per layer required");
    for (std::size_t l = 0; l < indices.size(); ++l) {
      if (layer_lengths[l] > sparse_max_elements)
        throw invalid_argument_error("lgc_index_payload: layer longer than 2^32-1");
      const auto& v = indices[l];
      for (std::size_t j = 0; j < v.size(); ++j)
        if (v[j] >= layer_lengths[l] || (j > 0 && v[j] <= v[j - 1]))
          throw invalid_argument_error("lgc_index_payload: layer " + std::to_string(l) +
                                       " indices not strictly increasing below the length");
    }
    for (float s : scales)
      if (!(s > 0.0f) || !std::isfinite(s)) throw invalid_argument_error("lgc_index_payload: scale not finite and > 0");
  }

  /// Computes the DEFLATE stream from `indices` (zlib level 0-9, -1 default).
  void pack(int level = 6) {
    validate();
    std::vector<std::byte> raw;
    raw.reserve(count() * 2);
    wire::writer w(raw);
    for (const auto& v : indices) {
      std::uint32_t prev = 0;
      for (std::size_t j = 0; j < v.size(); ++j) {
        w.put_varint(j == 0 ? v[0] : v[j] - prev);
        prev = v[j];
      }
    }
    raw_length = raw.size();
    packed = detail::lgc_deflate(raw, level);
    is_packed = true;
  }

  std::size_t body_size() const {
    if (!is_packed) throw state_error("lgc_index_payload: pack() was not called");
    std::size_t n = 1 + wire::varint_size(layer_lengths.size());
    for (std::size_t l = 0; l < layer_lengths.size(); ++l)
      n += wire::varint_size(layer_lengths[l]) + wire::varint_size(indices[l].size());
    return n + wire::varint_size(scales.size()) + 4 * scales.size() + wire::varint_size(raw_length) +
           wire::varint_size(packed.size()) + packed.size();
  }
  void write_body(wire::writer& w) const {
    if (!is_packed) throw state_error("lgc_index_payload: pack() was not called");
    w.put<std::uint8_t>(detail::lgc_kind_index);
    w.put_varint(layer_lengths.size());
    for (std::size_t l = 0; l < layer_lengths.size(); ++l) {
      w.put_varint(layer_lengths[l]);
      w.put_varint(indices[l].size());
    }
    w.put_varint(scales.size());
    w.put_array<float>(scales);
    w.put_varint(raw_length);
    w.put_varint(packed.size());
    w.put_bytes(packed);
  }
  static lgc_index_payload read_body(wire::reader& r, const wire::header& h) {
    using wire::reader;
    using wire::wire_errc;
    if (r.get<std::uint8_t>() != detail::lgc_kind_index)
      reader::fail(wire_errc::malformed_body, "lgc: not an index set (another LGC message kind)");
    lgc_index_payload p;
    const std::uint64_t layers = r.get_varint();
    if (layers > r.remaining() / 2) reader::fail(wire_errc::truncated, "lgc index set: layer count exceeds the body");
    std::vector<std::uint64_t> counts(static_cast<std::size_t>(layers));
    p.layer_lengths.resize(static_cast<std::size_t>(layers));
    std::uint64_t total_length = 0, total_count = 0;
    for (std::size_t l = 0; l < layers; ++l) {
      p.layer_lengths[l] = r.get_varint();
      counts[l] = r.get_varint();
      if (p.layer_lengths[l] > sparse_max_elements)
        reader::fail(wire_errc::malformed_body, "lgc index set: layer longer than 2^32-1");
      if (counts[l] > p.layer_lengths[l]) reader::fail(wire_errc::malformed_body, "lgc index set: more indices than elements");
      total_length += p.layer_lengths[l];  // <= 2^32 * 2^32 / 2: cannot wrap (layers <= body bytes)
      total_count += counts[l];
    }
    if (total_length != h.element_count)
      reader::fail(wire_errc::malformed_body, "lgc index set: layer lengths do not add up to the element count");
    const std::uint64_t nscales = r.get_varint();
    p.scales = r.get_vector<float>(nscales);
    for (float s : p.scales)
      if (!(s > 0.0f) || !std::isfinite(s)) reader::fail(wire_errc::malformed_body, "lgc index set: scale not finite and > 0");
    p.raw_length = r.get_varint();
    const std::uint64_t packed_length = r.get_varint();
    if (packed_length > r.remaining()) reader::fail(wire_errc::truncated, "lgc index set: packed stream exceeds the body");
    // Each delta is a 1-5 byte varint; DEFLATE expands at most 1032:1. So the
    // allocation below is bounded by what the message itself justifies.
    if (p.raw_length < total_count || p.raw_length > 5 * total_count)
      reader::fail(wire_errc::malformed_body, "lgc index set: raw length inconsistent with the index count");
    if (p.raw_length > detail::lgc_max_inflate_ratio * packed_length + 64)
      reader::fail(wire_errc::malformed_body, "lgc index set: raw length beyond what DEFLATE can encode");
    const auto packed = r.get_bytes(packed_length);
    p.packed.assign(packed.begin(), packed.end());
    const std::vector<std::byte> raw = detail::lgc_inflate(packed, static_cast<std::size_t>(p.raw_length));
    wire::reader vr(raw);
    p.indices.resize(p.layer_lengths.size());
    for (std::size_t l = 0; l < p.layer_lengths.size(); ++l) {
      auto& v = p.indices[l];
      v.resize(static_cast<std::size_t>(counts[l]));
      std::uint64_t prev = 0;
      for (std::size_t j = 0; j < v.size(); ++j) {
        std::uint64_t d = 0;
        try {
          d = vr.get_varint();
        } catch (const wire::wire_error&) {
          reader::fail(wire_errc::malformed_body, "lgc index set: truncated or invalid index stream");
        }
        if (j > 0 && d == 0) reader::fail(wire_errc::malformed_body, "lgc index set: indices not strictly increasing");
        const std::uint64_t base = j == 0 ? 0 : prev;
        if (d >= p.layer_lengths[l] - base) reader::fail(wire_errc::malformed_body, "lgc index set: index out of range");
        prev = base + d;
        v[j] = static_cast<std::uint32_t>(prev);
      }
    }
    if (vr.remaining() != 0) reader::fail(wire_errc::malformed_body, "lgc index set: unused bytes in the index stream");
    p.is_packed = true;
    return p;
  }
};

// ===========================================================================
// Training

/// Optimiser of the online training.
enum class lgc_optimizer : std::uint8_t {
  sgd = 0,   ///< the paper's choice (Section VI-A): SGD, lr 1e-3, batch 1
  adam = 1,  ///< Adam (Kingma & Ba); converges faster on small budgets
};

/// Online training of an LGC network (Section V-B): one step per training
/// iteration on that iteration's vectors (batch 1; the iteration's windows
/// form the minibatch). Steps are transactional: inputs are checked finite
/// before anything changes, and a step whose loss, gradients or updated
/// weights are not finite is rolled back (weights and optimiser state) and
/// reported with non_finite_error, so a diverging step never poisons the weights.
template <class T>
class basic_lgc_trainer {
 public:
  basic_lgc_trainer(basic_lgc_network<T> initial, lgc_optimizer opt = lgc_optimizer::sgd, T learning_rate = T(1e-3))
      : net_(std::move(initial)), kind_(opt), sgd_(learning_rate), adam_(learning_rate) {}

  const basic_lgc_network<T>& network() const noexcept { return net_; }
  basic_lgc_network<T>& network() noexcept { return net_; }
  std::uint64_t steps() const noexcept { return steps_; }
  std::uint64_t rejected_steps() const noexcept { return rejected_; }
  T last_loss() const noexcept { return last_loss_; }

  /// One ring step (eqs. 9-11) on K node vectors of equal length (>= one
  /// window), each divided per window by `scales` (one per window; empty =
  /// the RMS of the first vector's windows). Returns the loss.
  T step_ring(std::span<const std::span<const T>> nodes, std::span<const float> scales = {}) {
    const prepared p = prepare(nodes, scales, "step_ring");
    return transact([&] { return net_.ring_loss_backward(p.x, nodes.size(), p.valid); });
  }

  /// One parameter-server step (eq. 7) on K node vectors and their
  /// innovation vectors (same length, zeros off the innovation), with the
  /// code of node r fed to every decoder.
  T step_ps(std::span<const std::span<const T>> nodes, std::span<const std::span<const T>> innovations, std::size_t r,
            std::span<const float> scales = {}, T lambda1 = T(1), T lambda2 = T(0.5)) {
    const prepared p = prepare(nodes, scales, "step_ps");
    const auto& x = p.x;
    if (innovations.size() != nodes.size())
      throw size_mismatch_error("lgc trainer: innovation vectors", nodes.size(), innovations.size());
    const std::size_t w = net_.window();
    nn1d::matrix<T> h(1, x.data.cols());
    for (std::size_t k = 0; k < nodes.size(); ++k) {
      if (innovations[k].size() != nodes[k].size())
        throw size_mismatch_error("lgc trainer: innovation vector", nodes[k].size(), innovations[k].size());
      if (auto bad = first_non_finite(innovations[k]); bad != innovations[k].size())
        throw non_finite_error("lgc trainer: innovation", bad);
      detail::lgc_to_windows<T, T>(innovations[k], p.scales, w, h,
                                   nn1d::index_type(k) * (x.data.cols() / nn1d::index_type(nodes.size())));
    }
    return transact([&] { return net_.ps_loss_backward(p.x, h, nodes.size(), r, p.valid, lambda1, lambda2); });
  }

 private:
  struct prepared {
    nn1d::tensor<T> x;
    nn1d::index_type valid;
    std::vector<float> scales;
  };
  static std::size_t first_non_finite(std::span<const T> v) {
    for (std::size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(double(v[i]))) return i;
    return v.size();
  }
  prepared prepare(std::span<const std::span<const T>> nodes, std::span<const float> scales, const char* who) {
    if (nodes.empty()) throw invalid_argument_error(std::string("lgc trainer ") + who + ": no vectors");
    const std::size_t n = nodes[0].size(), w = net_.window();
    if (n < w)
      throw invalid_argument_error(std::string("lgc trainer ") + who + ": input of " + std::to_string(n) +
                                   " values is shorter than one window (" + std::to_string(w) + ")");
    for (const auto& v : nodes) {
      if (v.size() != n) throw size_mismatch_error(std::string("lgc trainer ") + who + ": vector", n, v.size());
      if (auto bad = first_non_finite(v); bad != v.size()) throw non_finite_error(std::string("lgc trainer ") + who, bad);
    }
    const std::size_t windows = detail::lgc_window_count(n, w);
    prepared p;
    if (scales.empty()) {
      detail::lgc_window_scales<T>(nodes[0], w, p.scales);
    } else {
      if (scales.size() != windows) throw size_mismatch_error(std::string("lgc trainer ") + who + ": scales", windows, scales.size());
      for (float s : scales)
        if (!(s > 0.0f) || !std::isfinite(s)) throw invalid_argument_error("lgc trainer: scales must be finite and > 0");
      p.scales.assign(scales.begin(), scales.end());
    }
    const auto block = nn1d::index_type(windows * w);
    p.x.resize(1, nn1d::index_type(w), nn1d::index_type(windows * nodes.size()));
    for (std::size_t k = 0; k < nodes.size(); ++k)
      detail::lgc_to_windows<T, T>(nodes[k], p.scales, w, p.x.data, nn1d::index_type(k) * block);
    p.valid = nn1d::index_type(n);
    return p;
  }

  template <class F>
  T transact(F&& loss_backward) {
    // Snapshot weights and optimiser, so any non-finite outcome can be undone.
    auto params = net_.parameters();
    std::vector<T> saved;
    for (const auto& p : params) saved.insert(saved.end(), p.value.begin(), p.value.end());
    const auto sgd_saved = sgd_;
    const auto adam_saved = adam_;
    const T loss = loss_backward();
    std::size_t bad = std::numeric_limits<std::size_t>::max();
    if (!std::isfinite(double(loss))) bad = 0;
    std::size_t at = 0;
    for (const auto& p : params) {
      if (bad != std::numeric_limits<std::size_t>::max()) break;
      for (std::size_t i = 0; i < p.grad.size(); ++i)
        if (!std::isfinite(double(p.grad[i]))) {
          bad = at + i;
          break;
        }
      at += p.grad.size();
    }
    if (bad == std::numeric_limits<std::size_t>::max()) {
      if (kind_ == lgc_optimizer::sgd)
        sgd_.step(params);
      else
        adam_.step(params);
      at = 0;
      for (const auto& p : params) {
        for (std::size_t i = 0; i < p.value.size(); ++i)
          if (!std::isfinite(double(p.value[i]))) {
            bad = at + i;
            break;
          }
        if (bad != std::numeric_limits<std::size_t>::max()) break;
        at += p.value.size();
      }
    }
    if (bad != std::numeric_limits<std::size_t>::max()) {
      at = 0;
      for (const auto& p : params) {
        std::copy(saved.begin() + std::ptrdiff_t(at), saved.begin() + std::ptrdiff_t(at + p.value.size()), p.value.begin());
        at += p.value.size();
      }
      sgd_ = sgd_saved;
      adam_ = adam_saved;
      ++rejected_;
      throw non_finite_error("lgc trainer: diverging step rolled back (loss, gradient or weight)", bad);
    }
    ++steps_;
    last_loss_ = loss;
    return loss;
  }

  basic_lgc_network<T> net_;
  lgc_optimizer kind_;
  nn1d::sgd<T> sgd_;
  nn1d::adam<T> adam_;
  std::uint64_t steps_ = 0, rejected_ = 0;
  T last_loss_ = T(0);
};

using lgc_trainer = basic_lgc_trainer<float>;

// ===========================================================================
// The codec over one concatenated top-k value vector

/// Codec of the LGC autoencoder over a vector of `value_count` values (the
/// concatenated top-k values of Section V-A): encode = per-window scale, E_c,
/// code payload; decode = D_c, times the scale. value_count must be at least
/// one window; the last window is zero-padded and its padding dropped at decode.
///
/// Not a LinearCodec: E_c is non-linear, so the sum of codes does not decode
/// to the sum of inputs. The ring form's linear step is the average of the
/// code floats (eq. 18), which lgc_ring_node does with ring_allreduce and
/// `decode` then turns into the aggregate (eq. 19). For the average of codes
/// to be meaningful every node must encode with the same scales (the
/// leader's, carried by lgc_index_payload): use encode(values, scales, out).
///
/// Non-finite policy: encode rejects NaN/Inf with non_finite_error naming
/// the first bad index; decode rejects a payload whose window or code length
/// differs from this codec's with size_mismatch_error.
template <ExecutionPolicy Policy = execution::seq>
class autoencoder_codec {
 public:
  using payload_type = lgc_code_payload;

  /// A codec over `value_count` values with the (shared, read-only) network `net`.
  autoencoder_codec(std::shared_ptr<const lgc_network> net, std::size_t value_count)
      : net_(std::move(net)), n_(value_count) {
    if (!net_) throw invalid_argument_error("autoencoder_codec: no network");
    if (n_ < net_->window())
      throw invalid_argument_error("autoencoder_codec: input of " + std::to_string(n_) +
                                   " values is shorter than one window (" + std::to_string(net_->window()) + ")");
  }

  std::size_t value_count() const noexcept { return n_; }
  std::size_t windows() const noexcept { return detail::lgc_window_count(n_, net_->window()); }
  /// Floats of a code: windows() * network().code_length().
  std::size_t code_length() const noexcept { return windows() * net_->code_length(); }
  const lgc_network& network() const noexcept { return *net_; }

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

  /// Decodes (ring decoder, or decoder 0) with the payload's scales.
  void decode(const payload_type& p, std::span<float> out) const {
    check_payload(p);
    if (p.scales.empty()) throw invalid_argument_error("autoencoder_codec::decode: the payload carries no scales");
    decode_impl(p.codes, p.scales, 0, {}, out);
  }
  /// Decodes code floats (e.g. the ring average of codes) with given scales.
  void decode(std::span<const float> codes, std::span<const float> scales, std::span<float> out) const {
    if (codes.size() != code_length()) throw size_mismatch_error("autoencoder_codec::decode: codes", code_length(), codes.size());
    check_scales(scales);
    decode_impl(codes, scales, 0, {}, out);
  }
  /// Parameter-server decoder D_c^k (eq. 12) with worker k's innovation
  /// vector (value_count values, zeros off the innovation) and the payload's scales.
  void decode(const payload_type& p, std::size_t decoder, std::span<const float> innovation, std::span<float> out) const {
    check_payload(p);
    if (p.scales.empty()) throw invalid_argument_error("autoencoder_codec::decode: the payload carries no scales");
    if (innovation.size() != n_) throw size_mismatch_error("autoencoder_codec::decode: innovation", n_, innovation.size());
    decode_impl(p.codes, p.scales, decoder, innovation, out);
  }

  std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }

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
                   std::span<const float> innovation, std::span<float> out) const {
    if (out.size() != n_) throw size_mismatch_error("autoencoder_codec::decode: output", n_, out.size());
    // Reuse the codec's scratch (no allocation or page faults once warm); a
    // concurrent decode on the same codec falls back to a local one.
    std::unique_lock<std::mutex> lock(scratch_->mutex, std::try_to_lock);
    decode_scratch local;
    decode_scratch& s = lock.owns_lock() ? scratch_->scratch : local;
    const std::size_t w = net_->window(), windows_ = windows();
    s.code.length = nn1d::index_type(net_->code_positions());
    s.code.data = Eigen::Map<const nn1d::matrix<float>>(codes.data(), nn1d::index_type(net_->architecture().code_channels),
                                                        nn1d::index_type(codes.size() / net_->architecture().code_channels));
    if (net_->form() == lgc_form::parameter_server) {
      s.h.resize(1, nn1d::index_type(windows_ * w));
      detail::lgc_to_windows<float, float>(innovation, scales, w, s.h, 0);
      net_->decode(decoder, s.code, &s.h, s.y, s.ws);
    } else {
      net_->decode(decoder, s.code, nullptr, s.y, s.ws);
    }
    for (std::size_t i = 0; i < n_; ++i) out[i] = s.y.data(0, nn1d::index_type(i)) * scales[i / w];
  }

  struct decode_scratch {
    nn1d::tensor<float> code, y;
    nn1d::matrix<float> h;
    typename lgc_network::workspace ws;
  };
  struct scratch_holder {
    std::mutex mutex;
    decode_scratch scratch;
  };

  std::shared_ptr<const lgc_network> net_;
  std::size_t n_;
  std::unique_ptr<scratch_holder> scratch_ = std::make_unique<scratch_holder>();
  std::vector<float> scales_;
  nn1d::tensor<float> x_, code_;
  typename lgc_network::workspace ws_;
};

// ===========================================================================
// Layout, options, schedule, accounting

/// The three phases of Section V-B.
enum class lgc_phase : std::uint8_t {
  full = 0,          ///< eq. 14: uncompressed gradients
  topk_training = 1, ///< eq. 15: top-k updates while the autoencoder trains online
  compressed = 2,    ///< eq. 16: reconstructed aggregates from the trained autoencoder
};

/// Lengths of the phases (Section VI-A: about 200 full iterations, then 300
/// training iterations for classification, 200 for segmentation).
struct lgc_schedule {
  std::uint64_t full_iterations = 200;
  std::uint64_t training_iterations = 300;

  lgc_phase phase(std::uint64_t step) const noexcept {
    if (step < full_iterations) return lgc_phase::full;
    if (step - full_iterations < training_iterations) return lgc_phase::topk_training;
    return lgc_phase::compressed;
  }
  /// The first compressed step (weights are distributed at its start).
  std::uint64_t first_compressed() const noexcept { return full_iterations + training_iterations; }
};

/// Options of the LGC protocol (both forms).
struct lgc_options {
  double alpha_percent = 0.1;        ///< top-k: alpha% of each compressed layer (Section V-A; 0.1%)
  double innovation_percent = 10.0;  ///< parameter server: top 10% of each layer's top-k values (Alg. 1)
  float momentum = 0.9f;             ///< DGC momentum correction in [0, 1); 0 = plain accumulation (Algs. 1-2)
  bool first_layer_dense = true;     ///< Section VI-A: the first layer is sent uncompressed
  bool last_layer_topk_only = true;  ///< Section VI-A: the last layer gets top-k without the autoencoder
  /// Beyond the paper (ring form): in the compressed phase each node decodes
  /// its own code and adds the reconstruction error back to its accumulator,
  /// as the unsent entries are kept, so the autoencoder's error is delayed
  /// rather than lost (error feedback). Costs one extra decode per step.
  bool feedback_reconstruction_error = false;
  std::size_t window = 1024;         ///< autoencoder window (multiple of 2^depth)
  lgc_architecture architecture{};
  lgc_schedule schedule{};
  lgc_optimizer optimizer = lgc_optimizer::sgd;
  float learning_rate = 1e-3f;       ///< Section VI-A: SGD, lr 0.001, batch 1
  float lambda1 = 1.0f, lambda2 = 0.5f;  ///< eq. 7 (Section VI-G: lambda2 = 0.5)
  int deflate_level = 6;             ///< zlib level of the index sets
  std::uint64_t seed = 0;            ///< weights, leader election, the training's common node
  int trainer_rank = 0;              ///< ring: the node that trains the autoencoder
  int common_worker = 0;             ///< parameter server: the worker that sends the common code
  int tag_base = 31000;              ///< tags tag_base .. tag_base + 19

  void validate() const {
    if (!(alpha_percent > 0.0 && alpha_percent <= 100.0))
      throw invalid_argument_error("lgc: alpha must be in (0, 100] percent");
    if (!(innovation_percent > 0.0 && innovation_percent <= 100.0))
      throw invalid_argument_error("lgc: innovation percent must be in (0, 100]");
    if (!(momentum >= 0.0f && momentum < 1.0f)) throw invalid_argument_error("lgc: momentum must be in [0, 1)");
    if (!(learning_rate > 0.0f) || !std::isfinite(learning_rate))
      throw invalid_argument_error("lgc: learning rate must be finite and > 0");
    if (!(lambda1 >= 0.0f && lambda2 >= 0.0f) || !std::isfinite(lambda1) || !std::isfinite(lambda2))
      throw invalid_argument_error("lgc: lambdas must be finite and >= 0");
    if (deflate_level < -1 || deflate_level > 9) throw invalid_argument_error("lgc: DEFLATE level must be in [-1, 9]");
    if (tag_base < 0 || tag_base > std::numeric_limits<int>::max() - 20) throw invalid_argument_error("lgc: bad tag base");
    architecture.validate();
    if (window == 0 || window % architecture.reduction() != 0)
      throw invalid_argument_error("lgc: the window must be a positive multiple of 2^depth = " +
                                   std::to_string(architecture.reduction()));
  }
};

/// The role of a layer (Section VI-A).
enum class lgc_layer_role : std::uint8_t {
  dense = 0,        ///< sent uncompressed (the first layer)
  autoencoder = 1,  ///< top-k values through the autoencoder
  topk = 2,         ///< top-k values sent as they are (the last layer)
};

/// Which layers are dense, autoencoded or top-k only, their top-k counts and
/// where each layer's values sit in the autoencoder's input vector.
struct lgc_layout {
  std::vector<std::size_t> sizes;
  std::vector<lgc_layer_role> roles;
  std::vector<std::size_t> k;             ///< top-k count per layer (0 for dense layers)
  std::vector<std::size_t> value_offset;  ///< autoencoder layers: offset of the layer's values in the mu-vector
  std::vector<std::size_t> space_offset;  ///< autoencoder layers: offset of the layer in the concatenated layer space
  std::size_t mu = 0;             ///< values through the autoencoder per iteration
  std::size_t space = 0;          ///< elements of the autoencoder layers (their concatenated index space)
  std::size_t dense_values = 0;   ///< elements of the dense layers
  std::size_t topk_values = 0;    ///< values of the top-k-only layers
  std::size_t total = 0;          ///< all elements

  lgc_layout() = default;
  /// Throws invalid_argument_error on an empty model, an empty layer, no
  /// autoencoder layer, or fewer autoencoder values than one window.
  lgc_layout(std::vector<std::size_t> layer_sizes, const lgc_options& o) : sizes(std::move(layer_sizes)) {
    o.validate();
    if (sizes.empty()) throw invalid_argument_error("lgc: no layers");
    const std::size_t n = sizes.size();
    roles.assign(n, lgc_layer_role::autoencoder);
    if (o.first_layer_dense) roles[0] = lgc_layer_role::dense;
    if (o.last_layer_topk_only && n > 1) roles[n - 1] = lgc_layer_role::topk;
    k.assign(n, 0);
    value_offset.assign(n, 0);
    space_offset.assign(n, 0);
    for (std::size_t l = 0; l < n; ++l) {
      if (sizes[l] == 0) throw invalid_argument_error("lgc: layer " + std::to_string(l) + " is empty");
      if (sizes[l] > sparse_max_elements) throw invalid_argument_error("lgc: layers are limited to 2^32-1 elements");
      total += sizes[l];
      switch (roles[l]) {
        case lgc_layer_role::dense: dense_values += sizes[l]; break;
        case lgc_layer_role::topk:
          k[l] = sparse_selection_count(sizes[l], o.alpha_percent);
          topk_values += k[l];
          break;
        case lgc_layer_role::autoencoder:
          k[l] = sparse_selection_count(sizes[l], o.alpha_percent);
          value_offset[l] = mu;
          space_offset[l] = space;
          mu += k[l];
          space += sizes[l];
          break;
      }
    }
    if (space > sparse_max_elements) throw invalid_argument_error("lgc: autoencoder layers above 2^32-1 elements in total");
    if (mu == 0) throw invalid_argument_error("lgc: no layer goes through the autoencoder");
    if (mu < o.window)
      throw invalid_argument_error("lgc: the autoencoder input (" + std::to_string(mu) +
                                   " top-k values per iteration) is shorter than one window (" +
                                   std::to_string(o.window) + "); use a smaller window");
  }
  std::size_t windows(std::size_t window) const noexcept { return detail::lgc_window_count(mu, window); }
};

/// Bytes of one node (or one run) for the compression-ratio accounting.
///  - original_bytes: the float32 gradient the node would send uncompressed (4 n per iteration);
///  - payload_bytes: wire::serialized_size of every payload the node produced,
///    each counted once: the paper's CR = size(original) / size(compressed)
///    (Section VI-A), indices and (once) weights included;
///  - wire_bytes: the bytes the node handed to its transport (ring
///    forwarding of the all-reduce, one copy per receiver of a broadcast).
struct lgc_traffic {
  std::uint64_t original_bytes = 0;
  std::uint64_t payload_bytes = 0;
  std::uint64_t wire_bytes = 0;

  double compression_ratio() const noexcept {
    return payload_bytes ? double(original_bytes) / double(payload_bytes) : 0.0;
  }
  lgc_traffic& operator+=(const lgc_traffic& o) noexcept {
    original_bytes += o.original_bytes;
    payload_bytes += o.payload_bytes;
    wire_bytes += o.wire_bytes;
    return *this;
  }
};

namespace detail {

/// A Transport that counts the bytes handed to isend (for lgc_traffic::wire_bytes).
template <Transport T>
class lgc_counting_transport {
 public:
  lgc_counting_transport(T& t, std::uint64_t& bytes) : t_(&t), bytes_(&bytes) {}
  int rank() const { return static_cast<int>(t_->rank()); }
  int size() const { return static_cast<int>(t_->size()); }
  auto isend(int peer, int tag, std::vector<std::byte>&& b) {
    *bytes_ += b.size();
    return t_->isend(peer, tag, std::move(b));
  }
  auto irecv(int peer, int tag) { return t_->irecv(peer, tag); }

 private:
  T* t_;
  std::uint64_t* bytes_;
};

/// Per-node accumulation with DGC momentum correction (Section V-A, [20]):
/// u <- m u + g, v <- v + u (m = 0: v <- v + g); the sent entries of v and u
/// are cleared (momentum-factor masking). Dense layers keep only u (their
/// contribution is u, or g when m = 0).
template <class Policy>
struct lgc_accumulator {
  std::vector<std::vector<float>> u, v;
  float m = 0.0f;

  void reset(const lgc_layout& layout, float momentum) {
    m = momentum;
    u.assign(layout.sizes.size(), {});
    v.assign(layout.sizes.size(), {});
    for (std::size_t l = 0; l < layout.sizes.size(); ++l) {
      if (m > 0.0f) u[l].assign(layout.sizes[l], 0.0f);
      if (layout.roles[l] != lgc_layer_role::dense) v[l].assign(layout.sizes[l], 0.0f);
    }
  }
  /// The contribution of a layer sent dense (phase 1, or a dense layer).
  void dense(std::size_t l, std::span<const float> g, std::vector<float>& out) {
    if (m > 0.0f) {
      axpby_update(Policy{}, std::span<float>(u[l]), g, m, 1.0f);
      out.insert(out.end(), u[l].begin(), u[l].end());
    } else {
      out.insert(out.end(), g.begin(), g.end());
    }
  }
  /// Folds g into the accumulation of a sparsified layer.
  void accumulate(std::size_t l, std::span<const float> g) {
    if (m > 0.0f) {
      axpby_update(Policy{}, std::span<float>(u[l]), g, m, 1.0f);
      axpby_update(Policy{}, std::span<float>(v[l]), std::span<const float>(u[l]), 1.0f, 1.0f);
    } else {
      axpby_update(Policy{}, std::span<float>(v[l]), g, 1.0f, 1.0f);
    }
  }
  /// Appends v[idx] to out and clears v and u there.
  void take(std::size_t l, std::span<const std::uint32_t> idx, std::vector<float>& out) {
    auto& vl = v[l];
    for (std::uint32_t i : idx) {
      out.push_back(vl[i]);
      vl[i] = 0.0f;
    }
    if (m > 0.0f)
      for (std::uint32_t i : idx) u[l][i] = 0.0f;
  }
};

/// Throws unless `layers` matches the layout and every value is finite.
template <class Policy>
void lgc_check_gradients(const lgc_layout& layout, std::span<const std::span<float>> layers, const char* who) {
  if (layers.size() != layout.sizes.size()) throw size_mismatch_error(std::string(who) + ": layers", layout.sizes.size(), layers.size());
  std::size_t offset = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].size() != layout.sizes[l])
      throw size_mismatch_error(std::string(who) + ": layer " + std::to_string(l), layout.sizes[l], layers[l].size());
    if (const auto bad = find_non_finite(Policy{}, std::span<const float>(layers[l])); bad != layers[l].size())
      throw non_finite_error(std::string(who) + " (index over all layers)", offset + bad);
    offset += layers[l].size();
  }
}

/// Per-layer innovation (Alg. 1): in each autoencoder layer, the
/// innovation_percent largest magnitudes among that layer's top-k values.
/// `positions` are increasing positions in the layout's concatenated space,
/// `values` their values; returns the selected (position, value) pairs.
template <class Policy>
void lgc_innovation(Policy, const lgc_layout& layout, double percent, std::span<const std::uint32_t> positions,
                    std::span<const float> values, std::vector<std::uint32_t>& out_pos, std::vector<float>& out_val,
                    execution::topk_workspace& ws) {
  out_pos.clear();
  out_val.clear();
  std::vector<std::uint32_t> sel;
  std::size_t j = 0;
  for (std::size_t l = 0; l < layout.sizes.size(); ++l) {
    if (layout.roles[l] != lgc_layer_role::autoencoder) continue;
    const std::size_t end_pos = layout.space_offset[l] + layout.sizes[l];
    std::size_t e = j;
    while (e < positions.size() && positions[e] < end_pos) ++e;
    const std::size_t cnt = e - j;
    if (cnt > 0) {
      const std::size_t kk = sparse_selection_count(cnt, percent);
      topk_exact(Policy{}, values.subspan(j, cnt), kk, sel, ws);
      for (std::uint32_t s : sel) {
        out_pos.push_back(positions[j + s]);
        out_val.push_back(values[j + s]);
      }
    }
    j = e;
  }
}

/// Values of a sparse (position, value) list at the increasing `slots`
/// positions (0 where absent), and the entries whose position is not a slot.
inline void lgc_map_to_slots(std::span<const std::uint32_t> slots, std::span<const std::uint32_t> pos,
                             std::span<const float> val, std::vector<float>& at_slots,
                             std::vector<std::uint32_t>* outside_pos, std::vector<float>* outside_val) {
  at_slots.assign(slots.size(), 0.0f);
  std::size_t s = 0;
  for (std::size_t j = 0; j < pos.size(); ++j) {
    while (s < slots.size() && slots[s] < pos[j]) ++s;
    if (s < slots.size() && slots[s] == pos[j]) {
      at_slots[s] = val[j];
    } else if (outside_pos) {
      outside_pos->push_back(pos[j]);
      outside_val->push_back(val[j]);
    }
  }
}

/// Receives one message and parses it as P (wire-validated).
template <class P, class T>
P lgc_receive(T& t, int peer, int tag) {
  message m = t.irecv(peer, tag).wait();
  return wire::parse<P>(m.bytes);
}

template <class P, class T>
std::size_t lgc_send(T& t, int peer, int tag, const P& p) {
  auto bytes = wire::serialize(p);
  const std::size_t n = bytes.size();
  t.isend(peer, tag, std::move(bytes)).wait();
  return n;
}

/// Wire bytes of a dense_payload of n floats (0 when nothing is sent).
inline std::size_t lgc_dense_bytes(std::size_t n) { return n ? wire::header_size + 4 * n : 0; }

}  // namespace detail

// ===========================================================================
// Ring form (Section IV-B, Algorithm 2)

/// One node of the LGC ring-all-reduce form (Section IV-B, Algorithm 2, Fig. 9).
///
/// Every call of `step(transport, layers)` is one training iteration on every
/// rank: `layers` holds this node's gradient, one span per layer, and is
/// overwritten with the aggregated update (the average over the nodes;
/// with momentum > 0 the momentum-corrected update, to be applied with plain
/// SGD, as in DGC).
///  - full phase (eq. 14): the dense gradients (or velocities) are averaged
///    with ring_allreduce.
///  - top-k phases (eqs. 15-16): the leader of the iteration, drawn by the
///    counter-based generator from (seed, step), selects the alpha% largest
///    |v| of each sparsified layer and sends the index set (DEFLATE) to every
///    other node; every node gathers its own v at those indices and clears
///    them. The dense layer, the top-k-only layer and the autoencoder part are
///    averaged in one ring_allreduce: the autoencoder part is the top-k values
///    in the training phase (while non-trainers also send their values to the
///    trainer, which takes one training step, eq. 11), and in the compressed
///    phase the codes E(g_k / s) (eq. 17), whose average (eq. 18) every node
///    decodes once (eq. 19) and multiplies by the leader's per-window scales s.
///  - At the first compressed step the trainer sends the trained weights to
///    every other node (counted once in payload_bytes, K-1 times in wire_bytes).
/// All ranks must call step() with the same step count and layer sizes; an
/// error on one rank (bad gradient, transport failure) leaves the others to
/// fail on their transport's timeout.
template <ExecutionPolicy Policy = execution::seq>
class lgc_ring_node {
 public:
  /// Node `rank` of `size` for a model with the given layer sizes.
  lgc_ring_node(int rank, int size, std::vector<std::size_t> layer_sizes, lgc_options options = {})
      : rank_(rank), size_(size), options_(std::move(options)), layout_(std::move(layer_sizes), options_),
        net_(std::make_shared<lgc_network>(lgc_form::ring, 1, options_.window, options_.architecture, options_.seed)) {
    if (size < 1 || rank < 0 || rank >= size) throw invalid_argument_error("lgc_ring_node: rank outside [0, size)");
    if (options_.trainer_rank < 0 || options_.trainer_rank >= size)
      throw invalid_argument_error("lgc_ring_node: trainer rank outside [0, size)");
    acc_.reset(layout_, options_.momentum);
    if (rank_ == options_.trainer_rank)
      trainer_.emplace(*net_, options_.optimizer, options_.learning_rate);
  }

  const lgc_layout& layout() const noexcept { return layout_; }
  const lgc_options& options() const noexcept { return options_; }
  /// Iterations done so far; the next step() is iteration steps().
  std::uint64_t steps() const noexcept { return step_; }
  /// Phase of the next step().
  lgc_phase phase() const noexcept { return options_.schedule.phase(step_); }
  /// The leader of iteration `step` (a pure function of the seed and the step).
  int leader(std::uint64_t step) const noexcept {
    return static_cast<int>(detail::counter_rng(options_.seed ^ 0x4C47435249ull).stream(step).below(0, std::uint64_t(size_)));
  }
  /// The weights in use (decoding); the trained ones from the first compressed step on.
  const lgc_network& network() const noexcept { return *net_; }
  /// The trainer (only on the trainer rank, until the weights are distributed).
  const lgc_trainer* trainer() const noexcept { return trainer_ ? &*trainer_ : nullptr; }
  std::uint64_t training_steps() const noexcept { return training_steps_; }
  std::uint64_t rejected_training_steps() const noexcept { return rejected_steps_; }
  float last_training_loss() const noexcept { return last_loss_; }
  /// Bytes of the last iteration and of all iterations so far.
  const lgc_traffic& last_traffic() const noexcept { return last_; }
  const lgc_traffic& total_traffic() const noexcept { return total_; }
  /// This node's own top-k vector g~_k of the last top-k iteration (the
  /// autoencoder's input before scaling) and the index set it was taken at.
  const std::vector<float>& last_values() const noexcept { return mid_; }
  const lgc_index_payload& last_index_set() const noexcept { return index_set_; }

  /// One iteration; see the class comment. Throws size_mismatch_error /
  /// non_finite_error before any state changes on a bad gradient.
  template <Transport T>
  void step(T& transport, std::span<const std::span<float>> layers) {
    detail::lgc_check_gradients<Policy>(layout_, layers, "lgc_ring_node::step");
    if (static_cast<int>(transport.size()) != size_ || static_cast<int>(transport.rank()) != rank_)
      throw invalid_argument_error("lgc_ring_node::step: transport rank/size differ from the node's");
    lgc_traffic traffic;
    traffic.original_bytes = 4 * layout_.total;
    detail::lgc_counting_transport<T> t(transport, traffic.wire_bytes);
    const lgc_phase ph = options_.schedule.phase(step_);
    const int tag = options_.tag_base;
    ring_options ro;
    ro.average = true;
    ro.tag_base = tag + 4;

    if (ph == lgc_phase::full) {
      buffer_.clear();
      for (std::size_t l = 0; l < layers.size(); ++l) acc_.dense(l, layers[l], buffer_);
      traffic.payload_bytes += detail::lgc_dense_bytes(buffer_.size());
      if (size_ > 1) ring_allreduce(Policy{}, t, std::span<float>(buffer_), ro);
      std::size_t at = 0;
      for (auto& layer : layers) {
        std::copy(buffer_.begin() + std::ptrdiff_t(at), buffer_.begin() + std::ptrdiff_t(at + layer.size()), layer.begin());
        at += layer.size();
      }
      finish(traffic);
      return;
    }

    if (ph == lgc_phase::compressed && step_ == options_.schedule.first_compressed()) distribute_weights(t, traffic);

    // Accumulate, agree on the index set, gather this node's values.
    buffer_.clear();
    for (std::size_t l = 0; l < layers.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense)
        acc_.dense(l, layers[l], buffer_);
      else
        acc_.accumulate(l, layers[l]);
    }
    const int lead = leader(step_);
    if (lead == rank_) {
      index_set_ = select_indices();
      auto bytes = wire::serialize(index_set_);
      traffic.payload_bytes += bytes.size();
      for (int r = 0; r < size_; ++r)
        if (r != rank_) t.isend(r, tag, std::vector<std::byte>(bytes)).wait();
    } else {
      index_set_ = detail::lgc_receive<lgc_index_payload>(t, lead, tag);
      check_index_set(index_set_);
    }
    mid_.clear();
    std::vector<float> last_vals;
    for (std::size_t l = 0, j = 0; l < layers.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense) continue;
      acc_.take(l, index_set_.indices[j++], layout_.roles[l] == lgc_layer_role::topk ? last_vals : mid_);
    }
    const std::size_t dense_n = buffer_.size();
    buffer_.insert(buffer_.end(), last_vals.begin(), last_vals.end());
    traffic.payload_bytes += detail::lgc_dense_bytes(dense_n) + detail::lgc_dense_bytes(last_vals.size());
    const std::span<const float> scales(index_set_.scales);

    if (ph == lgc_phase::topk_training) {
      buffer_.insert(buffer_.end(), mid_.begin(), mid_.end());
      traffic.payload_bytes += detail::lgc_dense_bytes(mid_.size());
      // The trainer needs every node's vector (eq. 11).
      std::vector<std::vector<float>> gathered;
      if (rank_ == options_.trainer_rank) {
        gathered.resize(std::size_t(size_));
        gathered[std::size_t(rank_)] = mid_;
        for (int r = 0; r < size_; ++r) {
          if (r == rank_) continue;
          auto p = detail::lgc_receive<dense_payload>(t, r, tag + 2);
          if (p.values.size() != layout_.mu)
            throw size_mismatch_error("lgc_ring_node: training vector from rank " + std::to_string(r), layout_.mu,
                                      p.values.size());
          gathered[std::size_t(r)] = std::move(p.values);
        }
      } else {
        detail::lgc_send(t, options_.trainer_rank, tag + 2, dense_payload{mid_});
      }
      if (size_ > 1) ring_allreduce(Policy{}, t, std::span<float>(buffer_), ro);
      write_sparse_output(layers, std::span<const float>(buffer_).subspan(dense_n + last_vals.size()));
      if (trainer_) {
        std::vector<std::span<const float>> views(gathered.begin(), gathered.end());
        train(views, scales);
      }
    } else {
      if (!codec_) codec_.emplace(net_, layout_.mu);
      auto& codec = *codec_;
      lgc_code_payload code;
      codec.encode(mid_, scales, code, false);
      traffic.payload_bytes += wire::serialized_size(code);
      if (options_.feedback_reconstruction_error) feed_back_error(codec, code, scales);
      buffer_.insert(buffer_.end(), code.codes.begin(), code.codes.end());
      if (size_ > 1) ring_allreduce(Policy{}, t, std::span<float>(buffer_), ro);
      decoded_.resize(layout_.mu);
      codec.decode(std::span<const float>(buffer_).subspan(dense_n + last_vals.size()), scales, decoded_);
      write_sparse_output(layers, decoded_);
    }
    // Dense and top-k-only layers.
    std::size_t at = 0, lv = dense_n, j = 0;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense) {
        std::copy(buffer_.begin() + std::ptrdiff_t(at), buffer_.begin() + std::ptrdiff_t(at + layers[l].size()), layers[l].begin());
        at += layers[l].size();
        continue;
      }
      const auto& idx = index_set_.indices[j++];
      if (layout_.roles[l] == lgc_layer_role::topk) {
        std::fill(layers[l].begin(), layers[l].end(), 0.0f);
        for (std::uint32_t i : idx) layers[l][i] = buffer_[lv++];
      }
    }
    finish(traffic);
  }

  /// The unsent accumulation of layer l (empty for a dense layer): what
  /// this node still owes the other nodes.
  std::span<const float> residual(std::size_t l) const {
    if (l >= acc_.v.size()) throw invalid_argument_error("lgc_ring_node: residual: no layer " + std::to_string(l));
    return acc_.v[l];
  }

 private:
  void finish(const lgc_traffic& t) {
    last_ = t;
    total_ += t;
    ++step_;
  }

  /// Error feedback of the compressed phase: v += mid - decode(own code) at
  /// the entries this node just sent through the autoencoder.
  template <class Codec>
  void feed_back_error(const Codec& codec, const lgc_code_payload& own, std::span<const float> scales) {
    own_decoded_.resize(layout_.mu);
    codec.decode(std::span<const float>(own.codes), scales, own_decoded_);
    std::size_t at = 0;
    for_each_autoencoder_layer([&](std::size_t l, const std::vector<std::uint32_t>& idx) {
      auto& vl = acc_.v[l];
      for (std::uint32_t i : idx) {
        vl[i] += mid_[at] - own_decoded_[at];
        ++at;
      }
    });
  }

  /// Calls fn(l, indices) for each autoencoder layer of this iteration's
  /// index set, in the order its values take in mid_ and in the codes.
  template <class Fn>
  void for_each_autoencoder_layer(Fn&& fn) const {
    for (std::size_t l = 0, j = 0; l < layout_.roles.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense) continue;
      const auto& idx = index_set_.indices[j++];
      if (layout_.roles[l] == lgc_layer_role::autoencoder) fn(l, idx);
    }
  }

  lgc_index_payload select_indices() {
    lgc_index_payload p;
    std::vector<float> mid_vals;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense) continue;
      p.layer_lengths.push_back(layout_.sizes[l]);
      std::vector<std::uint32_t> idx;
      topk_exact(Policy{}, std::span<const float>(acc_.v[l]), layout_.k[l], idx, ws_);
      if (layout_.roles[l] == lgc_layer_role::autoencoder)
        for (std::uint32_t i : idx) mid_vals.push_back(acc_.v[l][i]);
      p.indices.push_back(std::move(idx));
    }
    detail::lgc_window_scales<float>(mid_vals, options_.window, p.scales);
    p.pack(options_.deflate_level);
    return p;
  }

  void check_index_set(const lgc_index_payload& p) const {
    std::size_t j = 0;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense) continue;
      if (j >= p.layer_lengths.size() || p.layer_lengths[j] != layout_.sizes[l] || p.indices[j].size() != layout_.k[l])
        throw size_mismatch_error("lgc_ring_node: index set of layer " + std::to_string(l), layout_.k[l],
                                  j < p.indices.size() ? p.indices[j].size() : 0);
      ++j;
    }
    if (j != p.layer_lengths.size()) throw size_mismatch_error("lgc_ring_node: index set layers", j, p.layer_lengths.size());
    if (p.scales.size() != layout_.windows(options_.window))
      throw size_mismatch_error("lgc_ring_node: index set scales", layout_.windows(options_.window), p.scales.size());
  }

  /// Scatters the autoencoder values (mu, in index-set order) into their layers.
  void write_sparse_output(std::span<const std::span<float>> layers, std::span<const float> values) {
    std::size_t v = 0;
    for_each_autoencoder_layer([&](std::size_t l, const std::vector<std::uint32_t>& idx) {
      std::fill(layers[l].begin(), layers[l].end(), 0.0f);
      for (std::uint32_t i : idx) layers[l][i] = values[v++];
    });
  }

  void train(std::span<const std::span<const float>> vectors, std::span<const float> scales) {
    try {
      last_loss_ = trainer_->step_ring(vectors, scales);
      ++training_steps_;
    } catch (const non_finite_error&) {
      ++rejected_steps_;  // rolled back: the weights stay finite
    }
  }

  template <class T>
  void distribute_weights(T& t, lgc_traffic& traffic) {
    const int tag = options_.tag_base + 3;
    if (rank_ == options_.trainer_rank) {
      auto bytes = trainer_->network().save();
      traffic.payload_bytes += bytes.size();
      for (int r = 0; r < size_; ++r)
        if (r != rank_) t.isend(r, tag, std::vector<std::byte>(bytes)).wait();
      auto trained = std::make_shared<lgc_network>(trainer_->network());
      net_ = std::move(trained);
      trainer_.reset();
      codec_.reset();
    } else {
      message m = t.irecv(options_.trainer_rank, tag).wait();
      auto fresh = std::make_shared<lgc_network>(*net_);
      fresh->load(m.bytes);
      net_ = std::move(fresh);
      codec_.reset();
    }
  }

  int rank_, size_;
  lgc_options options_;
  lgc_layout layout_;
  std::shared_ptr<lgc_network> net_;
  std::optional<autoencoder_codec<Policy>> codec_;  // over net_ (reset when the weights change)
  std::optional<lgc_trainer> trainer_;
  detail::lgc_accumulator<Policy> acc_;
  execution::topk_workspace ws_;
  std::uint64_t step_ = 0, training_steps_ = 0, rejected_steps_ = 0;
  float last_loss_ = 0.0f;
  lgc_traffic last_, total_;
  std::vector<float> buffer_, mid_, decoded_, own_decoded_;
  lgc_index_payload index_set_;
};

// ===========================================================================
// Parameter-server form (Section IV-A, Algorithm 1)

/// Tags (offsets from options.tag_base) of the parameter-server messages.
namespace detail {
inline constexpr int lgc_ps_up_dense = 10, lgc_ps_up_last = 11, lgc_ps_up_sparse = 12, lgc_ps_up_index = 13,
                     lgc_ps_up_code = 14, lgc_ps_down = 15, lgc_ps_weights = 16;
}

/// One worker of the LGC parameter-server form (Section IV-A, Algorithm 1,
/// Fig. 8). Workers are ranks 0..K-1, the server rank K.
///
/// Each step(transport, layers) sends this worker's contribution and
/// overwrites `layers` with the server's aggregate (sent back dense; the
/// downlink is not compressed, as in the paper):
///  - full phase: all layers dense (eq. 14);
///  - training phase: the dense layer, and the own top-k of every sparsified
///    layer as sparse COO payloads (eq. 15);
///  - compressed phase: the dense layer, the top-k-only layer as COO, and the
///    innovation (the innovation_percent largest of each layer's top-k values,
///    Alg. 1) as COO; the common worker also sends its index set (DEFLATE) and
///    the code E_c(g~_r / s) with its scales (eq. 3). Every worker clears its
///    own top-k from its accumulation (Alg. 1).
/// The common worker receives the trained encoder once, at the first
/// compressed step.
template <ExecutionPolicy Policy = execution::seq>
class lgc_ps_worker {
 public:
  lgc_ps_worker(int worker, int workers, std::vector<std::size_t> layer_sizes, lgc_options options = {})
      : worker_(worker), workers_(workers), options_(std::move(options)), layout_(std::move(layer_sizes), options_) {
    if (workers < 1 || worker < 0 || worker >= workers) throw invalid_argument_error("lgc_ps_worker: worker outside [0, K)");
    if (options_.common_worker < 0 || options_.common_worker >= workers)
      throw invalid_argument_error("lgc_ps_worker: common worker outside [0, K)");
    acc_.reset(layout_, options_.momentum);
    if (is_common())
      net_ = std::make_shared<lgc_network>(lgc_form::parameter_server, std::size_t(workers), options_.window,
                                           options_.architecture, options_.seed);
  }

  bool is_common() const noexcept { return worker_ == options_.common_worker; }
  const lgc_layout& layout() const noexcept { return layout_; }
  std::uint64_t steps() const noexcept { return step_; }
  lgc_phase phase() const noexcept { return options_.schedule.phase(step_); }
  const lgc_traffic& last_traffic() const noexcept { return last_; }
  const lgc_traffic& total_traffic() const noexcept { return total_; }
  /// This worker's own top-k value vector of the last top-k iteration.
  const std::vector<float>& last_values() const noexcept { return mid_; }

  template <Transport T>
  void step(T& transport, std::span<const std::span<float>> layers) {
    detail::lgc_check_gradients<Policy>(layout_, layers, "lgc_ps_worker::step");
    if (static_cast<int>(transport.size()) != workers_ + 1 || static_cast<int>(transport.rank()) != worker_)
      throw invalid_argument_error("lgc_ps_worker::step: the transport must have K + 1 ranks, this worker at its index");
    lgc_traffic traffic;
    traffic.original_bytes = 4 * layout_.total;
    detail::lgc_counting_transport<T> t(transport, traffic.wire_bytes);
    const int server = workers_, tag = options_.tag_base;
    const lgc_phase ph = options_.schedule.phase(step_);

    if (ph == lgc_phase::compressed && step_ == options_.schedule.first_compressed() && is_common()) {
      message m = t.irecv(server, tag + detail::lgc_ps_weights).wait();
      auto fresh = std::make_shared<lgc_network>(*net_);
      fresh->load(m.bytes, true);
      net_ = std::move(fresh);
    }

    std::vector<float> dense;
    if (ph == lgc_phase::full) {
      for (std::size_t l = 0; l < layers.size(); ++l) acc_.dense(l, layers[l], dense);
      traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_dense, dense_payload{dense});
    } else {
      sparse_coo_payload sparse, last;
      sparse.length = layout_.space;
      std::vector<std::vector<std::uint32_t>> own;
      mid_.clear();
      std::vector<std::uint32_t> idx;
      for (std::size_t l = 0; l < layers.size(); ++l) {
        if (layout_.roles[l] == lgc_layer_role::dense) {
          acc_.dense(l, layers[l], dense);
          continue;
        }
        acc_.accumulate(l, layers[l]);
        topk_exact(Policy{}, std::span<const float>(acc_.v[l]), layout_.k[l], idx, ws_);
        if (layout_.roles[l] == lgc_layer_role::topk) {
          last.length = layout_.sizes[l];
          last.indices = idx;
          acc_.take(l, idx, last.values);
        } else {
          for (std::uint32_t i : idx) sparse.indices.push_back(static_cast<std::uint32_t>(layout_.space_offset[l] + i));
          acc_.take(l, idx, mid_);
          own.push_back(idx);
        }
      }
      sparse.values = mid_;
      if (!dense.empty())
        traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_dense, dense_payload{dense});
      if (layout_.topk_values > 0) traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_last, last);
      if (ph == lgc_phase::topk_training) {
        traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_sparse, sparse);
      } else {
        sparse_coo_payload innovation;
        innovation.length = layout_.space;
        detail::lgc_innovation(Policy{}, layout_, options_.innovation_percent, sparse.indices, mid_, innovation.indices,
                               innovation.values, ws_);
        traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_sparse, innovation);
        if (is_common()) {
          lgc_index_payload index_set;
          std::size_t j = 0;
          for (std::size_t l = 0; l < layout_.sizes.size(); ++l)
            if (layout_.roles[l] == lgc_layer_role::autoencoder) {
              index_set.layer_lengths.push_back(layout_.sizes[l]);
              index_set.indices.push_back(own[j++]);
            }
          index_set.pack(options_.deflate_level);
          traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_index, index_set);
          autoencoder_codec<Policy> codec(net_, layout_.mu);
          lgc_code_payload code;
          codec.encode(mid_, code);  // scales: the per-window RMS of g~_r, carried in the payload
          traffic.payload_bytes += detail::lgc_send(t, server, tag + detail::lgc_ps_up_code, code);
        }
      }
    }
    // The aggregate comes back dense.
    auto agg = detail::lgc_receive<dense_payload>(t, server, tag + detail::lgc_ps_down);
    if (agg.values.size() != layout_.total)
      throw size_mismatch_error("lgc_ps_worker: aggregate from the server", layout_.total, agg.values.size());
    std::size_t at = 0;
    for (auto& layer : layers) {
      std::copy(agg.values.begin() + std::ptrdiff_t(at), agg.values.begin() + std::ptrdiff_t(at + layer.size()), layer.begin());
      at += layer.size();
    }
    last_ = traffic;
    total_ += traffic;
    ++step_;
  }

 private:
  int worker_, workers_;
  lgc_options options_;
  lgc_layout layout_;
  std::shared_ptr<lgc_network> net_;
  detail::lgc_accumulator<Policy> acc_;
  execution::topk_workspace ws_;
  std::uint64_t step_ = 0;
  lgc_traffic last_, total_;
  std::vector<float> mid_;
};

/// The server of the LGC parameter-server form (rank K of K + 1). It owns the
/// encoder and the K decoders D_c^k, trains them during the training phase
/// (eq. 7, the code of a worker drawn per iteration from (seed, step) fed to
/// every decoder, Fig. 6), sends the encoder to the common worker once, and
/// in the compressed phase reconstructs every worker's vector as
/// D_c^k(code, innovation_k) (eq. 12) on the common worker's index set and
/// averages (eq. 13). Innovation entries outside the common index set are
/// added exactly (value / K). Its step() must be called once per iteration,
/// alongside the workers'.
template <ExecutionPolicy Policy = execution::seq>
class lgc_ps_server {
 public:
  lgc_ps_server(int workers, std::vector<std::size_t> layer_sizes, lgc_options options = {})
      : workers_(workers), options_(std::move(options)), layout_(std::move(layer_sizes), options_) {
    if (workers < 1) throw invalid_argument_error("lgc_ps_server: at least one worker");
    if (options_.common_worker < 0 || options_.common_worker >= workers)
      throw invalid_argument_error("lgc_ps_server: common worker outside [0, K)");
    net_ = std::make_shared<lgc_network>(lgc_form::parameter_server, std::size_t(workers), options_.window,
                                         options_.architecture, options_.seed);
    trainer_.emplace(*net_, options_.optimizer, options_.learning_rate);
  }

  const lgc_layout& layout() const noexcept { return layout_; }
  std::uint64_t steps() const noexcept { return step_; }
  lgc_phase phase() const noexcept { return options_.schedule.phase(step_); }
  const lgc_network& network() const noexcept { return *net_; }
  std::uint64_t training_steps() const noexcept { return training_steps_; }
  std::uint64_t rejected_training_steps() const noexcept { return rejected_steps_; }
  float last_training_loss() const noexcept { return last_loss_; }
  /// Bytes the server sent: the weights once (payload_bytes), the dense downlink (wire_bytes).
  const lgc_traffic& total_traffic() const noexcept { return total_; }
  /// The worker whose code feeds every decoder in training iteration `step`.
  std::size_t training_common(std::uint64_t step) const noexcept {
    return std::size_t(detail::counter_rng(options_.seed ^ 0x4C47435053ull).stream(step).below(0, std::uint64_t(workers_)));
  }
  /// The aggregate of the last iteration (all layers concatenated).
  const std::vector<float>& last_aggregate() const noexcept { return aggregate_; }

  template <Transport T>
  void step(T& transport) {
    if (static_cast<int>(transport.size()) != workers_ + 1 || static_cast<int>(transport.rank()) != workers_)
      throw invalid_argument_error("lgc_ps_server::step: the server is rank K of K + 1");
    lgc_traffic traffic;
    detail::lgc_counting_transport<T> t(transport, traffic.wire_bytes);
    const int tag = options_.tag_base;
    const lgc_phase ph = options_.schedule.phase(step_);
    const float inv = 1.0f / float(workers_);
    aggregate_.assign(layout_.total, 0.0f);

    if (ph == lgc_phase::compressed && step_ == options_.schedule.first_compressed()) {
      net_ = std::make_shared<lgc_network>(trainer_->network());
      trainer_.reset();
      auto bytes = net_->save(true);
      traffic.payload_bytes += bytes.size();
      t.isend(options_.common_worker, tag + detail::lgc_ps_weights, std::move(bytes)).wait();
    }

    if (ph == lgc_phase::full) {
      for (int k = 0; k < workers_; ++k) {
        auto p = detail::lgc_receive<dense_payload>(t, k, tag + detail::lgc_ps_up_dense);
        if (p.values.size() != layout_.total) throw size_mismatch_error("lgc_ps_server: dense push", layout_.total, p.values.size());
        add_into(Policy{}, std::span<float>(aggregate_), std::span<const float>(p.values));
      }
    } else {
      std::vector<sparse_coo_payload> sparse(static_cast<std::size_t>(workers_));
      for (int k = 0; k < workers_; ++k) {
        if (layout_.dense_values > 0) {
          auto p = detail::lgc_receive<dense_payload>(t, k, tag + detail::lgc_ps_up_dense);
          if (p.values.size() != layout_.dense_values)
            throw size_mismatch_error("lgc_ps_server: dense layers", layout_.dense_values, p.values.size());
          add_dense(p.values);
        }
        if (layout_.topk_values > 0) {
          auto p = detail::lgc_receive<sparse_coo_payload>(t, k, tag + detail::lgc_ps_up_last);
          const std::size_t l = layout_.sizes.size() - 1;
          if (p.length != layout_.sizes[l] || p.indices.size() > layout_.k[l])
            throw size_mismatch_error("lgc_ps_server: top-k layer", layout_.k[l], p.indices.size());
          const std::size_t off = layout_.total - layout_.sizes[l];
          for (std::size_t j = 0; j < p.indices.size(); ++j) aggregate_[off + p.indices[j]] += p.values[j];
        }
        sparse[std::size_t(k)] = detail::lgc_receive<sparse_coo_payload>(t, k, tag + detail::lgc_ps_up_sparse);
        if (sparse[std::size_t(k)].length != layout_.space)
          throw size_mismatch_error("lgc_ps_server: sparse push", layout_.space, std::size_t(sparse[std::size_t(k)].length));
      }
      if (ph == lgc_phase::topk_training) {
        if (!training_ready(sparse)) throw size_mismatch_error("lgc_ps_server: top-k count", layout_.mu, 0);
        for (const auto& p : sparse)
          for (std::size_t j = 0; j < p.indices.size(); ++j) add_space(p.indices[j], p.values[j]);
        train(sparse);
      } else {
        reconstruct(t, sparse);
      }
    }
    for (float& v : aggregate_) v *= inv;
    const dense_payload down{aggregate_};
    for (int k = 0; k < workers_; ++k) detail::lgc_send(t, k, tag + detail::lgc_ps_down, down);
    total_ += traffic;
    ++step_;
  }

 private:
  /// Position in the aggregate of a position of the autoencoder layers' concatenated space.
  std::size_t space_to_total(std::uint32_t pos) const {
    // Layers are few; a linear scan keeps this simple.
    std::size_t off = 0;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::autoencoder && pos >= layout_.space_offset[l] &&
          pos < layout_.space_offset[l] + layout_.sizes[l])
        return off + (pos - layout_.space_offset[l]);
      off += layout_.sizes[l];
    }
    throw size_mismatch_error("lgc_ps_server: position outside the autoencoder layers", layout_.space, pos);
  }
  void add_space(std::uint32_t pos, float v) { aggregate_[space_to_total(pos)] += v; }
  void add_dense(const std::vector<float>& values) {
    std::size_t off = 0, at = 0;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] == lgc_layer_role::dense)
        for (std::size_t i = 0; i < layout_.sizes[l]; ++i) aggregate_[off + i] += values[at++];
      off += layout_.sizes[l];
    }
  }
  bool training_ready(const std::vector<sparse_coo_payload>& sparse) const {
    for (const auto& p : sparse)
      if (p.indices.size() != layout_.mu) return false;
    return true;
  }

  void train(const std::vector<sparse_coo_payload>& sparse) {
    const std::size_t r = training_common(step_);
    const auto& slots = sparse[r].indices;
    std::vector<float> scales;
    detail::lgc_window_scales<float>(sparse[r].values, options_.window, scales);
    std::vector<std::vector<float>> x(sparse.size()), h(sparse.size());
    std::vector<std::uint32_t> ipos;
    std::vector<float> ival;
    for (std::size_t k = 0; k < sparse.size(); ++k) {
      detail::lgc_map_to_slots(slots, sparse[k].indices, sparse[k].values, x[k], nullptr, nullptr);
      detail::lgc_innovation(Policy{}, layout_, options_.innovation_percent, sparse[k].indices, sparse[k].values, ipos,
                             ival, ws_);
      detail::lgc_map_to_slots(slots, ipos, ival, h[k], nullptr, nullptr);
    }
    std::vector<std::span<const float>> xs(x.begin(), x.end()), hs(h.begin(), h.end());
    try {
      last_loss_ = trainer_->step_ps(xs, hs, r, scales, options_.lambda1, options_.lambda2);
      ++training_steps_;
    } catch (const non_finite_error&) {
      ++rejected_steps_;
    }
  }

  template <class T>
  void reconstruct(T& t, const std::vector<sparse_coo_payload>& innovations) {
    const int tag = options_.tag_base;
    const int c = options_.common_worker;
    auto index_set = detail::lgc_receive<lgc_index_payload>(t, c, tag + detail::lgc_ps_up_index);
    auto code = detail::lgc_receive<lgc_code_payload>(t, c, tag + detail::lgc_ps_up_code);
    // The common worker's index set, as positions of the concatenated space.
    std::vector<std::uint32_t> slots;
    std::size_t j = 0;
    for (std::size_t l = 0; l < layout_.sizes.size(); ++l) {
      if (layout_.roles[l] != lgc_layer_role::autoencoder) continue;
      if (j >= index_set.indices.size() || index_set.layer_lengths[j] != layout_.sizes[l] ||
          index_set.indices[j].size() != layout_.k[l])
        throw size_mismatch_error("lgc_ps_server: common index set, layer " + std::to_string(l), layout_.k[l],
                                  j < index_set.indices.size() ? index_set.indices[j].size() : 0);
      for (std::uint32_t i : index_set.indices[j]) slots.push_back(static_cast<std::uint32_t>(layout_.space_offset[l] + i));
      ++j;
    }
    if (j != index_set.indices.size()) throw size_mismatch_error("lgc_ps_server: common index set layers", j, index_set.indices.size());
    autoencoder_codec<Policy> codec(net_, layout_.mu);  // checks the code's window and length in decode
    std::vector<float> h, rec(layout_.mu), sum(layout_.mu, 0.0f);
    std::vector<std::uint32_t> out_pos;
    std::vector<float> out_val;
    for (int k = 0; k < workers_; ++k) {
      const auto& inn = innovations[std::size_t(k)];
      out_pos.clear();
      out_val.clear();
      detail::lgc_map_to_slots(slots, inn.indices, inn.values, h, &out_pos, &out_val);
      codec.decode(code, std::size_t(k), h, rec);
      add_into(Policy{}, std::span<float>(sum), std::span<const float>(rec));
      for (std::size_t e = 0; e < out_pos.size(); ++e) add_space(out_pos[e], out_val[e]);
    }
    for (std::size_t s = 0; s < slots.size(); ++s) add_space(slots[s], sum[s]);
  }

  int workers_;
  lgc_options options_;
  lgc_layout layout_;
  std::shared_ptr<lgc_network> net_;
  std::optional<lgc_trainer> trainer_;
  execution::topk_workspace ws_;
  std::uint64_t step_ = 0, training_steps_ = 0, rejected_steps_ = 0;
  float last_loss_ = 0.0f;
  lgc_traffic total_;
  std::vector<float> aggregate_;
};

}  // namespace gradcomp
