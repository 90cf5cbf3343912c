#pragma once
/// \file abi.hpp
/// The ABI namespace: an inline namespace, named after the instruction-set
/// configuration of the translation unit, that holds everything whose machine
/// code depends on that configuration (docs/architecture.md, "The ABI
/// namespace"). It follows nlohmann/json's abi_macros.hpp: the tag is pasted
/// together from one component per feature.
///
/// Why: gradcomp is header-only, so every kernel is an inline function or a
/// template instantiation, emitted as a weak symbol in each object file that
/// uses it. A unit built with `-mavx2 -mfma` and xsimd and one built without
/// would define the same symbol (say `two_bit_quantizer<execution::seq>::encode`)
/// with different bodies, and the linker would keep either one: the baseline
/// unit could run AVX2 code, or the AVX2 unit the baseline kernel. With the
/// policy tags (execution::seq, simd, thrust<P>) and every kernel inside
/// `gradcomp::execution::GRADCOMP_ABI_TAG`, each configuration instantiates
/// its own symbols (`gradcomp::two_bit_quantizer<gradcomp::execution::abi_v0_1_avx2_fma_xsimd::seq>`),
/// and source code keeps naming `gradcomp::execution::seq`.
///
/// Outside the namespace stay the payload types, the wire format and the
/// codec class templates: they are the contract between differently built
/// units (a payload or a saved state made by one is read by the other).
/// Their inline functions whose code the compiler may vectorise (payload
/// validation loops, serialization, error messages) take a last template
/// parameter `class AbiMarker = execution::abi_marker`: the function, not the
/// type, then has a symbol per configuration. (GCC's abi_tag attribute would
/// do it for plain functions, but GCC ignores it on function templates.)
///
/// Macros (all documented here). Private helpers, which stay defined because
/// GRADCOMP_ABI_TAG expands through them where it is used:
/// GRADCOMP_ABI_FEATURE_* (one tag component each, or nothing),
/// GRADCOMP_ABI_CONCAT(_EX), GRADCOMP_ABI_VERSION(_EX), GRADCOMP_ABI_STRINGIFY(_EX).
/// Public:
///   GRADCOMP_VERSION_MAJOR / _MINOR / _PATCH   the library version (CMake checks it against project()).
///   GRADCOMP_ABI_TAG            the namespace name, e.g. abi_v0_1_avx2_fma_xsimd. A build may
///                               predefine it to pin one name; then it alone answers for mixing flags.
///   GRADCOMP_ABI_TAG_STRING     the same, as a string literal.
///   GRADCOMP_ABI_NAMESPACE_BEGIN / _END   open and close the inline namespace; used inside
///                               `namespace gradcomp::execution { ... }` (kernels), `gradcomp::wire`
///                               (its functions), every `detail` namespace (helpers), and `gradcomp`,
///                               `gradcomp::tags`, `gradcomp::nn1d`, `gradcomp::transport` (free functions
///                               and implementation classes, docs/architecture.md), never at global scope.
///
/// Components, in order: avx512f, avx512bw, avx512dq, avx512vl, avx2, avx, fma, f16c, sse4_2,
/// neon, sve (the instruction sets the compiler may use), xsimd (GRADCOMP_HAS_XSIMD:
/// the simd policy runs xsimd kernels), thrust (GRADCOMP_HAS_THRUST), cuda (compiled by nvcc).

#define GRADCOMP_VERSION_MAJOR 0
#define GRADCOMP_VERSION_MINOR 1
#define GRADCOMP_VERSION_PATCH 0

#if defined(__AVX512F__)
#define GRADCOMP_ABI_FEATURE_AVX512F _avx512f
#else
#define GRADCOMP_ABI_FEATURE_AVX512F
#endif
#if defined(__AVX512BW__)
#define GRADCOMP_ABI_FEATURE_AVX512BW _avx512bw
#else
#define GRADCOMP_ABI_FEATURE_AVX512BW
#endif
#if defined(__AVX512DQ__)
#define GRADCOMP_ABI_FEATURE_AVX512DQ _avx512dq
#else
#define GRADCOMP_ABI_FEATURE_AVX512DQ
#endif
#if defined(__AVX512VL__)
#define GRADCOMP_ABI_FEATURE_AVX512VL _avx512vl
#else
#define GRADCOMP_ABI_FEATURE_AVX512VL
#endif
#if defined(__AVX2__)
#define GRADCOMP_ABI_FEATURE_AVX2 _avx2
#else
#define GRADCOMP_ABI_FEATURE_AVX2
#endif
#if defined(__AVX__) && !defined(__AVX2__)
#define GRADCOMP_ABI_FEATURE_AVX _avx
#else
#define GRADCOMP_ABI_FEATURE_AVX
#endif
#if defined(__FMA__)
#define GRADCOMP_ABI_FEATURE_FMA _fma
#else
#define GRADCOMP_ABI_FEATURE_FMA
#endif
#if defined(__F16C__)
#define GRADCOMP_ABI_FEATURE_F16C _f16c
#else
#define GRADCOMP_ABI_FEATURE_F16C
#endif
#if defined(__SSE4_2__) && !defined(__AVX__)
#define GRADCOMP_ABI_FEATURE_SSE42 _sse4_2
#else
#define GRADCOMP_ABI_FEATURE_SSE42
#endif
#if defined(__ARM_NEON)
#define GRADCOMP_ABI_FEATURE_NEON _neon
#else
#define GRADCOMP_ABI_FEATURE_NEON
#endif
#if defined(__ARM_FEATURE_SVE)
#define GRADCOMP_ABI_FEATURE_SVE _sve
#else
#define GRADCOMP_ABI_FEATURE_SVE
#endif
#if defined(GRADCOMP_HAS_XSIMD)
#define GRADCOMP_ABI_FEATURE_XSIMD _xsimd
#else
#define GRADCOMP_ABI_FEATURE_XSIMD
#endif
#if defined(GRADCOMP_HAS_THRUST)
#define GRADCOMP_ABI_FEATURE_THRUST _thrust
#else
#define GRADCOMP_ABI_FEATURE_THRUST
#endif
#if defined(__CUDACC__)
#define GRADCOMP_ABI_FEATURE_CUDA _cuda
#else
#define GRADCOMP_ABI_FEATURE_CUDA
#endif

// Token pasting with empty components (placemarkers) yields one identifier.
#define GRADCOMP_ABI_CONCAT_EX(v, a, b, c, d, e, f, g, h, i, j, k, x, t, u) \
  v##a##b##c##d##e##f##g##h##i##j##k##x##t##u
#define GRADCOMP_ABI_CONCAT(v, a, b, c, d, e, f, g, h, i, j, k, x, t, u) \
  GRADCOMP_ABI_CONCAT_EX(v, a, b, c, d, e, f, g, h, i, j, k, x, t, u)
#define GRADCOMP_ABI_VERSION_EX(major, minor) abi_v##major##_##minor
#define GRADCOMP_ABI_VERSION(major, minor) GRADCOMP_ABI_VERSION_EX(major, minor)
#define GRADCOMP_ABI_STRINGIFY_EX(x) #x
#define GRADCOMP_ABI_STRINGIFY(x) GRADCOMP_ABI_STRINGIFY_EX(x)

#if !defined(GRADCOMP_ABI_TAG)
#define GRADCOMP_ABI_TAG                                                                                    \
  GRADCOMP_ABI_CONCAT(GRADCOMP_ABI_VERSION(GRADCOMP_VERSION_MAJOR, GRADCOMP_VERSION_MINOR),                \
                      GRADCOMP_ABI_FEATURE_AVX512F, GRADCOMP_ABI_FEATURE_AVX512BW,                          \
                      GRADCOMP_ABI_FEATURE_AVX512DQ, GRADCOMP_ABI_FEATURE_AVX512VL, GRADCOMP_ABI_FEATURE_AVX2, \
                      GRADCOMP_ABI_FEATURE_AVX, GRADCOMP_ABI_FEATURE_FMA, GRADCOMP_ABI_FEATURE_F16C,        \
                      GRADCOMP_ABI_FEATURE_SSE42, GRADCOMP_ABI_FEATURE_NEON, GRADCOMP_ABI_FEATURE_SVE,      \
                      GRADCOMP_ABI_FEATURE_XSIMD, GRADCOMP_ABI_FEATURE_THRUST, GRADCOMP_ABI_FEATURE_CUDA)
#endif

#define GRADCOMP_ABI_TAG_STRING GRADCOMP_ABI_STRINGIFY(GRADCOMP_ABI_TAG)

#define GRADCOMP_ABI_NAMESPACE_BEGIN inline namespace GRADCOMP_ABI_TAG {
#define GRADCOMP_ABI_NAMESPACE_END }

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN
/// The ABI tag of this translation unit's configuration (the inline namespace's name).
inline constexpr const char abi_tag[] = GRADCOMP_ABI_TAG_STRING;
/// An empty type per configuration: the default of the last template
/// parameter of functions outside the ABI namespace whose code depends on the
/// instruction set, so each configuration instantiates its own copy.
struct abi_marker {};
GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
