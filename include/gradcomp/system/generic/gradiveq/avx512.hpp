#pragma once
/// \file system/generic/gradiveq/avx512.hpp
/// GradiVeQ's seq kernels, part 3 of 3 (see system/generic/gradiveq.hpp):
/// the 512-bit kernels of eqs. 3 and 5 (AVX-512 F, DQ and VL builds), in the
/// reference order: tiles and a packed basis for eq. 3, whole-line
/// streaming for eq. 5.

#include <algorithm>
#include <cstdint>
#include <vector>

#include <gradcomp/system/generic/gradiveq/avx2.hpp>

#if defined(GRADCOMP_GRADIVEQ_AVX512)
namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace gradiveq_kernel {
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's own AVX-512 intrinsics (broadcast, extract) start from
// _mm512_undefined_*, which -Wuninitialized reports once inlined at -O3
// (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// AVX-512: 512-bit vectors compute the very same order. Eq. 3 puts two
// columns' 8 lanes in one register (lanes 0-7 column j, 8-15 column j + 1),
// eq. 5 is vectorised over columns, whose order does not depend on the width.

/// Basis loads of 16 values of one column (load_basis8 in avx2.hpp: of 8):
/// floats, IEEE binary16 values widened to float, or int8 values widened and
/// multiplied by the column's power-of-two scale `s`, for a basis stored at
/// half or quarter width (gradiveq_options::basis_storage), which halves or
/// quarters the basis' memory traffic and gives the same bits as the float
/// kernels on the same values.
inline __m512 load_basis16(const float* p, const float* = nullptr) noexcept { return _mm512_loadu_ps(p); }
inline __m512 load_basis16(const std::uint16_t* p, const float* = nullptr) noexcept {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load_basis16(const std::int8_t* p, const float* s) noexcept {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(*s));
}

/// Eq. 3's register of two columns: lanes 0-7 the 8 values at `a` (column
/// j), 8-15 those at `b` (column j + 1); `s` the 16 lanes' column scales
/// (int8 only).
template <class U>
inline __m512 load_column_pair(const U* a, const U* b, const float*) noexcept {
  return _mm512_insertf32x8(_mm512_castps256_ps512(load_basis8(a)), load_basis8(b), 1);
}
inline __m512 load_column_pair(const std::int8_t* a, const std::int8_t* b, const float* s) noexcept {
  const __m128i q = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                       _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_loadu_ps(s));
}

/// Register blocks: eq. 3 six slices x 8 columns (24 accumulators), eq. 5
/// four slices x 64 columns (16 accumulators).
inline constexpr int compress_block_rows_512 = 6;
inline constexpr int expand_block_rows_512 = 4;

/// Eq. 3 for slices [s, s + R) and columns [j, j + 8), k a multiple of 8.
/// `u`: the basis, or with Packed its pairs of columns interleaved in runs
/// of 8 (pack_column_pairs: one load per register instead of two and a
/// shuffle; measured, 46 MB: 13.8 -> 11.7 ms).
/// `ahead`, `ahead_lines`: lines of input to prefetch into L2, one per
/// iteration over k (spread over the arithmetic: a burst of a whole block's
/// lines stalls the core until the queue drains).
template <int R, bool Packed = false, class U = float>
inline void compress_block8(const float* x, std::size_t s, std::size_t k, const U* u, const float* scales,
                            std::size_t j, std::size_t d, const float* offset, float* y,
                            const float* ahead = nullptr, std::size_t ahead_lines = 0) noexcept {
  __m512 acc[R][4];
  GRADCOMP_GRADIVEQ_UNROLL
  for (int r = 0; r < R; ++r)
    GRADCOMP_GRADIVEQ_UNROLL
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  const U* u0 = u + j * k;
  // int8: each register's 16 lanes' column scales (8 of column j + 2c, 8 of j + 2c + 1).
  alignas(64) float pair_scale[std::is_same_v<U, std::int8_t> ? 4 : 1][16];
  if constexpr (std::is_same_v<U, std::int8_t>)
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 16; ++l) pair_scale[c][l] = scales[j + std::size_t(2 * c + l / 8)];
  for (std::size_t i = 0; i < k; i += 8) {
    if (i / 8 < ahead_lines) _mm_prefetch(reinterpret_cast<const char*>(ahead + 2 * i), _MM_HINT_T1);  // line i / 8
    __m512 v[4];  // columns (j + 2c, j + 2c + 1), lanes i .. i + 7 of each
    GRADCOMP_GRADIVEQ_UNROLL
    for (int c = 0; c < 4; ++c) {
      if constexpr (Packed)
        v[c] = _mm512_loadu_ps(u0 + std::size_t(2 * c) * k + 2 * i);
      else
        v[c] = load_column_pair(u0 + std::size_t(2 * c) * k + i, u0 + std::size_t(2 * c + 1) * k + i,
                                pair_scale[std::is_same_v<U, std::int8_t> ? c : 0]);
      // Built once, used R times: in a register (an input-only constraint:
      // measured 13.5 -> 12.5 ms against "+v", which helps eq. 5 instead).
      GRADCOMP_GRADIVEQ_USE_REGISTER(v[c]);
    }
    GRADCOMP_GRADIVEQ_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + (s + std::size_t(r)) * k + i));
      GRADCOMP_GRADIVEQ_UNROLL
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(xv, v[c], acc[r][c]);
    }
  }
  const __m256 off = _mm256_loadu_ps(offset + j);
  GRADCOMP_GRADIVEQ_UNROLL
  for (int r = 0; r < R; ++r) {
    const __m128 lo = lanes_sum4(_mm512_castps512_ps256(acc[r][0]), _mm512_extractf32x8_ps(acc[r][0], 1),
                                 _mm512_castps512_ps256(acc[r][1]), _mm512_extractf32x8_ps(acc[r][1], 1));
    const __m128 hi = lanes_sum4(_mm512_castps512_ps256(acc[r][2]), _mm512_extractf32x8_ps(acc[r][2], 1),
                                 _mm512_castps512_ps256(acc[r][3]), _mm512_extractf32x8_ps(acc[r][3], 1));
    _mm256_storeu_ps(y + (s + std::size_t(r)) * d + j,
                     _mm256_sub_ps(_mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1), off));
  }
}

/// Eq. 3, columns [j, j + 8), for fewer than compress_block_rows_512 slices.
template <bool Packed, class U>
inline void compress_block8_rest(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const U* u,
                                 const float* scales, std::size_t j, std::size_t d, const float* offset,
                                 float* y) noexcept {
  static_assert(compress_block_rows_512 == 6);
  switch (s1 - s0) {
    case 5: return compress_block8<5, Packed, U>(x, s0, k, u, scales, j, d, offset, y);
    case 4: return compress_block8<4, Packed, U>(x, s0, k, u, scales, j, d, offset, y);
    case 3: return compress_block8<3, Packed, U>(x, s0, k, u, scales, j, d, offset, y);
    case 2: return compress_block8<2, Packed, U>(x, s0, k, u, scales, j, d, offset, y);
    case 1: return compress_block8<1, Packed, U>(x, s0, k, u, scales, j, d, offset, y);
    default: return;
  }
}

/// Columns [0, d8) of the basis with each pair (2p, 2p + 1) interleaved in
/// runs of 8: packed[p][i / 8][16] = u_2p[i .. i + 8), u_2p+1[i .. i + 8).
inline void pack_column_pairs(const float* u, std::size_t k, std::size_t d8, float* packed) noexcept {
  for (std::size_t p = 0; p < d8 / 2; ++p)
    for (std::size_t i = 0; i < k; i += 8) {
      float* dst = packed + p * 2 * k + 2 * i;
      _mm256_storeu_ps(dst, _mm256_loadu_ps(u + 2 * p * k + i));
      _mm256_storeu_ps(dst + 8, _mm256_loadu_ps(u + (2 * p + 1) * k + i));
    }
}

/// A call covers at least this many slices per basis column before it packs
/// the basis (the packing reads and writes the basis once).
inline constexpr std::size_t pack_min_slices_per_column = 8;

/// Eq. 3 over the tiles and blocks of compress_rows_avx512, columns [0, d8).
template <bool Packed, class U>
inline void compress_tiles512(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const U* u,
                              const float* scales, std::size_t d8, std::size_t d, const float* offset,
                              float* y) noexcept {
  constexpr auto R = static_cast<std::size_t>(compress_block_rows_512);
  const std::size_t fit = compress_tile_floats / k / R * R;
  const std::size_t tile = fit ? fit : R;
  // The tile compress_prefetch_floats ahead is prefetched a few lines per
  // register block, spread over the tile's blocks (measured, 46 MB: one
  // burst per register block 12.6-12.9 ms, spread 9.7-9.9 ms).
  const std::size_t tile_lines = tile * k / 16, blocks = (d8 / 8) * (tile / R);
  const std::size_t lines_per_block = (tile_lines + blocks - 1) / blocks;
  std::size_t s = s0;
  for (; s + tile <= s1; s += tile) {
    const std::size_t ahead = (s + tile) * k + compress_prefetch_floats;
    std::size_t line = ahead + tile * k <= s1 * k ? 0 : tile_lines;  // none past the call's input
    for (std::size_t j = 0; j < d8; j += 8)
      for (std::size_t g = s; g < s + tile; g += R) {
        const std::size_t n = std::min(lines_per_block, tile_lines - line);
        compress_block8<compress_block_rows_512, Packed, U>(x, g, k, u, scales, j, d, offset, y, x + ahead + 16 * line,
                                                            n);
        line += n;
      }
  }
  for (; s + R <= s1; s += R) {
    compress_prefetch(x, s, R, k, s1);
    for (std::size_t j = 0; j < d8; j += 8)
      compress_block8<compress_block_rows_512, Packed, U>(x, s, k, u, scales, j, d, offset, y);
  }
  if (s < s1)
    for (std::size_t j = 0; j < d8; j += 8) compress_block8_rest<Packed, U>(x, s, s1, k, u, scales, j, d, offset, y);
}

/// Eq. 3 for slices [s0, s1), k a multiple of 8: tiles of slices that fit
/// compress_tile_floats, each 8-column block of the basis over the whole
/// tile (from a packed copy of the basis when the call is long enough to
/// pay for it: a buffer of this thread's, kept); the last d % 8 columns with
/// 256-bit vectors. `nb`: a narrow copy of the same basis (or none), read
/// instead of u except by the packed copy (packed from u, whose values are
/// the same).
inline void compress_rows_avx512(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const float* u,
                                 std::size_t d, const float* offset, float* y,
                                 gradiveq_narrow_basis nb = {}) noexcept {
  const std::size_t d8 = d - d % 8;
  if (d8 > 0) {
    float* packed = nullptr;
    if (s1 - s0 >= pack_min_slices_per_column * d8) {
      thread_local std::vector<float> buffer;
      try {
        if (buffer.size() < k * d8) buffer.resize(k * d8);
        packed = buffer.data();
      } catch (...) {  // no memory for it: the unpacked loads give the same bits
      }
    }
    if (packed) {
      pack_column_pairs(u, k, d8, packed);
      compress_tiles512<true, float>(x, s0, s1, k, packed, nullptr, d8, d, offset, y);
    } else if (nb.i8) {
      compress_tiles512<false, std::int8_t>(x, s0, s1, k, nb.i8, nb.i8_scale, d8, d, offset, y);
    } else if (nb.f16) {
      compress_tiles512<false, std::uint16_t>(x, s0, s1, k, nb.f16, nullptr, d8, d, offset, y);
    } else {
      compress_tiles512<false, float>(x, s0, s1, k, u, nullptr, d8, d, offset, y);
    }
  }
  if (d8 < d) compress_columns_avx2(x, s0, s1, k, u, d8, d, offset, y, nb);
}

/// Eq. 5 for slices [s, s + R) and columns [c, c + 16 CB): each result
/// vector goes to sink(slice, r, column, value).
template <int R, int CB, class Sink, class U>
inline void expand_block16(const float* y, std::size_t s, std::size_t d, const U* u, const float* scales,
                           std::size_t k, std::size_t c, const float* mu, float scale, bool add, const float* out,
                           Sink& sink) noexcept {
  __m512 acc[R][CB];
  GRADCOMP_GRADIVEQ_UNROLL
  for (int r = 0; r < R; ++r)
    GRADCOMP_GRADIVEQ_UNROLL
    for (int b = 0; b < CB; ++b) acc[r][b] = _mm512_setzero_ps();
  for (std::size_t j = 0; j < d; ++j) {
    if constexpr (CB == 4) {  // the block expand_prefetch_blocks ahead: 4 x 16 values, one line each (binary16: 2, int8: 4)
      constexpr int step = 64 / (16 * int(sizeof(U)));
      GRADCOMP_GRADIVEQ_UNROLL
      for (int b = 0; b < 4; b += step) {
        const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(u + j * k + c) +
                                  (64 * expand_prefetch_blocks + 16 * std::size_t(b)) * sizeof(U);
        _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T0);  // as an integer: see prefetch_floats_ahead
      }
    }
    __m512 v[CB];
    GRADCOMP_GRADIVEQ_UNROLL
    for (int b = 0; b < CB; ++b) {
      v[b] = load_basis16(u + j * k + c + 16 * std::size_t(b), column_scale<U>(scales, j));
      GRADCOMP_GRADIVEQ_IN_REGISTER(v[b]);  // loaded once, used R times
    }
    GRADCOMP_GRADIVEQ_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 yv = _mm512_set1_ps(y[(s + std::size_t(r)) * d + j]);
      GRADCOMP_GRADIVEQ_UNROLL
      for (int b = 0; b < CB; ++b) acc[r][b] = _mm512_fmadd_ps(yv, v[b], acc[r][b]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  GRADCOMP_GRADIVEQ_UNROLL
  for (int r = 0; r < R; ++r)
    GRADCOMP_GRADIVEQ_UNROLL
    for (int b = 0; b < CB; ++b) {
      const std::size_t col = c + 16 * std::size_t(b);
      const __m512 m = _mm512_loadu_ps(mu + col);
      const __m512 t = add ? _mm512_add_ps(_mm512_loadu_ps(out + (s + std::size_t(r)) * k + col), acc[r][b]) : acc[r][b];
      sink(s + std::size_t(r), r, col, _mm512_fmadd_ps(sc, m, t));
    }
}

/// Ordinary stores of eq. 5's vectors.
struct expand_store {
  float* out;
  std::size_t k;
  void begin_group(int) noexcept {}
  void operator()(std::size_t s, int, std::size_t col, __m512 v) const noexcept { _mm512_storeu_ps(out + s * k + col, v); }
};

/// Non-temporal stores of eq. 5's vectors into whole rows of k floats (k a
/// multiple of 16, so every row has the alignment of row 0, whatever it is):
/// each aligned 64-byte line is assembled from the two result vectors it
/// straddles (one permute) and streamed whole; only the first and last
/// partial lines of the region (the rows one call writes) get ordinary
/// (masked) stores. A partial-line non-temporal store is
/// a read-modify-write in memory (measured: 46 MB decoded 16 bytes off a
/// line, 22-24 ms against 14 ms aligned). Rows are contiguous, so the line
/// across two rows joins the last vector of one and the first of the next,
/// whichever of them the column blocks produce second.
struct expand_line_stream {
  static constexpr int max_rows = expand_block_rows_512;
  float* out;         // row 0 of the output
  std::size_t k;
  unsigned h;         // columns before the first 64-byte boundary of a row
  __m512i join_index; // h, h + 1, ..., h + 15
  __m512 prev[max_rows], first[max_rows], last[max_rows], carry;
  bool has_first[max_rows] = {}, has_last[max_rows] = {}, has_carry = false;
  int group_rows = 0;

  expand_line_stream(float* out_, std::size_t k_) noexcept
      : out(out_), k(k_), h(static_cast<unsigned>((16 - (reinterpret_cast<std::uintptr_t>(out_) % 64) / 4) % 16)),
        join_index(_mm512_add_epi32(_mm512_set1_epi32(int(h)),
                                    _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))) {}

  /// Address of the line that ends h columns into column `col` of row s
  /// (computed as an integer: for the region's first line it precedes it).
  float* line(std::size_t s, std::size_t col) const noexcept {
    return reinterpret_cast<float*>(reinterpret_cast<std::uintptr_t>(out) + 4 * (s * k + col + h) - 64);
  }
  /// a[h..16) then b[0..h): the 16 floats of the line between them.
  __m512 join(__m512 a, __m512 b) const noexcept { return _mm512_permutex2var_ps(a, join_index, b); }

  void begin_group(int rows) noexcept {
    group_rows = rows;
    for (int r = 0; r < max_rows; ++r) has_first[r] = has_last[r] = false;
  }
  void operator()(std::size_t s, int r, std::size_t col, __m512 v) noexcept {
    if (col != 0) {
      _mm512_stream_ps(line(s, col), join(prev[r], v));
    } else if (r == 0) {
      if (has_carry) _mm512_stream_ps(line(s, 0), join(carry, v));
      else if (h != 0) _mm512_mask_storeu_ps(line(s, 0), __mmask16(0xFFFFu << (16 - h)), join(v, v));  // region start
    } else if (has_last[r - 1]) {
      _mm512_stream_ps(line(s, 0), join(last[r - 1], v));
    } else {
      first[r] = v;
      has_first[r] = true;
    }
    prev[r] = v;
    if (col + 16 == k) {
      if (r + 1 == group_rows) {
        carry = v;
        has_carry = true;
      } else if (r + 1 < max_rows && has_first[r + 1]) {
        _mm512_stream_ps(line(s + 1, 0), join(v, first[r + 1]));
      } else {
        last[r] = v;
        has_last[r] = true;
      }
    }
  }
  /// The region's last partial line (or whole one when h = 0), then a fence:
  /// the stores are visible before anything this thread does next.
  void finish(std::size_t s1) noexcept {
    if (has_carry) {
      if (h == 0) _mm512_stream_ps(line(s1, 0), carry);
      else _mm512_mask_storeu_ps(line(s1, 0), __mmask16((1u << (16 - h)) - 1u), join(carry, carry));
    }
    _mm_sfence();
  }
};

/// Eq. 5 for slices [s, s + R), columns [0, k - k % 16), into `sink`.
template <int R, class Sink, class U>
inline void expand_group512(const float* y, std::size_t s, std::size_t d, const U* u, const float* scales,
                            std::size_t k, const float* mu, float scale, bool add, const float* out,
                            Sink& sink) noexcept {
  sink.begin_group(R);
  const std::size_t k64 = k - k % 64, k16 = k - k % 16;
  std::size_t c = 0;
  for (; c < k64; c += 64) expand_block16<R, 4, Sink, U>(y, s, d, u, scales, k, c, mu, scale, add, out, sink);
  for (; c < k16; c += 16) expand_block16<R, 1, Sink, U>(y, s, d, u, scales, k, c, mu, scale, add, out, sink);
}

/// Eq. 5 for slices [s0, s1), columns [0, k - k % 16), in register blocks of
/// expand_block_rows_512 slices.
template <class Sink, class U>
inline void expand_rows512(const float* y, std::size_t s0, std::size_t s1, std::size_t d, const U* u,
                           const float* scales, std::size_t k, const float* mu, float scale, bool add,
                           const float* out, Sink& sink) noexcept {
  static_assert(expand_block_rows_512 == 4);
  std::size_t s = s0;
  for (; s + 4 <= s1; s += 4) expand_group512<4, Sink, U>(y, s, d, u, scales, k, mu, scale, add, out, sink);
  switch (s1 - s) {
    case 3: return expand_group512<3, Sink, U>(y, s, d, u, scales, k, mu, scale, add, out, sink);
    case 2: return expand_group512<2, Sink, U>(y, s, d, u, scales, k, mu, scale, add, out, sink);
    case 1: return expand_group512<1, Sink, U>(y, s, d, u, scales, k, mu, scale, add, out, sink);
    default: return;
  }
}

/// Eq. 5 for slices [s0, s1), every column: non-temporal stores for a large
/// output (see expand_rows), the last k % 16 columns with 256-bit vectors.
/// `nb`: a narrow copy of the same basis (or none), read instead of u
/// except by the last k % 16 columns.
inline void expand_rows_avx512(const float* y, std::size_t s0, std::size_t s1, std::size_t d, const float* u,
                               std::size_t k, const float* mu, float scale, bool add, float* out,
                               gradiveq_narrow_basis nb = {}) noexcept {
  auto rows = [&](auto& sink) {
    if (nb.i8) expand_rows512(y, s0, s1, d, nb.i8, nb.i8_scale, k, mu, scale, add, out, sink);
    else if (nb.f16) expand_rows512(y, s0, s1, d, nb.f16, nullptr, k, mu, scale, add, out, sink);
    else expand_rows512(y, s0, s1, d, u, nullptr, k, mu, scale, add, out, sink);
  };
  const bool stream = !add && k % 16 == 0 && (s1 - s0) * k >= stream_min_elements;
  if (stream) {
    expand_line_stream sink(out, k);
    rows(sink);
    sink.finish(s1);
    return;
  }
  if (k >= 16) {
    expand_store sink{out, k};
    rows(sink);
  }
  if (k % 16 != 0) expand_columns_avx2(y, s0, s1, d, u, k, k - k % 16, mu, scale, add, out);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
}  // namespace gradiveq_kernel

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution

#endif  // GRADCOMP_GRADIVEQ_AVX512
