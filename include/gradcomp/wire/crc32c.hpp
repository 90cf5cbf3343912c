#pragma once
/// \file wire/crc32c.hpp
/// CRC-32C (Castagnoli), the checksum of every wire message (wire.hpp):
/// the SSE4.2 instruction where the CPU has it (three chains at once on
/// large buffers), a slicing-by-8 table otherwise. Part of <gradcomp/wire.hpp>.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include <gradcomp/abi.hpp>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define GRADCOMP_WIRE_HW_CRC32C 1
#endif

namespace gradcomp::wire {

// CRC-32C (Castagnoli): SSE4.2 instruction when the CPU has it, table otherwise.

GRADCOMP_ABI_NAMESPACE_BEGIN
namespace detail {

inline const std::array<std::array<std::uint32_t, 256>, 8>& crc32c_tables() noexcept {
  static const auto tables = [] {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (std::size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
    return t;
  }();
  return tables;
}

/// Slicing-by-8 software CRC-32C on the un-inverted running value.
inline std::uint32_t crc32c_update_soft(std::uint32_t crc, const unsigned char* p, std::size_t n) noexcept {
  const auto& t = crc32c_tables();
  while (n >= 8) {
    std::uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    if constexpr (std::endian::native == std::endian::big) {
      lo = __builtin_bswap32(lo);
      hi = __builtin_bswap32(hi);
    }
    lo ^= crc;
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
          t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFFu];
  return crc;
}

/// a * b modulo the CRC-32C polynomial, in the CRC's bit-reflected form
/// (bit 31 is x^0).
inline std::uint32_t crc32c_multiply(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t product = 0;
  for (int i = 0; i < 32; ++i) {
    if (a & (0x80000000u >> i)) product ^= b;
    b = (b >> 1) ^ (0x82F63B78u & (0u - (b & 1u)));  // b * x
  }
  return product;
}

/// x^(8 n) modulo the polynomial: what n zero bytes do to a running CRC
/// (products of x^(8 * 2^k), k < 64, tabulated once).
inline std::uint32_t crc32c_zeros_operator(std::size_t n) noexcept {
  static const auto powers = [] {
    std::array<std::uint32_t, 64> t{};
    t[0] = 0x00800000u;  // x^8
    for (std::size_t k = 1; k < t.size(); ++k) t[k] = crc32c_multiply(t[k - 1], t[k - 1]);
    return t;
  }();
  std::uint32_t r = 0x80000000u;  // x^0
  for (std::size_t k = 0; n != 0; ++k, n >>= 1)
    if (n & 1u) r = crc32c_multiply(r, powers[k]);
  return r;
}

/// The running CRC after `crc`'s bytes, then n bytes whose CRC from a zero
/// running value is `next` (CRC-32C is linear: the two parts combine).
inline std::uint32_t crc32c_join(std::uint32_t crc, std::uint32_t next, std::size_t n) noexcept {
  return crc32c_multiply(crc, crc32c_zeros_operator(n)) ^ next;
}

#if defined(GRADCOMP_WIRE_HW_CRC32C)
/// Buffers from this size on run three CRC chains at once, joined at the end
/// (the instruction's latency is 3 cycles, its throughput 1 a cycle:
/// measured 7.1 GB/s for one chain).
inline constexpr std::size_t crc32c_parallel_min = std::size_t(1) << 14;

__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_update_hw(std::uint32_t crc, const unsigned char* p,
                                                                         std::size_t n) noexcept {
  std::uint64_t c = crc;
  if (n >= crc32c_parallel_min) {
    const std::size_t third = n / 3 / 8 * 8;
    const unsigned char* p1 = p + third;
    const unsigned char* p2 = p1 + third;
    std::uint64_t c1 = 0, c2 = 0;
    for (std::size_t i = 0; i < third; i += 8) {
      std::uint64_t v0, v1, v2;
      std::memcpy(&v0, p + i, 8);
      std::memcpy(&v1, p1 + i, 8);
      std::memcpy(&v2, p2 + i, 8);
      c = _mm_crc32_u64(c, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    c = crc32c_join(crc32c_join(static_cast<std::uint32_t>(c), static_cast<std::uint32_t>(c1), third),
                    static_cast<std::uint32_t>(c2), third);
    p += 3 * third;
    n -= 3 * third;
  }
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

inline bool cpu_has_sse42() noexcept {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace detail

/// Continue a CRC-32C over more bytes. Start with crc = 0.
inline std::uint32_t crc32c(std::uint32_t crc, std::span<const std::byte> bytes) noexcept {
  auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  crc = ~crc;
#if defined(GRADCOMP_WIRE_HW_CRC32C)
  if (detail::cpu_has_sse42()) return ~detail::crc32c_update_hw(crc, p, bytes.size());
#endif
  return ~detail::crc32c_update_soft(crc, p, bytes.size());
}
GRADCOMP_ABI_NAMESPACE_END

}  // namespace gradcomp::wire
