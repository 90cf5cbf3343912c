#pragma once
/// \file system/simd/sparsify.hpp
/// xsimd (execution::simd) overloads of the sparsifying codecs' fused
/// update-and-select kernels. Bit-identical to the generic ones: a*y and b*x
/// are separate multiplications followed by an addition in both, and the
/// selection compares the same integer keys.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <gradcomp/detail/policy_tags.hpp>

#include <xsimd/xsimd.hpp>

#include <gradcomp/system/generic/sparsify.hpp>
#include <gradcomp/system/simd/topk.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace sparsify_simd_detail {
using topk_simd_detail::fbatch;
using topk_simd_detail::ibatch;
using topk_simd_detail::width;

/// Batch form of sparsify_detail::no_contract (the register passes through an
/// empty asm, so the product is rounded before the addition).
inline void no_contract(fbatch& v) noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+x"(v.data));
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
  asm("" : "+w"(v.data));
#else
  (void)v;  // other compilers do not contract across statements by default
#endif
}

inline fbatch axpby(const fbatch& a, const fbatch& y, const fbatch& b, const fbatch& x) noexcept {
  fbatch ay = a * y;
  fbatch bx = b * x;
  no_contract(ay);
  no_contract(bx);
  return ay + bx;
}
}  // namespace sparsify_simd_detail

/// Vectorised axpby_update.
inline void axpby_update(simd, std::span<float> y, std::span<const float> x, float a, float b) noexcept {
  using namespace sparsify_simd_detail;
  const fbatch ab(a), bb(b);
  const std::size_t n = y.size();
  const std::size_t vec_end = n - n % width;
  float* py = y.data();
  const float* px = x.data();
  for (std::size_t i = 0; i < vec_end; i += width)
    axpby(ab, xsimd::load_unaligned(py + i), bb, xsimd::load_unaligned(px + i)).store_unaligned(py + i);
  for (std::size_t i = vec_end; i < n; ++i) py[i] = sparsify_detail::axpby(a, py[i], b, px[i]);
}

/// Vectorised axpby_histogram: a block is updated with SIMD, then its keys
/// are counted by the scalar loop while the block is in L1 (reading back the
/// just-stored batch lane by lane would stall on store forwarding).
inline void axpby_histogram(simd, std::span<float> y, std::span<const float> x, float a, float b,
                            topk_workspace& ws) {
  using namespace sparsify_simd_detail;
  constexpr std::size_t stride = topk_bins + 1;
  constexpr std::size_t block = 256;
  static_assert(block % width == 0 && block % topk_sub_histograms == 0);
  std::uint32_t* sub = ws.sub.data();
  const fbatch ab(a), bb(b);
  const std::size_t n = y.size();
  const std::size_t blocks_end = n - n % block;
  float* py = y.data();
  const float* px = x.data();
  for (std::size_t i0 = 0; i0 < blocks_end; i0 += block) {
    for (std::size_t i = i0; i < i0 + block; i += width)
      axpby(ab, xsimd::load_unaligned(py + i), bb, xsimd::load_unaligned(px + i)).store_unaligned(py + i);
    for (std::size_t i = i0; i < i0 + block; i += topk_sub_histograms)
      for (std::size_t h = 0; h < topk_sub_histograms; ++h)
        ++sub[h * stride + (topk_key(py[i + h]) >> topk_level_shift[0])];
  }
  for (std::size_t i = blocks_end; i < n; ++i) {
    const float v = sparsify_detail::axpby(a, py[i], b, px[i]);
    py[i] = v;
    ++sub[topk_key(v) >> topk_level_shift[0]];
  }
  topk_detail::reduce_sub_histograms(ws);
}

/// Vectorised axpby_collect_ge: one pass that updates, tests a batch against
/// the threshold and only looks at lanes of batches holding a candidate.
inline void axpby_collect_ge(simd, std::span<float> y, std::span<const float> x, float a, float b,
                             std::uint32_t key_lo, float s, std::vector<std::uint32_t>& out) {
  using namespace sparsify_simd_detail;
  const fbatch ab(a), bb(b), sb(s);
  const ibatch lo(static_cast<std::int32_t>(key_lo));
  const bool scale = s != 1.0f;
  const std::size_t n = y.size();
  const std::size_t vec_end = n - n % width;
  float* py = y.data();
  const float* px = x.data();
  for (std::size_t i = 0; i < vec_end; i += width) {
    const fbatch v = axpby(ab, xsimd::load_unaligned(py + i), bb, xsimd::load_unaligned(px + i));
    const auto hit = topk_simd_detail::keys_of(v) >= lo;
    if (!scale) {
      v.store_unaligned(py + i);
      if (xsimd::any(hit))
        for (std::uint32_t bits = topk_simd_detail::lane_bits(hit); bits != 0; bits &= bits - 1)
          out.push_back(static_cast<std::uint32_t>(i + static_cast<std::size_t>(std::countr_zero(bits))));
      continue;
    }
    if (!xsimd::any(hit)) {
      (v * sb).store_unaligned(py + i);
      continue;
    }
    // Keep the candidates as updated, scale the others.
    xsimd::select(xsimd::bool_cast(hit), v, v * sb).store_unaligned(py + i);
    for (std::uint32_t bits = topk_simd_detail::lane_bits(hit); bits != 0; bits &= bits - 1)
      out.push_back(static_cast<std::uint32_t>(i + static_cast<std::size_t>(std::countr_zero(bits))));
  }
  for (std::size_t i = vec_end; i < n; ++i) {
    const float v = sparsify_detail::axpby(a, py[i], b, px[i]);
    if (topk_key(v) >= key_lo) {
      py[i] = v;
      out.push_back(static_cast<std::uint32_t>(i));
    } else {
      py[i] = scale ? v * s : v;
    }
  }
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
