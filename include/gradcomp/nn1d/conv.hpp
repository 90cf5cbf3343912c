#pragma once
/// \file nn1d/conv.hpp
/// The two 1-D convolutions of nn1d, im2col + Eigen GEMM: `conv1d` and
/// `conv_transpose1d` (seed 004, Tables I-II), with their forward and
/// backward passes and Kaiming-uniform initialisation.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/nn1d/detail/warnings_push.hpp>  // GCC bug 105593, see there

#include <gradcomp/detail/random.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/nn1d/tensor.hpp>

namespace gradcomp::nn1d {
GRADCOMP_ABI_NAMESPACE_BEGIN

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

/// Column j = b*L_col + t of im2col (see im2col) into `dst` (K*C values).
template <class T, class Dst>
void im2col_column(const matrix<T>& src, index_type l_src, index_type l_col, index_type j, index_type kernel,
                   index_type stride, index_type padding, Dst&& dst) {
  const index_type c = src.rows(), b = j / l_col, t = j % l_col;
  for (index_type k = 0; k < kernel; ++k) {
    const index_type p = t * stride + k - padding;
    if (p >= 0 && p < l_src)
      dst.segment(k * c, c) = src.col(b * l_src + p);
    else
      dst.segment(k * c, c).setZero();
  }
}

/// y = weight * im2col(src) (C_out x batch*L_col), with the same bits as
/// that product, mostly without building im2col. When stride * L_col ==
/// L_src, the K*C inputs of output column j are the contiguous floats of
/// src's columns S*j - P .. S*j - P + K - 1, so the columns whose window
/// stays inside its sample are a strided view of src (OuterStride S*C) that
/// Eigen's GEMM packs directly: one GEMM over the column range
/// [j0, j1) (both multiples of 8), then the few columns whose window
/// leaves its sample (zero padding; t < ceil(P/S) or near the end) and
/// those outside [j0, j1) are gathered through im2col and multiplied
/// again, in a block of a multiple of 8 columns. Every output column goes
/// through Eigen's full nr-column panels in both products, as it does in
/// the one-GEMM product when batch*L_col is a multiple of 8, and the depth
/// and row blocking depend only on depth and C_out, so each column has the
/// same sums in the same order (checked bit for bit in test_nn1d).
/// Otherwise (shapes where that does not hold, small products): one GEMM
/// with `built`, the im2col of src when the caller has it, else with an
/// im2col into `col`. `col` is scratch.
template <class T>
void conv_product(const matrix<T>& weight, const matrix<T>& src, index_type l_src, index_type l_col, index_type batch,
                  index_type kernel, index_type stride, index_type padding, matrix<T>& y, matrix<T>& col,
                  const matrix<T>* built = nullptr) {
  const index_type c = src.rows(), n = l_col * batch, depth = kernel * c;
  y.resize(weight.rows(), n);
  const index_type t_lo = (padding + stride - 1) / stride;  // first t whose window starts inside the sample
  const index_type t_hi = (l_src - kernel + padding) >= 0 ? (l_src - kernel + padding) / stride : -1;  // last inside
  const index_type j0 = (t_lo + 7) / 8 * 8;
  const index_type j1 = (n - (l_col - 1 - t_hi)) / 8 * 8;
  const index_type bad_per_sample = t_lo + (l_col - 1 - t_hi);
  const bool strided = stride * l_col == l_src && n % 8 == 0 && n >= 64 && weight.rows() >= 2 && t_hi >= t_lo &&
                       j1 - j0 >= 32 && 4 * (bad_per_sample * batch + 16) <= n;
  if (!strided) {
    if (!built) {
      im2col(src, l_src, l_col, batch, kernel, stride, padding, col);
      built = &col;
    }
    y.noalias() = weight * *built;
    return;
  }
  using strided_map = Eigen::Map<const matrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
  y.middleCols(j0, j1 - j0).noalias() =
      weight * strided_map(src.data() + (stride * j0 - padding) * c, depth, j1 - j0, Eigen::OuterStride<>(stride * c));
  // The columns left: [0, j0), [j1, n), and inside [j0, j1) every t outside [t_lo, t_hi].
  index_type fixes = j0 + (n - j1);
  for (index_type b = 0; b < batch; ++b)
    for (index_type t = 0; t < l_col; ++t) {
      const index_type j = b * l_col + t;
      if ((t < t_lo || t > t_hi) && j >= j0 && j < j1) ++fixes;
    }
  const index_type width = (fixes + 7) / 8 * 8;
  col.resize(depth + weight.rows(), width);  // rows [0, depth): gathered im2col columns; below: their products
  index_type f = 0;
  auto gather = [&](index_type j) { im2col_column(src, l_src, l_col, j, kernel, stride, padding, col.col(f++).head(depth)); };
  auto for_each_fix = [&](auto&& fn) {
    for (index_type j = 0; j < j0; ++j) fn(j);
    for (index_type b = 0; b < batch; ++b)
      for (index_type t = 0; t < l_col; ++t) {
        const index_type j = b * l_col + t;
        if ((t < t_lo || t > t_hi) && j >= j0 && j < j1) fn(j);
      }
    for (index_type j = j1; j < n; ++j) fn(j);
  };
  for_each_fix(gather);
  col.topRightCorner(depth, width - fixes).setZero();
  col.bottomRows(weight.rows()).noalias() = weight * col.topRows(depth);
  f = 0;
  for_each_fix([&](index_type j) { y.col(j) = col.col(f++).tail(weight.rows()); });
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

/// y = act(y + bias), column by column so each column is read and written
/// once while it is in L1 (act: leaky ReLU of the given slope, or none when
/// `leaky_slope` is null). Bit-identical to the bias pass followed by a
/// separate leaky_relu layer: a = y + b, then a > 0 ? a : slope * a (NaN
/// and -0 included). Written with Eigen's packet primitives: Eigen 3.4's
/// select() is scalar, and GCC does not if-convert the scalar loop without
/// AVX-512 masks (-ftrapping-math), which cost 2.3 ms of the encoder's 37 ms
/// in a build without -march=native.
template <class T>
void add_bias_activate(matrix<T>& y, const vector<T>& bias, const T* leaky_slope) {
  if (!leaky_slope) {
    y.colwise() += bias;
    return;
  }
  namespace ei = Eigen::internal;
  using packet = typename ei::packet_traits<T>::type;
  constexpr index_type width = ei::packet_traits<T>::Vectorizable ? ei::packet_traits<T>::size : 1;
  const T s = *leaky_slope;
  const index_type rows = y.rows(), whole = width > 1 ? rows / width * width : 0;
  const T* b = bias.data();
  for (index_type j = 0; j < y.cols(); ++j) {
    T* c = y.data() + j * rows;
    index_type i = 0;
    if constexpr (width > 1) {
      const packet zero = ei::pset1<packet>(T(0)), slope = ei::pset1<packet>(s);
      for (; i < whole; i += width) {
        const packet a = ei::padd(ei::ploadu<packet>(c + i), ei::ploadu<packet>(b + i));
        ei::pstoreu(c + i, ei::pselect(ei::pcmp_lt(zero, a), a, ei::pmul(slope, a)));
      }
    }
    for (; i < rows; ++i) {
      const T a = c[i] + b[i];
      c[i] = a > T(0) ? a : s * a;
    }
  }
}

template <class T>
void check_input(const tensor<T>& x, index_type channels, const char* layer) {
  if (x.channels() != channels)
    throw size_mismatch_error(std::string(layer) + ": input channels", static_cast<std::size_t>(channels),
                              static_cast<std::size_t>(x.channels()));
  if (x.length <= 0 || x.data.cols() % x.length != 0)
    throw invalid_argument_error(std::string(layer) + ": input columns are not a whole number of samples");
}

}  // namespace detail

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

  /// Inference pass: y = conv(x), then a leaky ReLU of slope *leaky_slope
  /// fused into the bias pass when leaky_slope is not null. `col` is scratch.
  void infer(const tensor<T>& x, tensor<T>& y, matrix<T>& col, const T* leaky_slope = nullptr) const {
    detail::check_input(x, in_, "conv1d");
    const index_type lo = output_length(x.length), b = x.batch();
    y.resize(out_, lo, b);
    if (pointwise())
      y.data.noalias() = weight * x.data;
    else
      detail::conv_product(weight, x.data, x.length, lo, b, kernel_, stride_, padding_, y.data, col);
    detail::add_bias_activate(y.data, bias, leaky_slope);
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
      // The same product as infer (same bits in every configuration); the
      // im2col is kept for backward.
      detail::im2col(x.data, x.length, lo, batch_, kernel_, stride_, padding_, cache_);
      detail::conv_product(weight, x.data, x.length, lo, batch_, kernel_, stride_, padding_, y.data, dcol_, &cache_);
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

  /// Inference pass, with an optional fused leaky ReLU as conv1d::infer.
  void infer(const tensor<T>& x, tensor<T>& y, matrix<T>& col, const T* leaky_slope = nullptr) const {
    detail::check_input(x, in_, "conv_transpose1d");
    const index_type lo = output_length(x.length), b = x.batch();
    col.noalias() = weight * x.data;
    y.resize(out_, lo, b);
    y.data.setZero();
    detail::col2im_add(col, lo, x.length, b, kernel_, stride_, padding_, y.data);
    detail::add_bias_activate(y.data, bias, leaky_slope);
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

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::nn1d

#include <gradcomp/nn1d/detail/warnings_pop.hpp>
