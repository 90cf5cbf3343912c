#pragma once
/// \file lgc/windows.hpp
/// Cutting the LGC autoencoder's input into windows: window count,
/// per-window RMS scales, and the scaled, zero-padded window matrix.

// nn1d.hpp first: its diagnostic pragma must be active when Eigen is first included.
#include <gradcomp/nn1d.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Number of windows for n values: ceil(n / w).
[[nodiscard]] inline std::size_t lgc_window_count(std::size_t n, std::size_t w) noexcept { return (n + w - 1) / w; }

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

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

}  // namespace gradcomp
