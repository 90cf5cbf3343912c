#pragma once
/// \file nn1d/cuda.hpp
/// nn1d inference on a CUDA GPU: the CUDA backend of nn1d's two
/// convolutions (nn1d/conv.hpp; kernels in system/cuda/nn1d.hpp), for the
/// LGC autoencoder's encode and decode (lgc/cuda.hpp). nvcc only; link CUDA::cublas and CUDA::cudart.
///
/// `device_sequential` is a device copy of an `nn1d::sequential<float>`: the
/// same layers, the same fusion of a convolution with the leaky ReLU after
/// it, the same layouts (a tensor is channels x (batch * length),
/// column-major, as nn1d::tensor). Per layer:
///   conv1d            im2col kernel, then cublasSgemm y = W col (W: C_out x K C_in);
///   conv_transpose1d  cublasSgemm col = W x (W: K C_out x C_in), then a gather
///                     kernel (each output sums its taps; no atomics) that adds
///                     the taps in the order of the CPU's col2im_add;
///   bias + leaky ReLU one elementwise kernel.
/// The products run in cuBLAS's own order, so results agree with the CPU
/// within float rounding, not bit for bit (tests/cuda compares them).
///
/// Training stays on the CPU: after the trainer updates the weights,
/// `upload` copies them again (the shapes must not change).

#if !defined(__CUDACC__)
#error "gradcomp/nn1d/cuda.hpp needs nvcc (CUDA)"
#endif

#include <cstddef>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <thrust/device_vector.h>

#include <gradcomp/abi.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/nn1d/sequential.hpp>
#include <gradcomp/system/cuda/nn1d.hpp>

namespace gradcomp::nn1d::cuda {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace kern = gradcomp::execution::cuda_detail;

/// A batch of 1-D signals on the device, laid out as nn1d::tensor.
struct device_tensor {
  ::thrust::device_vector<float> data;
  index_type channels = 0, length = 0, batch = 0;

  /// Resizes (the allocation grows only); contents unspecified.
  void resize(index_type c, index_type l, index_type b) {
    channels = c;
    length = l;
    batch = b;
    const auto n = std::size_t(c * l * b);
    if (data.size() < n) data.resize(n);
  }
  [[nodiscard]] std::size_t size() const noexcept { return std::size_t(channels * length * batch); }
  [[nodiscard]] float* ptr() { return ::thrust::raw_pointer_cast(data.data()); }
  [[nodiscard]] const float* ptr() const { return ::thrust::raw_pointer_cast(data.data()); }

  /// Copies a host tensor in.
  void upload(const tensor<float>& x) {
    resize(x.channels(), x.length, x.batch());
    kern::check_cuda(
        cudaMemcpy(ptr(), x.data.data(), size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy (upload)");
  }
  /// Copies into a host tensor.
  void download(tensor<float>& y) const {
    y.resize(channels, length, batch);
    kern::check_cuda(
        cudaMemcpy(y.data.data(), ptr(), size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy (download)");
  }
};



/// Device copy of an nn1d::sequential<float> for inference (see the file comment).
class device_sequential {
 public:
  /// Scratch of infer: one activation and one column buffer per layer, reused across calls.
  struct workspace {
    std::vector<device_tensor> acts;
    std::vector<::thrust::device_vector<float>> cols;
  };

  device_sequential() = default;
  explicit device_sequential(const sequential<float>& net) { upload(net); }

  /// Builds the device plan and copies every weight and bias. Called again
  /// after training, it refreshes the weights; a network of other shapes
  /// throws layout_error.
  void upload(const sequential<float>& net) {
    std::vector<layer_plan> plan;
    const auto& layers = net.layers();
    for (std::size_t i = 0; i < layers.size(); ++i) {
      layer_plan p;
      const leaky_relu<float>* act =
          (i + 1 < layers.size() && !std::holds_alternative<leaky_relu<float>>(layers[i]))
              ? std::get_if<leaky_relu<float>>(&layers[i + 1])
              : nullptr;
      std::visit(
          [&](const auto& l) {
            using L = std::decay_t<decltype(l)>;
            if constexpr (std::is_same_v<L, leaky_relu<float>>) {
              p.what = layer_plan::kind::leaky;
              p.slope = l.slope();
            } else {
              p.what = std::is_same_v<L, conv1d<float>> ? layer_plan::kind::conv : layer_plan::kind::conv_transpose;
              p.in = l.in_channels();
              p.out = l.out_channels();
              p.kernel = l.kernel();
              p.stride = l.stride();
              p.padding = l.padding();
              if constexpr (std::is_same_v<L, conv_transpose1d<float>>) p.output_padding = l.output_padding();
              p.weight.assign(l.weight.data(), l.weight.data() + l.weight.size());
              p.bias.assign(l.bias.data(), l.bias.data() + l.bias.size());
              p.fused_leaky = act != nullptr;
              p.slope = act ? act->slope() : 0.0f;
            }
          },
          layers[i]);
      if (p.fused_leaky) ++i;
      plan.push_back(std::move(p));
    }
    if (!plan_.empty() && !same_shapes(plan))
      throw layout_error("nn1d device_sequential::upload: the network's shapes differ from the uploaded one");
    plan_ = std::move(plan);
  }

  [[nodiscard]] std::size_t layers() const noexcept { return plan_.size(); }

  /// Output length for an input of length l (throws as the CPU layers do).
  [[nodiscard]] index_type output_length(index_type l) const {
    for (const auto& p : plan_) l = p.output_length(l);
    return l;
  }

  /// y = net(x) on the device; x: `channels` x (batch * length), column-major.
  void infer(const float* x, index_type channels, index_type length, index_type batch, device_tensor& y,
             workspace& ws) const {
    if (plan_.empty()) throw state_error("nn1d device_sequential::infer: no layers (upload a network first)");
    if (length <= 0 || batch <= 0) throw invalid_argument_error("nn1d device_sequential::infer: empty input");
    ws.acts.resize(plan_.size());
    ws.cols.resize(plan_.size());
    const float* in = x;
    index_type c = channels, l = length;
    for (std::size_t i = 0; i < plan_.size(); ++i) {
      device_tensor& out = (i + 1 == plan_.size()) ? y : ws.acts[i];
      plan_[i].run(in, c, l, batch, out, ws.cols[i]);
      in = out.ptr();
      c = out.channels;
      l = out.length;
    }
    kern::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (nn1d infer)");
  }

  /// Host convenience: copies x in and y out (the device path's own cost is in infer above).
  void infer(const tensor<float>& x, tensor<float>& y, workspace& ws, device_tensor& dx, device_tensor& dy) const {
    dx.upload(x);
    infer(dx.ptr(), dx.channels, dx.length, dx.batch, dy, ws);
    dy.download(y);
  }

 private:
  struct layer_plan {
    enum class kind { conv, conv_transpose, leaky } what = kind::leaky;
    index_type in = 0, out = 0, kernel = 1, stride = 1, padding = 0, output_padding = 0;
    bool fused_leaky = false;
    float slope = 0.0f;
    ::thrust::device_vector<float> weight, bias;

    index_type output_length(index_type l) const {
      if (what == kind::leaky) return l;
      const index_type lo = what == kind::conv ? (l + 2 * padding - kernel) / stride + 1
                                               : (l - 1) * stride - 2 * padding + kernel + output_padding;
      if (l <= 0 || lo < 1 || (what == kind::conv && l + 2 * padding < kernel))
        throw invalid_argument_error("nn1d device_sequential: input of length " + std::to_string(l) +
                                     " gives no output");
      return lo;
    }

    void run(const float* x, index_type c, index_type l, index_type b, device_tensor& y,
             ::thrust::device_vector<float>& col) const {
      const index_type lo = output_length(l);
      if (what == kind::leaky) {
        y.resize(c, lo, b);
        const std::size_t n = y.size();
        kern::leaky_kernel<<<kern::blocks_for(n), 256>>>(x, y.ptr(), index_type(n), slope);
        kern::check_launch("leaky ReLU kernel");
        return;
      }
      if (c != in)
        throw size_mismatch_error("nn1d device_sequential: input channels", std::size_t(in), std::size_t(c));
      const float* w = ::thrust::raw_pointer_cast(weight.data());
      y.resize(out, lo, b);
      if (what == kind::conv) {
        const bool pointwise = kernel == 1 && stride == 1 && padding == 0;
        const float* src = x;
        if (!pointwise) {
          const std::size_t n = std::size_t(kernel * in * lo * b);
          if (col.size() < n) col.resize(n);
          kern::im2col_kernel<<<kern::blocks_for(n), 256>>>(x, in, l, lo, b, kernel, stride, padding,
                                                                ::thrust::raw_pointer_cast(col.data()));
          kern::check_launch("im2col kernel");
          src = ::thrust::raw_pointer_cast(col.data());
        }
        kern::gemm(w, src, y.ptr(), out, lo * b, kernel * in, "cublasSgemm (conv1d)");
      } else {
        const std::size_t n = std::size_t(kernel * out * l * b);
        if (col.size() < n) col.resize(n);
        float* pc = ::thrust::raw_pointer_cast(col.data());
        kern::gemm(w, x, pc, kernel * out, l * b, in, "cublasSgemm (conv_transpose1d)");
        const std::size_t m = y.size();
        kern::col2im_gather_kernel<<<kern::blocks_for(m), 256>>>(pc, out, lo, l, b, kernel, stride, padding,
                                                                     y.ptr());
        kern::check_launch("col2im kernel");
      }
      const std::size_t m = y.size();
      kern::bias_activate_kernel<<<kern::blocks_for(m), 256>>>(y.ptr(), ::thrust::raw_pointer_cast(bias.data()),
                                                                   out, index_type(m), fused_leaky, slope);
      kern::check_launch("bias + leaky ReLU kernel");
    }
  };

  bool same_shapes(const std::vector<layer_plan>& other) const {
    if (other.size() != plan_.size()) return false;
    for (std::size_t i = 0; i < other.size(); ++i) {
      const auto &a = plan_[i], &b = other[i];
      if (a.what != b.what || a.in != b.in || a.out != b.out || a.kernel != b.kernel || a.stride != b.stride ||
          a.padding != b.padding || a.output_padding != b.output_padding || a.fused_leaky != b.fused_leaky)
        return false;
    }
    return true;
  }

  std::vector<layer_plan> plan_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::nn1d::cuda
