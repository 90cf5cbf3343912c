#pragma once
/// \file layout.hpp
/// Layer shapes and the GradiVeQ flattening of a convolutional layer's
/// gradient (seed 002, Sec. 2 and Fig. 3a), with its exact inverse.
///
/// Framework layout. A conv layer with F filters of height H, width W and
/// depth D (input channels) stores its weight gradient as the row-major 4-D
/// tensor [F, D, H, W] (PyTorch's `weight.grad` of a Conv2d: [out_channels,
/// in_channels, kH, kW]), so element (f, d, h, w) sits at
///
///     framework_index = ((f * D + d) * H + h) * W + w.
///
/// GradiVeQ layout. "Every F collocated gradients from all the F filters" are
/// placed next to each other, and the location (d, h, w) is traversed depth
/// first, then width, then height (Fig. 3a), i.e. the tensor [H, W, D, F]:
///
///     gradiveq_index = ((h * W + w) * D + d) * F + f.
///
/// Consequences used by the codec: a run of F*D consecutive elements is one
/// spatial position (h, w) with all its depths and filters, and a run of
/// W*D*F elements is one row h of the kernel. A slice size K that is a
/// multiple of F*D therefore starts and ends on position boundaries (the
/// spatial consistency of Fig. 5); K = W*D*F (e.g. 768 for a (3,3,16,16)
/// layer) is the paper's choice and `layer_shape::default_slice_size()`.
///
/// Dense (fully connected, bias, norm) layers are not reordered: GradiVeQ
/// "is not applied to the gradient of other parameters" (footnote 3), but a
/// user may still compress them, so flatten/unflatten pass them through.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <span>
#include <string>

#include <gradcomp/errors.hpp>

namespace gradcomp {

/// What kind of parameter tensor a layer holds.
enum class layer_kind {
  dense,  ///< any tensor kept in framework order (fully connected, bias, norm, ...)
  conv,   ///< conv weight [F, D, H, W], reordered by the GradiVeQ flattening (Fig. 3a)
};

/// The shape of one layer's gradient tensor.
struct layer_shape {
  layer_kind kind = layer_kind::dense;
  std::size_t filters = 0;  ///< F (conv)
  std::size_t depth = 0;    ///< D, input channels (conv)
  std::size_t height = 0;   ///< H, kernel height (conv)
  std::size_t width = 0;    ///< W, kernel width (conv)
  std::size_t length = 0;   ///< element count (dense; for conv F*D*H*W)

  /// A conv layer of F filters of H x W x D, framework layout [F, D, H, W].
  ///
  /// Argument order: the framework's tensor order, outermost first,
  ///
  ///     conv(f, d, h, w) = conv(filters F,          // out_channels
  ///                             depth D,            // in_channels
  ///                             height H,           // kernel height kH
  ///                             width W)            // kernel width kW
  ///
  /// i.e. PyTorch's `Conv2d.weight.shape` read left to right:
  /// `conv(t.size(0), t.size(1), t.size(2), t.size(3))`. The paper writes a
  /// layer's shape the other way round, (H, W, D, F): its "(3,3,16,16)" layer
  /// is `conv(16, 16, 3, 3)`, and `conv(64, 3, 5, 7)` is 64 filters over 3
  /// input channels with 5 x 7 kernels (K = W*D*F = 7*3*64). Getting the order
  /// wrong still compiles and gives a layer of the same size, but flattens
  /// (and slices) it wrongly: keep F first and W last.
  /// Throws invalid_argument_error on a zero extent or an element count that overflows.
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static layer_shape conv(std::size_t f, std::size_t d, std::size_t h, std::size_t w) {
    if (f == 0 || d == 0 || h == 0 || w == 0)
      throw invalid_argument_error("layer_shape::conv: every extent must be positive");
    const std::size_t max = std::numeric_limits<std::size_t>::max();
    if (d > max / f || h > max / (f * d) || w > max / (f * d * h))
      throw invalid_argument_error("layer_shape::conv: element count overflows");
    layer_shape s;
    s.kind = layer_kind::conv;
    s.filters = f;
    s.depth = d;
    s.height = h;
    s.width = w;
    s.length = f * d * h * w;
    return s;
  }

  /// A tensor of n elements kept in framework order.
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static layer_shape dense(std::size_t n) {
    layer_shape s;
    s.kind = layer_kind::dense;
    s.length = n;
    return s;
  }

  /// A 2-D tensor [rows, cols] kept in framework order (a linear layer's
  /// weight [out_features, in_features]): a dense layer for every codec but
  /// PowerSGD, which views it as a rows x cols matrix (powersgd.hpp).
  /// Throws invalid_argument_error on a zero extent or an overflowing count.
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  static layer_shape matrix(std::size_t rows, std::size_t cols) {
    if (rows == 0 || cols == 0) throw invalid_argument_error("layer_shape::matrix: every extent must be positive");
    if (cols > std::numeric_limits<std::size_t>::max() / rows)
      throw invalid_argument_error("layer_shape::matrix: element count overflows");
    layer_shape s;
    s.kind = layer_kind::dense;
    s.filters = rows;
    s.depth = cols;
    s.height = 1;
    s.width = 1;
    s.length = rows * cols;
    return s;
  }

  /// Number of gradient elements.
  std::size_t size() const noexcept { return length; }

  /// The slice granularity of Fig. 5: F*D for conv (one spatial position), 1 otherwise.
  std::size_t slice_granularity() const noexcept { return kind == layer_kind::conv ? filters * depth : 1; }

  /// The paper's slice size K = W*D*F for conv (one kernel row, e.g. 768 for
  /// (3,3,16,16)); for a dense tensor the whole tensor capped at 1024, which
  /// keeps the K x K PCA cheap (docs/codecs.md).
  std::size_t default_slice_size() const noexcept {
    if (kind == layer_kind::conv) return width * depth * filters;
    return std::max<std::size_t>(1, std::min<std::size_t>(length, 1024));
  }
};

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Position of framework element (f, d, h, w) of a conv layer in the GradiVeQ order (Fig. 3a).
inline std::size_t gradiveq_index(const layer_shape& s, std::size_t f, std::size_t d, std::size_t h,
                                  std::size_t w) noexcept {
  return ((h * s.width + w) * s.depth + d) * s.filters + f;
}

/// Position of element (f, d, h, w) in the framework layout [F, D, H, W].
inline std::size_t framework_index(const layer_shape& s, std::size_t f, std::size_t d, std::size_t h,
                                   std::size_t w) noexcept {
  return ((f * s.depth + d) * s.height + h) * s.width + w;
}

GRADCOMP_ABI_NAMESPACE_END
namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN
inline void check_layout_sizes(const char* where, const layer_shape& s, std::size_t in, std::size_t out) {
  if (in != s.size()) throw size_mismatch_error(std::string(where) + ": input", s.size(), in);
  if (out != s.size()) throw size_mismatch_error(std::string(where) + ": output", s.size(), out);
}
inline bool overlaps(std::span<const float> a, std::span<float> b) noexcept {
  if (a.empty() || b.empty()) return false;
  const float* a0 = a.data();
  const float* b0 = b.data();
  return std::less<const float*>{}(a0, b0 + b.size()) && std::less<const float*>{}(b0, a0 + a.size());
}
GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN
/// flatten_gradiveq (Inverse: unflatten_gradiveq). Source [F][D][P] (P = H*W
/// positions), destination [P][D][F] (Inverse: the other way round): for each
/// depth a transpose of the F x P block, tiled so both sides stay in cache.
/// Each direction keeps its own loop order inside a tile: writes run along
/// the destination's contiguous dimension.
template <bool Inverse>
void gradiveq_transpose(const char* who, const layer_shape& s, std::span<const float> in, std::span<float> out) {
  check_layout_sizes(who, s, in.size(), out.size());
  if (overlaps(in, out)) throw invalid_argument_error(std::string(who) + ": input and output overlap");
  if (s.kind != layer_kind::conv) {
    std::copy(in.begin(), in.end(), out.begin());
    return;
  }
  const std::size_t F = s.filters, D = s.depth, P = s.height * s.width;
  constexpr std::size_t tile = 32;
  for (std::size_t d = 0; d < D; ++d)
    for (std::size_t f0 = 0; f0 < F; f0 += tile)
      for (std::size_t p0 = 0; p0 < P; p0 += tile) {
        const std::size_t f1 = std::min(F, f0 + tile), p1 = std::min(P, p0 + tile);
        if constexpr (Inverse) {
          for (std::size_t f = f0; f < f1; ++f)
            for (std::size_t p = p0; p < p1; ++p) out[(f * D + d) * P + p] = in[(p * D + d) * F + f];
        } else {
          for (std::size_t p = p0; p < p1; ++p)
            for (std::size_t f = f0; f < f1; ++f) out[(p * D + d) * F + f] = in[(f * D + d) * P + p];
        }
      }
}
GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

GRADCOMP_ABI_NAMESPACE_BEGIN
/// Reorders a layer gradient from the framework layout into the GradiVeQ
/// layout (Fig. 3a): out[gradiveq_index(f,d,h,w)] = in[framework_index(f,d,h,w)].
/// Dense layers are copied unchanged. `in` and `out` must not overlap.
inline void flatten_gradiveq(const layer_shape& s, std::span<const float> in, std::span<float> out) {
  detail::gradiveq_transpose<false>("flatten_gradiveq", s, in, out);
}

/// The exact inverse of flatten_gradiveq: GradiVeQ layout back to [F, D, H, W].
inline void unflatten_gradiveq(const layer_shape& s, std::span<const float> in, std::span<float> out) {
  detail::gradiveq_transpose<true>("unflatten_gradiveq", s, in, out);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
