#pragma once
/// \file system/thrust/topk.hpp
/// Thrust (execution::thrust<P>) top-k selection by magnitude: the same
/// selections as system/generic/topk.hpp (the k largest |x|, lower index first
/// among equal magnitudes, increasing indices), built from three Thrust-native
/// pieces instead of the generic kernels' sequential scans:
///
///  - compaction: `thrust::for_each` over chunks marks the qualifying entries
///    in a bitmask and counts them per chunk, `thrust::exclusive_scan` turns
///    the counts into offsets, a second `for_each` writes each chunk's indices
///    in increasing order (the marking pass may update the data as it goes:
///    the sparse codecs fuse their state update into it);
///  - radix select: per-chunk histograms of the 11/11/9-bit key digits
///    (`for_each` over chunks, then a `for_each` over bins summing the
///    chunks' counts); the bin choice (pick_bin) runs on the host;
///  - the stratified sample of the sampled threshold: one counter-based draw
///    per sample, `for_each` over samples.
///
/// Algorithms (same names and results as the generic ones): topk_radix,
/// topk_exact (sampled bracket + exact re-selection, radix fallback),
/// topk_sampled (DGC, no fallback; same sample and threshold as seq, so the
/// same selection).

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/system/generic/topk.hpp>
#include <gradcomp/system/thrust/common.hpp>

#include <thrust/scan.h>
#include <thrust/transform_reduce.h>

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN

namespace thrust_detail {

// --- key digits (topk_level_shift / topk_level_bits, usable on a device) -------

GRADCOMP_HD constexpr unsigned topk_shift(int level) noexcept { return level == 0 ? 20u : (level == 1 ? 9u : 0u); }
GRADCOMP_HD constexpr unsigned topk_digit_bits(int level) noexcept { return level == 2 ? 9u : 11u; }
static_assert(topk_shift(0) == topk_level_shift[0] && topk_shift(1) == topk_level_shift[1] &&
                  topk_shift(2) == topk_level_shift[2] && topk_digit_bits(0) == topk_level_bits[0] &&
                  topk_digit_bits(1) == topk_level_bits[1] && topk_digit_bits(2) == topk_level_bits[2],
              "digit layout must match system/generic/topk.hpp");
inline constexpr std::size_t topk_hist_stride = topk_bins + 1;  // + the discard bin

/// topk_detail::digit_or_discard for host and device.
GRADCOMP_HD inline std::uint32_t topk_digit(std::uint32_t key, int level, std::uint32_t prefix) noexcept {
  const unsigned shift = topk_shift(level);
  const unsigned high = shift + topk_digit_bits(level);
  const std::uint32_t digit = (key >> shift) & ((1u << topk_digit_bits(level)) - 1u);
  return (key >> high) == prefix ? digit : static_cast<std::uint32_t>(topk_bins);
}

// --- what is selected from --------------------------------------------------------

/// The values are x[i].
struct value_at {
  const float* x;
  GRADCOMP_HD float operator()(std::size_t i) const { return x[i]; }
};

/// Key of entry i of a value functor.
template <class Value>
struct key_of_value {
  Value value;
  GRADCOMP_HD std::uint32_t operator()(std::size_t i) const { return magnitude_key(value(i)); }
};

/// Keys given as such: keys[i].
struct key_at {
  const std::uint32_t* keys;
  GRADCOMP_HD std::uint32_t operator()(std::size_t i) const { return keys[i]; }
};

// --- compaction ----------------------------------------------------------------------

/// Elements per compaction chunk (a multiple of 32).
template <class P>
inline constexpr std::size_t compact_chunk = on_device<P> ? 1024 : 8192;

/// Pass 1: mask bit i = mark(i) (mark is called exactly once per i, and may
/// update element i), count per chunk.
template <class Mark>
struct mark_chunks {
  Mark mark;
  std::uint32_t* mask;
  std::uint32_t* counts;
  std::size_t n, chunk;
  GRADCOMP_HD void operator()(std::size_t c) const {
    const std::size_t begin = c * chunk, end = min_size(n, begin + chunk);
    std::uint32_t count = 0;
    for (std::size_t w0 = begin; w0 < end; w0 += 32) {
      const std::size_t m = min_size(32, end - w0);
      std::uint32_t bits = 0;
      for (std::size_t j = 0; j < m; ++j) bits |= static_cast<std::uint32_t>(mark(w0 + j)) << j;
      mask[w0 / 32] = bits;
      count += static_cast<std::uint32_t>(popcount32(bits));
    }
    counts[c] = count;
  }
};

/// Pass 2: out[offset of chunk c + ...] = map(i) for the marked i of chunk c, in order.
template <class Map>
struct emit_chunks {
  const std::uint32_t* mask;
  const std::uint32_t* offsets;
  std::uint32_t* out;
  std::size_t n, chunk;
  Map map;
  GRADCOMP_HD void operator()(std::size_t c) const {
    const std::size_t begin = c * chunk, end = min_size(n, begin + chunk);
    std::uint32_t pos = offsets[c];
    for (std::size_t w0 = begin; w0 < end; w0 += 32)
      for (std::uint32_t bits = mask[w0 / 32]; bits != 0; bits &= bits - 1)
        out[pos++] = map(w0 + static_cast<std::size_t>(countr_zero32(bits)));
  }
};

struct index_identity {
  GRADCOMP_HD std::uint32_t operator()(std::size_t i) const { return static_cast<std::uint32_t>(i); }
};
struct index_of_candidate {
  const std::uint32_t* cand;
  GRADCOMP_HD std::uint32_t operator()(std::size_t j) const { return cand[j]; }
};

/// out = [map(i) for i in [0, n) if mark(i)], in increasing i. Returns the count.
/// `scratch` (host systems) backs the bitmask and the chunk counts.
template <class P, class Mark, class Map>
std::size_t compact(std::size_t n, Mark mark, Map map, buffer<P, std::uint32_t>& out,
                    std::vector<std::uint32_t>* scratch = nullptr) {
  constexpr std::size_t chunk = compact_chunk<P>;
  const std::size_t chunks = items(n, chunk), words = items(n, 32);
  buffer<P, std::uint32_t> meta(words + chunks + 1, scratch);
  std::uint32_t* mask = meta.data();
  std::uint32_t* counts = meta.data() + words;
  for_each_index<P>(chunks, n, mark_chunks<Mark>{mark, mask, counts, n, chunk});
  // Exclusive scan: counts[c] becomes chunk c's offset, counts[chunks] the
  // total (one count per chunk: a host loop on host systems).
  if constexpr (on_device<P>) {
    ::thrust::exclusive_scan(P{}, counts, counts + chunks + 1, counts);
  } else {
    std::uint32_t sum = 0;
    for (std::size_t c = 0; c <= chunks; ++c) {
      const std::uint32_t v = c < chunks ? counts[c] : 0u;
      counts[c] = sum;
      sum += v;
    }
  }
  const std::size_t total = meta.get(words + chunks);
  out.resize(total);
  for_each_index<P>(chunks, n, emit_chunks<Map>{mask, counts, out.data(), n, chunk, map});
  return total;
}

// --- radix select --------------------------------------------------------------------

template <class KeyFn>
struct histogram_chunks {
  KeyFn key;
  std::uint32_t* rows;  // topk_hist_stride per chunk
  std::size_t n, chunk;
  int level;
  std::uint32_t prefix;
  GRADCOMP_HD void operator()(std::size_t c) const {
    std::uint32_t* row = rows + c * topk_hist_stride;
    for (std::size_t b = 0; b < topk_hist_stride; ++b) row[b] = 0;
    const std::size_t end = min_size(n, (c + 1) * chunk);
    if (level == 0) {
      for (std::size_t i = c * chunk; i < end; ++i) ++row[key(i) >> topk_shift(0)];
    } else {
      for (std::size_t i = c * chunk; i < end; ++i) ++row[topk_digit(key(i), level, prefix)];
    }
  }
};

struct histogram_columns {
  const std::uint32_t* rows;
  std::uint32_t* hist;
  std::size_t chunks;
  GRADCOMP_HD void operator()(std::size_t b) const {
    std::uint32_t s = 0;
    for (std::size_t c = 0; c < chunks; ++c) s += rows[c * topk_hist_stride + b];
    hist[b] = s;
  }
};

/// Histogram of digit `level` of key(i), i < n, over the keys whose higher
/// digits equal `prefix`, into host memory hist[0, topk_bins).
template <class P>
class histogrammer {
 public:
  explicit histogrammer(std::size_t n)
      : n_(n),
        chunks_(on_device<P> ? items(n, 4096) : min_size(16, items(n, 65536))),
        chunk_(items(n, chunks_ ? chunks_ : 1)),
        rows_(chunks_ * topk_hist_stride),
        sums_(on_device<P> ? topk_bins : 0),
        host_(topk_bins) {}

  template <class KeyFn>
  const std::uint32_t* run(KeyFn key, int level, std::uint32_t prefix) {
    for_each_index<P>(chunks_, n_, histogram_chunks<KeyFn>{key, rows_.data(), n_, chunk_, level, prefix});
    if constexpr (on_device<P>) {
      for_each_index<P>(topk_bins, topk_bins * chunks_, histogram_columns{rows_.data(), sums_.data(), chunks_});
      sums_.copy_to_host(host_.data(), topk_bins);
    } else {  // a few rows of host memory: summed on the calling thread
      const histogram_columns columns{rows_.data(), host_.data(), chunks_};
      for (std::size_t b = 0; b < topk_bins; ++b) columns(b);
    }
    return host_.data();
  }

 private:
  std::size_t n_, chunks_, chunk_;
  buffer<P, std::uint32_t> rows_, sums_;
  std::vector<std::uint32_t> host_;
};

/// The key of the k-th largest of key(i), i < n, and how many keys are larger
/// (topk_select_keys). Requires 1 <= k <= n.
template <class P, class KeyFn>
topk_threshold radix_threshold(KeyFn key, std::size_t n, std::size_t k) {
  histogrammer<P> h(n);
  std::uint32_t prefix = 0;
  std::size_t greater = 0;
  for (int level = 0; level < topk_levels; ++level) {
    const std::uint32_t* hist = h.run(key, level, prefix);
    const auto pick = topk_detail::pick_bin(hist, std::size_t{1} << topk_digit_bits(level), k);
    greater += pick.above;
    k -= pick.above;
    prefix = (prefix << topk_digit_bits(level)) | pick.bin;
  }
  return {prefix, greater};
}

// --- selection among candidates -----------------------------------------------------------

/// Candidate j (key keys[j]) is kept when its key is above t, or equal to t and j < eq_limit.
struct keep_candidate {
  const std::uint32_t* keys;
  std::uint32_t t;
  std::size_t eq_limit;
  GRADCOMP_HD bool operator()(std::size_t j) const { return keys[j] > t || (keys[j] == t && j < eq_limit); }
};
struct key_equals {
  const std::uint32_t* keys;
  std::uint32_t t;
  GRADCOMP_HD bool operator()(std::size_t j) const { return keys[j] == t; }
};
struct key_equals_count {
  const std::uint32_t* keys;
  std::uint32_t t;
  GRADCOMP_HD std::size_t operator()(std::size_t j) const { return keys[j] == t ? 1u : 0u; }
};
struct add_sizes {
  GRADCOMP_HD std::size_t operator()(std::size_t a, std::size_t b) const { return a + b; }
};

/// keys[j] = key(x[cand[j]]) for the candidates of one work item.
struct gather_keys {
  const float* x;
  const std::uint32_t* cand;
  std::uint32_t* keys;
  std::size_t m, per_item;
  GRADCOMP_HD void operator()(std::size_t item) const {
    const std::size_t end = min_size(m, (item + 1) * per_item);
    for (std::size_t j = item * per_item; j < end; ++j) keys[j] = magnitude_key(x[cand[j]]);
  }
};

/// x[i] *= s (the rescaling of a rejected candidate, DGS eq. 15).
struct scale_at {
  float* x;
  float s;
  GRADCOMP_HD void operator()(std::uint32_t i) const { x[i] = x[i] * s; }
};
/// Nothing to do for a rejected candidate.
struct no_reject {
  GRADCOMP_HD void operator()(std::uint32_t) const {}
};

template <class Keep, class Reject>
struct reject_unkept {
  Keep keep;
  const std::uint32_t* cand;
  Reject reject;
  GRADCOMP_HD void operator()(std::size_t j) const {
    if (!keep(j)) reject(cand[j]);
  }
};

/// Scratch of one selection: candidate indices and their keys (the indices
/// borrow the workspace's vectors on host systems so warm calls do not
/// allocate).
template <class P>
struct selection {
  explicit selection(topk_workspace* ws)
      : scratch(ws ? &ws->keys : nullptr), cand(0, ws ? &ws->scratch : nullptr), spare(0), keys(0) {}
  std::vector<std::uint32_t>* scratch;
  buffer<P, std::uint32_t> cand, spare, keys;

  /// keys = key(x[cand]) (one gather, so the selection passes read contiguous keys).
  void gather(const float* x) {
    const std::size_t m = cand.size();
    keys.resize(m);
    constexpr std::size_t per = item_elements<P>;
    for_each_index<P>(items(m, per), m, gather_keys{x, cand.data(), keys.data(), m, per});
  }
};

/// Keeps from the candidates (increasing indices, keys gathered, all >= t)
/// those with key > t and the first need_eq with key == t; reject(i) for the others.
template <class P, class Reject>
void select_final(selection<P>& sel, std::uint32_t t, std::size_t need_eq, Reject reject) {
  const std::size_t m = sel.cand.size();
  const std::uint32_t* cand = sel.cand.data();
  const std::uint32_t* keys = sel.keys.data();
  std::size_t equal = 0;
  if (run_serially<P>(m, m)) {
    for (std::size_t j = 0; j < m; ++j) equal += keys[j] == t;
  } else {
    equal = ::thrust::transform_reduce(P{}, ::thrust::counting_iterator<std::size_t>(0),
                                       ::thrust::counting_iterator<std::size_t>(m), key_equals_count{keys, t},
                                       std::size_t{0}, add_sizes{});
  }
  std::size_t eq_limit = m;  // keep every equal candidate
  if (need_eq < equal) {
    eq_limit = 0;
    if (need_eq > 0) {  // position of the need_eq-th equal candidate, + 1
      buffer<P, std::uint32_t> eq(0);
      compact(m, key_equals{keys, t}, index_identity{}, eq, sel.scratch);
      eq_limit = std::size_t{eq.get(need_eq - 1)} + 1;
    }
  }
  const keep_candidate keep{keys, t, eq_limit};
  compact(m, keep, index_of_candidate{cand}, sel.spare, sel.scratch);
  if constexpr (!std::is_same_v<Reject, no_reject>)
    for_each_index<P>(m, m, reject_unkept<keep_candidate, Reject>{keep, cand, reject});
  sel.cand.swap(sel.spare);
}

/// topk_keep_largest: keeps the k candidates of largest |x| (lower index
/// first among ties), order preserved; reject(i) for every dropped index.
template <class P, class Reject>
void keep_largest(const float* x, selection<P>& sel, std::size_t k, Reject reject) {
  const std::size_t m = sel.cand.size();
  if (m <= k) return;
  sel.gather(x);
  const topk_threshold th = k == 0 ? topk_threshold{0xFFFFFFFFu, 0} : radix_threshold<P>(key_at{sel.keys.data()}, m, k);
  select_final(sel, th.key, k - th.greater, reject);
}

/// Marks key(x[i]) >= t.
struct key_at_least {
  const float* x;
  std::uint32_t t;
  GRADCOMP_HD bool operator()(std::size_t i) const { return magnitude_key(x[i]) >= t; }
};

/// Exact top-k of |x| (topk_exact_levels without the rescaling): 1 <= k < n.
/// The selection (increasing indices) ends in sel.cand. Histogram levels as
/// in the generic kernel; once the bin holding the k-th key is small, one
/// compaction collects the entries at or above it and the exact k are kept.
template <class P>
void exact_top_k(const float* x, std::size_t n, std::size_t k, selection<P>& sel) {
  histogrammer<P> h(n);
  const key_of_value<value_at> key{value_at{x}};
  std::uint32_t prefix = 0;
  std::size_t rem = k;  // rank of the k-th key within the current bin
  const std::size_t small = k > (std::size_t{1} << 16) ? k : (std::size_t{1} << 16);
  for (int level = 0; level < topk_levels; ++level) {
    const std::uint32_t* hist = h.run(key, level, prefix);
    const auto pick = topk_detail::pick_bin(hist, std::size_t{1} << topk_digit_bits(level), rem);
    const std::size_t in_bin = hist[pick.bin];
    rem -= pick.above;
    prefix = (prefix << topk_digit_bits(level)) | pick.bin;
    const std::uint32_t key_lo = prefix << topk_shift(level);
    if (level + 1 == topk_levels) {  // the threshold is the full key
      compact(n, key_at_least{x, key_lo}, index_identity{}, sel.cand, sel.scratch);
      sel.gather(x);
      select_final(sel, key_lo, rem, no_reject{});
      return;
    }
    if (in_bin <= small) {
      compact(n, key_at_least{x, key_lo}, index_identity{}, sel.cand, sel.scratch);
      keep_largest(x, sel, k, no_reject{});
      return;
    }
  }
}

// --- stratified sample (topk_sample_keys / axpby_sample_keys) ---------------------------

template <class Value>
struct sample_keys_op {
  Value value;
  std::uint32_t* keys;
  std::uint64_t n, s;
  counter_draws draws;
  GRADCOMP_HD void operator()(std::size_t j) const {
    const std::uint64_t lo = std::uint64_t(j) * n / s;
    const std::uint64_t hi = (std::uint64_t(j) + 1) * n / s;
    keys[j] = magnitude_key(value(static_cast<std::size_t>(lo + draws.below(j, hi - lo))));
  }
};

/// The sampled threshold key of topk_plan_sample(n, k) (0 when no sample is
/// taken): the plan.rank-th largest key of the stratified sample of value(i).
template <class P, class Value>
std::uint32_t sampled_threshold(const topk_sample_plan& plan, Value value, std::size_t n, std::uint64_t seed,
                                std::uint64_t stream) {
  if (plan.use_exact) return 0;
  buffer<P, std::uint32_t> keys(plan.samples);
  for_each_index<P>(plan.samples, plan.samples,
                    sample_keys_op<Value>{value, keys.data(), n, plan.samples, draws_of(seed, stream)});
  return radix_threshold<P>(key_at{keys.data()}, plan.samples, plan.rank).key;
}

// --- rescaling of everything not selected --------------------------------------------------

/// x[i] *= s over the item's range, skipping the (increasing) selected indices.
struct scale_except_items {
  float* x;
  const std::uint32_t* selected;
  std::size_t k, n, per_item;
  float s;
  GRADCOMP_HD void operator()(std::size_t item) const {
    const std::size_t begin = item * per_item, end = min_size(n, begin + per_item);
    std::size_t lo = 0, hi = k;  // first selected index >= begin
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (selected[mid] < begin)
        lo = mid + 1;
      else
        hi = mid;
    }
    std::size_t from = begin;
    for (std::size_t j = lo; j < k && selected[j] < end; ++j) {
      for (std::size_t i = from; i < selected[j]; ++i) x[i] = x[i] * s;
      from = std::size_t{selected[j]} + 1;
    }
    for (std::size_t i = from; i < end; ++i) x[i] = x[i] * s;
  }
};

/// x[i] *= s for every i not in `selected` (increasing indices;
/// topk_scale_unselected), in one pass.
template <class P>
void scale_unselected(float* x, std::size_t n, const buffer<P, std::uint32_t>& selected, float s) {
  constexpr std::size_t per = item_elements<P>;
  for_each_index<P>(items(n, per), n, scale_except_items{x, selected.data(), selected.size(), n, per, s});
}

}  // namespace thrust_detail

/// topk_radix with P's system: the min(k, n) largest |x|, lower index first
/// among ties, as increasing indices in `out`.
template <class P>
void topk_radix(thrust<P>, std::span<const float> x, std::size_t k, std::vector<std::uint32_t>& out,
                topk_workspace& ws) {
  using namespace thrust_detail;
  const std::size_t n = x.size();
  if (k >= n) {
    out.resize(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint32_t>(i);
    return;
  }
  out.clear();
  if (k == 0) return;
  operand<P, const float> xs(x);
  selection<P> sel(&ws);
  exact_top_k<P>(xs.data(), n, k, sel);
  sel.cand.assign_to(out, sel.cand.size());
}

/// topk_exact with P's system: always the same selection as topk_radix; a
/// stratified sample (stream (seed, stream)) brackets the threshold so that
/// usually one compaction pass and a small selection suffice.
template <class P>
void topk_exact(thrust<P> policy, std::span<const float> x, std::size_t k, std::vector<std::uint32_t>& out,
                topk_workspace& ws, std::uint64_t seed = 0, std::uint64_t stream = 0) {
  using namespace thrust_detail;
  const std::size_t n = x.size();
  if (k >= n || k == 0) return topk_radix(policy, x, k, out, ws);
  operand<P, const float> xs(x);
  selection<P> sel(&ws);
  const std::uint32_t t = sampled_threshold<P>(topk_plan_sample(n, k), value_at{xs.data()}, n, seed, stream);
  if (t != 0) {
    compact(n, key_at_least{xs.data(), t}, index_identity{}, sel.cand, sel.scratch);
    if (sel.cand.size() >= k) {
      keep_largest(xs.data(), sel, k, no_reject{});
      sel.cand.assign_to(out, sel.cand.size());
      return;
    }
  }
  exact_top_k<P>(xs.data(), n, k, sel);
  sel.cand.assign_to(out, sel.cand.size());
}

/// topk_sampled (DGC) with P's system: the same sample, threshold and
/// selection as the seq kernel; returns the number selected (<= k).
template <class P>
std::size_t topk_sampled(thrust<P> policy, std::span<const float> x, std::size_t k, std::uint64_t seed,
                         std::uint64_t stream, std::vector<std::uint32_t>& out, topk_workspace& ws) {
  using namespace thrust_detail;
  const std::size_t n = x.size();
  if (k >= n || k == 0) {
    topk_radix(policy, x, k, out, ws);
    return out.size();
  }
  operand<P, const float> xs(x);
  selection<P> sel(&ws);
  const std::uint32_t t = sampled_threshold<P>(topk_plan_sample(n, k), value_at{xs.data()}, n, seed, stream);
  if (t != 0) {
    compact(n, key_at_least{xs.data(), t}, index_identity{}, sel.cand, sel.scratch);
    keep_largest(xs.data(), sel, k, no_reject{});
  } else {
    exact_top_k<P>(xs.data(), n, k, sel);
  }
  sel.cand.assign_to(out, sel.cand.size());
  return out.size();
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
