// Summable buffers (payloads/summable.hpp): the fp16 / bfloat16 conversions
// (exhaustive over the 65536 16-bit patterns, round-to-nearest-even ties,
// overflow, subnormals, NaN, against a double-precision reference and, where
// the CPU has F16C, against the hardware), add_into's single rounding,
// pack / unpack, the summable ring (ring/summable.hpp) and the exchange's
// rounds of every element type over 2-4 in-process ranks (identical bits on
// every rank, the control block inside 16-bit and integer-word rounds).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include <gradcomp/model_exchange.hpp>
#include <gradcomp/payloads/summable.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <support/equality.hpp>
#include <support/random_vectors.hpp>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SUMMABLE_TEST_X86 1
#endif

namespace gs = gradcomp::summable;
namespace gx = gradcomp::exchange;
namespace ge = gradcomp::execution;
using gradcomp::summable_element;
using gradcomp::test_support::bit_equal;
using gradcomp::transport::inproc_endpoint;

namespace {

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

/// The value of fp16 bits, computed in double from the definition.
double half_value(std::uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : s * std::numeric_limits<double>::infinity();
  if (e == 0) return s * std::ldexp(double(m), -24);
  return s * std::ldexp(1.0 + double(m) / 1024.0, e - 15);
}

/// Reference round-to-nearest-even of a double to fp16 (overflow to Inf), by search.
std::uint16_t half_reference(double x) {
  if (std::isnan(x)) return 0x7E00;
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7C00;
  // Candidates: the largest magnitude pattern <= a, and the next.
  std::uint16_t lo = 0;
  for (int step = 1 << 14; step > 0; step >>= 1)
    if (lo + step <= 0x7BFF && half_value(std::uint16_t(lo + step)) <= a) lo = std::uint16_t(lo + step);
  if (half_value(lo) == a) return sign | lo;
  const std::uint16_t hi = std::uint16_t(lo + 1);
  const double dl = a - half_value(lo), dh = half_value(hi) - a;
  if (dl < dh) return sign | lo;
  if (dh < dl) return sign | hi;
  return sign | ((lo & 1) ? hi : lo);
}

}  // namespace

TEST_CASE("fp16: every one of the 65536 patterns converts to float and back unchanged") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto x = std::uint16_t(h);
    const float f = ge::half_bits_to_float(x);
    const double v = half_value(x);
    if (std::isnan(v)) {
      REQUIRE(std::isnan(f));
      // Quiet bit set, payload kept, sign kept.
      CHECK(ge::float_to_half_bits(f) == std::uint16_t(x | 0x0200));
      CHECK((bits(f) >> 31) == (h >> 15));
    } else {
      REQUIRE(double(f) == v);
      REQUIRE(std::signbit(f) == bool(h & 0x8000));
      REQUIRE(ge::float_to_half_bits(f) == x);
      if (std::fabs(v) <= 65504.0) REQUIRE(ge::float_to_half_bits_saturated(f) == x);
    }
  }
}

TEST_CASE("fp16: round to nearest even at every midpoint and beside it, against a reference") {
  // Between consecutive finite fp16 values (and 0 / the first subnormal):
  // the midpoint ties to the even pattern, one float ulp either side goes to the nearer.
  for (std::uint32_t h = 0; h < 0x7BFF; ++h) {
    const double a = half_value(std::uint16_t(h)), b = half_value(std::uint16_t(h + 1));
    const float mid = float((a + b) / 2);  // exact: fp16 midpoints need at most 12 bits
    REQUIRE(double(mid) == (a + b) / 2);
    const std::uint16_t even = (h & 1) ? std::uint16_t(h + 1) : std::uint16_t(h);
    REQUIRE(ge::float_to_half_bits(mid) == even);
    REQUIRE(ge::float_to_half_bits(-mid) == std::uint16_t(even | 0x8000));
    REQUIRE(ge::float_to_half_bits(std::nextafter(mid, 0.0f)) == std::uint16_t(h));
    REQUIRE(ge::float_to_half_bits(std::nextafter(mid, 1e9f)) == std::uint16_t(h + 1));
  }
  // A sweep of float patterns against the search reference.
  for (std::uint64_t u = 0; u < (1ull << 32); u += 65537) {
    const float x = std::bit_cast<float>(std::uint32_t(u));
    if (std::isnan(x)) continue;
    REQUIRE(ge::float_to_half_bits(x) == half_reference(double(x)));
  }
}

TEST_CASE("fp16: overflow, saturation, subnormals, zeros and NaN") {
  CHECK(ge::float_to_half_bits(65504.0f) == 0x7BFF);
  CHECK(ge::float_to_half_bits(65519.99f) == 0x7BFF);
  CHECK(ge::float_to_half_bits(65520.0f) == 0x7C00);  // the tie rounds to even: Inf
  CHECK(ge::float_to_half_bits(-1e9f) == 0xFC00);
  CHECK(ge::float_to_half_bits(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(ge::float_to_half_bits_saturated(65520.0f) == 0x7BFF);
  CHECK(ge::float_to_half_bits_saturated(-std::numeric_limits<float>::infinity()) == 0xFBFF);
  CHECK(ge::float_to_half_bits_saturated(1e30f) == 0x7BFF);
  CHECK(ge::round_to_half(1e6f) == 65504.0f);
  CHECK(ge::float_to_half_bits(0x1p-24f) == 0x0001);    // smallest subnormal
  CHECK(ge::float_to_half_bits(0x1p-25f) == 0x0000);    // tie with 0: even
  CHECK(ge::float_to_half_bits(0x1.8p-24f) == 0x0002);  // 1.5 ulp: tie to even (2)
  CHECK(ge::float_to_half_bits(0x1.000002p-25f) == 0x0001);
  CHECK(ge::float_to_half_bits(0x1p-14f) == 0x0400);  // smallest normal
  CHECK(ge::float_to_half_bits(0x1.FFFp-15f) == 0x0400);  // rounds up into the normals
  CHECK(ge::float_to_half_bits(-0.0f) == 0x8000);
  CHECK(ge::float_to_half_bits(1e-30f) == 0x0000);
  CHECK(ge::half_bits_to_float(0x0001) == 0x1p-24f);
  CHECK(ge::half_bits_to_float(0x03FF) == 0x1.FF8p-15f);
  const float qnan = std::bit_cast<float>(0xFFC12345u), snan = std::bit_cast<float>(0x7F802000u);
  CHECK(ge::float_to_half_bits(qnan) == std::uint16_t(0xFE00 | (0x412345u >> 13 & 0x3FF)));
  CHECK(ge::float_to_half_bits(snan) == 0x7E01);  // quieted, payload kept (not Inf)
  CHECK(ge::float_to_half_bits_saturated(qnan) == ge::float_to_half_bits(qnan));
}

TEST_CASE("bfloat16: round to nearest even, overflow, NaN; every pattern round-trips") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = ge::bfloat16_bits_to_float(std::uint16_t(h));
    if (std::isnan(f)) {
      CHECK(ge::float_to_bfloat16_bits(f) == std::uint16_t(h | 0x40));
    } else {
      REQUIRE(bits(f) == h << 16);
      REQUIRE(ge::float_to_bfloat16_bits(f) == std::uint16_t(h));
    }
  }
  CHECK(ge::float_to_bfloat16_bits(std::bit_cast<float>(0x3F808000u)) == 0x3F80);  // tie, even below
  CHECK(ge::float_to_bfloat16_bits(std::bit_cast<float>(0x3F818000u)) == 0x3F82);  // tie, even above
  CHECK(ge::float_to_bfloat16_bits(std::bit_cast<float>(0x3F808001u)) == 0x3F81);
  CHECK(ge::float_to_bfloat16_bits(std::bit_cast<float>(0x7F7F8000u)) == 0x7F80);  // overflow: Inf
  CHECK(ge::float_to_bfloat16_bits_saturated(std::bit_cast<float>(0x7F7F8000u)) == 0x7F7F);
  CHECK(ge::float_to_bfloat16_bits(std::bit_cast<float>(0x7F800001u)) == 0x7FC0);  // NaN stays NaN
  CHECK(ge::float_to_bfloat16_bits(std::bit_cast<float>(0x00000001u)) == 0x0000);  // tiny float subnormal
  CHECK(ge::float_to_bfloat16_bits(std::bit_cast<float>(0x00018000u)) == 0x0002);  // subnormal tie: even
}

#if defined(SUMMABLE_TEST_X86)
namespace {
__attribute__((target("avx,f16c"))) std::uint16_t hw_to_half(float x) {
  return static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("avx,f16c"))) float hw_from_half(std::uint16_t h) { return _cvtsh_ss(h); }
}  // namespace

TEST_CASE("fp16: the portable conversions give the bits of the F16C instructions") {
  if (!__builtin_cpu_supports("f16c")) return;  // nothing to compare with on this CPU
  for (std::uint32_t h = 0; h < 65536; ++h)
    REQUIRE(bits(ge::half_bits_to_float(std::uint16_t(h))) == bits(hw_from_half(std::uint16_t(h))));
  for (std::uint64_t u = 0; u < (1ull << 32); u += 4099) {
    const float x = std::bit_cast<float>(std::uint32_t(u));
    REQUIRE(ge::float_to_half_bits(x) == hw_to_half(x));
  }
}
#endif

TEST_CASE("the branch-free bulk kernels give the bits of the scalar conversions") {
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t h = 0; h < 65536; ++h) all[h] = std::uint16_t(h);
  std::vector<float> f(65536), fb(65536);
  ge::half_to_floats_portable(all, f);
  ge::bfloat16_to_floats(all, fb);
  for (std::uint32_t h = 0; h < 65536; ++h) {
    REQUIRE(bits(f[h]) == bits(ge::half_bits_to_float(std::uint16_t(h))));
    REQUIRE(bits(fb[h]) == bits(ge::bfloat16_bits_to_float(std::uint16_t(h))));
  }
  std::vector<float> x;
  for (std::uint64_t u = 0; u < (1ull << 32); u += 1021) x.push_back(std::bit_cast<float>(std::uint32_t(u)));
  for (std::uint32_t h = 0; h < 65536; ++h) {  // every fp16 value, midpoint and neighbours
    const float v = ge::half_bits_to_float(std::uint16_t(h));
    x.push_back(v);
    x.push_back(std::nextafter(v, 0.0f));
    x.push_back(std::bit_cast<float>(bits(v) + 0x1000u));
  }
  std::vector<std::uint16_t> h16(x.size()), b16(x.size());
  ge::floats_to_half_portable(x, h16);
  ge::floats_to_bfloat16(x, b16);
  for (std::size_t i = 0; i < x.size(); ++i) {
    REQUIRE(h16[i] == ge::float_to_half_bits_saturated(x[i]));
    REQUIRE(b16[i] == ge::float_to_bfloat16_bits_saturated(x[i]));
  }
}

TEST_CASE("fp16 bulk kernels of this build agree with the portable ones (F16C when compiled for it)") {
  INFO("F16C kernels: " << ge::half_f16c);
  std::vector<float> in;
  for (std::uint32_t u = 0; u < (1u << 20); ++u) in.push_back(std::bit_cast<float>(u * 4093u + 0x30000000u));
  in.push_back(std::numeric_limits<float>::infinity());
  in.push_back(-65520.0f);
  in.push_back(std::bit_cast<float>(0x7FC00001u));
  std::vector<std::uint16_t> a(in.size()), b(in.size());
  ge::floats_to_half(in, a);
  ge::floats_to_half_portable(in, b);
  CHECK(a == b);
  std::vector<float> fa(in.size()), fb(in.size());
  ge::half_to_floats(a, fa);
  ge::half_to_floats_portable(a, fb);
  CHECK(std::memcmp(fa.data(), fb.data(), fa.size() * 4) == 0);
  std::vector<float> acc1(in.size(), 3.0f), acc2(in.size(), 3.0f);
  for (std::size_t i = 0; i < in.size(); ++i) acc1[i] = acc2[i] = ge::round_to_half(float(i % 97) * 0.37f);
  std::vector<float> small(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) small[i] = ge::half_bits_to_float(std::uint16_t(i * 7919u));
  // Same bits, except that the payload of NaN + NaN is the hardware's choice
  // of operand (the compiler may swap a commutative addition): any NaN then.
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    for (std::size_t i = 0; i < x.size(); ++i)
      if (bits(x[i]) != bits(y[i]) && !(std::isnan(x[i]) && std::isnan(y[i]))) return false;
    return true;
  };
  ge::add_round_half(acc1, small);
  ge::add_round_half_portable(acc2, small);
  CHECK(same(acc1, acc2));
  ge::add_half_bits_round(acc1, a);
  ge::add_half_bits_round_portable(acc2, a);
  CHECK(same(acc1, acc2));
  std::vector<float> r1 = small, r2 = small;
  ge::round_half(r1);
  ge::round_half_portable(r2);
  CHECK(bit_equal(r1, r2));
}

TEST_CASE("summable::add_into rounds the sum once, to nearest even; words add modulo 2^32") {
  // 1 + 2^-11 is the fp16 midpoint between 1 and 1 + 2^-10: ties to even (1).
  std::vector<float> acc{1.0f, 1.0f, 2048.0f, 2048.0f, 60000.0f, -60000.0f, 0x1p-24f};
  const std::vector<float> in{0x1p-11f, 0x1.8p-11f, 1.0f, 3.0f, 60000.0f, -60000.0f, 0x1p-24f};
  gs::add_into(summable_element::float16, acc, in);
  CHECK(acc[0] == 1.0f);
  CHECK(acc[1] == 1.0f + 0x1p-10f);
  CHECK(acc[2] == 2048.0f);  // 2049 ties to even at a step of 2
  CHECK(acc[3] == 2052.0f);  // 2051 ties to even (2052)
  CHECK(acc[4] == 65504.0f);  // saturated, never Inf
  CHECK(acc[5] == -65504.0f);
  CHECK(acc[6] == 0x1p-23f);  // subnormals add exactly
  // One rounding of the exact sum, for random pairs of fp16 values.
  const auto r = gradcomp::test_support::counter_gaussian(20000, 7, 300.0f);
  std::vector<float> x(10000), y(10000);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = ge::round_to_half(r[i]);
    y[i] = ge::round_to_half(r[i + 10000] * (i % 3 == 0 ? 1e-3f : 1.0f));
  }
  std::vector<float> z = x;
  gs::add_into(summable_element::float16, z, y);
  for (std::size_t i = 0; i < x.size(); ++i)
    REQUIRE(ge::float_to_half_bits(z[i]) == half_reference(double(x[i]) + double(y[i])));
  // bfloat16: a float32 overflow saturates.
  std::vector<float> b{3e38f, 1.0f}, bi{3e38f, 0x1p-8f};
  for (auto& v : b) v = ge::round_to_bfloat16(v);
  for (auto& v : bi) v = ge::round_to_bfloat16(v);
  gs::add_into(summable_element::bfloat16, b, bi);
  CHECK(b[0] == ge::bfloat16_max);
  CHECK(b[1] == 1.0f);  // 1 + 2^-8 ties to even
  std::vector<float> w{std::bit_cast<float>(0xFFFFFFF0u), std::bit_cast<float>(0x7FC00001u)};
  const std::vector<float> wi{std::bit_cast<float>(0x20u), std::bit_cast<float>(1u)};
  gs::add_into(summable_element::int32_words, w, wi);
  CHECK(bits(w[0]) == 0x10u);
  CHECK(bits(w[1]) == 0x7FC00002u);  // NaN patterns are just words
  CHECK_THROWS_AS(gs::add_into(summable_element::float16, acc, std::vector<float>(3)), gradcomp::size_mismatch_error);
}

TEST_CASE("summable::pack / unpack / add_packed_into / max_into") {
  for (auto e : {summable_element::float32, summable_element::float16, summable_element::bfloat16,
                 summable_element::int32_words}) {
    INFO(gs::to_string(e));
    auto v = gradcomp::test_support::counter_gaussian(1001, 3, 10.0f);
    if (e == summable_element::int32_words)
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::bit_cast<float>(std::uint32_t(i * 2654435761u));
    gs::round_cells(e, v);
    std::vector<std::byte> p(v.size() * gs::wire_bytes(e) + 1);
    // Unaligned on purpose: received bytes may sit anywhere.
    const std::span<std::byte> packed(p.data() + 1, v.size() * gs::wire_bytes(e));
    gs::pack(e, v, packed);
    std::vector<float> back(v.size());
    gs::unpack(e, packed, back);
    CHECK(bit_equal(back, v));
    std::vector<float> acc = v, ref = v;
    gs::add_packed_into(e, acc, packed);
    gs::add_into(e, ref, v);
    CHECK(bit_equal(acc, ref));
    CHECK_THROWS_AS(gs::pack(e, v, packed.first(packed.size() - 1)), gradcomp::size_mismatch_error);
    CHECK_THROWS_AS(gs::unpack(e, packed, std::span<float>(back).first(10)), gradcomp::size_mismatch_error);
    if (e == summable_element::int32_words) {
      CHECK_THROWS_AS(gs::max_into(e, acc, v), gradcomp::invalid_argument_error);
    } else {
      std::vector<float> m{1.0f, -2.0f, 0.5f}, o{-1.0f, 3.0f, std::numeric_limits<float>::quiet_NaN()};
      gs::max_into(e, m, o);
      CHECK(m[0] == 1.0f);
      CHECK(m[1] == 3.0f);
      CHECK(std::isnan(m[2]));
    }
  }
  CHECK(gs::wire_bytes(summable_element::float16) == 2);
  CHECK(gs::wire_bytes(summable_element::int32_words) == 4);
  CHECK(std::is_same_v<gx::buffer_element, gradcomp::summable_element>);
}

TEST_CASE("ring_allreduce_summable: every element type, 2-4 ranks, identical bits, rounded once per hop") {
  for (int n : {2, 3, 4})
    for (auto e : {summable_element::float32, summable_element::float16, summable_element::bfloat16,
                   summable_element::int32_words}) {
      INFO("ranks " << n << ", " << gs::to_string(e));
      const std::size_t len = 1003;
      auto input = [&](int r) {
        auto v = gradcomp::test_support::counter_gaussian(len, 100 + std::uint64_t(r), 50.0f);
        if (e == summable_element::int32_words)
          for (std::size_t i = 0; i < len; ++i) v[i] = std::bit_cast<float>(std::uint32_t(i * 977u + 13u * unsigned(r)));
        gs::round_cells(e, v);
        return v;
      };
      std::vector<std::vector<float>> out(static_cast<std::size_t>(n));
      std::vector<gradcomp::ring_stats> st(static_cast<std::size_t>(n));
      gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
        auto v = input(ep.rank());
        st[std::size_t(ep.rank())] = gradcomp::ring_allreduce_summable(ep, std::span<float>(v), e);
        out[std::size_t(ep.rank())] = v;
      });
      for (int r = 1; r < n; ++r) CHECK(bit_equal(out[std::size_t(r)], out[0]));
      // The reference: segment j summed along the ring from rank j + 1, one rounding per hop.
      const gradcomp::ring_schedule ring(0, n, len);
      std::vector<float> ref(len);
      for (int j = 0; j < n; ++j) {
        std::vector<float> acc;
        auto first = input(j);  // rank j sends segment j first (reduce_scatter_send(0) = r)
        acc.assign(first.begin() + std::ptrdiff_t(ring.begin(j)), first.begin() + std::ptrdiff_t(ring.end(j)));
        for (int h = 1; h < n; ++h) {
          auto x = input((j + h) % n);
          gs::add_into(e, acc, std::span<const float>(x).subspan(ring.begin(j), ring.size(j)));
        }
        std::copy(acc.begin(), acc.end(), ref.begin() + std::ptrdiff_t(ring.begin(j)));
      }
      CHECK(bit_equal(out[0], ref));
      CHECK(st[0].bytes_sent <= 2 * (len / std::size_t(n) + 1) * std::size_t(n - 1) * gs::wire_bytes(e));
      CHECK(st[0].messages_sent == 2 * std::size_t(n - 1));
    }
}

namespace {

/// A bucket codec with one round of a chosen element (and, optionally, a
/// float max round first): sums its layers' values rounded to the element
/// (int32_words: the values as integers in the low 16 bits of each word).
struct one_element_codec {
  summable_element element = summable_element::float16;
  bool max_first = false;
  std::size_t total = 0;
  std::vector<std::span<const float>> in;
  std::span<const float> sums;
  float scale = 0.0f;
  void begin(const gx::step_context&) {}
  void prepare(const gx::step_context&, std::span<const std::span<const float>> g) { in.assign(g.begin(), g.end()); }
  std::size_t rounds() const { return max_first ? 2 : 1; }
  gx::round_spec round(std::size_t r) const {
    if (max_first && r == 0) return {gx::round_op::max, element, 1, gx::after_reduce_check::finite};
    return {gx::round_op::sum, element, total,
            element == summable_element::int32_words ? gx::after_reduce_check::lane_range : gx::after_reduce_check::finite};
  }
  void contribute(std::size_t r, std::span<float> buf) {
    if (max_first && r == 0) {
      float m = 0.0f;
      for (const auto& s : in)
        for (float v : s) m = std::max(m, std::abs(v));
      buf[0] = ge::round_to_half(m);
      return;
    }
    std::size_t at = 0;
    for (const auto& s : in)
      for (float v : s)
        buf[at++] = element == summable_element::int32_words ? std::bit_cast<float>(std::uint32_t(std::lround(v * 100.0f) + 32768))
                                                             : v;
    gs::round_cells(element, buf);
  }
  std::vector<std::byte> contribute(std::size_t) { throw gradcomp::state_error("no all-gather"); }
  void absorb(std::size_t r, std::span<const float> x) {
    if (max_first && r == 0) {
      scale = x[0];
      return;
    }
    if (element == summable_element::int32_words)
      for (float c : x)
        if (bits(c) >= (1u << 24)) throw gradcomp::invalid_argument_error("lane out of range");
    sums = x;
  }
  void absorb(std::size_t, std::span<const std::vector<std::byte>>) { throw gradcomp::state_error("no all-gather"); }
  void finish(std::span<const std::span<float>> out) {
    std::size_t at = 0;
    for (const auto& s : out)
      for (auto& v : s) {
        const float c = sums[at++];
        v = element == summable_element::int32_words ? float(bits(c)) : c;
      }
  }
  void abandon() {}
  bool vote() const { return false; }
  std::uint64_t digest() const { return 7; }
  std::vector<std::byte> save_state() const { return {}; }
  void restore_state(std::span<const std::byte>) {}
};
static_assert(gx::BucketCodec<one_element_codec>);

gx::plan element_plan(summable_element e, bool max_first) {
  gx::model_description m;
  m.add_dense("a", 300).add_dense("b", 77).add_dense("bias", 5, 1);
  gx::plan_options o;
  o.rules.small_below = 16;
  o.rules.explicit_choices = {{"a", gx::codec_kind::custom}, {"b", gx::codec_kind::custom}};
  o.custom_name = std::string("one_element_") + gs::to_string(e) + (max_first ? "_max" : "");
  o.average = false;
  o.custom_factory = [e, max_first](const gx::plan& p, const gx::bucket_desc& b, int, int) {
    one_element_codec c;
    c.element = e;
    c.max_first = max_first;
    for (auto i : b.layers) c.total += p.model()[i].shape.size();
    return std::make_unique<gx::bucket_codec_model<one_element_codec>>(std::move(c), b.layers.size(), "one_element");
  };
  return gx::plan(std::move(m), o);
}

std::vector<std::vector<float>> element_gradients(const gx::model_description& m, int rank, bool bad = false) {
  std::vector<std::vector<float>> g;
  for (const auto& l : m.layers()) {
    std::vector<float> v(l.shape.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.7f * float(i) + float(rank));
    g.push_back(std::move(v));
  }
  if (bad) g[1][3] = std::numeric_limits<float>::quiet_NaN();
  return g;
}

}  // namespace

TEST_CASE("exchange: sum rounds of every element carry the control block; identical bits on every rank") {
  for (int n : {2, 3, 4})
    for (auto e : {summable_element::float32, summable_element::float16, summable_element::bfloat16,
                   summable_element::int32_words})
      for (bool max_first : {false, true}) {
        if (max_first && e == summable_element::int32_words) continue;  // words have no max
        INFO("ranks " << n << ", " << gs::to_string(e) << (max_first ? ", max round first" : ""));
        const auto plan = element_plan(e, max_first);
        REQUIRE(plan.buckets().front().kind == gx::codec_kind::custom);  // the control block rides in its first round
        std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(n));
        std::vector<gx::step_stats> st(static_cast<std::size_t>(n));
        gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
          gx::model_exchange ex(ep, plan);
          for (int step = 0; step < 2; ++step) {
            auto g = element_gradients(plan.model(), ep.rank());
            std::vector<std::span<float>> s(g.begin(), g.end());
            st[std::size_t(ep.rank())] = ex.step(s);
            out[std::size_t(ep.rank())] = g;
          }
        });
        for (int r = 0; r < n; ++r) {
          CHECK_FALSE(st[std::size_t(r)].skipped);
          for (std::size_t l = 0; l < 3; ++l) CHECK(bit_equal(out[std::size_t(r)][l], out[0][l]));
        }
        // The sums are right: exact integers for words, within the rounding for 16-bit types.
        const double tol = e == summable_element::float16 ? 4e-3 : e == summable_element::bfloat16 ? 3e-2 : 1e-5;
        for (std::size_t l = 0; l < 2; ++l)
          for (std::size_t i = 0; i < out[0][l].size(); ++i) {
            double ref = 0.0;
            for (int r = 0; r < n; ++r) {
              const float v = element_gradients(plan.model(), r)[l][i];
              ref += e == summable_element::int32_words ? double(std::lround(v * 100.0f) + 32768) : double(v);
            }
            CHECK(std::abs(double(out[0][l][i]) - ref) <= tol * std::max(1.0, std::abs(ref)) * n);
          }
        // Bytes: the bucket's cells at the element's width, the control block included.
        const std::size_t cells = 377 + gx::control_block::cells(e, n) + (max_first ? 1 : 0);
        CHECK(st[0].bucket_bytes[0] == cells * gs::wire_bytes(e));
      }
}

TEST_CASE("exchange: a failed rank is seen by every rank through a 16-bit or word round") {
  for (auto e : {summable_element::float16, summable_element::bfloat16, summable_element::int32_words}) {
    INFO(gs::to_string(e));
    const int n = 3;
    const auto plan = element_plan(e, false);
    std::vector<int> ok(n, 0);
    gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      auto g = element_gradients(plan.model(), ep.rank(), ep.rank() == 2);
      std::vector<std::span<float>> s(g.begin(), g.end());
      const auto& st = ex.step(s);
      ok[std::size_t(ep.rank())] = st.skipped && st.failures.size() == 1 && st.failures[0].rank == 2 &&
                                   st.failures[0].layer == 1 &&
                                   st.failures[0].reason == gx::failure_reason::non_finite_gradient;
    });
    for (int r = 0; r < n; ++r) CHECK(ok[std::size_t(r)] == 1);
  }
}

TEST_CASE("exchange: a 16-bit sum that saturates, or a lane out of range, fails every rank alike") {
  // fp16: 40000 on each of 2 ranks saturates at 65504: an overflow, not a sum.
  {
    const auto plan = element_plan(summable_element::float16, false);
    std::vector<int> ok(2, 0);
    gradcomp::transport::run_workers(2, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      auto g = element_gradients(plan.model(), ep.rank());
      g[0][5] = 40000.0f;
      std::vector<std::span<float>> s(g.begin(), g.end());
      const auto& st = ex.step(s);
      ok[std::size_t(ep.rank())] = st.skipped && st.failures.size() == 1 && st.failures[0].rank == -1 &&
                                   st.failures[0].reason == gx::failure_reason::non_finite_sum;
    });
    CHECK(ok[0] == 1);
    CHECK(ok[1] == 1);
  }
  // Words: a lane past 2^24 after the sum is refused by the codec's absorb on every rank.
  {
    const auto plan = element_plan(summable_element::int32_words, false);
    std::vector<int> ok(2, 0);
    gradcomp::transport::run_workers(2, [&](inproc_endpoint& ep) {
      gx::model_exchange ex(ep, plan);
      auto g = element_gradients(plan.model(), ep.rank());
      g[0][5] = 90000.0f;  // 9e6 + 32768 per rank: 1.8e7 > 2^24 after the sum
      std::vector<std::span<float>> s(g.begin(), g.end());
      const auto& st = ex.step(s);
      ok[std::size_t(ep.rank())] = st.skipped && st.failures.size() == 1 &&
                                   st.failures[0].reason == gx::failure_reason::non_finite_sum &&
                                   st.local_detail.empty();
    });
    CHECK(ok[0] == 1);
    CHECK(ok[1] == 1);
  }
}

TEST_CASE("control block: encoded cells sum exactly and decode back; malformed cells are refused") {
  for (auto e : {summable_element::float32, summable_element::float16, summable_element::bfloat16,
                 summable_element::int32_words}) {
    INFO(gs::to_string(e));
    const int n = 4;
    std::vector<float> expect(gx::control_block::length(n), 0.0f);
    std::vector<float> sum(gx::control_block::cells(e, n), 0.0f);
    for (int r = 0; r < n; ++r) {
      std::vector<float> block(gx::control_block::length(n), 0.0f);
      block[3 * std::size_t(r)] = gx::control_block::failure_value(gx::failure_reason::codec_error, 1000 * r);
      block[3 * std::size_t(r) + 1] = float(r % 2);
      block[3 * std::size_t(r) + 2] = float(1 + (0xABCDEu * unsigned(r + 1)) % gx::control_block::digest_modulus);
      for (std::size_t i = 0; i < block.size(); ++i) expect[i] += block[i];
      std::vector<float> cells(sum.size());
      gx::control_block::encode(e, block, cells);
      gs::add_into(e, sum, cells);
    }
    std::vector<float> back(expect.size());
    gx::control_block::decode(e, sum, back);
    CHECK(bit_equal(back, expect));
    if (e != summable_element::float32) {
      sum[0] = e == summable_element::int32_words ? std::bit_cast<float>(1u << 25) : 300.0f;
      CHECK_THROWS_AS(gx::control_block::decode(e, sum, back), gradcomp::transport_error);
    }
  }
}
