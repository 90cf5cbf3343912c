#pragma once
/// \file system/generic/topk.hpp
/// Generic (execution::seq) top-k selection kernels by magnitude, and the two
/// selection algorithms built on them (exact radix select, sampled threshold).
/// Used by sparsifier_with_memory and sa_momentum (DGS Alg. 1 lines 9-12,
/// Alg. 3 lines 8-11) and reusable by any codec that needs the k largest |x|.
///
/// Keys. For a finite float v, key(v) = bits(v) & 0x7FFFFFFF (the bit pattern
/// of |v|) is an unsigned integer whose order is the order of |v| (+0 and -0
/// share key 0). Comparing integer keys instead of floats keeps the selection
/// independent of the FPU's denormal mode (DAZ/FTZ). Inputs must be finite
/// (the codecs reject NaN/Inf before selecting).
///
/// Ties. The selected set is the k largest magnitudes; among equal magnitudes
/// the lower index wins. Output indices are strictly increasing.
///
/// Radix select. A 31-bit key is split in three digits of 11, 11 and 9 bits.
/// A histogram pass over the top digit finds the bin holding the k-th largest
/// magnitude; when that bin is small the entries at or above it are collected
/// in one pass and the exact threshold is found among them, otherwise the next
/// digit is histogrammed over the entries of that bin, and so on.
///
/// Sampled threshold (DGC, Lin et al.): the threshold is estimated from a
/// stratified random sample, entries at or above it are collected in one pass,
/// and if more than k were collected the exact top-k among them is kept.
///
/// Algorithms: topk_radix (radix select only), topk_exact (sampled bracket,
/// exact re-selection, radix fallback when the bracket holds fewer than k:
/// same result as topk_radix, usually one pass), topk_sampled (DGC: the same
/// without the fallback, so it may return fewer than k).
/// Randomness comes from detail::counter_rng (a counter-based generator keyed
/// by (seed, stream, sample index)): the same inputs give the same selection
/// everywhere.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/detail/random.hpp>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Order-preserving integer key of |v| (v finite).
inline constexpr std::uint32_t topk_key(float v) noexcept { return std::bit_cast<std::uint32_t>(v) & 0x7FFFFFFFu; }

/// Digit layout of the radix select: level L uses bits [shift, shift + bits) of the key.
inline constexpr int topk_levels = 3;
inline constexpr unsigned topk_level_shift[topk_levels] = {20, 9, 0};
inline constexpr unsigned topk_level_bits[topk_levels] = {11, 11, 9};
/// Bins of the widest level.
inline constexpr std::size_t topk_bins = 2048;
/// Sub-histograms the histogram kernels spread consecutive elements over,
/// so repeated hits on one bin do not serialise on one counter.
inline constexpr std::size_t topk_sub_histograms = 4;

/// The exact threshold of a selection: `key` is the key of the k-th largest
/// magnitude and `greater` the number of entries whose key is larger.
struct topk_threshold {
  std::uint32_t key = 0;
  std::size_t greater = 0;
};

/// Reusable scratch of the selection algorithms (no allocation once warm).
struct topk_workspace {
  std::vector<std::uint32_t> hist = std::vector<std::uint32_t>(topk_bins);  ///< histogram of the current level
  std::vector<std::uint32_t> sub = std::vector<std::uint32_t>(topk_sub_histograms * (topk_bins + 1));
  std::vector<std::uint32_t> keys;     ///< candidate or sample keys
  std::vector<std::uint32_t> scratch;  ///< second buffer of the key radix select
};

namespace topk_detail {

/// Digit of `key` at `level`, or topk_bins (the discard bin) when the key's
/// higher digits differ from `prefix`.
inline std::uint32_t digit_or_discard(std::uint32_t key, int level, std::uint32_t prefix) noexcept {
  const unsigned shift = topk_level_shift[level];
  const unsigned high = shift + topk_level_bits[level];  // 31 at level 0: key >> 31 == 0 == prefix
  const std::uint32_t digit = (key >> shift) & ((1u << topk_level_bits[level]) - 1u);
  return (key >> high) == prefix ? digit : static_cast<std::uint32_t>(topk_bins);
}

/// Sums the sub-histograms into ws.hist (first topk_bins entries) and clears them.
inline void reduce_sub_histograms(topk_workspace& ws) noexcept {
  constexpr std::size_t stride = topk_bins + 1;
  std::uint32_t* sub = ws.sub.data();
  for (std::size_t b = 0; b < topk_bins; ++b) {
    std::uint32_t s = 0;
    for (std::size_t h = 0; h < topk_sub_histograms; ++h) s += sub[h * stride + b];
    ws.hist[b] = s;
  }
  std::fill(ws.sub.begin(), ws.sub.end(), 0u);
}

/// Scans histogram bins from the top: the bin holding the k-th largest key,
/// and the count of keys in higher bins. Requires 1 <= k <= total count.
struct bin_pick {
  std::uint32_t bin = 0;
  std::size_t above = 0;
};
inline bin_pick pick_bin(const std::uint32_t* hist, std::size_t bins, std::size_t k) noexcept {
  std::size_t cum = 0;
  std::size_t b = bins - 1;
  while (b > 0 && cum + hist[b] < k) cum += hist[b--];
  return {static_cast<std::uint32_t>(b), cum};
}

/// The counter-based stream of a sample: draws depend on (seed, stream) only.
inline constexpr gradcomp::detail::counter_stream sample_stream(std::uint64_t seed, std::uint64_t stream) noexcept {
  return gradcomp::detail::counter_rng(seed).stream(stream);
}

/// Position of sample j of s over n elements: uniform in the stratum
/// [floor(j n / s), floor((j+1) n / s)). Requires s <= n < 2^32.
inline std::size_t sample_position(std::size_t n, std::size_t s, std::size_t j,
                                   const gradcomp::detail::counter_stream& rng) noexcept {
  const std::uint64_t lo = std::uint64_t(j) * n / s;
  const std::uint64_t hi = std::uint64_t(j + 1) * n / s;
  return static_cast<std::size_t>(lo + rng.below(j, hi - lo));
}

/// sample_position for j in [j0, j0 + m), into pos[0, m). Stratum bounds are
/// stepped without a division per sample (floor((j+1)n/s) - floor(jn/s) is
/// q or q+1 with q = n/s), which keeps the loop free of microcoded divides.
inline void sample_positions(std::size_t n, std::size_t s, std::size_t j0, std::size_t m,
                             const gradcomp::detail::counter_stream& rng, std::size_t* pos) noexcept {
  const std::uint64_t q = n / s, r = n % s;
  std::uint64_t lo = std::uint64_t(j0) * n / s;
  std::uint64_t acc = (std::uint64_t(j0) * r) % s;  // (j n) mod s
  for (std::size_t t = 0; t < m; ++t) {
    acc += r;
    std::uint64_t width = q;
    if (acc >= s) {
      acc -= s;
      ++width;
    }
    pos[t] = static_cast<std::size_t>(lo + rng.below(j0 + t, width));
    lo += width;
  }
}

/// Samples per chunk: positions are computed first, then gathered, so the
/// cache misses of one chunk overlap.
inline constexpr std::size_t sample_chunk = 256;

/// out[j] = key_of(position of sample j) for the stratified sample of size out.size().
template <class KeyOf>
void sample_keys_with(std::size_t n, std::uint64_t seed, std::uint64_t stream, std::span<std::uint32_t> out,
                      KeyOf&& key_of) {
  const auto rng = sample_stream(seed, stream);
  const std::size_t s = out.size();
  std::size_t pos[sample_chunk];
  for (std::size_t j0 = 0; j0 < s; j0 += sample_chunk) {
    const std::size_t m = std::min(sample_chunk, s - j0);
    sample_positions(n, s, j0, m, rng, pos);
    for (std::size_t t = 0; t < m; ++t) out[j0 + t] = key_of(pos[t]);
  }
}

/// Shared body of the collect kernels. Appends to `out` the indices i (in
/// increasing order) with key > t, plus the first `need_eq` with key == t.
/// With Scale, every entry not appended is multiplied by `s`.
template <bool Scale, class T>
void collect(std::span<T> x, std::uint32_t t, std::size_t need_eq, float s, std::vector<std::uint32_t>& out,
             std::size_t begin = 0) {
  const std::size_t n = x.size();
  for (std::size_t i = begin; i < n; ++i) {
    const std::uint32_t key = topk_key(x[i]);
    bool take = key > t;
    if (key == t && need_eq > 0) {
      take = true;
      --need_eq;
    }
    if (take) {
      out.push_back(static_cast<std::uint32_t>(i));
    } else if constexpr (Scale) {
      x[i] = x[i] * s;
    }
  }
}

}  // namespace topk_detail

/// Histogram of digit `level` of key(x[i]) over the entries whose higher
/// digits equal `prefix` (level 0: all entries), into ws.hist[0, topk_bins).
/// Scalar increments into interleaved sub-histograms; measured faster here
/// than computing digits with SIMD and storing them for the increments (the
/// wide-store to narrow-load round trip stalls), so it serves every policy.
inline void topk_histogram(seq, std::span<const float> x, int level, std::uint32_t prefix, topk_workspace& ws) {
  constexpr std::size_t stride = topk_bins + 1;
  std::uint32_t* sub = ws.sub.data();
  const std::size_t n = x.size();
  std::size_t i = 0;
  if (level == 0) {  // the common pass: no prefix to test
    for (; i + topk_sub_histograms <= n; i += topk_sub_histograms)
      for (std::size_t h = 0; h < topk_sub_histograms; ++h) ++sub[h * stride + (topk_key(x[i + h]) >> topk_level_shift[0])];
  } else {
    for (; i + topk_sub_histograms <= n; i += topk_sub_histograms)
      for (std::size_t h = 0; h < topk_sub_histograms; ++h)
        ++sub[h * stride + topk_detail::digit_or_discard(topk_key(x[i + h]), level, prefix)];
  }
  for (; i < n; ++i) ++sub[topk_detail::digit_or_discard(topk_key(x[i]), level, prefix)];
  topk_detail::reduce_sub_histograms(ws);
}

/// Appends the indices with key(x[i]) >= key_lo to `out`, in increasing order.
inline void topk_collect_ge(seq, std::span<const float> x, std::uint32_t key_lo, std::vector<std::uint32_t>& out) {
  if (key_lo == 0) {  // everything qualifies
    for (std::size_t i = 0; i < x.size(); ++i) out.push_back(static_cast<std::uint32_t>(i));
    return;
  }
  topk_detail::collect<false>(x, key_lo - 1, 0, 1.0f, out);
}

/// As topk_collect_ge, and multiplies every entry not collected by s
/// (sa_momentum's u *= 1/m on unsent coordinates, DGS eq. 15).
inline void topk_collect_ge_scale_rest(seq, std::span<float> x, std::uint32_t key_lo, float s,
                                       std::vector<std::uint32_t>& out) {
  if (key_lo == 0) {
    for (std::size_t i = 0; i < x.size(); ++i) out.push_back(static_cast<std::uint32_t>(i));
    return;
  }
  topk_detail::collect<true>(x, key_lo - 1, 0, s, out);
}

/// Final selection pass once the exact threshold t is known: appends the
/// indices with key > t and the first `need_eq` indices with key == t.
inline void topk_collect_final(seq, std::span<const float> x, std::uint32_t t, std::size_t need_eq,
                               std::vector<std::uint32_t>& out) {
  topk_detail::collect<false>(x, t, need_eq, 1.0f, out);
}

/// As topk_collect_final, and multiplies every entry not selected by s.
inline void topk_collect_final_scale_rest(seq, std::span<float> x, std::uint32_t t, std::size_t need_eq, float s,
                                          std::vector<std::uint32_t>& out) {
  topk_detail::collect<true>(x, t, need_eq, s, out);
}

/// Exact k-th largest of a key buffer by three radix passes with compaction
/// (keys is overwritten). Requires 1 <= k <= keys.size().
inline topk_threshold topk_select_keys(seq, std::span<std::uint32_t> keys, std::size_t k,
                                       std::vector<std::uint32_t>& scratch) {
  std::uint32_t hist[topk_bins];
  std::span<std::uint32_t> cur = keys;
  if (scratch.size() < keys.size()) scratch.resize(keys.size());
  std::span<std::uint32_t> other(scratch.data(), keys.size());
  std::uint32_t prefix = 0;
  std::size_t greater = 0;
  for (int level = 0; level < topk_levels; ++level) {
    const unsigned shift = topk_level_shift[level];
    const std::size_t bins = std::size_t{1} << topk_level_bits[level];
    const std::uint32_t mask = static_cast<std::uint32_t>(bins - 1);
    std::fill(hist, hist + bins, 0u);
    for (std::uint32_t key : cur) ++hist[(key >> shift) & mask];
    const auto pick = topk_detail::pick_bin(hist, bins, k);
    greater += pick.above;
    k -= pick.above;
    prefix = (prefix << topk_level_bits[level]) | pick.bin;
    if (level + 1 < topk_levels && hist[pick.bin] != cur.size()) {
      std::size_t m = 0;
      for (std::uint32_t key : cur)
        if (((key >> shift) & mask) == pick.bin) other[m++] = key;
      const auto next = other.first(m);
      other = std::span<std::uint32_t>(cur.data(), keys.size());
      cur = next;
    }
  }
  return {prefix, greater};
}

/// Keys of `s` entries of x drawn by stratified sampling (one uniform draw per
/// stratum of n/s entries) from the counter-based stream (seed, stream).
inline void topk_sample_keys(seq, std::span<const float> x, std::uint64_t seed, std::uint64_t stream,
                             std::span<std::uint32_t> out) {
  topk_detail::sample_keys_with(x.size(), seed, stream, out, [&](std::size_t i) { return topk_key(x[i]); });
}

/// Size of the sample and the rank within it whose key becomes the sampled
/// threshold. The rank sits three standard deviations above the expected
/// count s*k/n, so the threshold is at or below the true k-th largest with
/// probability about 99.9% and the candidate count is about (1 + 3/sqrt(s k/n)) k.
/// `use_exact` when a sample would be a large part of the data.
struct topk_sample_plan {
  std::size_t samples = 0;
  std::size_t rank = 0;
  bool use_exact = true;
};
inline constexpr double topk_sample_expected_hits = 64.0;  ///< target of s*k/n
inline constexpr std::size_t topk_min_samples = 4096;

inline topk_sample_plan topk_plan_sample(std::size_t n, std::size_t k) noexcept {
  topk_sample_plan plan;
  if (k == 0 || k >= n) return plan;
  const double s_real = std::ceil(topk_sample_expected_hits * double(n) / double(k));
  std::size_t s = s_real >= double(n) ? n : static_cast<std::size_t>(s_real);
  s = std::max(s, std::min(n, topk_min_samples));
  if (2 * s > n) return plan;
  const double mu = double(s) * double(k) / double(n);
  // volatile: the rank must not depend on whether the compiler fuses this
  // into an FMA (it would differ between instantiations, and with it the sample).
  volatile double three_sd = 3.0 * std::sqrt(mu);
  std::size_t rank = static_cast<std::size_t>(std::ceil(mu + three_sd)) + 1;
  plan.samples = s;
  plan.rank = std::min(rank, s);
  plan.use_exact = false;
  return plan;
}

/// Keeps in `cand` (increasing indices of x) the k entries of largest
/// magnitude, lower index first among ties, preserving order; calls
/// on_reject(i) for every index dropped. Nothing happens when cand.size() <= k.
template <class Policy, class T, class OnReject>
void topk_keep_largest(Policy policy, std::span<T> x, std::vector<std::uint32_t>& cand, std::size_t k,
                       topk_workspace& ws, OnReject&& on_reject) {
  if (cand.size() <= k) return;
  if (k == 0) {
    for (std::uint32_t c : cand) on_reject(c);
    cand.clear();
    return;
  }
  ws.keys.resize(cand.size());
  for (std::size_t j = 0; j < cand.size(); ++j) ws.keys[j] = topk_key(x[cand[j]]);
  const topk_threshold th = topk_select_keys(policy, std::span<std::uint32_t>(ws.keys), k, ws.scratch);
  std::size_t need_eq = k - th.greater;
  std::size_t m = 0;
  for (std::uint32_t c : cand) {
    const std::uint32_t key = topk_key(x[c]);
    if (key > th.key || (key == th.key && need_eq > 0)) {
      if (key == th.key) --need_eq;
      cand[m++] = c;
    } else {
      on_reject(c);
    }
  }
  cand.resize(m);
}

/// Exact top-k by radix select over x, given (when `level0_ready`) that
/// ws.hist already holds the level-0 histogram of x. Writes the selected
/// indices, increasing, into `out`. With a mutable span and s != 1, every
/// entry not selected is multiplied by s. Requires k < x.size().
template <class Policy, class T>
void topk_exact_levels(Policy policy, std::span<T> x, std::size_t k, float s, bool level0_ready, topk_workspace& ws,
                       std::vector<std::uint32_t>& out) {
  static_assert(std::is_same_v<std::remove_const_t<T>, float>);
  constexpr bool can_scale = !std::is_const_v<T>;
  const bool scale = can_scale && s != 1.0f;
  const std::span<const float> cx(x.data(), x.size());
  out.clear();
  if (k == 0) {
    if constexpr (can_scale)
      if (scale)
        for (auto& v : x) v = v * s;
    return;
  }
  std::uint32_t prefix = 0;
  std::size_t greater = 0, rem = k;
  const std::size_t small = std::max<std::size_t>(k, std::size_t{1} << 16);
  for (int level = 0; level < topk_levels; ++level) {
    if (level > 0 || !level0_ready) topk_histogram(policy, cx, level, prefix, ws);
    const std::size_t bins = std::size_t{1} << topk_level_bits[level];
    const auto pick = topk_detail::pick_bin(ws.hist.data(), bins, rem);
    const std::size_t in_bin = ws.hist[pick.bin];
    greater += pick.above;
    rem -= pick.above;
    prefix = (prefix << topk_level_bits[level]) | pick.bin;
    const std::uint32_t key_lo = prefix << topk_level_shift[level];
    if (level + 1 == topk_levels) {  // the threshold is the full key
      out.reserve(k);
      if constexpr (can_scale) {
        if (scale) {
          topk_collect_final_scale_rest(policy, x, key_lo, rem, s, out);
          return;
        }
      }
      topk_collect_final(policy, cx, key_lo, rem, out);
      return;
    }
    if (in_bin <= small) {
      out.reserve(greater + in_bin);
      if constexpr (can_scale) {
        if (scale) {
          topk_collect_ge_scale_rest(policy, x, key_lo, s, out);
          topk_keep_largest(policy, cx, out, k, ws, [&](std::uint32_t i) { x[i] = x[i] * s; });
          return;
        }
      }
      topk_collect_ge(policy, cx, key_lo, out);
      topk_keep_largest(policy, cx, out, k, ws, [](std::uint32_t) {});
      return;
    }
  }
}

/// y[i] <- y[i] * s for every i not in `selected` (increasing indices).
inline void topk_scale_unselected(seq, std::span<float> y, std::span<const std::uint32_t> selected, float s) {
  std::size_t from = 0;
  auto scale_range = [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) y[i] = y[i] * s;
  };
  for (std::uint32_t i : selected) {
    scale_range(from, i);
    from = std::size_t{i} + 1;
  }
  scale_range(from, y.size());
}

/// Pure radix select: the min(k, n) largest |x|, lower index first among
/// ties, as increasing indices in `out`. A histogram pass and a collecting
/// pass in the common case; no randomness, so its cost does not vary.
template <class Policy>
void topk_radix(Policy policy, std::span<const float> x, std::size_t k, std::vector<std::uint32_t>& out,
                topk_workspace& ws) {
  if (k >= x.size()) {
    out.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) out[i] = static_cast<std::uint32_t>(i);
    return;
  }
  topk_exact_levels(policy, x, k, 1.0f, false, ws, out);
}

namespace topk_detail {
/// The sampled threshold key of `plan` (0 when no sample is taken);
/// sample_into(span) fills the sample keys.
template <class Policy, class SampleInto>
std::uint32_t sampled_threshold(Policy policy, const topk_sample_plan& plan, topk_workspace& ws,
                                SampleInto&& sample_into) {
  if (plan.use_exact) return 0;
  ws.keys.resize(plan.samples);
  sample_into(std::span<std::uint32_t>(ws.keys));
  return topk_select_keys(policy, std::span<std::uint32_t>(ws.keys), plan.rank, ws.scratch).key;
}

/// The sampling pass of topk_exact and topk_sampled: when sampling pays (k <
/// n and the sampled threshold t is not 0), `out` receives every index with
/// key >= t (a superset of the top k whenever it holds at least k) and the
/// result is true; otherwise false and `out` is untouched.
template <class Policy>
bool sampled_candidates(Policy policy, std::span<const float> x, std::size_t k, std::uint64_t seed,
                        std::uint64_t stream, std::vector<std::uint32_t>& out, topk_workspace& ws) {
  if (k >= x.size()) return false;
  const std::uint32_t t = topk_detail::sampled_threshold(
      policy, topk_plan_sample(x.size(), k), ws,
      [&](std::span<std::uint32_t> keys) { topk_sample_keys(policy, x, seed, stream, keys); });
  if (t == 0) return false;
  out.clear();
  out.reserve(k + k / 2 + 64);
  topk_collect_ge(policy, x, t, out);
  return true;
}
}  // namespace topk_detail

/// Exact top-k of |x|: the min(k, n) largest magnitudes, lower index first
/// among ties, as increasing indices in `out` -- always the same result as
/// topk_radix. A stratified sample (stream (seed, stream)) gives a threshold
/// t a little below the k-th magnitude; one collecting pass takes every
/// entry with key >= t and, when at least k qualified, the exact top-k among
/// them is the answer (every larger entry is a candidate). When fewer than k
/// qualified (about 0.1% of calls on continuous data), or when sampling does
/// not pay (small x, large k, t == 0), it runs topk_radix. The seed only
/// changes the work, never the result.
template <class Policy>
void topk_exact(Policy policy, std::span<const float> x, std::size_t k, std::vector<std::uint32_t>& out,
                topk_workspace& ws, std::uint64_t seed = 0, std::uint64_t stream = 0) {
  if (topk_detail::sampled_candidates(policy, x, k, seed, stream, out, ws) && out.size() >= k) {
    topk_keep_largest(policy, x, out, k, ws, [](std::uint32_t) {});
    return;
  }
  topk_radix(policy, x, k, out, ws);
}

/// Sampled top-k of |x| (DGC): the same sampled threshold and collecting pass
/// as topk_exact, then the exact top-k among the candidates when more than k
/// qualified, but no fallback: when fewer than k qualified they are all the
/// selection. Returns the number selected (<= k; the selection is always the
/// exact top of its own size). Runs topk_radix where sampling does not pay.
template <class Policy>
std::size_t topk_sampled(Policy policy, std::span<const float> x, std::size_t k, std::uint64_t seed,
                         std::uint64_t stream, std::vector<std::uint32_t>& out, topk_workspace& ws) {
  if (topk_detail::sampled_candidates(policy, x, k, seed, stream, out, ws))
    topk_keep_largest(policy, x, out, k, ws, [](std::uint32_t) {});
  else
    topk_radix(policy, x, k, out, ws);
  return out.size();
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
