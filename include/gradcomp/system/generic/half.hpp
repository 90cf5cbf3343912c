#pragma once
/// \file system/generic/half.hpp
/// Portable, bit-exact conversions between float32 and the two 16-bit float
/// types (IEEE binary16 "fp16" and bfloat16), and the bulk kernels the
/// summable buffers and the 16-bit codecs run (payloads/summable.hpp,
/// half.hpp). The scalar conversions use integer arithmetic only: no
/// dependence on the rounding mode, flush-to-zero or the compiler's
/// floating-point options; the bulk kernels are their branch-free forms.
///
/// Rounding is to nearest, ties to even (IEEE 754 roundTiesToEven).
///  - fp16: overflow (|x| >= 65520) gives +-Inf; values below 2^-14 become
///    fp16 subnormals (steps of 2^-24), below or at 2^-25 they round to +-0;
///    a NaN stays a NaN: sign kept, quiet bit set, the top 9 payload bits kept
///    (what x86's F16C vcvtps2ph does, so the two paths agree bit for bit).
///  - bfloat16: the top 16 bits of the float after rounding; overflow
///    (|x| >= 0x1.FFp127 rounded up) gives +-Inf; a NaN stays a NaN with the
///    quiet bit set. bfloat16 has float32's exponent range: no other overflow.
///  - The *_saturated forms clamp to +-max first (fp16: 65504; bfloat16:
///    0x1.FEp127), so a finite or infinite input never becomes Inf; NaN stays NaN.
///  - fp16 / bfloat16 to float is exact (fp16 subnormals become normal floats;
///    a NaN keeps its payload with the quiet bit set, as F16C's vcvtph2ps).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include <gradcomp/abi.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Largest finite fp16 value (0x7BFF).
inline constexpr float half_max = 65504.0f;
/// Largest finite bfloat16 value (0x7F7F): 0x1.FEp127.
inline constexpr float bfloat16_max = 0x1.FEp127f;

/// fp16 bits of x, round to nearest even (overflow to Inf; see the file comment).
constexpr std::uint16_t float_to_half_bits(float x) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t ax = u & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));  // NaN
  if (ax >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520 (ties to even: Inf), Inf
  if (ax >= 0x38800000u) {  // normal fp16: >= 2^-14. Rebias the exponent (127 -> 15), round at bit 13.
    std::uint32_t m = ax - 0x38000000u;
    m += 0xFFFu + ((m >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (m >> 13));
  }
  if (ax <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25: ties to even give 0
  // fp16 subnormal: the value in units of 2^-24 is mant * 2^(e - 126), e in [102, 112].
  const std::uint32_t e = ax >> 23;
  const std::uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - e;  // 14 .. 24
  std::uint32_t q = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
  return static_cast<std::uint16_t>(sign | q);  // q == 0x400 is 2^-14, the smallest normal: right encoding
}

/// The float value of fp16 bits (exact).
constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu)  // Inf, or NaN (quiet bit set, payload kept)
    return std::bit_cast<float>(sign | 0x7F800000u | (m << 13) | (m != 0 ? 0x400000u : 0u));
  if (e != 0) return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return std::bit_cast<float>(sign);
  const int s = std::countl_zero(m) - 21;  // m << s has its leading one at bit 10
  const std::uint32_t mm = (m << s) & 0x3FFu;
  return std::bit_cast<float>(sign | ((113u - static_cast<std::uint32_t>(s)) << 23) | (mm << 13));
}

/// fp16 bits of x clamped to [-65504, 65504] (never Inf; NaN stays NaN).
constexpr std::uint16_t float_to_half_bits_saturated(float x) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x477FE000u && (u & 0x7FFFFFFFu) <= 0x7F800000u)
    return static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | 0x7BFFu);
  return float_to_half_bits(x);
}

/// bfloat16 bits of x, round to nearest even (overflow to Inf; NaN quiet).
constexpr std::uint16_t float_to_bfloat16_bits(float x) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/// bfloat16 bits of x clamped to +-bfloat16_max (never Inf; NaN stays NaN).
constexpr std::uint16_t float_to_bfloat16_bits_saturated(float x) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x), ax = u & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  if (ax >= 0x7F7F8000u) return static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | 0x7F7Fu);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/// The float value of bfloat16 bits (exact; a NaN gets its quiet bit).
constexpr float bfloat16_bits_to_float(std::uint16_t h) noexcept {
  std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) u |= 0x400000u;
  return std::bit_cast<float>(u);
}

/// x rounded to the nearest fp16 value, saturated (as a float).
constexpr float round_to_half(float x) noexcept { return half_bits_to_float(float_to_half_bits_saturated(x)); }
/// x rounded to the nearest bfloat16 value, saturated (as a float).
constexpr float round_to_bfloat16(float x) noexcept {
  return bfloat16_bits_to_float(float_to_bfloat16_bits_saturated(x));
}

// Bulk kernels, portable. The per-element bodies below are branch-free
// (selects, integer operations and one exact or correctly rounded float
// addition) so that the compiler vectorises them; they give the bits of the
// scalar functions above (tests/unit/test_summable.cpp) under the default
// rounding mode, which every float addition here assumes anyway. Sizes are
// checked by the callers (equal lengths).

namespace half_detail {
/// All ones when c, else 0.
constexpr std::uint32_t mask(bool c) noexcept { return 0u - static_cast<std::uint32_t>(c); }
/// c ? a : b without a branch.
constexpr std::uint32_t select(std::uint32_t m, std::uint32_t a, std::uint32_t b) noexcept { return (a & m) | (b & ~m); }
}  // namespace half_detail

/// float_to_half_bits_saturated, branch-free.
inline std::uint16_t half_bits_saturated_bulk(float x) noexcept {
  using half_detail::mask;
  using half_detail::select;
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::int32_t ax = static_cast<std::int32_t>(u & 0x7FFFFFFFu);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = select(mask(ax > 0x477FE000), 0x477FE000u, static_cast<std::uint32_t>(ax));  // saturated
  const std::uint32_t m = a - 0x38000000u;
  const std::uint32_t normal = (m + 0xFFFu + ((m >> 13) & 1u)) >> 13;
  // Below 2^-14: adding 0.5 (whose ulp is 2^-24) rounds to the subnormal grid, ties to even.
  const std::uint32_t sub = std::bit_cast<std::uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3F000000u;
  const std::uint32_t mag = select(mask(static_cast<std::int32_t>(a) < 0x38800000), sub, normal);
  const std::uint32_t nan = 0x7E00u | ((static_cast<std::uint32_t>(ax) >> 13) & 0x3FFu);
  return static_cast<std::uint16_t>(sign | select(mask(ax > 0x7F800000), nan, mag));
}
/// half_bits_to_float, branch-free.
inline float half_to_float_bulk(std::uint16_t h) noexcept {
  using half_detail::mask;
  using half_detail::select;
  const std::uint32_t hu = h;
  const std::uint32_t o = ((hu & 0x7FFFu) << 13) + 0x38000000u;  // rebias 15 -> 127
  const std::uint32_t exp = hu & 0x7C00u;
  const std::uint32_t special = mask(exp == 0x7C00u);
  // Inf / NaN: exponent all ones, and the quiet bit for a NaN.
  const std::uint32_t big = (o + 0x38000000u) | select(mask((hu & 0x3FFu) != 0), 0x400000u, 0u);
  // Zero / subnormal: 2^-14 (1 + m / 1024) - 2^-14, exact.
  const std::uint32_t sub =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(o + 0x800000u) - std::bit_cast<float>(113u << 23));
  const std::uint32_t r = select(special, big, select(mask(exp == 0), sub, o));
  return std::bit_cast<float>(r | ((hu & 0x8000u) << 16));
}
/// float_to_bfloat16_bits_saturated, branch-free.
inline std::uint16_t bfloat16_bits_saturated_bulk(float x) noexcept {
  using half_detail::mask;
  using half_detail::select;
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::int32_t ax = static_cast<std::int32_t>(u & 0x7FFFFFFFu);
  const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t top = ((u >> 16) & 0x8000u) | 0x7F7Fu;
  return static_cast<std::uint16_t>(
      select(mask(ax > 0x7F800000), (u >> 16) | 0x40u, select(mask(ax >= 0x7F7F8000), top, rounded)));
}
/// bfloat16_bits_to_float, branch-free.
inline float bfloat16_to_float_bulk(std::uint16_t h) noexcept {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  return std::bit_cast<float>(
      u | half_detail::select(half_detail::mask(static_cast<std::int32_t>(u & 0x7FFFFFFFu) > 0x7F800000), 0x400000u, 0u));
}

/// out[i] = fp16 bits of in[i], saturated.
inline void floats_to_half_portable(std::span<const float> in, std::span<std::uint16_t> out) noexcept {
  const float* a = in.data();
  std::uint16_t* o = out.data();
  for (std::size_t i = 0; i < in.size(); ++i) o[i] = half_bits_saturated_bulk(a[i]);
}
/// out[i] = the float of fp16 bits in[i].
inline void half_to_floats_portable(std::span<const std::uint16_t> in, std::span<float> out) noexcept {
  const std::uint16_t* a = in.data();
  float* o = out.data();
  for (std::size_t i = 0; i < in.size(); ++i) o[i] = half_to_float_bulk(a[i]);
}
/// acc[i] = round_to_half(acc[i] + in[i]): one rounding of the float32 sum (exact
/// for fp16 operands up to the final rounding: 24 >= 2 * 11 + 2 bits).
inline void add_round_half_portable(std::span<float> acc, std::span<const float> in) noexcept {
  float* a = acc.data();
  const float* b = in.data();
  for (std::size_t i = 0; i < acc.size(); ++i) a[i] = half_to_float_bulk(half_bits_saturated_bulk(a[i] + b[i]));
}
/// acc[i] = round_to_half(acc[i] + float(in[i])), in[i] fp16 bits.
inline void add_half_bits_round_portable(std::span<float> acc, std::span<const std::uint16_t> in) noexcept {
  float* a = acc.data();
  const std::uint16_t* b = in.data();
  for (std::size_t i = 0; i < acc.size(); ++i)
    a[i] = half_to_float_bulk(half_bits_saturated_bulk(a[i] + half_to_float_bulk(b[i])));
}
/// x[i] = round_to_half(x[i]) in place.
inline void round_half_portable(std::span<float> x) noexcept {
  float* a = x.data();
  for (std::size_t i = 0; i < x.size(); ++i) a[i] = half_to_float_bulk(half_bits_saturated_bulk(a[i]));
}

/// out[i] = bfloat16 bits of in[i], saturated.
inline void floats_to_bfloat16(std::span<const float> in, std::span<std::uint16_t> out) noexcept {
  const float* a = in.data();
  std::uint16_t* o = out.data();
  for (std::size_t i = 0; i < in.size(); ++i) o[i] = bfloat16_bits_saturated_bulk(a[i]);
}
/// out[i] = the float of bfloat16 bits in[i].
inline void bfloat16_to_floats(std::span<const std::uint16_t> in, std::span<float> out) noexcept {
  const std::uint16_t* a = in.data();
  float* o = out.data();
  for (std::size_t i = 0; i < in.size(); ++i) o[i] = bfloat16_to_float_bulk(a[i]);
}
/// acc[i] = round_to_bfloat16(acc[i] + in[i]) (a float32 overflow saturates too).
inline void add_round_bfloat16(std::span<float> acc, std::span<const float> in) noexcept {
  float* a = acc.data();
  const float* b = in.data();
  for (std::size_t i = 0; i < acc.size(); ++i)
    a[i] = bfloat16_to_float_bulk(bfloat16_bits_saturated_bulk(a[i] + b[i]));
}
/// acc[i] = round_to_bfloat16(acc[i] + float(in[i])), in[i] bfloat16 bits.
inline void add_bfloat16_bits_round(std::span<float> acc, std::span<const std::uint16_t> in) noexcept {
  float* a = acc.data();
  const std::uint16_t* b = in.data();
  for (std::size_t i = 0; i < acc.size(); ++i)
    a[i] = bfloat16_to_float_bulk(bfloat16_bits_saturated_bulk(a[i] + bfloat16_to_float_bulk(b[i])));
}
/// x[i] = round_to_bfloat16(x[i]) in place.
inline void round_bfloat16(std::span<float> x) noexcept {
  float* a = x.data();
  for (std::size_t i = 0; i < x.size(); ++i) a[i] = bfloat16_to_float_bulk(bfloat16_bits_saturated_bulk(a[i]));
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
