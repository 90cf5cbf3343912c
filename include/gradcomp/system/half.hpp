#pragma once
/// \file system/half.hpp
/// The fp16 and bfloat16 bulk kernels of this translation unit's
/// configuration: F16C (system/f16c/half.hpp) for fp16 when the unit targets
/// it (__F16C__), the portable ones (system/generic/half.hpp) otherwise; both
/// give the same bits. bfloat16 needs integer operations only, which the
/// compiler vectorises: portable everywhere.

#include <cstdint>
#include <span>

#include <gradcomp/abi.hpp>
#include <gradcomp/system/generic/half.hpp>
#if defined(__F16C__)
#include <gradcomp/system/f16c/half.hpp>
#endif

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// True when this unit's fp16 kernels use F16C.
#if defined(__F16C__)
inline constexpr bool half_f16c = true;
#else
inline constexpr bool half_f16c = false;
#endif

/// out[i] = fp16 bits of in[i], round to nearest even, saturated at +-65504.
inline void floats_to_half(std::span<const float> in, std::span<std::uint16_t> out) noexcept {
#if defined(__F16C__)
  floats_to_half_f16c(in, out);
#else
  floats_to_half_portable(in, out);
#endif
}
/// out[i] = the float of fp16 bits in[i] (exact).
inline void half_to_floats(std::span<const std::uint16_t> in, std::span<float> out) noexcept {
#if defined(__F16C__)
  half_to_floats_f16c(in, out);
#else
  half_to_floats_portable(in, out);
#endif
}
/// acc[i] = round_to_half(acc[i] + in[i]).
inline void add_round_half(std::span<float> acc, std::span<const float> in) noexcept {
#if defined(__F16C__)
  add_round_half_f16c(acc, in);
#else
  add_round_half_portable(acc, in);
#endif
}
/// acc[i] = round_to_half(acc[i] + float(in[i])), in[i] fp16 bits.
inline void add_half_bits_round(std::span<float> acc, std::span<const std::uint16_t> in) noexcept {
#if defined(__F16C__)
  add_half_bits_round_f16c(acc, in);
#else
  add_half_bits_round_portable(acc, in);
#endif
}
/// x[i] = round_to_half(x[i]) in place.
inline void round_half(std::span<float> x) noexcept {
#if defined(__F16C__)
  round_half_f16c(x);
#else
  round_half_portable(x);
#endif
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
