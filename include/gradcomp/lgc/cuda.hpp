#pragma once
/// \file lgc/cuda.hpp
/// The LGC autoencoder's inference on a CUDA GPU (seed 004, Section IV; the
/// paper runs its network on GPUs): `lgc_device_network` holds device copies
/// of an `lgc_network`'s encoder E_c and decoders D_c^k (nn1d/cuda.hpp:
/// im2col + cuBLAS GEMM per convolution) and runs encode (eqs. 3, 8, 17) and
/// decode (eqs. 4, 10, 12, 19) on device buffers. nvcc only; link
/// CUDA::cublas and CUDA::cudart.
///
/// Training stays on the CPU (lgc/trainer.hpp); after each retraining,
/// `upload` refreshes the device weights. The codec and its wire format are
/// unchanged: the device path computes the same codes within float rounding
/// (cuBLAS sums in its own order), checked by tests/cuda against
/// lgc_network::encode / decode.

#if !defined(__CUDACC__)
#error "gradcomp/lgc/cuda.hpp needs nvcc (CUDA)"
#endif

#include <cstddef>
#include <string>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/lgc/network.hpp>
#include <gradcomp/nn1d/cuda.hpp>

namespace gradcomp {
GRADCOMP_ABI_NAMESPACE_BEGIN



/// Device copy of an lgc_network for encode and decode (see the file comment).
class lgc_device_network {
 public:
  /// Scratch reused across calls (device buffers).
  struct workspace {
    nn1d::cuda::device_sequential::workspace encoder, body_layers, head;
    nn1d::cuda::device_tensor body, cat;
  };

  explicit lgc_device_network(const lgc_network& net) { upload(net); }

  /// Copies every weight again (after retraining); a network of another form,
  /// window or architecture throws layout_error.
  void upload(const lgc_network& net) {
    if (!encoder_.layers()) {
      form_ = net.form();
      window_ = net.window();
      arch_ = net.architecture();
      bodies_.resize(net.decoders());
      heads_.resize(net.decoders());
    } else if (net.form() != form_ || net.window() != window_ || !(net.architecture() == arch_) ||
               net.decoders() != bodies_.size()) {
      throw layout_error("lgc_device_network::upload: the network's form, window or architecture differs");
    }
    encoder_.upload(net.encoder());
    for (std::size_t k = 0; k < bodies_.size(); ++k) {
      bodies_[k].upload(net.decoder_body(k));
      heads_[k].upload(net.decoder_head(k));
    }
  }

  [[nodiscard]] std::size_t window() const noexcept { return window_; }
  [[nodiscard]] std::size_t decoders() const noexcept { return bodies_.size(); }
  /// Code floats per window (code_channels * window / 2^depth).
  [[nodiscard]] std::size_t code_length() const noexcept {
    return arch_.code_channels * (window_ / arch_.reduction());
  }

  /// E_c on the device: x holds `windows` windows (1 x (windows * window)),
  /// code becomes code_channels x (windows * code positions).
  void encode(const float* x, std::size_t windows, nn1d::cuda::device_tensor& code, workspace& ws) const {
    if (windows == 0) throw invalid_argument_error("lgc_device_network::encode: no windows");
    encoder_.infer(x, 1, nn1d::index_type(window_), nn1d::index_type(windows), code, ws.encoder);
  }

  /// D_c^k on the device. `innovation` (1 x (windows * window), device) is
  /// required in the parameter-server form and must be null in the ring form.
  void decode(std::size_t k, const nn1d::cuda::device_tensor& code, const float* innovation,
              nn1d::cuda::device_tensor& y, workspace& ws) const {
    if (k >= bodies_.size())
      throw invalid_argument_error("lgc_device_network: decoder " + std::to_string(k) + " does not exist");
    const auto positions = nn1d::index_type(window_ / arch_.reduction());
    if (code.channels != nn1d::index_type(arch_.code_channels) || code.length != positions || code.batch <= 0)
      throw size_mismatch_error("lgc_device_network::decode: code floats per window", code_length(),
                                std::size_t(code.channels * code.length));
    bodies_[k].infer(code.ptr(), code.channels, code.length, code.batch, ws.body, ws.body_layers);
    if (form_ == lgc_form::parameter_server) {
      if (!innovation) throw invalid_argument_error("lgc_device_network::decode: the parameter-server form needs the innovation");
      ws.cat.resize(ws.body.channels + 1, ws.body.length, ws.body.batch);
      const auto n = ws.body.length * ws.body.batch;
      execution::cuda_detail::append_channel_kernel<<<execution::cuda_detail::blocks_for(ws.cat.size()), 256>>>(
          ws.body.ptr(), innovation, ws.cat.ptr(), ws.body.channels, n);
      execution::cuda_detail::check_launch("innovation channel kernel");
      heads_[k].infer(ws.cat.ptr(), ws.cat.channels, ws.cat.length, ws.cat.batch, y, ws.head);
    } else {
      if (innovation) throw invalid_argument_error("lgc_device_network::decode: the ring form takes no innovation");
      heads_[k].infer(ws.body.ptr(), ws.body.channels, ws.body.length, ws.body.batch, y, ws.head);
    }
  }

 private:
  lgc_form form_ = lgc_form::ring;
  std::size_t window_ = 0;
  lgc_architecture arch_;
  nn1d::cuda::device_sequential encoder_;
  std::vector<nn1d::cuda::device_sequential> bodies_, heads_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
