#pragma once
/// \file system/f16c/half.hpp
/// The fp16 bulk kernels with x86's F16C instructions (vcvtps2ph with
/// round-to-nearest-even, vcvtph2ps), 8 values per instruction. Only
/// compiled when the translation unit targets F16C (__F16C__, e.g. -mf16c or
/// -march=native); they live in the ABI namespace, whose tag then carries
/// `_f16c`. Bit-identical to the portable kernels of system/generic/half.hpp
/// (tests/unit/test_summable.cpp compares them over all 65536 fp16 patterns
/// and a sweep of float patterns): saturation is a clamp before the
/// conversion, with the operands ordered so that a NaN passes through.
/// Debian's xsimd 8.1 has no fp16 conversion, hence the intrinsics.

/// Without __F16C__ this header declares nothing.
#if defined(__F16C__)

#include <cstddef>
#include <cstdint>
#include <span>

#include <immintrin.h>

#include <gradcomp/abi.hpp>
#include <gradcomp/system/generic/half.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace f16c_detail {
/// min(max(x, -65504), 65504) with NaN kept (minps/maxps return the second operand on NaN).
inline __m256 clamp_half(__m256 x) noexcept {
  const __m256 hi = _mm256_set1_ps(half_max), lo = _mm256_set1_ps(-half_max);
  return _mm256_max_ps(lo, _mm256_min_ps(hi, x));
}
inline __m128i to_half(__m256 x) noexcept {
  return _mm256_cvtps_ph(clamp_half(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline __m256 round_half(__m256 x) noexcept { return _mm256_cvtph_ps(to_half(x)); }
inline __m128i load8(const std::uint16_t* p) noexcept { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline void store8(std::uint16_t* p, __m128i v) noexcept { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }
}  // namespace f16c_detail

/// out[i] = fp16 bits of in[i], saturated (F16C).
inline void floats_to_half_f16c(std::span<const float> in, std::span<std::uint16_t> out) noexcept {
  const std::size_t n = in.size(), v = n - n % 8;
  for (std::size_t i = 0; i < v; i += 8) f16c_detail::store8(out.data() + i, f16c_detail::to_half(_mm256_loadu_ps(in.data() + i)));
  floats_to_half_portable(in.subspan(v), out.subspan(v));
}
/// out[i] = the float of fp16 bits in[i] (F16C).
inline void half_to_floats_f16c(std::span<const std::uint16_t> in, std::span<float> out) noexcept {
  const std::size_t n = in.size(), v = n - n % 8;
  for (std::size_t i = 0; i < v; i += 8) _mm256_storeu_ps(out.data() + i, _mm256_cvtph_ps(f16c_detail::load8(in.data() + i)));
  half_to_floats_portable(in.subspan(v), out.subspan(v));
}
/// acc[i] = round_to_half(acc[i] + in[i]) (F16C).
inline void add_round_half_f16c(std::span<float> acc, std::span<const float> in) noexcept {
  const std::size_t n = acc.size(), v = n - n % 8;
  for (std::size_t i = 0; i < v; i += 8)
    _mm256_storeu_ps(acc.data() + i,
                     f16c_detail::round_half(_mm256_add_ps(_mm256_loadu_ps(acc.data() + i), _mm256_loadu_ps(in.data() + i))));
  add_round_half_portable(acc.subspan(v), in.subspan(v));
}
/// acc[i] = round_to_half(acc[i] + float(in[i])), in[i] fp16 bits (F16C).
inline void add_half_bits_round_f16c(std::span<float> acc, std::span<const std::uint16_t> in) noexcept {
  const std::size_t n = acc.size(), v = n - n % 8;
  for (std::size_t i = 0; i < v; i += 8)
    _mm256_storeu_ps(acc.data() + i, f16c_detail::round_half(_mm256_add_ps(
                                         _mm256_loadu_ps(acc.data() + i), _mm256_cvtph_ps(f16c_detail::load8(in.data() + i)))));
  add_half_bits_round_portable(acc.subspan(v), in.subspan(v));
}
/// x[i] = round_to_half(x[i]) in place (F16C).
inline void round_half_f16c(std::span<float> x) noexcept {
  const std::size_t n = x.size(), v = n - n % 8;
  for (std::size_t i = 0; i < v; i += 8)
    _mm256_storeu_ps(x.data() + i, f16c_detail::round_half(_mm256_loadu_ps(x.data() + i)));
  round_half_portable(x.subspan(v));
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
#endif  // __F16C__
