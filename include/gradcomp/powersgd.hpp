#pragma once
/// \file powersgd.hpp
/// PowerSGD (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical low-rank
/// gradient compression for distributed optimization", NeurIPS 2019): the
/// per-layer algebra and state of rank-r PowerSGD with error feedback and a
/// warm-started Q. The two-round exchange of a bucket's layers is in
/// exchange/powersgd_bucket.hpp; docs/codecs.md has the equations.
///
/// Matrix view. A layer's gradient is viewed as a matrix M, row-major, with
/// no copy: a conv weight [C_out, C_in, kH, kW] is C_out x (C_in kH kW),
/// exactly as PyTorch's powerSGD_hook does (`tensor.view(shape[0], -1)`); a
/// 2-D layer (layer_shape::matrix) is rows x cols. A plain dense layer (a
/// bias, a norm weight, a flattened tensor) has no matrix view: the exchange
/// leaves it dense, as it does tiny layers (powersgd_compresses).
///
/// One step of one rank w (Algorithm 1 with the error feedback of Algorithm 2):
///
///     M_w   = G_w + E_w                         error feedback (E_w = 0 when off)
///     P_w   = M_w Q                             Q: warm start, orthonormalised
///     P     = sum_w P_w                         round 0 (a sum; the mean would do:
///     P^    = orthonormalise(P)                  orthonormalising ignores the scale)
///     Q_w   = M_w^T P^
///     Q_sum = sum_w Q_w                         round 1
///     out   = P^ Q_sum^T = P^ P^^T sum_w M_w    the SUM over ranks (caller divides for a mean)
///     E_w  <- M_w - P^ Q_w^T                    the rank's own approximation (paper, Alg. 2)
///     Q    <- Q_sum                             warm start of the next step
///
/// Error feedback: the paper's local form. Each rank keeps M_w minus its own
/// approximation P^ Q_w^T (so M_w == P^ Q_w^T + E_w, and E_w is the part of
/// M_w outside span(P^), no larger than M_w). PyTorch's hook instead keeps
/// M_w minus the decompressed average P^ Q_sum^T / N. The two differ per
/// rank by M_w - mean_w M_w, but their sums over ranks are equal, and P, P^
/// and the output depend on the ranks' residuals only through that sum, so
/// both give the same aggregates in exact arithmetic; the local form keeps
/// each residual bounded (PyTorch's carries the ranks' disagreement forward)
/// and costs one more rank-r product.
///
/// Orthonormalisation: modified Gram-Schmidt with a second projection pass
/// ("twice is enough"), dot products accumulated in double in index order,
/// plain scalar code without threads. Every rank gets the same summed P bits
/// from the all-reduce, so every rank gets the same P^ bits. A column that is
/// exactly zero stays zero (a layer with a zero gradient).
///
/// Q starts from a standard normal matrix drawn from counter_rng(seed), the
/// same on every rank (the exchange gives every layer its own seed, never
/// mixed with the rank), and is orthonormalised at the start of each step as
/// in PyTorch's hook. Without warm start a fresh Q is drawn every step.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <span>
#include <string>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/detail/random.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/layout.hpp>
#include <gradcomp/wire.hpp>

#include <gradcomp/system/powersgd.hpp>

namespace gradcomp {

/// Options of PowerSGD (the codec and its exchange).
struct powersgd_options {
  std::size_t rank = 2;         ///< r, the rank of the approximation (1 <= r <= min(rows, cols))
  bool error_feedback = true;   ///< keep M - approximation for the next step (Alg. 2)
  bool warm_start = true;       ///< reuse last step's Q (Alg. 1 "warm start"); else a fresh random Q each step
  std::uint64_t seed = 0;       ///< seed of the random Q (the same on every rank)
  /// Exchange: steps (completed, not skipped) summed uncompressed before
  /// PowerSGD starts (PyTorch's start_powerSGD_iter).
  std::size_t start_iter = 10;
  /// Exchange: matrices with fewer elements stay dense (as do 1-D layers and
  /// matrices with 2 r >= min(rows, cols), where P and Q would not be smaller).
  std::size_t min_elements = 1024;
};

/// The matrix view of a layer (see the file comment): rows x cols, or 0 x 0
/// when the layer has none (a plain dense tensor).
struct powersgd_matrix {
  std::size_t rows = 0;
  std::size_t cols = 0;
};

GRADCOMP_ABI_NAMESPACE_BEGIN

/// Allocator of 64-byte aligned storage (a cache line), for the big
/// matrices of powersgd_compressor: rows of M start on a line when cols is
/// a multiple of 16, so the kernels can write them non-temporally. Blocks
/// of 4 MiB and more are 2 MiB aligned and, on Linux, advised as
/// transparent huge pages (MADV_HUGEPAGE, a hint): the passes stream them,
/// and 4 KiB pages cost a TLB miss every 1024 floats of each stream (about
/// 6% of a PowerSGD step here).
template <class T>
struct powersgd_line_allocator {
  using value_type = T;
  static constexpr std::size_t huge_bytes = std::size_t(4) << 20, huge_align = std::size_t(2) << 20;
  powersgd_line_allocator() noexcept = default;
  template <class U>
  powersgd_line_allocator(const powersgd_line_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (n > std::size_t(-1) / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    if (bytes < huge_bytes) return static_cast<T*>(::operator new(bytes, std::align_val_t{64}));
    void* p = ::operator new(bytes, std::align_val_t{huge_align});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)::madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n * sizeof(T) < huge_bytes)
      ::operator delete(p, std::align_val_t{64});
    else
      ::operator delete(p, std::align_val_t{huge_align});
  }
  template <class U>
  bool operator==(const powersgd_line_allocator<U>&) const noexcept {
    return true;
  }
};

/// The matrix view of a layer shape: conv [C_out, C_in, kH, kW] ->
/// C_out x (C_in kH kW) (PyTorch's powerSGD_hook view); layer_shape::matrix
/// -> rows x cols; any other dense shape -> 0 x 0 (no view).
inline powersgd_matrix powersgd_view(const layer_shape& s) noexcept {
  if (s.kind == layer_kind::conv) return {s.filters, s.depth * s.height * s.width};
  if (s.filters > 0 && s.depth > 0 && s.height == 1 && s.width == 1 && s.filters * s.depth == s.length)
    return {s.filters, s.depth};
  return {};
}

/// The exchange's rule: true when PowerSGD compresses a layer of this view
/// (a matrix with both sides > 1, 2 r < min(rows, cols) and at least
/// min_elements elements); false means the layer is summed dense.
inline bool powersgd_compresses(const powersgd_matrix& v, const powersgd_options& o) noexcept {
  if (v.rows < 2 || v.cols < 2 || o.rank == 0) return false;
  return 2 * o.rank < std::min(v.rows, v.cols) && v.rows * v.cols >= o.min_elements;
}

/// Orthonormalises the r columns of the column-major rows x r matrix `a` in
/// place (modified Gram-Schmidt, two projection passes, double accumulation,
/// fixed order): deterministic, so the same input bits give the same output
/// bits on every rank. A column that becomes exactly zero stays zero.
inline void powersgd_orthonormalize(std::span<float> a, std::size_t rows, std::size_t r) {
  if (a.size() != rows * r) throw size_mismatch_error("powersgd_orthonormalize", rows * r, a.size());
  for (std::size_t k = 0; k < r; ++k) {
    float* c = a.data() + k * rows;
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t j = 0; j < k; ++j) {
        const float* b = a.data() + j * rows;
        double dot = 0.0;
        for (std::size_t i = 0; i < rows; ++i) dot += double(c[i]) * double(b[i]);
        for (std::size_t i = 0; i < rows; ++i) c[i] = float(double(c[i]) - dot * double(b[i]));
      }
    double norm2 = 0.0;
    for (std::size_t i = 0; i < rows; ++i) norm2 += double(c[i]) * double(c[i]);
    const double norm = std::sqrt(norm2);
    if (norm > 0.0 && std::isfinite(norm)) {
      for (std::size_t i = 0; i < rows; ++i) c[i] = float(double(c[i]) / norm);
    } else {
      std::fill(c, c + rows, 0.0f);
    }
  }
}

/// Rank-r PowerSGD of one layer (see the file comment): the state (residual
/// E, warm-start Q, step count) and the three stages of a step. A step is
/// encode_p -> (sum P over ranks) -> encode_q -> (sum Q over ranks) ->
/// decode; abandon() drops a step begun with encode_p. The state changes only
/// in decode, so an abandoned step leaves it as it was.
template <ExecutionPolicy Policy = execution::seq>
class powersgd_compressor {
 public:
  /// A rows x cols matrix. Throws invalid_argument_error for an empty
  /// matrix, rank 0 or rank > min(rows, cols).
  powersgd_compressor(std::size_t rows, std::size_t cols, powersgd_options o = {}) : o_(o), rows_(rows), cols_(cols) {
    if (rows == 0 || cols == 0) throw invalid_argument_error("powersgd_compressor: empty matrix");
    if (o.rank == 0) throw invalid_argument_error("powersgd_compressor: rank must be >= 1");
    if (o.rank > std::min(rows, cols))
      throw invalid_argument_error("powersgd_compressor: rank " + std::to_string(o.rank) + " above min(rows, cols) = " +
                                   std::to_string(std::min(rows, cols)));
    if (rows > std::size_t(-1) / cols) throw invalid_argument_error("powersgd_compressor: element count overflows");
    residual_.assign(o.error_feedback ? rows * cols : 0, 0.0f);
    q_.resize(cols * o.rank);
    draw_q(0);
  }
  /// The matrix view of a layer shape (powersgd_view); a shape without one
  /// is an invalid_argument_error.
  powersgd_compressor(const layer_shape& s, powersgd_options o = {})
      : powersgd_compressor(checked_view(s).rows, checked_view(s).cols, o) {}

  std::size_t rows() const noexcept { return rows_; }
  std::size_t cols() const noexcept { return cols_; }
  std::size_t rank() const noexcept { return o_.rank; }
  /// Elements of the layer (rows cols).
  std::size_t size() const noexcept { return rows_ * cols_; }
  /// Floats of P (round 0): rows r.
  std::size_t p_length() const noexcept { return rows_ * o_.rank; }
  /// Floats of Q (round 1): cols r.
  std::size_t q_length() const noexcept { return cols_ * o_.rank; }
  /// Compressed steps completed (decode calls).
  std::uint64_t steps() const noexcept { return steps_; }
  const powersgd_options& options() const noexcept { return o_; }
  /// The residual E (empty without error feedback), row-major rows x cols.
  std::span<const float> residual() const noexcept { return residual_; }
  /// The warm-start Q (column-major cols x r) the next step starts from.
  std::span<const float> q() const noexcept { return q_; }
  /// This step's orthonormal P^ (valid after encode_q), column-major rows x r.
  std::span<const float> p_hat() const noexcept { return p_hat_; }
  /// This step's own Q_w = M_w^T P^ (valid after encode_q).
  std::span<const float> q_local() const noexcept { return q_w_; }

  /// Stage 1: M = gradient + E, P_w = M Q^ into p_out (p_length() floats).
  /// Throws size_mismatch_error, or non_finite_error naming the first index
  /// where M is not finite (a NaN or Inf in the gradient, or an overflow of
  /// G + E), before touching the state (p_out is then unspecified).
  void encode_p(std::span<const float> gradient, std::span<float> p_out) {
    if (gradient.size() != size()) throw size_mismatch_error("powersgd_compressor::encode_p: gradient", size(), gradient.size());
    if (p_out.size() != p_length()) throw size_mismatch_error("powersgd_compressor::encode_p: P", p_length(), p_out.size());
    stage_ = 0;
    m_.resize(size());
    q_hat_ = q_;
    if (!o_.warm_start && steps_ > 0) draw_into(q_hat_, steps_);
    powersgd_orthonormalize(q_hat_, cols_, o_.rank);
    const std::size_t bad = powersgd_encode_p(Policy{}, gradient.data(), o_.error_feedback ? residual_.data() : nullptr,
                                              m_.data(), rows_, cols_, q_hat_.data(), o_.rank, p_out.data());
    if (bad != size()) throw non_finite_error("powersgd_compressor::encode_p", bad);
    stage_ = 1;
  }

  /// Stage 2: P^ = orthonormalise(p_sum) (the P of every rank summed),
  /// Q_w = M^T P^ into q_out (q_length() floats).
  void encode_q(std::span<const float> p_sum, std::span<float> q_out) {
    if (stage_ != 1) throw state_error("powersgd_compressor::encode_q: call encode_p first");
    if (p_sum.size() != p_length()) throw size_mismatch_error("powersgd_compressor::encode_q: P", p_length(), p_sum.size());
    if (q_out.size() != q_length()) throw size_mismatch_error("powersgd_compressor::encode_q: Q", q_length(), q_out.size());
    if (const auto bad = find_non_finite(execution::seq{}, p_sum); bad != p_sum.size())
      throw non_finite_error("powersgd_compressor::encode_q: summed P", bad);
    p_hat_.assign(p_sum.begin(), p_sum.end());
    powersgd_orthonormalize(p_hat_, rows_, o_.rank);
    q_w_.resize(q_length());
    powersgd_back_project(Policy{}, m_.data(), rows_, cols_, p_hat_.data(), o_.rank, q_w_.data());
    std::memcpy(q_out.data(), q_w_.data(), q_length() * sizeof(float));
    stage_ = 2;
  }

  /// Stage 3: out = P^ q_sum^T (q_sum: the Q of every rank summed, so out is
  /// the SUM over ranks of their approximations); commits the step: E = M -
  /// P^ Q_w^T, warm-start Q = q_sum. `out` may alias the gradient of encode_p.
  void decode(std::span<const float> q_sum, std::span<float> out) {
    if (stage_ != 2) throw state_error("powersgd_compressor::decode: call encode_q first");
    if (q_sum.size() != q_length()) throw size_mismatch_error("powersgd_compressor::decode: Q", q_length(), q_sum.size());
    if (out.size() != size()) throw size_mismatch_error("powersgd_compressor::decode: output", size(), out.size());
    if (const auto bad = find_non_finite(execution::seq{}, q_sum); bad != q_sum.size())
      throw non_finite_error("powersgd_compressor::decode: summed Q", bad);
    // The new residual is written over M (one read and one write of each
    // element, no third stream), and the buffers swap: the old residual's
    // memory holds the next step's M. The state is untouched until here.
    powersgd_decode(Policy{}, m_.data(), p_hat_.data(), rows_, o_.rank, q_sum.data(),
                    o_.error_feedback ? q_w_.data() : nullptr, cols_, out.data(),
                    o_.error_feedback ? m_.data() : nullptr);
    if (o_.error_feedback) residual_.swap(m_);
    q_.assign(q_sum.begin(), q_sum.end());
    ++steps_;
    stage_ = 0;
  }

  /// Drops a step begun with encode_p: the state is as before it.
  void abandon() noexcept { stage_ = 0; }

  /// The exact state (residual, warm-start Q, step count), in the wire
  /// container with the codec-state flag (wire codec powersgd). Between steps only.
  std::vector<std::byte> save_state() const {
    if (stage_ != 0) throw state_error("powersgd_compressor::save_state: inside a step");
    return wire::serialize_state(wire::codec_id::powersgd, size(), [&](wire::writer& w) {
      w.put<std::uint8_t>(state_version);
      w.put<std::uint8_t>(o_.error_feedback ? 1 : 0);
      w.put<std::uint8_t>(o_.warm_start ? 1 : 0);
      w.put<std::uint8_t>(0);
      w.put<std::uint64_t>(rows_);
      w.put<std::uint64_t>(cols_);
      w.put<std::uint64_t>(o_.rank);
      w.put<std::uint64_t>(o_.seed);
      w.put<std::uint64_t>(steps_);
      w.put_array<float>(std::span<const float>(q_));
      w.put_array<float>(std::span<const float>(residual_));
    });
  }

  /// Restores save_state() bytes of a compressor of the same shape and
  /// options, so it continues bit for bit (strong guarantee). Bad bytes or
  /// non-finite values: wire_error; another shape: size_mismatch_error;
  /// another rank, seed, error feedback or warm start: option_mismatch_error.
  void restore_state(std::span<const std::byte> bytes) {
    const char* where = "powersgd_compressor::restore_state";
    if (stage_ != 0) throw state_error(std::string(where) + ": inside a step");
    wire::header h;
    wire::reader r = wire::parse_state(bytes, wire::codec_id::powersgd, &h);
    wire::reader::check(r.get<std::uint8_t>() == state_version, "powersgd state: unknown state version");
    const auto ef = r.get<std::uint8_t>();
    const auto ws = r.get<std::uint8_t>();
    wire::reader::check(ef <= 1 && ws <= 1 && r.get<std::uint8_t>() == 0, "powersgd state: malformed flags");
    const auto rows = r.get<std::uint64_t>(), cols = r.get<std::uint64_t>(), rank = r.get<std::uint64_t>();
    const auto seed = r.get<std::uint64_t>(), steps = r.get<std::uint64_t>();
    wire::reader::check(rows > 0 && cols > 0 && rank > 0 && rank <= std::min(rows, cols) && rows <= (1ull << 40) / cols &&
                            h.element_count == rows * cols,
                        "powersgd state: shape does not match its element count");
    const std::uint64_t residual_n = ef ? rows * cols : 0;
    wire::reader::check(r.remaining() == (cols * rank + residual_n) * sizeof(float),
                        "powersgd state: body length does not match its shape");
    std::vector<float> q = r.get_vector<float>(cols * rank);
    std::vector<float> e = r.get_vector<float>(residual_n);
    r.expect_end();
    for (float v : q) wire::reader::check(std::isfinite(v), "powersgd state: non-finite Q");
    for (float v : e) wire::reader::check(std::isfinite(v), "powersgd state: non-finite residual");
    if (rows * cols != size()) throw size_mismatch_error(where, size(), static_cast<std::size_t>(rows * cols));
    if (rows != rows_) throw option_mismatch_error(where, "rows");
    if (rank != o_.rank) throw option_mismatch_error(where, "rank");
    if (seed != o_.seed) throw option_mismatch_error(where, "seed");
    if ((ef != 0) != o_.error_feedback) throw option_mismatch_error(where, "error_feedback");
    if ((ws != 0) != o_.warm_start) throw option_mismatch_error(where, "warm_start");
    q_ = std::move(q);
    residual_.assign(e.begin(), e.end());
    steps_ = steps;
  }

 private:
  static constexpr std::uint8_t state_version = 1;

  static powersgd_matrix checked_view(const layer_shape& s) {
    const powersgd_matrix v = powersgd_view(s);
    if (v.rows == 0) throw invalid_argument_error("powersgd_compressor: the layer has no matrix view (a 1-D tensor)");
    return v;
  }

  // A standard normal cols x r matrix from stream `stream` of counter_rng(seed) (Box-Muller).
  void draw_into(std::vector<float>& q, std::uint64_t stream) const {
    const auto s = detail::counter_rng(o_.seed).stream(stream);
    for (std::size_t i = 0; i < q.size(); ++i) {
      const double u1 = 1.0 - s.uniform_double(2 * i), u2 = s.uniform_double(2 * i + 1);
      q[i] = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
  }
  void draw_q(std::uint64_t stream) { draw_into(q_, stream); }

  powersgd_options o_;
  std::size_t rows_, cols_;
  using line_vector = std::vector<float, powersgd_line_allocator<float>>;
  line_vector residual_;  // E, row-major rows x cols (empty without error feedback)
  std::vector<float> q_;         // warm-start Q, column-major cols x r
  std::uint64_t steps_ = 0;
  // Scratch of the running step (not state).
  int stage_ = 0;
  line_vector m_;  // M = G + E; after decode it holds the old residual's memory (swapped)
  std::vector<float> q_hat_, p_hat_, q_w_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp
