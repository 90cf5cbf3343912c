#pragma once
/// \file system/thrust/common.hpp
/// Building blocks shared by the Thrust kernels (execution::thrust<P>):
/// where operands live (host memory in place, or staged through CUDA device
/// memory), scratch buffers, a parallel loop over work items, and scalar
/// helpers that compile for the host and, under nvcc, for a CUDA device.
///
/// Work items. Most kernels run `thrust::for_each` over work items of a few
/// thousand consecutive elements (a few hundred on CUDA) rather than over
/// single elements: an item's loop is the generic kernel's loop, which the
/// host compiler vectorises, and every result is a pure function of the data,
/// so the item size never changes a result (docs/backends.md).
///
/// Floating point on a device. Host code calls the generic kernels' own
/// scalar functions, so the CPU systems reproduce execution::seq bit for bit
/// (tests/unit/test_thrust_backend.cpp). Device code cannot call those host
/// functions; it uses mirrors written with CUDA's round-to-nearest intrinsics
/// (__fmul_rn, __fadd_rn, which nvcc never fuses into an FMA) so that each
/// product is rounded exactly as on the host. The integer hashes of the
/// counter-based generator are written once here and used on both sides.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/detail/policy_tags.hpp>
#include <gradcomp/detail/random.hpp>
#include <gradcomp/system/thrust/policy.hpp>

#include <thrust/copy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/reduce.h>
#if defined(__CUDACC__)
#include <thrust/system/cuda/vector.h>
#endif

namespace gradcomp::execution {
GRADCOMP_ABI_NAMESPACE_BEGIN
namespace thrust_detail {

// --- where a kernel's work items and memory live ------------------------------

/// True when P is a CUDA policy (operands must be staged to device memory).
template <class P>
inline constexpr bool on_device = is_cuda_system<P>::value;

/// Elements per work item of the element-wise kernels.
template <class P>
inline constexpr std::size_t item_elements = on_device<P> ? 256 : 4096;

/// Storage of a scratch array: a std::vector for host systems, a
/// thrust::cuda::vector on CUDA.
template <class P, class T, class = void>
struct storage {
  using type = std::vector<T>;
};
#if defined(__CUDACC__)
template <class P, class T>
struct storage<P, T, std::enable_if_t<is_cuda_system<P>::value>> {
  using type = ::thrust::cuda::vector<T>;
};
#endif

template <class V>
auto raw_data(V& v) {
  return ::thrust::raw_pointer_cast(v.data());
}

/// A scratch array in the memory P's algorithms work on. On a host system it
/// may borrow a caller's std::vector (e.g. a codec's topk_workspace) so that
/// warm calls allocate nothing.
template <class P, class T>
class buffer {
 public:
  explicit buffer(std::size_t n = 0, std::vector<T>* borrowed = nullptr) {
    if constexpr (on_device<P>) {
      (void)borrowed;
    } else {
      vec_ = borrowed ? borrowed : &own_;
    }
    resize(n);
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;

  /// Resizes to n elements (contents of the first min(old, n) kept; new ones unspecified).
  void resize(std::size_t n) {
    if constexpr (on_device<P>) {
      dev_.resize(n);
      ptr_ = raw_data(dev_);
    } else {
      vec_->resize(n);
      ptr_ = vec_->data();
    }
    size_ = n;
  }
  T* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return size_; }

  /// Copies elements [offset, offset + count) to host memory at dst.
  void copy_to_host(T* dst, std::size_t count, std::size_t offset = 0) const {
    if (count == 0) return;
    if constexpr (on_device<P>) {
      ::thrust::copy(dev_.begin() + static_cast<std::ptrdiff_t>(offset),
                     dev_.begin() + static_cast<std::ptrdiff_t>(offset + count), dst);
    } else {
      const T* src = ptr_ + offset;
      for (std::size_t i = 0; i < count; ++i) dst[i] = src[i];
    }
  }
  /// Element i, read on the host.
  T get(std::size_t i) const {
    T v{};
    copy_to_host(&v, 1, i);
    return v;
  }
  /// out = the first `count` elements.
  void assign_to(std::vector<T>& out, std::size_t count) const {
    out.resize(count);
    copy_to_host(out.data(), count);
  }
  /// Exchanges the contents (and the storage) of two buffers.
  void swap(buffer& o) noexcept {
    const bool a_own = vec_ == &own_, b_own = o.vec_ == &o.own_;
    std::swap(dev_, o.dev_);
    std::swap(own_, o.own_);
    std::swap(vec_, o.vec_);
    std::swap(ptr_, o.ptr_);
    std::swap(size_, o.size_);
    if (b_own) vec_ = &own_;
    if (a_own) o.vec_ = &o.own_;
  }

 private:
  typename storage<P, T>::type dev_;  // CUDA: the storage; host: unused (empty)
  std::vector<T> own_;
  std::vector<T>* vec_ = nullptr;
  T* ptr_ = nullptr;
  std::size_t size_ = 0;
};

/// A kernel operand given as a host span: on a host system the span itself;
/// on CUDA a device copy (copied in unless CopyIn is false; copied back by
/// commit() for a mutable span).
template <class P, class T, bool CopyIn = true>
class operand {
 public:
  using value_type = std::remove_const_t<T>;
  explicit operand(std::span<T> host) : host_(host) {
    if constexpr (on_device<P>) {
      if constexpr (CopyIn)
        dev_.assign(host.begin(), host.end());
      else
        dev_.resize(host.size());
      ptr_ = raw_data(dev_);
    } else {
      ptr_ = host.data();
    }
  }
  operand(const operand&) = delete;
  operand& operator=(const operand&) = delete;

  T* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return host_.size(); }
  /// Copies a device copy back into the host span (no-op on host systems).
  void commit() {
    static_assert(!std::is_const_v<T>, "commit() of a read-only operand");
    if constexpr (on_device<P>) ::thrust::copy(dev_.begin(), dev_.end(), host_.data());
  }

 private:
  std::span<T> host_;
  typename storage<P, value_type>::type dev_;
  T* ptr_ = nullptr;
};

/// On host systems, loops touching at most this many elements run on the
/// calling thread: a parallel region would cost a fork and a join (and, on a
/// busy machine, a wait for a descheduled thread) for microseconds of work.
inline constexpr std::size_t serial_work_limit = std::size_t{1} << 17;

/// True when a loop over `work` elements runs on the calling thread.
template <class P>
constexpr bool run_serially(std::size_t items, std::size_t work) noexcept {
  return !on_device<P> && (items <= 1 || work <= serial_work_limit);
}

/// Runs f(i) for i in [0, count) with P's system (each i exactly once, in
/// any order and concurrently); `work` is the number of elements the loop
/// touches (small loops on host systems run on the calling thread).
template <class P, class F>
void for_each_index(std::size_t count, std::size_t work, F f) {
  if (count == 0) return;
  if (run_serially<P>(count, work)) {
    for (std::size_t i = 0; i < count; ++i) f(i);
    return;
  }
  ::thrust::for_each_n(P{}, ::thrust::counting_iterator<std::size_t>(0), count, f);
}

/// Combines the per-item partial results a kernel left in data[0, count)
/// (count is small: one per work item) with op, from init. On a host system
/// a loop on the calling thread; on CUDA thrust::reduce. op must be
/// associative and commutative (max, min, +).
template <class P, class T, class Op>
T combine_items(const T* data, std::size_t count, T init, Op op) {
  if constexpr (on_device<P>) {
    return ::thrust::reduce(P{}, data, data + count, init, op);
  } else {
    for (std::size_t i = 0; i < count; ++i) init = op(init, data[i]);
    return init;
  }
}

/// Number of work items of `per_item` elements covering n.
constexpr std::size_t items(std::size_t n, std::size_t per_item) noexcept { return (n + per_item - 1) / per_item; }

// --- scalar helpers for host and device ---------------------------------------

GRADCOMP_HD inline std::uint32_t float_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<std::uint32_t>(f);
#endif
}
GRADCOMP_HD inline float bits_float(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}
GRADCOMP_HD inline int popcount32(std::uint32_t v) noexcept {
#if defined(__CUDA_ARCH__)
  return __popc(v);
#else
  return std::popcount(v);
#endif
}
GRADCOMP_HD inline int countr_zero32(std::uint32_t v) noexcept {  // v != 0
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(v)) - 1;
#else
  return std::countr_zero(v);
#endif
}
/// Order-preserving key of |v| (topk_key of the generic kernels).
GRADCOMP_HD inline std::uint32_t magnitude_key(float v) noexcept { return float_bits(v) & 0x7FFFFFFFu; }
GRADCOMP_HD constexpr std::size_t min_size(std::size_t a, std::size_t b) noexcept { return a < b ? a : b; }

/// The counter-based generator of detail/random.hpp, written once for host
/// and device (integer operations only, so both give the same bits; the CPU
/// tests compare them with detail::counter_stream).
struct counter_draws {
  std::uint64_t key = 0;

  GRADCOMP_HD static constexpr std::uint32_t mix32(std::uint32_t x) noexcept {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
  }
  GRADCOMP_HD static constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  GRADCOMP_HD static constexpr std::uint64_t mulhi64(std::uint64_t a, std::uint64_t b) noexcept {
    const std::uint64_t a_lo = a & 0xFFFFFFFFu, a_hi = a >> 32;
    const std::uint64_t b_lo = b & 0xFFFFFFFFu, b_hi = b >> 32;
    const std::uint64_t lo_lo = a_lo * b_lo;
    const std::uint64_t hi_lo = a_hi * b_lo;
    const std::uint64_t lo_hi = a_lo * b_hi;
    const std::uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFu) + lo_hi;
    return a_hi * b_hi + (hi_lo >> 32) + (cross >> 32);
  }
  /// counter_stream::bits32(index).
  GRADCOMP_HD constexpr std::uint32_t bits32(std::uint64_t index) const noexcept {
    const auto k_lo = static_cast<std::uint32_t>(key), k_hi = static_cast<std::uint32_t>(key >> 32);
    std::uint32_t x = mix32(static_cast<std::uint32_t>(index) ^ k_lo);
    x = x ^ k_hi ^ (static_cast<std::uint32_t>(index >> 32) * 0x9E3779B9u);
    return mix32(x);
  }
  /// counter_stream::uniform_float(index).
  GRADCOMP_HD constexpr float uniform_float(std::uint64_t index) const noexcept {
    return static_cast<float>(bits32(index) >> 8) * 0x1p-24f;
  }
  /// counter_stream::below(index, bound).
  GRADCOMP_HD constexpr std::uint64_t below(std::uint64_t index, std::uint64_t bound) const noexcept {
    return mulhi64(mix64(key + (index + 1) * 0x9E3779B97F4A7C15ull), bound);
  }
};

/// The draws of counter_rng(seed).stream(stream).
inline counter_draws draws_of(std::uint64_t seed, std::uint64_t stream) noexcept {
  return counter_draws{gradcomp::detail::counter_rng(seed).stream(stream).key()};
}

}  // namespace thrust_detail
GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::execution
