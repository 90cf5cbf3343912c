#pragma once
/// \file nn1d.hpp
/// A small, dependency-light 1-D convolutional network on Eigen: the layers,
/// losses and optimisers the LGC autoencoder (autoencoder.hpp, seed 004
/// Sections IV-V) is built from, with forward and backward passes.
///
///     nn1d::sequential<float> net;
///     net.add(nn1d::conv1d<float>(1, 8, 3, 2, 1));    // in, out, kernel, stride, padding
///     net.add(nn1d::leaky_relu<float>(0.01f));
///     net.initialize(seed);                            // counter-based, deterministic
///     const auto& y = net.forward(x);                  // training pass, keeps what backward needs
///     net.zero_grad();
///     net.backward(dy, nullptr);                       // accumulates weight gradients
///     nn1d::sgd<float> opt(1e-3f);
///     opt.step(net.parameters());
///
/// Data layout. A batch of B signals of C channels and length L is one
/// column-major C x (B*L) matrix (`tensor`): sample b occupies columns
/// [b*L, (b+1)*L), so every position is a contiguous column of C values and
/// the whole batch goes through one GEMM per layer.
///
/// Convolutions are im2col + Eigen GEMM. The im2col matrix of a layer with
/// kernel K over C input channels has K*C rows; row k*C + c of column
/// (b, t) holds x(c, b*L + t*S + k - P) (zero outside the signal), so each
/// kernel tap copies one contiguous column. A conv1d weight is therefore the
/// C_out x (K*C_in) matrix whose column k*C_in + c is tap k of input channel
/// c; a conv_transpose1d weight is the (K*C_out) x C_in matrix, the adjoint
/// operator (PyTorch's ConvTranspose1d, weight [C_in, C_out, K], is the same
/// map up to this reordering).
///
/// Shapes (PyTorch's formulas):
///     conv1d            L_out = floor((L_in + 2P - K) / S) + 1
///     conv_transpose1d  L_out = (L_in - 1) S - 2P + K + output_padding
///
/// Everything is templated on the scalar (float for use, double for the
/// finite-difference checks). GEMMs are single-threaded Eigen (no OpenMP), so
/// results are deterministic for a given build and machine whatever the
/// caller's threads do.
///
/// Weights are saved in the wire container (wire::serialize_state with
/// codec_id::autoencoder, element type float32); `load_weights` rejects a
/// buffer of another format version (wire_error unsupported_version) or a
/// network of another shape (invalid_argument_error naming the first layer
/// that differs), and leaves the network untouched on any error.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

// GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 intrinsics when
// Eigen's GEMM kernels are inlined here with -march=native (GCC bug 105593);
// the warning is spurious and silenced for this header only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <Eigen/Core>

#include <gradcomp/detail/random.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp::nn1d {

using index_type = Eigen::Index;
/// Column-major dynamic matrix.
template <class T>
using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
/// Dynamic column vector.
template <class T>
using vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;

/// A batch of 1-D signals: channels x (batch * length), sample b in columns [b*length, (b+1)*length).
template <class T>
struct tensor {
  matrix<T> data;
  index_type length = 0;  ///< samples' length L

  index_type channels() const noexcept { return data.rows(); }
  index_type batch() const noexcept { return length > 0 ? data.cols() / length : 0; }
  /// Resizes (keeping the allocation when the size is unchanged); contents unspecified.
  void resize(index_type channels, index_type len, index_type batch) {
    data.resize(channels, len * batch);
    length = len;
  }
};

namespace detail {

/// im2col: col((k*C + c), b*L_col + t) = src(c, b*L_src + t*S + k - P), zero outside [0, L_src).
template <class T>
void im2col(const matrix<T>& src, index_type l_src, index_type l_col, index_type batch, index_type kernel, index_type stride, index_type padding,
            matrix<T>& col) {
  const index_type c = src.rows();
  col.resize(kernel * c, l_col * batch);
  for (index_type b = 0; b < batch; ++b) {
    for (index_type t = 0; t < l_col; ++t) {
      const index_type j = b * l_col + t;
      for (index_type k = 0; k < kernel; ++k) {
        const index_type p = t * stride + k - padding;
        if (p >= 0 && p < l_src)
          col.col(j).segment(k * c, c) = src.col(b * l_src + p);
        else
          col.col(j).segment(k * c, c).setZero();
      }
    }
  }
}

/// The adjoint of im2col: dst(c, b*L_dst + t*S + k - P) += col(k*C + c, b*L_col + t). dst is not cleared.
template <class T>
void col2im_add(const matrix<T>& col, index_type l_dst, index_type l_col, index_type batch, index_type kernel, index_type stride,
                index_type padding, matrix<T>& dst) {
  const index_type c = dst.rows();
  for (index_type b = 0; b < batch; ++b) {
    for (index_type t = 0; t < l_col; ++t) {
      const index_type j = b * l_col + t;
      for (index_type k = 0; k < kernel; ++k) {
        const index_type p = t * stride + k - padding;
        if (p >= 0 && p < l_dst) dst.col(b * l_dst + p) += col.col(j).segment(k * c, c);
      }
    }
  }
}

/// A uniform draw in [-bound, bound] from the counter-based stream at `i`.
template <class T>
T uniform_symmetric(const gradcomp::detail::counter_stream& s, std::uint64_t i, double bound) {
  return static_cast<T>((2.0 * s.uniform_double(i) - 1.0) * bound);
}

inline void require_positive(index_type v, const char* what, const char* layer) {
  if (v <= 0) throw invalid_argument_error(std::string(layer) + ": " + what + " must be positive");
}

/// The geometry the two 1-D convolutions share: channels, kernel width,
/// stride and zero padding, checked on construction (`layer` names the layer
/// in the errors), with their accessors.
class conv_geometry {
 public:
  index_type in_channels() const noexcept { return in_; }
  index_type out_channels() const noexcept { return out_; }
  index_type kernel() const noexcept { return kernel_; }
  index_type stride() const noexcept { return stride_; }
  index_type padding() const noexcept { return padding_; }

 protected:
  conv_geometry() = default;
  conv_geometry(index_type in, index_type out, index_type kernel, index_type stride, index_type padding,
                const char* layer)
      : in_(in), out_(out), kernel_(kernel), stride_(stride), padding_(padding) {
    require_positive(in, "input channels", layer);
    require_positive(out, "output channels", layer);
    require_positive(kernel, "kernel", layer);
    require_positive(stride, "stride", layer);
    if (padding < 0) throw invalid_argument_error(std::string(layer) + ": padding must be >= 0");
  }

  index_type in_ = 0, out_ = 0, kernel_ = 1, stride_ = 1, padding_ = 0;
};

template <class T>
void check_input(const tensor<T>& x, index_type channels, const char* layer) {
  if (x.channels() != channels)
    throw size_mismatch_error(std::string(layer) + ": input channels", static_cast<std::size_t>(channels),
                              static_cast<std::size_t>(x.channels()));
  if (x.length <= 0 || x.data.cols() % x.length != 0)
    throw invalid_argument_error(std::string(layer) + ": input columns are not a whole number of samples");
}

}  // namespace detail

/// A view of one parameter array and its gradient, for optimisers and (de)serialisation.
template <class T>
struct parameter_ref {
  std::span<T> value;
  std::span<T> grad;
};

/// 1-D convolution (cross-correlation, as in every framework): y = W * im2col(x) + b.
/// Initialisation: Kaiming-uniform for a leaky-ReLU that follows, bound sqrt(6 / ((1 + a^2) fan_in)),
/// fan_in = C_in * K; bias 0.
template <class T>
class conv1d : public detail::conv_geometry {
 public:
  conv1d() = default;
  /// A layer of `out` filters of width `kernel` over `in` channels, with the given stride and zero padding.
  conv1d(index_type in, index_type out, index_type kernel, index_type stride = 1, index_type padding = 0)
      : conv_geometry(in, out, kernel, stride, padding, "conv1d") {
    weight = matrix<T>::Zero(out, kernel * in);
    bias = vector<T>::Zero(out);
    grad_weight = matrix<T>::Zero(out, kernel * in);
    grad_bias = vector<T>::Zero(out);
  }

  /// Output length for an input of length `l`; throws invalid_argument_error when it would be < 1.
  index_type output_length(index_type l) const {
    const index_type span = l + 2 * padding_ - kernel_;
    if (l <= 0 || span < 0) throw invalid_argument_error("conv1d: input of length " + std::to_string(l) + " is shorter than the kernel");
    return span / stride_ + 1;
  }

  /// Kaiming-uniform weights from stream `s`, zero bias.
  void initialize(const gradcomp::detail::counter_stream& s, double leaky_slope) {
    const double bound = std::sqrt(6.0 / ((1.0 + leaky_slope * leaky_slope) * double(in_ * kernel_)));
    for (index_type i = 0; i < weight.size(); ++i) weight.data()[i] = detail::uniform_symmetric<T>(s, std::uint64_t(i), bound);
    bias.setZero();
  }

  /// Inference pass: y = conv(x). `col` is scratch.
  void infer(const tensor<T>& x, tensor<T>& y, matrix<T>& col) const {
    detail::check_input(x, in_, "conv1d");
    const index_type lo = output_length(x.length), b = x.batch();
    y.resize(out_, lo, b);
    if (pointwise()) {
      y.data.noalias() = weight * x.data;
    } else {
      detail::im2col(x.data, x.length, lo, b, kernel_, stride_, padding_, col);
      y.data.noalias() = weight * col;
    }
    y.data.colwise() += bias;
  }

  /// Training pass: as infer, keeping what backward needs.
  void forward(const tensor<T>& x, tensor<T>& y) {
    detail::check_input(x, in_, "conv1d");
    in_length_ = x.length;
    batch_ = x.batch();
    const index_type lo = output_length(x.length);
    y.resize(out_, lo, batch_);
    if (pointwise()) {
      cache_ = x.data;
      y.data.noalias() = weight * cache_;
    } else {
      detail::im2col(x.data, x.length, lo, batch_, kernel_, stride_, padding_, cache_);
      y.data.noalias() = weight * cache_;
    }
    y.data.colwise() += bias;
  }

  /// Accumulates dL/dW and dL/db from dy = dL/dy of the last forward; writes dL/dx into *dx when dx != nullptr.
  void backward(const tensor<T>& dy, tensor<T>* dx) {
    const index_type lo = output_length(in_length_);
    if (dy.channels() != out_ || dy.length != lo || dy.batch() != batch_)
      throw state_error("conv1d::backward: gradient does not match the last forward pass");
    grad_weight.noalias() += dy.data * cache_.transpose();
    grad_bias.noalias() += dy.data.rowwise().sum();
    if (!dx) return;
    dx->resize(in_, in_length_, batch_);
    if (pointwise()) {
      dx->data.noalias() = weight.transpose() * dy.data;
    } else {
      dcol_.noalias() = weight.transpose() * dy.data;
      dx->data.setZero();
      detail::col2im_add(dcol_, in_length_, lo, batch_, kernel_, stride_, padding_, dx->data);
    }
  }

  void append_parameters(std::vector<parameter_ref<T>>& out) {
    out.push_back({std::span<T>(weight.data(), std::size_t(weight.size())),
                   std::span<T>(grad_weight.data(), std::size_t(grad_weight.size()))});
    out.push_back({std::span<T>(bias.data(), std::size_t(bias.size())),
                   std::span<T>(grad_bias.data(), std::size_t(grad_bias.size()))});
  }

  matrix<T> weight;       ///< C_out x (K*C_in), column k*C_in + c
  vector<T> bias;         ///< C_out
  matrix<T> grad_weight;  ///< accumulated dL/dW
  vector<T> grad_bias;    ///< accumulated dL/db

 private:
  bool pointwise() const noexcept { return kernel_ == 1 && stride_ == 1 && padding_ == 0; }
  index_type in_length_ = 0, batch_ = 0;
  matrix<T> cache_;  // im2col of the last input (or the input itself when pointwise)
  matrix<T> dcol_;
};

/// 1-D transposed convolution (the adjoint of conv1d, "deconvolution"):
/// y = col2im(W * x) + b, with output_padding extra positions at the end.
/// Initialisation: Kaiming-uniform with fan_in = C_in * K / S (the taps that reach one output), bias 0.
template <class T>
class conv_transpose1d : public detail::conv_geometry {
 public:
  conv_transpose1d() = default;
  conv_transpose1d(index_type in, index_type out, index_type kernel, index_type stride = 1, index_type padding = 0, index_type output_padding = 0)
      : conv_geometry(in, out, kernel, stride, padding, "conv_transpose1d"), output_padding_(output_padding) {
    if (output_padding < 0 || output_padding >= stride)
      throw invalid_argument_error("conv_transpose1d: output_padding must be in [0, stride)");
    weight = matrix<T>::Zero(kernel * out, in);
    bias = vector<T>::Zero(out);
    grad_weight = matrix<T>::Zero(kernel * out, in);
    grad_bias = vector<T>::Zero(out);
  }

  index_type output_padding() const noexcept { return output_padding_; }

  /// Output length for an input of length `l`; throws invalid_argument_error when it would be < 1.
  index_type output_length(index_type l) const {
    const index_type lo = (l - 1) * stride_ - 2 * padding_ + kernel_ + output_padding_;
    if (l <= 0 || lo < 1) throw invalid_argument_error("conv_transpose1d: input of length " + std::to_string(l) + " gives no output");
    return lo;
  }

  void initialize(const gradcomp::detail::counter_stream& s, double leaky_slope) {
    const double fan_in = std::max(1.0, double(in_ * kernel_) / double(stride_));
    const double bound = std::sqrt(6.0 / ((1.0 + leaky_slope * leaky_slope) * fan_in));
    for (index_type i = 0; i < weight.size(); ++i) weight.data()[i] = detail::uniform_symmetric<T>(s, std::uint64_t(i), bound);
    bias.setZero();
  }

  void infer(const tensor<T>& x, tensor<T>& y, matrix<T>& col) const {
    detail::check_input(x, in_, "conv_transpose1d");
    const index_type lo = output_length(x.length), b = x.batch();
    col.noalias() = weight * x.data;
    y.resize(out_, lo, b);
    y.data.setZero();
    detail::col2im_add(col, lo, x.length, b, kernel_, stride_, padding_, y.data);
    y.data.colwise() += bias;
  }

  void forward(const tensor<T>& x, tensor<T>& y) {
    detail::check_input(x, in_, "conv_transpose1d");
    cache_ = x;
    infer(x, y, col_);
  }

  void backward(const tensor<T>& dy, tensor<T>* dx) {
    const index_type lo = output_length(cache_.length), b = cache_.batch();
    if (dy.channels() != out_ || dy.length != lo || dy.batch() != b)
      throw state_error("conv_transpose1d::backward: gradient does not match the last forward pass");
    detail::im2col(dy.data, lo, cache_.length, b, kernel_, stride_, padding_, col_);
    grad_weight.noalias() += col_ * cache_.data.transpose();
    grad_bias.noalias() += dy.data.rowwise().sum();
    if (!dx) return;
    dx->resize(in_, cache_.length, b);
    dx->data.noalias() = weight.transpose() * col_;
  }

  void append_parameters(std::vector<parameter_ref<T>>& out) {
    out.push_back({std::span<T>(weight.data(), std::size_t(weight.size())),
                   std::span<T>(grad_weight.data(), std::size_t(grad_weight.size()))});
    out.push_back({std::span<T>(bias.data(), std::size_t(bias.size())),
                   std::span<T>(grad_bias.data(), std::size_t(grad_bias.size()))});
  }

  matrix<T> weight;       ///< (K*C_out) x C_in, row k*C_out + o
  vector<T> bias;         ///< C_out
  matrix<T> grad_weight;
  vector<T> grad_bias;

 private:
  index_type output_padding_ = 0;
  tensor<T> cache_;  // the last input
  matrix<T> col_;
};

/// Leaky ReLU: y = x for x > 0, a x otherwise (He et al., seed 004 ref. [52]).
template <class T>
class leaky_relu {
 public:
  explicit leaky_relu(T slope = T(0.01)) : slope_(slope) {
    if (!(slope >= T(0)) || !(slope < T(1))) throw invalid_argument_error("leaky_relu: slope must be in [0, 1)");
  }
  T slope() const noexcept { return slope_; }

  void infer(const tensor<T>& x, tensor<T>& y) const {
    y.length = x.length;
    y.data = (x.data.array() > T(0)).select(x.data.array(), slope_ * x.data.array()).matrix();
  }
  void forward(const tensor<T>& x, tensor<T>& y) {
    cache_ = x;
    infer(x, y);
  }
  void backward(const tensor<T>& dy, tensor<T>* dx) {
    if (dy.data.rows() != cache_.data.rows() || dy.data.cols() != cache_.data.cols())
      throw state_error("leaky_relu::backward: gradient does not match the last forward pass");
    if (!dx) return;
    dx->length = dy.length;
    dx->data = (cache_.data.array() > T(0)).select(dy.data.array(), slope_ * dy.data.array()).matrix();
  }

 private:
  T slope_;
  tensor<T> cache_;
};

/// One layer of a sequential network.
template <class T>
using layer = std::variant<conv1d<T>, conv_transpose1d<T>, leaky_relu<T>>;

/// Layers applied in order. Copyable (a copy is an independent network: the
/// autoencoder trains on a copy and commits only finite weights).
template <class T>
class sequential {
 public:
  sequential() = default;

  /// Appends a layer.
  void add(layer<T> l) {
    layers_.push_back(std::move(l));
    acts_.resize(layers_.size());
  }
  std::size_t size() const noexcept { return layers_.size(); }
  const std::vector<layer<T>>& layers() const noexcept { return layers_; }
  std::vector<layer<T>>& layers() noexcept { return layers_; }

  /// Deterministic initialisation: layer i draws from stream (seed, stream_base + i) of a counter-based generator.
  void initialize(std::uint64_t seed, std::uint64_t stream_base = 0) {
    const gradcomp::detail::counter_rng rng(seed);
    double slope = 0.0;
    // Each weight layer is initialised for the activation that follows it.
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      slope = 1.0;  // linear output when no leaky_relu follows
      if (i + 1 < layers_.size())
        if (auto* a = std::get_if<leaky_relu<T>>(&layers_[i + 1])) slope = double(a->slope());
      const auto s = rng.stream(stream_base + i);
      std::visit(
          [&](auto& l) {
            if constexpr (!std::is_same_v<std::decay_t<decltype(l)>, leaky_relu<T>>) l.initialize(s, slope);
          },
          layers_[i]);
    }
  }

  /// Output length for an input of length `l` (throws when a layer would produce nothing).
  index_type output_length(index_type l) const {
    for (const auto& ly : layers_)
      std::visit(
          [&](const auto& x) {
            if constexpr (!std::is_same_v<std::decay_t<decltype(x)>, leaky_relu<T>>) l = x.output_length(l);
          },
          ly);
    return l;
  }

  /// Inference. `ws` holds the intermediate tensors, one per layer, so calls
  /// on inputs of the same shape reuse every allocation.
  struct workspace {
    std::vector<tensor<T>> acts;
    std::vector<matrix<T>> cols;
  };
  void infer(const tensor<T>& x, tensor<T>& y, workspace& ws) const {
    if (layers_.empty()) {
      y = x;
      return;
    }
    ws.acts.resize(layers_.size());
    ws.cols.resize(layers_.size());
    const tensor<T>* in = &x;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      tensor<T>& out = (i + 1 == layers_.size()) ? y : ws.acts[i];
      std::visit(
          [&](const auto& l) {
            if constexpr (std::is_same_v<std::decay_t<decltype(l)>, leaky_relu<T>>)
              l.infer(*in, out);
            else
              l.infer(*in, out, ws.cols[i]);
          },
          layers_[i]);
      in = &out;
    }
  }
  void infer(const tensor<T>& x, tensor<T>& y) const {
    workspace ws;
    infer(x, y, ws);
  }

  /// Training pass; the returned output stays valid until the next forward.
  const tensor<T>& forward(const tensor<T>& x) {
    if (layers_.empty()) throw state_error("sequential::forward: no layers");
    const tensor<T>* in = &x;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      std::visit([&](auto& l) { l.forward(*in, acts_[i]); }, layers_[i]);
      in = &acts_[i];
    }
    return acts_.back();
  }

  /// Backward through every layer; accumulates parameter gradients; dL/dx into *dx when non-null.
  void backward(const tensor<T>& dy, tensor<T>* dx) {
    if (layers_.empty()) throw state_error("sequential::backward: no layers");
    const tensor<T>* g = &dy;
    for (std::size_t i = layers_.size(); i-- > 0;) {
      tensor<T>* out = (i == 0) ? dx : (g == &grad_a_ ? &grad_b_ : &grad_a_);
      if (i > 0 || dx) {
        std::visit([&](auto& l) { l.backward(*g, out); }, layers_[i]);
        g = out;
      } else {
        std::visit([&](auto& l) { l.backward(*g, nullptr); }, layers_[i]);
      }
    }
  }

  /// Every weight and bias with its gradient, in layer order.
  std::vector<parameter_ref<T>> parameters() {
    std::vector<parameter_ref<T>> out;
    for (auto& ly : layers_)
      std::visit(
          [&](auto& l) {
            if constexpr (!std::is_same_v<std::decay_t<decltype(l)>, leaky_relu<T>>) l.append_parameters(out);
          },
          ly);
    return out;
  }
  std::size_t parameter_count() {
    std::size_t n = 0;
    for (auto& p : parameters()) n += p.value.size();
    return n;
  }
  void zero_grad() {
    for (auto& p : parameters()) std::fill(p.grad.begin(), p.grad.end(), T(0));
  }

 private:
  std::vector<layer<T>> layers_;
  std::vector<tensor<T>> acts_;
  tensor<T> grad_a_, grad_b_;
};

// ---------------------------------------------------------------------------
// Losses. The paper writes squared L2 norms (eqs. 5, 6, 11); gradcomp divides
// each by the number of elements it sums (PyTorch's MSELoss reduction), so a
// learning rate does not depend on the vector length.

/// Mean squared error (1/N) sum_i (pred_i - target_i)^2 over the first `valid`
/// columns (all when valid < 0; N counts the summed elements): eqs. 6 and 11 per element. Writes dL/dpred into *grad (zero on the ignored columns) when non-null.
template <class T>
T mse_loss(const matrix<T>& pred, const matrix<T>& target, matrix<T>* grad, index_type valid = -1) {
  if (pred.rows() != target.rows() || pred.cols() != target.cols())
    throw size_mismatch_error("mse_loss", std::size_t(target.size()), std::size_t(pred.size()));
  const index_type cols = valid < 0 ? pred.cols() : std::min(valid, pred.cols());
  const double n = double(cols * pred.rows());
  if (n <= 0) {
    if (grad) *grad = matrix<T>::Zero(pred.rows(), pred.cols());
    return T(0);
  }
  const auto diff = (pred.leftCols(cols) - target.leftCols(cols)).eval();
  if (grad) {
    grad->resize(pred.rows(), pred.cols());
    grad->setZero();
    grad->leftCols(cols) = diff * T(2.0 / n);
  }
  return static_cast<T>(diff.squaredNorm() / n);
}

/// Similarity loss of seed 004 eq. (5) per element: (1/E) sum_k sum_{m != k} ||c_k - c_m||^2,
/// where `codes` holds K equal blocks of columns (block k = c_k, E elements each).
/// Writes dL/dcodes = (4/E)(K c_k - sum_m c_m) into *grad when non-null.
template <class T>
T similarity_loss(const matrix<T>& codes, index_type blocks, matrix<T>* grad) {
  if (blocks <= 0 || codes.cols() % blocks != 0)
    throw invalid_argument_error("similarity_loss: columns are not " + std::to_string(blocks) + " equal blocks");
  const index_type w = codes.cols() / blocks;
  const double e = double(w * codes.rows());
  matrix<T> sum = matrix<T>::Zero(codes.rows(), w);
  for (index_type k = 0; k < blocks; ++k) sum += codes.middleCols(k * w, w);
  // sum_k sum_{m!=k} ||c_k - c_m||^2 = 2 K sum_k ||c_k||^2 - 2 ||sum_k c_k||^2
  double sq = 0.0;
  for (index_type k = 0; k < blocks; ++k) sq += double(codes.middleCols(k * w, w).squaredNorm());
  const double loss = e > 0 ? (2.0 * double(blocks) * sq - 2.0 * double(sum.squaredNorm())) / e : 0.0;
  if (grad) {
    grad->resize(codes.rows(), codes.cols());
    for (index_type k = 0; k < blocks; ++k)
      grad->middleCols(k * w, w) = (T(blocks) * codes.middleCols(k * w, w) - sum) * T(e > 0 ? 4.0 / e : 0.0);
  }
  return static_cast<T>(std::max(0.0, loss));
}

// ---------------------------------------------------------------------------
// Optimisers. They hold per-parameter state, so one optimiser serves one
// fixed list of parameters (same order and sizes every step).

/// Stochastic gradient descent, optionally with (heavy-ball) momentum: v = m v + g; w -= lr v.
template <class T>
class sgd {
 public:
  explicit sgd(T lr = T(1e-3), T momentum = T(0)) : lr_(lr), momentum_(momentum) {
    if (!(lr > T(0)) || !std::isfinite(double(lr))) throw invalid_argument_error("sgd: learning rate must be positive");
    if (!(momentum >= T(0)) || !(momentum < T(1))) throw invalid_argument_error("sgd: momentum must be in [0, 1)");
  }
  T learning_rate() const noexcept { return lr_; }
  void step(const std::vector<parameter_ref<T>>& params) {
    if (momentum_ > T(0) && velocity_.size() != params.size()) {
      velocity_.clear();
      for (const auto& p : params) velocity_.emplace_back(p.value.size(), T(0));
    }
    for (std::size_t j = 0; j < params.size(); ++j) {
      auto& p = params[j];
      if (momentum_ > T(0)) {
        auto& v = velocity_[j];
        for (std::size_t i = 0; i < p.value.size(); ++i) {
          v[i] = momentum_ * v[i] + p.grad[i];
          p.value[i] -= lr_ * v[i];
        }
      } else {
        for (std::size_t i = 0; i < p.value.size(); ++i) p.value[i] -= lr_ * p.grad[i];
      }
    }
  }

 private:
  T lr_, momentum_;
  std::vector<std::vector<T>> velocity_;
};

/// Adam (Kingma & Ba), bias-corrected.
template <class T>
class adam {
 public:
  explicit adam(T lr = T(1e-3), T beta1 = T(0.9), T beta2 = T(0.999), T eps = T(1e-8))
      : lr_(lr), b1_(beta1), b2_(beta2), eps_(eps) {
    if (!(lr > T(0)) || !std::isfinite(double(lr))) throw invalid_argument_error("adam: learning rate must be positive");
    if (!(beta1 >= T(0) && beta1 < T(1)) || !(beta2 >= T(0) && beta2 < T(1)))
      throw invalid_argument_error("adam: betas must be in [0, 1)");
    if (!(eps > T(0))) throw invalid_argument_error("adam: eps must be positive");
  }
  T learning_rate() const noexcept { return lr_; }
  void step(const std::vector<parameter_ref<T>>& params) {
    if (m_.size() != params.size()) {
      m_.clear();
      v_.clear();
      for (const auto& p : params) {
        m_.emplace_back(p.value.size(), T(0));
        v_.emplace_back(p.value.size(), T(0));
      }
      t_ = 0;
    }
    ++t_;
    const double c1 = 1.0 - std::pow(double(b1_), double(t_)), c2 = 1.0 - std::pow(double(b2_), double(t_));
    const T step = static_cast<T>(double(lr_) * std::sqrt(c2) / c1);
    for (std::size_t j = 0; j < params.size(); ++j) {
      auto& p = params[j];
      auto& m = m_[j];
      auto& v = v_[j];
      for (std::size_t i = 0; i < p.value.size(); ++i) {
        const T g = p.grad[i];
        m[i] = b1_ * m[i] + (T(1) - b1_) * g;
        v[i] = b2_ * v[i] + (T(1) - b2_) * g * g;
        p.value[i] -= step * m[i] / (std::sqrt(v[i]) + eps_);
      }
    }
  }

 private:
  T lr_, b1_, b2_, eps_;
  std::uint64_t t_ = 0;
  std::vector<std::vector<T>> m_, v_;
};

// ---------------------------------------------------------------------------
// Weights in the wire container.

/// Version of the weights body written by write_weights (independent of the container version).
inline constexpr std::uint16_t weights_format_version = 1;

namespace detail {
enum : std::uint8_t { kind_conv = 1, kind_conv_transpose = 2, kind_leaky_relu = 3 };

template <class T>
std::string describe(const layer<T>& l) {
  return std::visit(
      [](const auto& x) -> std::string {
        using L = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<L, conv1d<T>>)
          return "conv1d(" + std::to_string(x.in_channels()) + "->" + std::to_string(x.out_channels()) + ", k" +
                 std::to_string(x.kernel()) + ", s" + std::to_string(x.stride()) + ", p" + std::to_string(x.padding()) + ")";
        else if constexpr (std::is_same_v<L, conv_transpose1d<T>>)
          return "conv_transpose1d(" + std::to_string(x.in_channels()) + "->" + std::to_string(x.out_channels()) +
                 ", k" + std::to_string(x.kernel()) + ", s" + std::to_string(x.stride()) + ", p" +
                 std::to_string(x.padding()) + ", op" + std::to_string(x.output_padding()) + ")";
        else
          return "leaky_relu(" + std::to_string(double(x.slope())) + ")";
      },
      l);
}
}  // namespace detail

/// Appends a network's structure and weights (float32) to a wire body.
/// Layout: u16 format version, varint layer count, per layer a kind byte and
/// its hyper-parameters (varints; the leaky slope as float64), then varint
/// parameter count and the float32 parameters in `parameters()` order.
template <class T>
void write_weights(wire::writer& w, sequential<T>& net) {
  w.put<std::uint16_t>(weights_format_version);
  w.put_varint(net.size());
  for (const auto& ly : net.layers()) {
    std::visit(
        [&](const auto& x) {
          using L = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<L, conv1d<T>>) {
            w.put<std::uint8_t>(detail::kind_conv);
            for (index_type v : {x.in_channels(), x.out_channels(), x.kernel(), x.stride(), x.padding()})
              w.put_varint(std::uint64_t(v));
          } else if constexpr (std::is_same_v<L, conv_transpose1d<T>>) {
            w.put<std::uint8_t>(detail::kind_conv_transpose);
            for (index_type v : {x.in_channels(), x.out_channels(), x.kernel(), x.stride(), x.padding(), x.output_padding()})
              w.put_varint(std::uint64_t(v));
          } else {
            w.put<std::uint8_t>(detail::kind_leaky_relu);
            w.put<double>(double(x.slope()));
          }
        },
        ly);
  }
  const auto params = net.parameters();
  std::size_t count = 0;
  for (const auto& p : params) count += p.value.size();
  w.put_varint(count);
  std::vector<float> buf;
  for (const auto& p : params) {
    buf.assign(p.value.begin(), p.value.end());
    w.put_array<float>(buf);
  }
}

/// Reads weights written by write_weights into `net`, whose structure must be
/// identical. Throws wire_error (unsupported_version for another format
/// version, malformed_body / truncated for broken bytes or non-finite weights)
/// or invalid_argument_error (another shape, naming the first differing
/// layer). `net` is only modified once everything has been validated.
template <class T>
void read_weights(wire::reader& r, sequential<T>& net) {
  const auto version = r.get<std::uint16_t>();
  if (version != weights_format_version)
    wire::reader::fail(wire::wire_errc::unsupported_version,
                       "nn1d weights format version " + std::to_string(version) + ", this build reads " +
                           std::to_string(weights_format_version));
  const std::uint64_t layers = r.get_varint();
  if (layers != net.size())
    throw invalid_argument_error("nn1d::read_weights: the weights describe " + std::to_string(layers) +
                                 " layers, this network has " + std::to_string(net.size()));
  for (std::size_t i = 0; i < net.size(); ++i) {
    const auto kind = r.get<std::uint8_t>();
    const auto& ly = net.layers()[i];
    bool same = false;
    std::string theirs;
    auto read_n = [&](int n) {
      std::vector<std::uint64_t> v;
      for (int j = 0; j < n; ++j) v.push_back(r.get_varint());
      return v;
    };
    if (kind == detail::kind_conv) {
      const auto v = read_n(5);
      theirs = "conv1d(" + std::to_string(v[0]) + "->" + std::to_string(v[1]) + ", k" + std::to_string(v[2]) + ", s" +
               std::to_string(v[3]) + ", p" + std::to_string(v[4]) + ")";
      if (auto* x = std::get_if<conv1d<T>>(&ly))
        same = v == std::vector<std::uint64_t>{std::uint64_t(x->in_channels()), std::uint64_t(x->out_channels()),
                                               std::uint64_t(x->kernel()), std::uint64_t(x->stride()),
                                               std::uint64_t(x->padding())};
    } else if (kind == detail::kind_conv_transpose) {
      const auto v = read_n(6);
      theirs = "conv_transpose1d(" + std::to_string(v[0]) + "->" + std::to_string(v[1]) + ", k" +
               std::to_string(v[2]) + ", s" + std::to_string(v[3]) + ", p" + std::to_string(v[4]) + ", op" +
               std::to_string(v[5]) + ")";
      if (auto* x = std::get_if<conv_transpose1d<T>>(&ly))
        same = v == std::vector<std::uint64_t>{std::uint64_t(x->in_channels()), std::uint64_t(x->out_channels()),
                                               std::uint64_t(x->kernel()), std::uint64_t(x->stride()),
                                               std::uint64_t(x->padding()), std::uint64_t(x->output_padding())};
    } else if (kind == detail::kind_leaky_relu) {
      const double slope = r.get<double>();
      theirs = "leaky_relu(" + std::to_string(slope) + ")";
      if (auto* x = std::get_if<leaky_relu<T>>(&ly)) same = double(x->slope()) == double(T(slope));
    } else {
      wire::reader::fail(wire::wire_errc::malformed_body, "nn1d weights: unknown layer kind " + std::to_string(kind));
    }
    if (!same)
      throw invalid_argument_error("nn1d::read_weights: layer " + std::to_string(i) + " is " + theirs +
                                   " in the weights, " + detail::describe<T>(ly) + " in this network");
  }
  const std::uint64_t count = r.get_varint();
  const auto params = net.parameters();
  std::size_t expected = 0;
  for (const auto& p : params) expected += p.value.size();
  if (count != expected)
    wire::reader::fail(wire::wire_errc::malformed_body, "nn1d weights: " + std::to_string(count) +
                                                            " parameters for a structure of " + std::to_string(expected));
  const std::vector<float> values = r.get_vector<float>(count);
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      wire::reader::fail(wire::wire_errc::malformed_body, "nn1d weights: non-finite parameter " + std::to_string(i));
  std::size_t at = 0;
  for (const auto& p : params)
    for (auto& v : p.value) v = static_cast<T>(values[at++]);
}

/// A network's weights as a self-contained message (wire container, codec
/// autoencoder, state flag; element_count = parameter count).
template <class T>
std::vector<std::byte> save_weights(sequential<T>& net) {
  return wire::serialize_state(wire::codec_id::autoencoder, net.parameter_count(),
                               [&](wire::writer& w) { write_weights(w, net); });
}

/// Loads a message written by save_weights; see read_weights for the errors.
template <class T>
void load_weights(sequential<T>& net, std::span<const std::byte> bytes) {
  wire::header h;
  wire::reader r = wire::parse_state(bytes, wire::codec_id::autoencoder, &h);
  sequential<T> copy = net;  // read into a copy: the network stays untouched on error
  read_weights(r, copy);
  r.expect_end();
  if (h.element_count != copy.parameter_count())
    wire::reader::fail(wire::wire_errc::malformed_body, "nn1d weights: header element count disagrees with the body");
  net = std::move(copy);
}

/// True when every parameter of `net` is finite.
template <class T>
bool all_finite(sequential<T>& net) {
  for (const auto& p : net.parameters())
    for (T v : p.value)
      if (!std::isfinite(double(v))) return false;
  return true;
}

}  // namespace gradcomp::nn1d

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
