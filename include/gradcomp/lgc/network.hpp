#pragma once
/// \file lgc/network.hpp
/// The LGC autoencoder network `basic_lgc_network<T>` (seed 004, Section IV):
/// encoder E_c, decoder(s) D_c^k, the ring loss (eqs. 9-11) and the
/// parameter-server loss (eqs. 5-7), and the weights message.

// nn1d.hpp first: its diagnostic pragma must be active when Eigen is first included.
#include <gradcomp/nn1d.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/lgc/architecture.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

GRADCOMP_ABI_NAMESPACE_BEGIN
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

  /// The form the network was built for.
  [[nodiscard]] lgc_form form() const noexcept { return form_; }
  /// Number of decoders (1 in the ring form, K in the parameter-server form).
  [[nodiscard]] std::size_t decoders() const noexcept { return bodies_.size(); }
  /// Values per window.
  [[nodiscard]] std::size_t window() const noexcept { return window_; }
  /// The hyper-parameters the network was built with.
  [[nodiscard]] const lgc_architecture& architecture() const noexcept { return arch_; }
  /// Code positions per window (window / 2^depth).
  [[nodiscard]] std::size_t code_positions() const noexcept { return window_ / arch_.reduction(); }
  /// Code floats per window (code_channels * window / 2^depth).
  [[nodiscard]] std::size_t code_length() const noexcept { return arch_.code_channels * code_positions(); }
  /// The layers themselves, read-only: the encoder E_c, and decoder k's body
  /// (before the innovation channel is appended) and head. For device copies
  /// (system/cuda/lgc.hpp); training goes through the losses below.
  [[nodiscard]] const nn1d::sequential<T>& encoder() const noexcept { return encoder_; }
  [[nodiscard]] const nn1d::sequential<T>& decoder_body(std::size_t k) const { return bodies_[checked_decoder(k)]; }
  [[nodiscard]] const nn1d::sequential<T>& decoder_head(std::size_t k) const { return heads_[checked_decoder(k)]; }

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
  [[nodiscard]] std::vector<nn1d::parameter_ref<T>> parameters() {
    auto out = encoder_.parameters();
    for (std::size_t d = 0; d < bodies_.size(); ++d) {
      for (auto& p : bodies_[d].parameters()) out.push_back(p);
      for (auto& p : heads_[d].parameters()) out.push_back(p);
    }
    return out;
  }
  /// Number of weights (encoder and every decoder).
  [[nodiscard]] std::size_t parameter_count() {
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
  [[nodiscard]] std::vector<std::byte> save(bool encoder_only = false) {
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
  std::size_t checked_decoder(std::size_t k) const {
    if (k >= bodies_.size()) throw invalid_argument_error("lgc network: decoder " + std::to_string(k) + " does not exist");
    return k;
  }
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

GRADCOMP_ABI_NAMESPACE_END
/// The network in use (float).
using lgc_network = basic_lgc_network<float>;

}  // namespace gradcomp
