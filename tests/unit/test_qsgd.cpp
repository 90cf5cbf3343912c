// qsgd: codes and layout, unbiasedness and the QSGD variance bound, simd ==
// seq, reproducibility of the counter-based draws, wire round trips and
// rejections, state save/restore, bad input.
#include <doctest/doctest.h>

#include <gradcomp/detail/random.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/two_bit.hpp>

#include <support/error_checks.hpp>
#include <support/equality.hpp>
#include <support/random_vectors.hpp>
#include <support/wire_checks.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numbers>
#include <thread>
#include <vector>

using namespace gradcomp;
using wire::wire_errc;

namespace {

// Normal(0, sigma) floats from stream 1 of the counter RNG.
std::vector<float> normal_floats(std::size_t n, std::uint64_t seed, double sigma = 1.0) {
  return test_support::normal_floats(n, seed, sigma, /*stream=*/1);
}

using test_support::bit_equal;

bool same_payload(const qsgd_payload& a, const qsgd_payload& b) {
  return a.count == b.count && a.bits == b.bits && a.levels == b.levels && a.bucket_size == b.bucket_size &&
         a.norm == b.norm && bit_equal(a.norms, b.norms) && a.words == b.words;
}

std::uint32_t code_of(const qsgd_payload& p, std::size_t i) {
  const auto slot = execution::qsgd_slot_of(i, p.bits);
  return (p.words[slot.word] >> slot.shift) & ((1u << p.bits) - 1u);
}

// Exact per-element variance of the decoded value: unit^2 * f (1 - f), f = frac(a).
double analytic_error(std::span<const float> x, const qsgd_payload& p) {
  double total = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float norm = p.norms[i / p.bucket_size];
    if (norm == 0.0f) continue;
    const double a = std::abs(double(x[i])) * p.levels / norm;
    const double f = a - std::floor(a);
    const double unit = double(norm) / p.levels;
    total += unit * unit * f * (1 - f);
  }
  return total;
}

wire_errc parse_error(std::span<const std::byte> bytes) {
  return test_support::parse_error_of<qsgd_payload>(bytes);
}

// A qsgd message with an arbitrary body and a valid header and checksum.
using raw_qsgd = test_support::raw_message_of<wire::codec_id::qsgd>;

std::vector<std::byte> raw_message(std::uint64_t n, std::uint8_t bits, std::uint8_t reserved, std::uint16_t levels,
                                   std::uint32_t bucket, const std::vector<float>& norms,
                                   const std::vector<std::uint32_t>& words) {
  raw_qsgd raw{n, {}};
  wire::writer w(raw.body);
  w.put<std::uint8_t>(bits);
  w.put<std::uint8_t>(reserved);
  w.put<std::uint16_t>(levels);
  w.put<std::uint32_t>(bucket);
  w.put_array<float>(norms);
  w.put_array<std::uint32_t>(words);
  return wire::serialize(raw);
}

qsgd_options opts(unsigned bits, unsigned levels, std::size_t bucket, std::uint64_t seed = 0,
                  execution::qsgd_norm norm = execution::qsgd_norm::l2) {
  qsgd_options o;
  o.bits = bits;
  o.levels = levels;
  o.bucket_size = bucket;
  o.seed = seed;
  o.norm = norm;
  return o;
}
constexpr auto max_norm = execution::qsgd_norm::max;

}  // namespace

static_assert(Codec<qsgd<>>);
static_assert(DecodeAddCodec<qsgd<>>);
static_assert(StatefulCodec<qsgd<>>);
static_assert(!LinearCodec<qsgd<>>);
static_assert(Codec<qsgd<execution::simd>>);
static_assert(wire::WirePayload<qsgd_payload>);

TEST_CASE("layout: word count and slots cover every element exactly once") {
  for (unsigned bits : {2u, 4u, 8u}) {
    for (std::size_t n : {0u, 1u, 15u, 16u, 17u, 63u, 64u, 65u, 128u, 129u, 256u, 300u, 1000u}) {
      const std::size_t nw = execution::qsgd_word_count(n, bits);
      CHECK(nw * 32 >= n * bits);
      CHECK(nw * 32 < n * bits + 16 * 32);  // at most one partial block of waste
      std::vector<std::uint32_t> used(nw, 0u);
      bool overlap = false, in_range = true;
      for (std::size_t i = 0; i < n; ++i) {
        const auto s = execution::qsgd_slot_of(i, bits);
        if (s.word >= nw || s.shift + bits > 32) {
          in_range = false;
          continue;
        }
        const std::uint32_t m = ((1u << bits) - 1u) << s.shift;
        overlap |= (used[s.word] & m) != 0;
        used[s.word] |= m;
      }
      CHECK(in_range);
      CHECK_FALSE(overlap);
      // every word holds at least one element
      for (auto u : used) CHECK(u != 0u);
    }
  }
  // element 16k + j of a block is in word j at bits [b*k, b*k + b)
  CHECK(execution::qsgd_slot_of(16 * 3 + 5, 4).word == 5);
  CHECK(execution::qsgd_slot_of(16 * 3 + 5, 4).shift == 12);
  CHECK(execution::qsgd_slot_of(128 + 1, 4).word == 17);
  CHECK(execution::qsgd_slot_of(128 + 1, 4).shift == 0);
}

TEST_CASE_TEMPLATE("codes: norm per bucket, levels floor(a) or floor(a)+1, sign, decode", Policy, execution::seq,
                   execution::simd) {
  const std::size_t n = 1000;
  const auto x = normal_floats(n, 3);
  for (unsigned bits : {2u, 4u, 8u}) {
    qsgd<Policy> q(opts(bits, 0, 100));
    qsgd_payload p;
    q.encode(x, p);
    const unsigned s = qsgd_max_levels(bits);
    CHECK(p.levels == s);
    REQUIRE(p.norms.size() == 10);
    for (std::size_t b = 0; b < 10; ++b) {
      double sq = 0;
      for (std::size_t i = b * 100; i < b * 100 + 100; ++i) sq += double(x[i]) * x[i];
      CHECK(p.norms[b] == doctest::Approx(std::sqrt(sq)).epsilon(1e-6));
    }
    std::vector<float> out(n);
    q.decode(p, out);
    int bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t c = code_of(p, i);
      const std::uint32_t level = c & ((1u << (bits - 1)) - 1u);
      const bool negative = (c >> (bits - 1)) & 1u;
      const float norm = p.norms[i / 100];
      const double a = std::abs(double(x[i])) * s / norm;
      bad += level != std::floor(a) && level != std::floor(a) + 1;
      bad += level > s;
      bad += level != 0 && negative != (x[i] < 0);
      bad += level == 0 && negative;
      bad += out[i] != (negative ? -1.0f : 1.0f) * static_cast<float>(level) * (norm / static_cast<float>(s));
    }
    CHECK(bad == 0);
    CHECK(q.step() == 1);
  }
}

TEST_CASE("unbiased: the mean of many decodes converges to x (every width, partial buckets)") {
  const std::size_t n = 300;
  auto x = normal_floats(n, 11);
  x[7] = 0.0f;
  x[8] = -0.0f;
  x[9] = 25.0f;  // a dominant entry: its bucket's other levels are mostly 0
  for (unsigned bits : {2u, 4u, 8u}) {
    for (std::size_t bucket : {std::size_t{64}, std::size_t{512}}) {
      qsgd<execution::simd> q(opts(bits, 0, bucket, 1234));
      qsgd_payload p;
      const int draws = 1500;
      std::vector<double> mean(n, 0.0);
      std::vector<float> out(n);
      for (int t = 0; t < draws; ++t) {
        q.encode(x, p);
        q.decode(p, out);
        for (std::size_t i = 0; i < n; ++i) mean[i] += out[i];
      }
      int bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        mean[i] /= draws;
        const float norm = p.norms[i / bucket];
        const double a = std::abs(double(x[i])) * p.levels / norm;
        const double f = a - std::floor(a);
        const double unit = double(norm) / p.levels;
        const double sd = unit * std::sqrt(f * (1 - f) / draws);
        // 6 sigma, plus the 2^-24 resolution of the uniform draw and float rounding
        bad += std::abs(mean[i] - x[i]) > 6 * sd + unit * 1e-6 + 1e-6 * std::abs(x[i]);
      }
      CHECK(bad == 0);
    }
  }
  // Over seeds instead of steps: same property.
  std::vector<double> mean(n, 0.0);
  std::vector<float> out(n);
  qsgd_payload p;
  const int seeds = 1500;
  for (int sd = 0; sd < seeds; ++sd) {
    qsgd<> q(opts(4, 0, 128, 77 + sd));
    q.encode(x, p);
    q.decode(p, out);
    for (std::size_t i = 0; i < n; ++i) mean[i] += out[i] / double(seeds);
  }
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(mean[i] - x[i]) / (p.norms[i / 128] / 7.0));
  CHECK(worst < 6 * 0.5 / std::sqrt(double(seeds)));
}

TEST_CASE("variance bound of QSGD Lemma 3.1: E||Q(x)-x||^2 <= min(n/s^2, sqrt(n)/s) ||x||^2 per bucket") {
  struct input {
    const char* name;
    std::vector<float> x;
  };
  std::vector<input> inputs;
  inputs.push_back({"normal", normal_floats(2048, 21)});
  std::vector<float> uni(2048);
  const auto st = detail::counter_rng(9).stream(0);
  for (std::size_t i = 0; i < uni.size(); ++i) uni[i] = st.uniform_float(i) - 0.5f;
  inputs.push_back({"uniform", uni});
  inputs.push_back({"constant", std::vector<float>(2048, 0.3f)});
  std::vector<float> spiky(2048, 1e-3f);
  for (std::size_t i = 0; i < spiky.size(); i += 97) spiky[i] = 5.0f;
  inputs.push_back({"spiky", spiky});
  std::vector<float> heavy = normal_floats(2048, 22);
  for (auto& v : heavy) v = v * v * v;
  inputs.push_back({"cubed normal", heavy});

  for (const auto& in : inputs) {
    for (unsigned bits : {2u, 4u, 8u}) {
      for (unsigned s : {1u, 3u, 7u, 127u}) {
        if (s > qsgd_max_levels(bits)) continue;
        for (std::size_t bucket : {std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{512}}) {
          CAPTURE(in.name);
          CAPTURE(bits);
          CAPTURE(s);
          CAPTURE(bucket);
          qsgd<execution::simd> q(opts(bits, s, bucket, 5));
          qsgd_payload p;
          q.encode(in.x, p);
          // Per bucket: exact expected error against the bound.
          const std::size_t n = in.x.size();
          bool within = true;
          for (std::size_t b = 0; b * bucket < n; ++b) {
            const auto xb = std::span<const float>(in.x).subspan(b * bucket, std::min(bucket, n - b * bucket));
            qsgd_payload pb = p;
            pb.norms = {p.norms[b]};
            pb.bucket_size = static_cast<std::uint32_t>(xb.size());
            double sq = 0;
            for (float v : xb) sq += double(v) * v;
            const double dn = double(xb.size());
            const double bound = std::min(dn / (double(s) * s), std::sqrt(dn) / s) * sq;
            within &= analytic_error(xb, pb) <= bound * (1 + 1e-5) + 1e-30;
          }
          CHECK(within);
        }
      }
    }
  }

  // The analytic variance matches the measured one (so the bound test measures the codec).
  const auto x = normal_floats(512, 31);
  qsgd<> q(opts(4, 0, 512, 8));
  qsgd_payload p;
  std::vector<float> out(512);
  double measured = 0, predicted = 0;
  const int draws = 2000;
  for (int t = 0; t < draws; ++t) {
    q.encode(x, p);
    q.decode(p, out);
    for (std::size_t i = 0; i < 512; ++i) measured += (double(out[i]) - x[i]) * (double(out[i]) - x[i]);
    predicted += analytic_error(x, p);
  }
  CHECK(measured / draws == doctest::Approx(predicted / draws).epsilon(0.05));
}

TEST_CASE("simd kernels equal seq kernels bit for bit") {
  std::vector<std::vector<float>> inputs;
  for (std::size_t n : {0u, 1u, 15u, 16u, 17u, 63u, 64u, 65u, 127u, 128u, 129u, 255u, 256u, 257u, 1000u, 5003u})
    inputs.push_back(normal_floats(n, n + 1));
  // norms on the scaled (double) path, the flush path and mixed buckets
  auto odd = normal_floats(700, 5);
  for (std::size_t i = 0; i < 100; ++i) odd[i] *= 1e-21f;
  for (std::size_t i = 100; i < 200; ++i) odd[i] *= 1e-36f;
  for (std::size_t i = 200; i < 300; ++i) odd[i] *= 1e30f;
  for (std::size_t i = 300; i < 320; ++i) odd[i] = 0.0f;
  odd[400] = -0.0f;
  inputs.push_back(odd);

  int mismatches = 0, checked = 0;
  for (const auto& x : inputs) {
    for (unsigned bits : {2u, 4u, 8u}) {
      for (std::size_t bucket : {std::size_t{1}, std::size_t{5}, std::size_t{16}, std::size_t{100},
                                 std::size_t{512}, std::size_t{4096}})
      for (const auto norm : {execution::qsgd_norm::l2, max_norm}) {
        qsgd<execution::seq> a(opts(bits, 0, bucket, 99, norm));
        qsgd<execution::simd> b(opts(bits, 0, bucket, 99, norm));
        qsgd_payload pa, pb;
        for (int t = 0; t < 2; ++t) {
          a.encode(x, pa);
          b.encode(x, pb);
          ++checked;
          if (!same_payload(pa, pb)) {
            ++mismatches;
            continue;
          }
          std::vector<float> da(x.size()), db(x.size()), sa = x, sb = x;
          a.decode(pa, da);
          b.decode(pb, db);
          a.decode_add(pa, sa);
          b.decode_add(pb, sb);
          mismatches += !bit_equal(da, db) + !bit_equal(sa, sb);
        }
      }
    }
  }
  CHECK(checked > 600);
  CHECK(mismatches == 0);
}

TEST_CASE("draws depend only on (seed, step, index): reproducible across instances, threads and layouts") {
  const auto x = normal_floats(4000, 42);
  qsgd_payload p1, p2;
  qsgd<execution::simd> a(opts(4, 0, 512, 7)), b(opts(4, 0, 512, 7));
  a.encode(x, p1);
  b.encode(x, p2);
  CHECK(same_payload(p1, p2));
  a.encode(x, p1);  // step 1 differs from step 0
  CHECK(p1.words != p2.words);
  b.set_step(5);
  b.encode(x, p2);
  qsgd<execution::seq> c(opts(4, 0, 512, 7));
  c.set_step(5);
  qsgd_payload p3;
  c.encode(x, p3);
  CHECK(same_payload(p2, p3));
  qsgd<> other_seed(opts(4, 0, 512, 8));
  other_seed.encode(x, p3);
  CHECK(p3.words != p1.words);

  // Two layers encoded by two threads == the same layers encoded serially.
  const auto y = normal_floats(3000, 43);
  qsgd_payload sx, sy, tx, ty;
  qsgd<execution::simd> qx(opts(8, 0, 256, 1)), qy(opts(8, 0, 256, 2));
  qx.encode(x, sx);
  qy.encode(y, sy);
  qsgd<execution::simd> rx(opts(8, 0, 256, 1)), ry(opts(8, 0, 256, 2));
  std::thread t1([&] { rx.encode(x, tx); });
  std::thread t2([&] { ry.encode(y, ty); });
  t1.join();
  t2.join();
  CHECK(same_payload(sx, tx));
  CHECK(same_payload(sy, ty));

  // Element i's draw does not depend on other buckets: changing bucket 0 leaves
  // the codes of bucket 3 unchanged.
  auto z = x;
  for (std::size_t i = 0; i < 512; ++i) z[i] *= 3.0f;
  qsgd<> u(opts(4, 0, 512, 7)), v(opts(4, 0, 512, 7));
  u.encode(x, p1);
  v.encode(z, p2);
  int differ = 0;
  for (std::size_t i = 3 * 512; i < 4 * 512; ++i) differ += code_of(p1, i) != code_of(p2, i);
  CHECK(differ == 0);
}

TEST_CASE("zero, tiny and huge buckets") {
  qsgd<execution::simd> q(opts(4, 0, 64));
  qsgd_payload p;
  std::vector<float> x(200, 0.0f), out(200, 5.0f);
  q.encode(x, p);
  for (float v : p.norms) CHECK(v == 0.0f);
  for (auto w : p.words) CHECK(w == 0u);
  q.decode(p, out);
  for (float v : out) CHECK(v == 0.0f);

  // below 2^-100: flushed to zero; 1e-20 and 1e30 use the double path, stay exact-ish
  x.assign(200, 0.0f);
  for (std::size_t i = 0; i < 64; ++i) x[i] = 1e-31f * float(i % 5);
  for (std::size_t i = 64; i < 128; ++i) x[i] = 1e-20f * float(i % 7 + 1);
  for (std::size_t i = 128; i < 192; ++i) x[i] = 1e30f * float(i % 3 + 1);
  q.encode(x, p);
  CHECK(p.norms[0] == 0.0f);
  double sq1 = 0, sq2 = 0;
  for (std::size_t i = 64; i < 128; ++i) sq1 += double(x[i]) * x[i];
  for (std::size_t i = 128; i < 192; ++i) sq2 += double(x[i]) * x[i];
  CHECK(p.norms[1] == doctest::Approx(std::sqrt(sq1)).epsilon(1e-6));
  CHECK(p.norms[2] == doctest::Approx(std::sqrt(sq2)).epsilon(1e-6));
  q.decode(p, out);
  for (std::size_t i = 64; i < 192; ++i) CHECK(std::abs(out[i] - x[i]) <= p.norms[i / 64] / 7 * 1.0001f);
}

TEST_CASE("payloads round-trip through wire.hpp with exact sizes") {
  for (unsigned bits : {2u, 4u, 8u}) {
    for (std::size_t n : {0u, 1u, 100u, 513u, 4096u}) {
      qsgd<> q(opts(bits, 0, 512, 3));
      qsgd_payload p;
      q.encode(normal_floats(n, n), p);
      const auto bytes = wire::serialize(p);
      CHECK(bytes.size() == q.encoded_bytes(p));
      CHECK(bytes.size() == 32 + 8 + 4 * ((n + 511) / 512) + 4 * execution::qsgd_word_count(n, bits));
      CHECK(same_payload(wire::parse<qsgd_payload>(bytes), p));
    }
  }
  // 4-bit QSGD of a large layer: ~8x smaller than float32
  qsgd<> q;
  qsgd_payload p;
  q.encode(normal_floats(1 << 16, 1), p);
  CHECK(double(4 << 16) / q.encoded_bytes(p) > 7.8);
}

TEST_CASE("corrupted, truncated and hand-crafted qsgd messages are rejected") {
  qsgd<> q(opts(4, 0, 64, 1));
  qsgd_payload p;
  q.encode(normal_floats(200, 1), p);
  const auto good = wire::serialize(p);

  SUBCASE("every flipped byte and every truncation is detected") {
    test_support::check_flipped_bytes_rejected<qsgd_payload>(good, std::byte{0x20});
    auto bad = good;
    bad[good.size() - 3] ^= std::byte{0x01};
    CHECK(parse_error(bad) == wire_errc::checksum_mismatch);
    test_support::check_truncations_rejected<qsgd_payload>(good);
  }
  SUBCASE("body fields that contradict the count are malformed (valid checksum)") {
    CHECK_NOTHROW(wire::parse<qsgd_payload>(raw_message(200, 4, 0, 7, 64, p.norms, p.words)));
    CHECK(parse_error(raw_message(300, 4, 0, 7, 64, p.norms, p.words)) == wire_errc::malformed_body);
    CHECK(parse_error(raw_message(200, 4, 0, 7, 40, p.norms, p.words)) == wire_errc::malformed_body);
    CHECK(parse_error(raw_message(200, 2, 0, 1, 64, p.norms, p.words)) == wire_errc::malformed_body);
    CHECK(parse_error(raw_message(1ull << 33, 4, 0, 7, 64, p.norms, p.words)) == wire_errc::malformed_body);
    raw_qsgd tiny{0, {std::byte{4}, std::byte{0}}};  // shorter than the fixed fields
    CHECK(parse_error(wire::serialize(tiny)) == wire_errc::malformed_body);
  }
  SUBCASE("bad field values are malformed") {
    CHECK(parse_error(raw_message(200, 3, 0, 7, 64, p.norms, p.words)) == wire_errc::malformed_body);
    CHECK(parse_error(raw_message(200, 4, 2, 7, 64, p.norms, p.words)) == wire_errc::malformed_body);  // norm kind
    CHECK(wire::parse<qsgd_payload>(raw_message(200, 4, 1, 7, 64, p.norms, p.words)).norm == max_norm);
    CHECK(parse_error(raw_message(200, 4, 0, 0, 64, p.norms, p.words)) == wire_errc::malformed_body);
    CHECK(parse_error(raw_message(200, 4, 0, 8, 64, p.norms, p.words)) == wire_errc::malformed_body);
    CHECK(parse_error(raw_message(200, 4, 0, 7, 0, p.norms, p.words)) == wire_errc::malformed_body);
    for (const float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      auto norms = p.norms;
      norms[2] = bad;
      CHECK(parse_error(raw_message(200, 4, 0, 7, 64, norms, p.words)) == wire_errc::malformed_body);
    }
  }
  SUBCASE("codes above the levels, negative zeros and codes past n are malformed") {
    const auto slot = execution::qsgd_slot_of(37, 4);
    auto words = p.words;
    words[slot.word] = (words[slot.word] & ~(0xFu << slot.shift)) | (0x8u << slot.shift);  // sign, level 0
    CHECK(parse_error(raw_message(200, 4, 0, 7, 64, p.norms, words)) == wire_errc::malformed_body);
    qsgd<> q5(opts(4, 5, 64, 1));
    qsgd_payload p5;
    q5.encode(normal_floats(200, 1), p5);
    CHECK_NOTHROW(wire::parse<qsgd_payload>(raw_message(200, 4, 0, 5, 64, p5.norms, p5.words)));
    words = p5.words;
    words[slot.word] = (words[slot.word] & ~(0xFu << slot.shift)) | (0x6u << slot.shift);  // level 6 > s = 5
    CHECK(parse_error(raw_message(200, 4, 0, 5, 64, p5.norms, words)) == wire_errc::malformed_body);
    CHECK_NOTHROW(wire::parse<qsgd_payload>(raw_message(200, 4, 0, 7, 64, p5.norms, words)));
    // 200 = 128 + 72: the last block has 72 elements, so word 16 + 9 row 4 is element 128 + 73 (absent)
    words = p.words;
    const auto absent = execution::qsgd_slot_of(128 + 16 * 4 + 9, 4);
    CHECK(absent.word == 16 + 9);
    words[absent.word] |= 0x1u << absent.shift;
    CHECK(parse_error(raw_message(200, 4, 0, 7, 64, p.norms, words)) == wire_errc::malformed_body);
  }
  SUBCASE("a state is not a payload, a payload is not a state") {
    CHECK(parse_error(q.save_state()) == wire_errc::wrong_kind);
    CHECK_THROWS_AS(q.restore_state(good), wire::wire_error);
  }
}

TEST_CASE_TEMPLATE("save_state / restore_state continues bit for bit", Policy, execution::seq, execution::simd) {
  const auto x = normal_floats(1500, 17);
  qsgd<Policy> a(opts(8, 100, 300, 55));
  qsgd_payload p;
  for (int t = 0; t < 3; ++t) a.encode(x, p);
  const auto saved = a.save_state();
  std::vector<qsgd_payload> expected;
  for (int t = 0; t < 4; ++t) {
    a.encode(x, p);
    expected.push_back(p);
  }
  qsgd<Policy> b(opts(8, 100, 300, 55));
  b.restore_state(saved);
  CHECK(b.step() == 3);
  CHECK(b.options().bits == 8);
  CHECK(b.options().levels == 100);
  CHECK(b.options().bucket_size == 300);
  CHECK(b.options().seed == 55);
  for (int t = 0; t < 4; ++t) {
    b.encode(x, p);
    CHECK(same_payload(p, expected[t]));
  }
  CHECK(b.save_state() == a.save_state());
}

TEST_CASE("restore_state rejects bad bytes and leaves the codec unchanged") {
  qsgd<> a(opts(4, 0, 64, 9));
  a.set_step(12);
  const auto good = a.save_state();
  qsgd<> b(opts(2, 0, 10, 3));
  const auto before = b.save_state();
  auto expect_rejected = [&](const std::vector<std::byte>& bytes) {
    CHECK_THROWS_AS(b.restore_state(bytes), wire::wire_error);
    CHECK(b.save_state() == before);
  };
  auto edit = [&](std::size_t at, auto value) {
    auto bytes = good;
    std::memcpy(bytes.data() + at, &value, sizeof value);
    auto span = std::span<const std::byte>(bytes);
    const std::uint32_t crc = wire::crc32c(wire::crc32c(0, span.first(28)), span.subspan(wire::header_size));
    std::memcpy(bytes.data() + 28, &crc, 4);
    return bytes;
  };
  auto flipped = good;
  flipped[40] ^= std::byte{1};
  expect_rejected(flipped);
  expect_rejected(std::vector<std::byte>(good.begin(), good.end() - 2));
  // body: 32 version, 33 bits, 34 levels, 36 bucket, 40 seed, 48 step (an l2 state: version 1)
  expect_rejected(edit(32, std::uint8_t{3}));
  expect_rejected(edit(32, std::uint8_t{2}));  // version 2 has a norm byte more: wrong length
  expect_rejected(edit(33, std::uint8_t{5}));
  expect_rejected(edit(34, std::uint16_t{8}));
  expect_rejected(edit(34, std::uint16_t{0}));
  expect_rejected(edit(36, std::uint32_t{0}));
  expect_rejected(edit(12, std::uint64_t{3}));
  // Valid bytes with levels 3: restored by a codec with those options.
  qsgd<> c(opts(4, 3, 64, 9));
  CHECK_NOTHROW(c.restore_state(edit(34, std::uint16_t{3})));
  CHECK(c.options().levels == 3);
  CHECK(c.step() == 12);
}

TEST_CASE_TEMPLATE("restore_state with other options throws option_mismatch_error and leaves the codec unchanged",
                   Policy, execution::seq, execution::simd) {
  qsgd<Policy> a(opts(4, 5, 64, 9));
  a.set_step(12);
  const auto saved = a.save_state();
  const std::pair<qsgd_options, const char*> cases[] = {
      {opts(8, 5, 64, 9), "bits"},
      {opts(4, 6, 64, 9), "levels"},
      {opts(4, 5, 65, 9), "bucket_size"},
      {opts(4, 5, 64, 10), "seed"},
      {opts(4, 5, 64, 9, max_norm), "norm"},
  };
  for (const auto& [o, option] : cases) {
    qsgd<Policy> b(o);
    b.set_step(3);
    const auto before = b.save_state();
    try {
      b.restore_state(saved);
      FAIL("restore accepted a state saved with another " << option);
    } catch (const option_mismatch_error& e) {
      CHECK(e.option() == option);
    }
    CHECK(b.save_state() == before);
  }
  qsgd<Policy> same(opts(4, 5, 64, 9));
  CHECK_NOTHROW(same.restore_state(saved));
  CHECK(same.step() == 12);
}

TEST_CASE_TEMPLATE("bad input: parameters, non-finite gradients, overflowing norms, payload shapes", Policy,
                   execution::seq, execution::simd) {
  using Q = qsgd<Policy>;
  for (unsigned bits : {0u, 1u, 3u, 16u, 32u}) CHECK_THROWS_AS(Q(opts(bits, 0, 512)), invalid_argument_error);
  CHECK_THROWS_AS(Q(opts(2, 2, 512)), invalid_argument_error);
  CHECK_THROWS_AS(Q(opts(4, 8, 512)), invalid_argument_error);
  CHECK_THROWS_AS(Q(opts(8, 128, 512)), invalid_argument_error);
  CHECK_THROWS_AS(Q(opts(4, 0, 0)), invalid_argument_error);
  CHECK_THROWS_AS(Q(opts(4, 0, std::size_t{1} << 32)), invalid_argument_error);
  CHECK_NOTHROW(Q(opts(8, 127, 1)));

  Q q(opts(4, 0, 100, 3));
  qsgd_payload p;
  const std::size_t n = 1000;
  for (const std::size_t bad : {std::size_t{0}, std::size_t{99}, std::size_t{100}, std::size_t{517}, n - 1}) {
    for (const float v : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
      auto g = normal_floats(n, 2);
      g[bad] = v;
      if (bad + 3 < n) g[bad + 3] = v;
      CHECK(gradcomp::test_support::non_finite_index_of([&] { q.encode(g, p); }) == bad);
      CHECK(q.step() == 0);
    }
  }
  auto huge = normal_floats(n, 4);
  for (std::size_t i = 200; i < 210; ++i) huge[i] = 3e38f;
  CHECK_THROWS_AS(q.encode(huge, p), invalid_argument_error);
  CHECK(q.step() == 0);

  q.encode(normal_floats(n, 5), p);
  CHECK(q.step() == 1);
  std::vector<float> out(n + 1);
  CHECK_THROWS_AS(q.decode(p, out), size_mismatch_error);
  CHECK_THROWS_AS(q.decode_add(p, out), size_mismatch_error);
  out.resize(n);
  for (int which = 0; which < 5; ++which) {
    auto broken = p;
    if (which == 0) broken.words.pop_back();
    if (which == 1) broken.norms.push_back(1.0f);
    if (which == 2) broken.bits = 3;
    if (which == 3) broken.levels = 9;
    if (which == 4) broken.bucket_size = 0;
    CHECK_THROWS_AS(q.decode(broken, out), invalid_argument_error);
    CHECK_THROWS_AS(q.decode_add(broken, out), invalid_argument_error);
  }
}

TEST_CASE("decode_add sums several workers' payloads; any instance decodes any payload") {
  const std::size_t n = 777;
  std::vector<float> sum(n, 0.5f), expect(n, 0.5f), out(n);
  qsgd<execution::simd> reader(opts(2, 0, 9));  // other settings: the payload carries its own
  for (int worker = 0; worker < 3; ++worker) {
    qsgd<execution::seq> q(opts(worker == 2 ? 8 : 4, 0, 128, worker));
    qsgd_payload p;
    q.encode(normal_floats(n, 60 + worker), p);
    reader.decode_add(p, sum);
    q.decode(p, out);
    for (std::size_t i = 0; i < n; ++i) expect[i] += out[i];
  }
  CHECK(bit_equal(sum, expect));
}

TEST_CASE("codes_valid agrees with a per-code check on random words") {
  // The whole-word (SWAR) check must accept and reject exactly what a
  // field-by-field check does.
  const auto s = detail::counter_rng(3).stream(0);
  int disagreements = 0, rejected = 0, trials = 0;
  std::uint64_t draw = 0;
  for (unsigned bits : {2u, 4u, 8u}) {
    for (unsigned levels = 1; levels <= qsgd_max_levels(bits); levels += (bits == 8 ? 9 : 1)) {
      for (const std::uint64_t n : {std::uint64_t{64}, std::uint64_t{256}, std::uint64_t{300}}) {
        const std::size_t nw = execution::qsgd_word_count(n, bits);
        for (int trial = 0; trial < 60; ++trial) {
          std::vector<std::uint32_t> words(nw);
          // mostly valid codes, with an occasional bad one
          for (std::uint64_t i = 0; i < n; ++i) {
            std::uint32_t level = static_cast<std::uint32_t>(s.below(draw++, levels + 1));
            std::uint32_t code = level | (level != 0 && s.below(draw++, 2) ? 1u << (bits - 1) : 0u);
            if (s.below(draw++, 400) == 0) code = static_cast<std::uint32_t>(s.below(draw++, 1u << bits));
            const auto slot = execution::qsgd_slot_of(i, bits);
            words[slot.word] |= code << slot.shift;
          }
          bool expect = true;
          for (std::uint64_t i = 0; i < n; ++i) {
            const std::uint32_t c = code_of(qsgd_payload{n, std::uint8_t(bits), std::uint16_t(levels), 1, {}, words}, i);
            expect &= (c & ((1u << (bits - 1)) - 1u)) <= levels && c != (1u << (bits - 1));
          }
          const bool got = qsgd_payload::codes_valid(words, n, bits, levels);
          disagreements += got != expect;
          rejected += !got;
          ++trials;
        }
      }
    }
  }
  CHECK(disagreements == 0);
  CHECK(rejected > 50);           // bad codes were exercised
  CHECK(trials - rejected > 50);  // and so were valid payloads
}

TEST_CASE("a state or payload of the other quantizer is rejected as wrong_codec") {
  qsgd<> q;
  two_bit_quantizer<> t(10);
  auto code_of_error = [](auto&& f) {
    try {
      f();
    } catch (const wire::wire_error& e) {
      return e.code();
    }
    FAIL("accepted another codec's bytes");
    return wire_errc::truncated;
  };
  CHECK(code_of_error([&] { q.restore_state(t.save_state()); }) == wire_errc::wrong_codec);
  CHECK(code_of_error([&] { t.restore_state(q.save_state()); }) == wire_errc::wrong_codec);
  two_bit_payload tp;
  t.encode(std::vector<float>(10, 1.0f), tp);
  qsgd_payload qp;
  q.encode(std::vector<float>(10, 1.0f), qp);
  CHECK(code_of_error([&] { (void)wire::parse<qsgd_payload>(wire::serialize(tp)); }) == wire_errc::wrong_codec);
  CHECK(code_of_error([&] { (void)wire::parse<two_bit_payload>(wire::serialize(qp)); }) == wire_errc::wrong_codec);
}

TEST_CASE_TEMPLATE("norm = max: each bucket's scale is max |x|, unbiased, never above the l2 scale's variance",
                   Policy, execution::seq, execution::simd) {
  const std::size_t n = 1000;
  auto x = normal_floats(n, 4);
  for (std::size_t i = 300; i < 400; ++i) x[i] = 0.0f;            // an all-zero bucket
  for (std::size_t i = 400; i < 500; ++i) x[i] *= 1e-35f;         // flushed like the l2 scale (< 2^-100)
  qsgd<Policy> q(opts(4, 0, 100, 7, max_norm));
  qsgd_payload p;
  q.encode(x, p);
  CHECK(p.norm == max_norm);
  REQUIRE(p.norms.size() == 10);
  for (std::size_t b = 0; b < 10; ++b) {
    float m = 0;
    for (std::size_t i = b * 100; i < b * 100 + 100; ++i) m = std::max(m, std::abs(x[i]));
    CHECK(p.norms[b] == (m < 0x1p-100f ? 0.0f : m));
  }
  // The payload says which norm it carries, and survives the wire.
  const auto back = wire::parse<qsgd_payload>(wire::serialize(p));
  CHECK(same_payload(back, p));
  // Unbiased: the mean of many decodes converges to x (the analytic error bounds the noise of the mean).
  std::vector<double> mean(n, 0.0);
  std::vector<float> out(n);
  const int draws = 400;
  for (int t = 0; t < draws; ++t) {
    q.encode(x, p);
    q.decode(p, out);
    for (std::size_t i = 0; i < n; ++i) mean[i] += out[i];
  }
  int far = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double unit = double(p.norms[i / 100]) / 7.0;
    far += std::abs(mean[i] / draws - x[i]) > 5.0 * unit * 0.5 / std::sqrt(double(draws)) + 1e-30;
  }
  CHECK(far == 0);
  // Variance: n m^2 / (4 s^2) per bucket, and far below the l2 scale's on a normal vector.
  const auto y = normal_floats(4096, 12);
  qsgd<Policy> l2(opts(4, 0, 512, 7)), mx(opts(4, 0, 512, 7, max_norm));
  qsgd_payload pl, pm;
  l2.encode(y, pl);
  mx.encode(y, pm);
  for (std::size_t b = 0; b < 8; ++b) {
    const auto yb = std::span<const float>(y).subspan(b * 512, 512);
    qsgd_payload one = pm;
    one.norms = {pm.norms[b]};
    one.bucket_size = 512;
    CHECK(analytic_error(yb, one) <= 512.0 * double(pm.norms[b]) * pm.norms[b] / (4.0 * 49.0) * (1 + 1e-6));
  }
  const double e_l2 = analytic_error(y, pl), e_max = analytic_error(y, pm);
  CHECK(e_max < e_l2 / 10);
  // A bucket whose max |x| is 2^127 or more is refused (its top level could decode to Inf), as l2 refuses an
  // overflowing norm; just below, it decodes finite.
  {
    qsgd<Policy> q8(opts(8, 0, 4, 3, max_norm));
    qsgd_payload big;
    const std::vector<float> huge = {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max() / 2, 1.0f, 0.0f};
    CHECK_THROWS_AS(q8.encode(huge, big), invalid_argument_error);
    const std::vector<float> large = {0x1.fffffep126f, -0x1p125f, 1.0f, 0.0f};
    q8.encode(large, big);
    std::vector<float> back(4);
    q8.decode(big, back);
    for (const float v : back) CHECK(std::isfinite(v));
  }
  // Any qsgd decodes it: the decoder never looks at the norm kind.
  qsgd<Policy> other(opts(2, 0, 7, 1));
  std::vector<float> d1(y.size()), d2(y.size());
  mx.decode(pm, d1);
  other.decode(pm, d2);
  CHECK(bit_equal(d1, d2));
}

TEST_CASE("qsgd states: l2 saves version 1 (the old bytes), max version 2 with its norm byte") {
  qsgd<> l2(opts(4, 5, 64, 9)), mx(opts(4, 5, 64, 9, max_norm));
  const auto a = l2.save_state(), b = mx.save_state();
  REQUIRE(a.size() == wire::header_size + 24);
  REQUIRE(b.size() == wire::header_size + 25);
  CHECK(a[wire::header_size] == std::byte{1});
  CHECK(b[wire::header_size] == std::byte{2});
  CHECK(b.back() == std::byte{1});
  // A version-2 state with a norm byte of 2 is malformed; with 0 (l2) it is a valid l2 state.
  auto edit_norm = [&](std::uint8_t v) {
    auto bytes = b;
    bytes.back() = std::byte{v};
    auto span = std::span<const std::byte>(bytes);
    const std::uint32_t crc = wire::crc32c(wire::crc32c(0, span.first(28)), span.subspan(wire::header_size));
    std::memcpy(bytes.data() + 28, &crc, 4);
    return bytes;
  };
  qsgd<> c(opts(4, 5, 64, 9, max_norm));
  CHECK_THROWS_AS(c.restore_state(edit_norm(2)), wire::wire_error);
  qsgd<> d(opts(4, 5, 64, 9));
  CHECK_NOTHROW(d.restore_state(edit_norm(0)));
  CHECK_THROWS_AS(c.restore_state(a), option_mismatch_error);
  CHECK_NOTHROW(c.restore_state(b));
}

TEST_CASE("a version-1 state (before the norm option) restores as the l2 norm") {
  qsgd<> a(opts(4, 5, 64, 9));
  a.set_step(12);
  // The same state as version 1 wrote it: no norm byte.
  const auto v1 = wire::serialize_state(wire::codec_id::qsgd, 0, [](wire::writer& w) {
    w.put<std::uint8_t>(1);
    w.put<std::uint8_t>(4);
    w.put<std::uint16_t>(5);
    w.put<std::uint32_t>(64);
    w.put<std::uint64_t>(9);
    w.put<std::uint64_t>(12);
  });
  qsgd<> b(opts(4, 5, 64, 9));
  CHECK_NOTHROW(b.restore_state(v1));
  CHECK(b.step() == 12);
  qsgd<> c(opts(4, 5, 64, 9, max_norm));
  CHECK_THROWS_AS(c.restore_state(v1), option_mismatch_error);
  CHECK(c.step() == 0);
}
