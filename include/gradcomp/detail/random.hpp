#pragma once
/// \file detail/random.hpp
/// Counter-based random numbers: every draw is a pure function of
/// (seed, stream, index), so a result never depends on the thread count, the
/// order in which elements are visited or the SIMD width.
///
///     counter_rng rng(seed);
///     counter_stream s = rng.stream(step);   // one stream per training step
///     float u = s.uniform_float(i);          // draw for element i, in [0, 1)
///
/// Two generators live here, both keyed by the stream:
///  - `bits32(i)`: two rounds of Wellons' lowbias32 bijection over the 64-bit
///    index, keyed by the stream key. Only 32-bit multiplies, xor and shifts,
///    so SIMD kernels evaluate the same function lane by lane: `bits32_lanes`
///    is a template that accepts uint32_t or an xsimd::batch<uint32_t>, and a
///    vectorised kernel reproduces the scalar draws bit for bit.
///  - `bits64(i)`: splitmix64 (Steele, Lea & Flood, OOPSLA 2014) at position i
///    of the stream, for scalar users that need 64 bits (sampled thresholds,
///    random indices through `below`).
/// Within one stream and one 2^32-aligned chunk of indices, bits32 is a
/// permutation of the 32-bit values (a composition of bijections); distinct
/// steps of one seed always get distinct stream keys.
///
/// This is not a cryptographic generator: it is for stochastic rounding and
/// sampling, where its statistics are tested (tests/unit/test_random.cpp).

#include <cstdint>

#include <gradcomp/abi.hpp>

// In the ABI namespace (abi.hpp): the generators are inlined into kernels,
// and their code depends on the instruction set like the kernels'.
namespace gradcomp::detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// splitmix64's output function (Stafford's Mix13 constants): a bijection on
/// 64-bit words with full avalanche.
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// GCC 12 warns -Wuninitialized inside its own AVX-512 shift intrinsics
// (_mm512_undefined_epi32, GCC bug 105593) when xsimd's batch >> int is
// inlined here; the warning is spurious, so it is silenced for mix32 only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
/// lowbias32 (C. Wellons, "Hash function prospector", 2018): a bijection on
/// 32-bit words. U is std::uint32_t or a SIMD batch of uint32 lanes with
/// wrapping *, ^ and >> (xsimd::batch<uint32_t>): one definition for both.
template <class U>
constexpr U mix32(U x) noexcept {
  x = x ^ (x >> 16);
  x = x * U(0x7FEB352Du);
  x = x ^ (x >> 15);
  x = x * U(0x846CA68Bu);
  x = x ^ (x >> 16);
  return x;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/// High 64 bits of the 128-bit product a*b (portable, no __int128).
constexpr std::uint64_t mulhi64(std::uint64_t a, std::uint64_t b) noexcept {
  const std::uint64_t a_lo = a & 0xFFFFFFFFu, a_hi = a >> 32;
  const std::uint64_t b_lo = b & 0xFFFFFFFFu, b_hi = b >> 32;
  const std::uint64_t lo_lo = a_lo * b_lo;
  const std::uint64_t hi_lo = a_hi * b_lo;
  const std::uint64_t lo_hi = a_lo * b_hi;
  const std::uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFu) + lo_hi;
  return a_hi * b_hi + (hi_lo >> 32) + (cross >> 32);
}

/// One random stream of a counter_rng (typically one training step): draws
/// are pure functions of the stream key and the element index.
class counter_stream {
 public:
  /// The stream of a 64-bit key (see counter_rng::stream for how keys are made).
  constexpr explicit counter_stream(std::uint64_t key) noexcept : key_(key) {}

  constexpr std::uint64_t key() const noexcept { return key_; }
  /// Low and high halves of the key, the constants of bits32_lanes.
  constexpr std::uint32_t key_lo() const noexcept { return static_cast<std::uint32_t>(key_); }
  constexpr std::uint32_t key_hi() const noexcept { return static_cast<std::uint32_t>(key_ >> 32); }

  /// 32 random bits for index (lo + 2^32 hi), evaluated lane-wise when U is a
  /// SIMD batch. `lo`/`hi` are the two halves of the index.
  template <class U>
  static constexpr U bits32_lanes(U lo, U hi, std::uint32_t k_lo, std::uint32_t k_hi) noexcept {
    U x = mix32<U>(lo ^ U(k_lo));
    x = x ^ U(k_hi) ^ (hi * U(0x9E3779B9u));
    return mix32<U>(x);
  }

  /// 32 random bits for element `index`.
  constexpr std::uint32_t bits32(std::uint64_t index) const noexcept {
    return bits32_lanes<std::uint32_t>(static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                                       key_lo(), key_hi());
  }

  /// A float uniform on [0, 1): the top 24 bits of bits32 times 2^-24, so
  /// every value is exact and a SIMD kernel computes it identically.
  constexpr float uniform_float(std::uint64_t index) const noexcept {
    return static_cast<float>(bits32(index) >> 8) * 0x1p-24f;
  }

  /// 64 random bits for element `index` (splitmix64 at position index + 1).
  constexpr std::uint64_t bits64(std::uint64_t index) const noexcept {
    return mix64(key_ + (index + 1) * 0x9E3779B97F4A7C15ull);
  }

  /// A double uniform on [0, 1) with 53 random bits.
  constexpr double uniform_double(std::uint64_t index) const noexcept {
    return static_cast<double>(bits64(index) >> 11) * 0x1p-53;
  }

  /// An integer in [0, bound) for bound >= 1 (Lemire's multiply-shift; its
  /// bias is below bound / 2^64, far under any test's resolution). 0 if bound == 0.
  constexpr std::uint64_t below(std::uint64_t index, std::uint64_t bound) const noexcept {
    return mulhi64(bits64(index), bound);
  }

 private:
  std::uint64_t key_;
};

/// A seeded counter-based generator: `stream(t)` gives the independent
/// stream of step t. Copyable, stateless apart from the seed, thread-safe.
class counter_rng {
 public:
  constexpr explicit counter_rng(std::uint64_t seed = 0) noexcept : seed_(seed) {}

  constexpr std::uint64_t seed() const noexcept { return seed_; }

  /// The stream of `stream_id` (e.g. the step number). For one seed the map
  /// stream_id -> key is a bijection, so two steps never share a stream.
  constexpr counter_stream stream(std::uint64_t stream_id) const noexcept {
    return counter_stream(mix64(mix64(seed_ ^ 0x6A09E667F3BCC909ull) ^ stream_id));
  }

 private:
  std::uint64_t seed_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::detail
