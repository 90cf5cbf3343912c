#pragma once
/// \file system/generic/gradiveq.hpp
/// Generic (execution::seq) kernels of the GradiVeQ linear compressor
/// (seed 002, eqs. 3 and 5): the two products over all slices of a layer
/// segment, on the calling thread only.
///
/// Storage: the slices of a segment are the rows of a row-major S x K matrix
/// (that is exactly the layer's memory, slice after slice); the basis U_d is
/// a column-major K x d matrix; the coefficients are a row-major S x d matrix
/// (slice after slice, d values each).
///
/// Threads: seq runs on the thread that calls it, whatever the program links
/// (until issue 21 these were Eigen GEMMs, which start an OpenMP team of
/// Eigen::nbThreads() threads per call in any build with OpenMP, e.g. one
/// that links gradcomp::thrust: four ring workers on two cores then ran eight
/// spinning GEMM threads). For a multi-threaded encode or decode of one
/// segment use execution::thrust_omp, which gives the same bits.
///
/// Order: every result element has one fixed summation order, independent of
/// the thread count, the CPU's cache sizes and the instruction set (the
/// AVX2/AVX-512 paths of gradiveq/avx2.hpp and gradiveq/avx512.hpp compute
/// exactly what the portable path of gradiveq/portable.hpp computes):
///  - eq. 3, y[s][j] = <x_s, u_j> - offset[j]: 8 float lanes, lane l summing
///    x[i] u[i] over i = l mod 8 in index order with one rounding per step
///    (a fused multiply-add where the target has FMA), then the lanes
///    ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then - offset[j];
///  - eq. 5, out[s][c] = sum_j y[s][j] u_j[c] (j in order, from 0, fused)
///    + scale mu[c] (fused), the sum added to out first when accumulating.
/// The Thrust host kernels (system/thrust/gradiveq.hpp) run these same row
/// kernels on their work items, so seq, thrust_cpp and thrust_omp agree bit
/// for bit. Builds with and without FMA differ by rounding (as every build
/// with another -march may); AVX2 and AVX-512 builds agree with each other
/// and with a portable build that has FMA.
///
/// Instruction sets (compile time: -mavx2 -mfma, or -march=native): AVX2
/// computes eq. 3 in blocks of 3-4 slices x 4 columns, eq. 5 in blocks of
/// 3-4 slices x 32 columns (prefetching the basis two blocks ahead).
/// AVX-512 (F, DQ, VL) keeps eq. 3's 8 lanes per column and puts two
/// columns in one 512-bit register (blocks of 6 slices
/// x 8 columns, over tiles of slices that share each block of the basis),
/// and eq. 5 in blocks of 4 slices x 64 columns, streaming whole 64-byte
/// lines at any output alignment (expand_line_stream).

#include <cstddef>
#include <cstdint>

#include <gradcomp/system/generic/gradiveq/avx512.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace gradiveq_kernel {

/// Eq. 3 for slices [s0, s1): y[s][j] = <x_s, u_j> - offset[j], every column.
/// `nb` (or none): a narrow copy of the same basis (gradiveq_narrow_basis),
/// which AVX-512 and AVX2 builds read instead of u (a binary16 copy: half
/// the bytes, where the build has F16C or AVX-512; an int8 copy: a quarter;
/// the same bits); other builds read u.
inline void compress_rows(const float* x, std::size_t s0, std::size_t s1, std::size_t k, const float* u, std::size_t d,
                          const float* offset, float* y, [[maybe_unused]] gradiveq_narrow_basis nb = {}) noexcept {
#if defined(GRADCOMP_GRADIVEQ_AVX512)
  if (k % 8 == 0 && d >= 4) return compress_rows_avx512(x, s0, s1, k, u, d, offset, y, nb);
#elif defined(GRADCOMP_GRADIVEQ_AVX2)
  if (k % 8 == 0 && d >= 4) return compress_columns_avx2(x, s0, s1, k, u, 0, d, offset, y, nb);
#endif
  compress_rows_scalar(x, s0, s1, k, u, 0, d, offset, y);
}

/// Eq. 5 for slices [s0, s1): out (=, or += when `add`) Y U^T + 1 (scale mu)^T, every column.
/// `nb`: as compress_rows.
inline void expand_rows(const float* y, std::size_t s0, std::size_t s1, std::size_t d, const float* u, std::size_t k,
                        const float* mu, float scale, bool add, float* out,
                        [[maybe_unused]] gradiveq_narrow_basis nb = {}) noexcept {
#if defined(GRADCOMP_GRADIVEQ_AVX512)
  if (d > 0) return expand_rows_avx512(y, s0, s1, d, u, k, mu, scale, add, out, nb);
#elif defined(GRADCOMP_GRADIVEQ_AVX2)
  if (d > 0) {
    constexpr auto R = static_cast<std::size_t>(expand_block_rows);
    const std::size_t blocked = s1 - (s1 - s0) % R;  // slices [s0, blocked) in blocks of R
    // A large output (a ring segment or chunk) goes past the caches: it is
    // read back later, if at all, after other work has replaced it there, and
    // the stores then neither read the lines first nor evict the basis. Only
    // whole 64-byte lines: rows on line boundaries (the AVX-512 path streams
    // any alignment).
    const bool stream = !add && k % 16 == 0 && (s1 - s0) * k >= stream_min_elements &&
                        reinterpret_cast<std::uintptr_t>(out + s0 * k) % 64 == 0;
    if (stream) {
      for (std::size_t s = s0; s < blocked; s += R) expand_rows_block<expand_block_rows, true>(y, s, d, u, k, mu, scale, add, out, nb);
      expand_rows_rest<true>(y, blocked, s1, d, u, k, mu, scale, add, out, nb);
      _mm_sfence();  // the stores are visible before anything this thread does next
    } else {
      for (std::size_t s = s0; s < blocked; s += R) expand_rows_block<expand_block_rows, false>(y, s, d, u, k, mu, scale, add, out, nb);
      expand_rows_rest<false>(y, blocked, s1, d, u, k, mu, scale, add, out, nb);
    }
    return;
  }
#endif
  expand_rows_scalar(y, s0, s1, d, u, k, 0, k, mu, scale, add, out);
}

}  // namespace gradiveq_kernel

#undef GRADCOMP_GRADIVEQ_UNROLL
#undef GRADCOMP_GRADIVEQ_IN_REGISTER
#undef GRADCOMP_GRADIVEQ_USE_REGISTER

/// Eq. 3 for S slices at once: Y = X U - 1 offset^T, where offset = U^T mu / N
/// is precomputed by the caller (writing it as X*U - (mu U)/N avoids the
/// S x K temporary that (X - mu/N) U would make). On the calling thread, in
/// the order of the file comment. `narrow` (or none): a copy of the same
/// basis' values as binary16, or int8 with power-of-two column scales (every
/// value of `basis` exactly representable), read where the instruction set
/// widens them (compress_rows).
inline void gradiveq_compress_slices(seq, const float* x, std::size_t slices, std::size_t k, const float* basis,
                                     std::size_t d, const float* offset, float* y,
                                     gradiveq_narrow_basis narrow = {}) {
  if (slices == 0 || d == 0) return;
  gradiveq_kernel::compress_rows(x, 0, slices, k, basis, d, offset, y, narrow);
}

/// Eq. 5 for S slices at once: out (=, or += when `add`) Y U^T + 1 (scale mu)^T.
/// scale is count/N: N for a fully aggregated payload (eq. 5 proper), 1/N for
/// one node's own payload (the local reconstruction of eq. 7). On the calling
/// thread, in the order of the file comment. `narrow`: as gradiveq_compress_slices.
inline void gradiveq_expand_slices(seq, const float* y, std::size_t slices, std::size_t d, const float* basis,
                                   std::size_t k, const float* mu, float scale, bool add, float* out,
                                   gradiveq_narrow_basis narrow = {}) {
  if (slices == 0) return;
  gradiveq_kernel::expand_rows(y, 0, slices, d, basis, k, mu, scale, add, out, narrow);
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
