// two_bit_quantizer: format, residual conservation, simd == seq, automatic
// threshold, wire round trips and rejections, state save/restore, bad input.
#include <doctest/doctest.h>

#include <gradcomp/detail/random.hpp>
#include <gradcomp/two_bit.hpp>

#include <support/error_checks.hpp>
#include <support/equality.hpp>
#include <support/random_vectors.hpp>
#include <support/wire_checks.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

using namespace gradcomp;
using wire::wire_errc;

namespace {

using test_support::normal_floats;  // Normal(0, sigma) from stream 0 of the counter RNG

using test_support::bit_equal;

bool same_payload(const two_bit_payload& a, const two_bit_payload& b) {
  return a.count == b.count && std::bit_cast<std::uint32_t>(a.threshold) == std::bit_cast<std::uint32_t>(b.threshold) &&
         a.words == b.words;
}

wire_errc parse_error(std::span<const std::byte> bytes) {
  return test_support::parse_error_of<two_bit_payload>(bytes);
}

using test_support::reseal;  // recomputes the CRC after a deliberate edit

// A two-bit message with an arbitrary body and a valid header and checksum.
using raw_two_bit = test_support::raw_message_of<wire::codec_id::two_bit>;

std::vector<std::byte> raw_message(std::uint64_t n, float thr, const std::vector<std::uint32_t>& words) {
  raw_two_bit raw{n, {}};
  wire::writer w(raw.body);
  w.put<float>(thr);
  w.put_array<std::uint32_t>(words);
  return wire::serialize(raw);
}

}  // namespace

static_assert(Codec<two_bit_quantizer<>>);
static_assert(DecodeAddCodec<two_bit_quantizer<>>);
static_assert(StatefulCodec<two_bit_quantizer<>>);
static_assert(!LinearCodec<two_bit_quantizer<>>, "two-bit payloads are not summable in the compressed domain");
static_assert(Codec<two_bit_quantizer<execution::simd>>);
static_assert(StatefulCodec<two_bit_quantizer<execution::simd>>);
static_assert(wire::WirePayload<two_bit_payload>);

TEST_CASE_TEMPLATE("two-bit codes, bit order and residual on a worked example", Policy, execution::seq,
                   execution::simd) {
  // 18 elements: one full word and 2 codes in a second word.
  std::vector<float> g = {0.5f, -0.5f, 0.49f, -0.49f, 1.7f, -1.2f, 0.0f, 0.25f, 0.6f,
                          -0.6f, 0.1f, 0.2f, 0.3f, 0.4f, -0.1f, 2.0f, -3.0f, 0.5f};
  two_bit_quantizer<Policy> q(g.size(), two_bit_options::fixed(0.5f));
  two_bit_payload p;
  q.encode(g, p);
  CHECK(p.count == 18);
  CHECK(p.threshold == 0.5f);
  REQUIRE(p.words.size() == 2);
  // codes per element (11 = +, 10 = -, 00 = 0), element j at bits 2j, 2j+1
  const unsigned codes[18] = {3, 2, 0, 0, 3, 2, 0, 0, 3, 2, 0, 0, 0, 0, 0, 3, 2, 3};
  std::uint32_t w0 = 0, w1 = 0;
  for (int j = 0; j < 16; ++j) w0 |= codes[j] << (2 * j);
  for (int j = 16; j < 18; ++j) w1 |= codes[j] << (2 * (j - 16));
  CHECK(p.words[0] == w0);
  CHECK(p.words[1] == w1);
  // residual = x - decoded (x = g on the first step)
  std::vector<float> out(g.size());
  q.decode(p, out);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const float expect = codes[i] == 3 ? 0.5f : (codes[i] == 2 ? -0.5f : 0.0f);
    CHECK(out[i] == expect);
    CHECK(q.residual()[i] == g[i] - expect);
  }
  // Second step with zero gradient: 1.2 (=1.7-0.5) still >= thr, sends again.
  std::vector<float> zero(g.size(), 0.0f);
  q.encode(zero, p);
  q.decode(p, out);
  CHECK(out[4] == 0.5f);
  CHECK(out[16] == -0.5f);  // -3.0 -> -2.5 -> sends -0.5 again
  CHECK(out[0] == 0.0f);
  CHECK(q.steps() == 2);
}

TEST_CASE_TEMPLATE("residual conservation: sum of decoded + final residual == sum of inputs", Policy,
                   execution::seq, execution::simd) {
  for (const auto opts : {two_bit_options::fixed(0.05f), two_bit_options::fixed(1e-3f),
                          two_bit_options::automatic(1.0f), two_bit_options::automatic(2.5f)}) {
    const std::size_t n = 3001;
    const int steps = 40;
    two_bit_quantizer<Policy> q(n, opts);
    std::vector<double> sent(n, 0.0), input(n, 0.0);
    std::vector<float> out(n);
    two_bit_payload p;
    double bound = 0.0;  // sum over steps of 2 eps max|x_t| (two roundings per step)
    for (int t = 0; t < steps; ++t) {
      // gradients with a per-element drift so some entries accumulate for many steps
      auto g = normal_floats(n, 100 + t, 0.01);
      for (std::size_t i = 0; i < n; ++i) g[i] += 0.002f * static_cast<float>(i % 7) - 0.006f;
      double max_x = 0.0;
      for (std::size_t i = 0; i < n; ++i) max_x = std::max(max_x, std::abs(double(q.residual()[i]) + g[i]));
      bound += 2.0 * std::numeric_limits<float>::epsilon() * max_x;
      q.encode(g, p);
      q.decode(p, out);
      for (std::size_t i = 0; i < n; ++i) {
        input[i] += g[i];
        sent[i] += out[i];
      }
    }
    double worst = 0.0;
    for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(sent[i] + q.residual()[i] - input[i]));
    CHECK(worst <= bound);
    CHECK(bound < 1e-5);
  }
}

TEST_CASE("simd kernels equal seq kernels bit for bit (words, thresholds, residuals, decode)") {
  for (const std::size_t n : {0u, 1u, 15u, 16u, 17u, 33u, 1023u, 1024u, 1025u, 4099u}) {
    for (const auto opts : {two_bit_options::fixed(0.3f), two_bit_options::automatic(1.0f)}) {
      two_bit_quantizer<execution::seq> a(n, opts);
      two_bit_quantizer<execution::simd> b(n, opts);
      two_bit_payload pa, pb;
      for (int t = 0; t < 5; ++t) {
        const auto g = normal_floats(n, 7 * n + t, 0.4);
        a.encode(g, pa);
        b.encode(g, pb);
        REQUIRE(same_payload(pa, pb));
        REQUIRE(bit_equal(a.residual(), b.residual()));
        std::vector<float> da(n), db(n), sa = g, sb = g;
        a.decode(pa, da);
        b.decode(pb, db);
        CHECK(bit_equal(da, db));
        a.decode_add(pa, sa);
        b.decode_add(pb, sb);
        CHECK(bit_equal(sa, sb));
      }
    }
  }
  // The scan kernels agree on everything they return, including where a NaN is.
  auto g = normal_floats(5000, 3);
  const auto r = normal_floats(5000, 4);
  const auto s1 = two_bit_prescan(execution::seq{}, g, r);
  const auto s2 = two_bit_prescan(execution::simd{}, g, r);
  CHECK(s1.first_non_finite == s2.first_non_finite);
  CHECK(s1.max_abs_gradient == s2.max_abs_gradient);
  CHECK(s1.sum_abs_accumulated == s2.sum_abs_accumulated);
  for (const std::size_t bad : {0u, 7u, 1023u, 1024u, 4097u, 4999u}) {
    auto h = g;
    h[bad] = std::numeric_limits<float>::quiet_NaN();
    CHECK(two_bit_prescan(execution::seq{}, h, r).first_non_finite == bad);
    CHECK(two_bit_prescan(execution::simd{}, h, r).first_non_finite == bad);
    h[bad] = -std::numeric_limits<float>::infinity();
    CHECK(two_bit_prescan(execution::simd{}, h, {}).first_non_finite == bad);
  }
}

TEST_CASE_TEMPLATE("automatic threshold = scale * mean |r + g|, and it follows the gradient scale", Policy,
                   execution::seq, execution::simd) {
  const std::size_t n = 20000;
  two_bit_quantizer<Policy> q(n, two_bit_options::automatic(1.5f));
  two_bit_payload p;
  for (int t = 0; t < 4; ++t) {
    const auto g = normal_floats(n, 40 + t, 1e-3);
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += std::abs(double(q.residual()[i] + g[i]));
    q.encode(g, p);
    CHECK(p.threshold == doctest::Approx(1.5 * sum / n).epsilon(1e-5));
    CHECK(q.last_threshold() == p.threshold);
  }

  // Scale equivariance: multiplying the gradients by 2^k multiplies the
  // threshold by 2^k and leaves every code unchanged (exact in floating point).
  for (const float c : {0.0009765625f, 1024.0f}) {
    two_bit_quantizer<Policy> a(n, two_bit_options::automatic()), b(n, two_bit_options::automatic());
    two_bit_payload pa, pb;
    for (int t = 0; t < 3; ++t) {
      auto g = normal_floats(n, 90 + t);
      a.encode(g, pa);
      for (auto& x : g) x *= c;
      b.encode(g, pb);
      CHECK(pa.words == pb.words);
      CHECK(pb.threshold == pa.threshold * c);
    }
  }

  // First step on N(0,1): density of non-zero codes is P(|x| >= E|x|) = 0.425.
  two_bit_quantizer<Policy> fresh(n, two_bit_options::automatic());
  fresh.encode(normal_floats(n, 5), p);
  std::size_t nonzero = 0;
  for (const auto w : p.words) nonzero += std::popcount(w & 0xAAAAAAAAu);
  CHECK(double(nonzero) / n == doctest::Approx(0.425).epsilon(0.05));
}

TEST_CASE("automatic threshold sends at every gradient scale where 0.5 sends nothing") {
  const std::size_t n = 4096;
  two_bit_quantizer<> fixed(n), automatic(n, two_bit_options::automatic());
  two_bit_payload pf, pa;
  std::size_t sent_fixed = 0, sent_auto = 0;
  for (int t = 0; t < 100; ++t) {
    const auto g = normal_floats(n, 500 + t, 1e-3);
    fixed.encode(g, pf);
    automatic.encode(g, pa);
    for (auto w : pf.words) sent_fixed += std::popcount(w);
    for (auto w : pa.words) sent_auto += std::popcount(w);
  }
  CHECK(sent_fixed == 0);  // 100 steps of 1e-3 noise never reach 0.5
  CHECK(sent_auto > 100 * n / 4);
  // and the residual stays at the gradient scale instead of growing
  double rms = 0;
  for (float v : automatic.residual()) rms += double(v) * v;
  CHECK(std::sqrt(rms / n) < 3e-3);
}

TEST_CASE("all-zero input: every code is 00, threshold stays a valid positive float") {
  two_bit_quantizer<> q(40, two_bit_options::automatic());
  two_bit_payload p;
  q.encode(std::vector<float>(40, 0.0f), p);
  CHECK(p.threshold == std::numeric_limits<float>::min());
  for (auto w : p.words) CHECK(w == 0u);
  const auto bytes = wire::serialize(p);
  CHECK(same_payload(wire::parse<two_bit_payload>(bytes), p));
}

TEST_CASE("decode_add sums several workers' payloads (decode-and-sum aggregation)") {
  const std::size_t n = 1000;
  std::vector<float> sum(n, 1.0f), expect(n, 1.0f), out(n);
  for (int worker = 0; worker < 4; ++worker) {
    two_bit_quantizer<execution::simd> q(n, two_bit_options::automatic());
    two_bit_payload p;
    q.encode(normal_floats(n, 1000 + worker), p);
    q.decode_add(p, sum);
    q.decode(p, out);
    for (std::size_t i = 0; i < n; ++i) expect[i] += out[i];
  }
  CHECK(bit_equal(sum, expect));
}

TEST_CASE("payloads round-trip through wire.hpp with exact sizes") {
  for (const std::size_t n : {0u, 1u, 16u, 17u, 1000u}) {
    two_bit_quantizer<> q(n, two_bit_options::automatic());
    two_bit_payload p;
    q.encode(normal_floats(n, n), p);
    const auto bytes = wire::serialize(p);
    CHECK(bytes.size() == q.encoded_bytes(p));
    CHECK(bytes.size() == 32 + 4 + 4 * ((n + 15) / 16));
    const auto back = wire::parse<two_bit_payload>(bytes);
    CHECK(same_payload(back, p));
  }
}

TEST_CASE("corrupted, truncated and hand-crafted two-bit messages are rejected") {
  two_bit_quantizer<> q(100, two_bit_options::fixed(0.5f));
  two_bit_payload p;
  q.encode(normal_floats(100, 1), p);
  const auto good = wire::serialize(p);

  SUBCASE("every flipped byte is detected") {
    test_support::check_flipped_bytes_rejected<two_bit_payload>(good, std::byte{0x10});
    auto bad = good;
    bad[40] ^= std::byte{0x01};  // a body byte: only the checksum can tell
    CHECK(parse_error(bad) == wire_errc::checksum_mismatch);
  }
  SUBCASE("every truncation is detected") {
    test_support::check_truncations_rejected<two_bit_payload>(good);
  }
  SUBCASE("a body whose length does not match the count is malformed (valid checksum)") {
    std::vector<std::uint32_t> words(7, 0u);  // 100 elements need 7 words
    CHECK_NOTHROW(wire::parse<two_bit_payload>(raw_message(100, 0.5f, words)));
    CHECK_NOTHROW(wire::parse<two_bit_payload>(raw_message(112, 0.5f, words)));
    CHECK(parse_error(raw_message(96, 0.5f, words)) == wire_errc::malformed_body);
    CHECK(parse_error(raw_message(113, 0.5f, words)) == wire_errc::malformed_body);
    words.push_back(0);
    CHECK(parse_error(raw_message(100, 0.5f, words)) == wire_errc::malformed_body);
    CHECK(parse_error(raw_message(1ull << 33, 0.5f, words)) == wire_errc::malformed_body);
  }
  SUBCASE("bad thresholds, code 01 and non-zero padding are malformed") {
    const std::vector<std::uint32_t> words(7, 0u);
    for (const float thr : {0.0f, -0.5f, std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity()})
      CHECK(parse_error(raw_message(100, thr, words)) == wire_errc::malformed_body);
    auto w01 = words;
    w01[3] = 0x1u << 10;  // code 01 at element 3*16+5
    CHECK(parse_error(raw_message(100, 0.5f, w01)) == wire_errc::malformed_body);
    auto pad = words;
    pad[6] = 0x3u << (2 * 4);  // 100 = 6*16 + 4: element 100 does not exist
    CHECK(parse_error(raw_message(100, 0.5f, pad)) == wire_errc::malformed_body);
    pad[6] = 0x3u << (2 * 3);  // element 99 exists
    CHECK_NOTHROW(wire::parse<two_bit_payload>(raw_message(100, 0.5f, pad)));
  }
  SUBCASE("a saved state is not a payload") {
    CHECK(parse_error(q.save_state()) == wire_errc::wrong_kind);
  }
}

TEST_CASE_TEMPLATE("save_state / restore_state continues bit for bit", Policy, execution::seq, execution::simd) {
  for (const auto opts : {two_bit_options::fixed(0.2f), two_bit_options::automatic(0.8f)}) {
    const std::size_t n = 777;
    two_bit_quantizer<Policy> a(n, opts);
    two_bit_payload p;
    for (int t = 0; t < 5; ++t) a.encode(normal_floats(n, 200 + t, 0.3), p);
    const auto saved = a.save_state();
    std::vector<two_bit_payload> expected;
    for (int t = 5; t < 10; ++t) {
      a.encode(normal_floats(n, 200 + t, 0.3), p);
      expected.push_back(p);
    }
    // A codec of the same size and options continues where the saved one was.
    two_bit_quantizer<Policy> b(n, opts);
    b.restore_state(saved);
    CHECK(b.size() == n);
    CHECK(b.steps() == 5);
    CHECK(b.options().mode == opts.mode);
    for (int t = 5; t < 10; ++t) {
      b.encode(normal_floats(n, 200 + t, 0.3), p);
      CHECK(same_payload(p, expected[t - 5]));
    }
    CHECK(bit_equal(a.residual(), b.residual()));
    // save -> restore -> save is the identity on bytes
    two_bit_quantizer<Policy> c(n, opts);
    c.restore_state(a.save_state());
    CHECK(c.save_state() == a.save_state());
  }
}

TEST_CASE_TEMPLATE("restore_state with other options or size throws and leaves the codec unchanged", Policy,
                   execution::seq, execution::simd) {
  const std::size_t n = 100;
  two_bit_quantizer<Policy> a(n, two_bit_options::fixed(0.2f));
  two_bit_payload p;
  a.encode(normal_floats(n, 7, 0.3), p);
  const auto saved = a.save_state();
  auto expect_option = [&](two_bit_quantizer<Policy>& b, const char* option) {
    b.encode(normal_floats(b.size(), 8, 0.3), p);
    const auto before = b.save_state();
    test_support::check_restore_names_option(b, saved, option);
    CHECK(b.save_state() == before);
  };
  two_bit_quantizer<Policy> other_mode(n, two_bit_options::automatic());
  expect_option(other_mode, "mode");
  two_bit_quantizer<Policy> other_threshold(n, two_bit_options::fixed(9.0f));
  expect_option(other_threshold, "threshold");
  two_bit_options scaled = two_bit_options::fixed(0.2f);
  scaled.auto_scale = 0.5f;
  two_bit_quantizer<Policy> other_scale(n, scaled);
  expect_option(other_scale, "auto_scale");
  two_bit_quantizer<Policy> other_size(3, two_bit_options::fixed(0.2f));
  const auto before = other_size.save_state();
  CHECK_THROWS_AS(other_size.restore_state(saved), size_mismatch_error);
  CHECK(other_size.save_state() == before);
  two_bit_quantizer<Policy> same(n, two_bit_options::fixed(0.2f));
  CHECK_NOTHROW(same.restore_state(saved));
  CHECK(same.save_state() == saved);
}

TEST_CASE("restore_state rejects bad bytes and leaves the codec unchanged") {
  two_bit_quantizer<> a(50, two_bit_options::automatic());
  two_bit_payload p;
  a.encode(normal_floats(50, 1), p);
  const auto good = a.save_state();
  two_bit_quantizer<> b(10, two_bit_options::fixed(0.25f));
  b.encode(normal_floats(10, 2), p);
  const auto before = b.save_state();

  auto expect_rejected = [&](const std::vector<std::byte>& bytes, wire_errc code) {
    try {
      b.restore_state(bytes);
      FAIL("restore accepted bad bytes");
    } catch (const wire::wire_error& e) {
      CHECK(e.code() == code);
    }
    CHECK(b.save_state() == before);
  };
  auto flipped = good;
  flipped[60] ^= std::byte{4};
  expect_rejected(flipped, wire_errc::checksum_mismatch);
  expect_rejected(std::vector<std::byte>(good.begin(), good.end() - 1), wire_errc::truncated);
  expect_rejected(wire::serialize(p), wire_errc::wrong_kind);
  // body offsets: 32 version, 33 mode, 34 reserved, 36 threshold, 40 scale, 44 last, 48 steps, 56 residual
  auto edit = [&](std::size_t at, auto value) {
    auto bytes = good;
    std::memcpy(bytes.data() + at, &value, sizeof value);
    reseal(bytes);
    return bytes;
  };
  expect_rejected(edit(32, std::uint8_t{9}), wire_errc::malformed_body);
  expect_rejected(edit(33, std::uint8_t{2}), wire_errc::malformed_body);
  expect_rejected(edit(34, std::uint16_t{1}), wire_errc::malformed_body);
  expect_rejected(edit(36, -1.0f), wire_errc::malformed_body);
  expect_rejected(edit(40, std::numeric_limits<float>::quiet_NaN()), wire_errc::malformed_body);
  expect_rejected(edit(44, -2.0f), wire_errc::malformed_body);
  expect_rejected(edit(56 + 4 * 7, std::numeric_limits<float>::infinity()), wire_errc::malformed_body);
  // element count that disagrees with the residual length
  expect_rejected(edit(12, std::uint64_t{51}), wire_errc::malformed_body);
}

TEST_CASE_TEMPLATE("bad input: parameters, sizes, non-finite gradients, overflow", Policy, execution::seq,
                   execution::simd) {
  using Q = two_bit_quantizer<Policy>;
  for (const float thr : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CHECK_THROWS_AS(Q(4, two_bit_options::fixed(thr)), invalid_argument_error);
    CHECK_THROWS_AS(Q(4, two_bit_options::automatic(thr)), invalid_argument_error);
  }
  two_bit_options weird;
  weird.mode = static_cast<two_bit_threshold_mode>(7);
  CHECK_THROWS_AS(Q(4, weird), invalid_argument_error);

  const std::size_t n = 2100;
  Q q(n, two_bit_options::automatic());
  two_bit_payload p;
  q.encode(normal_floats(n, 1), p);
  const auto state = q.save_state();
  CHECK_THROWS_AS(q.encode(std::vector<float>(n + 1), p), size_mismatch_error);

  for (const std::size_t bad : {std::size_t{0}, std::size_t{1}, std::size_t{1500}, n - 1}) {
    for (const float v : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
      auto g = normal_floats(n, 2);
      g[bad] = v;
      if (bad + 1 < n) g[bad + 1] = v;  // the first bad index is named
      CHECK(gradcomp::test_support::non_finite_index_of([&] { q.encode(g, p); }) == bad);
      CHECK(q.save_state() == state);  // residual, step count: untouched
    }
  }
  // Finite, but max|g| + max|r| exceeds FLT_MAX, so r + g could overflow:
  // rejected before any change (a conservative, max-based guard).
  {
    Q big(n, two_bit_options::fixed(1.0f));
    auto g = normal_floats(n, 3);
    g[10] = 3e38f;
    big.encode(g, p);  // residual[10] = 3e38 - 1
    const auto big_state = big.save_state();
    for (const std::size_t at : {std::size_t{10}, std::size_t{11}}) {
      auto h = normal_floats(n, 4);
      h[at] = 1e38f;
      CHECK_THROWS_AS(big.encode(h, p), invalid_argument_error);
      CHECK(big.save_state() == big_state);
    }
    big.reset();  // a zero residual accepts the same large gradient again
    CHECK_NOTHROW(big.encode(g, p));
  }

  // decode: wrong output size, and a payload whose words do not match its count
  q.encode(normal_floats(n, 4), p);
  std::vector<float> out(n - 1);
  CHECK_THROWS_AS(q.decode(p, out), size_mismatch_error);
  CHECK_THROWS_AS(q.decode_add(p, out), size_mismatch_error);
  out.resize(n);
  auto broken = p;
  broken.words.pop_back();
  CHECK_THROWS_AS(q.decode(broken, out), invalid_argument_error);
  CHECK_THROWS_AS(q.decode_add(broken, out), invalid_argument_error);
}

TEST_CASE("reset zeroes the residual and the step count") {
  two_bit_quantizer<> q(33);
  two_bit_payload p;
  q.encode(normal_floats(33, 8), p);
  q.reset();
  CHECK(q.steps() == 0);
  for (float v : q.residual()) CHECK(v == 0.0f);
  two_bit_quantizer<> fresh(33);
  two_bit_payload pf;
  const auto g = normal_floats(33, 9);
  q.encode(g, p);
  fresh.encode(g, pf);
  CHECK(same_payload(p, pf));
}

TEST_CASE("automatic mode: scale <= 1 sends every step; a larger scale can starve a drifting layer") {
  // A constant gradient spread over two decades: the residual of small entries
  // drifts. With scale <= 1, max|x| >= mean|x| >= thr, so something is sent
  // every step and the threshold settles; with scale 3 the residual flattens,
  // steps pass with nothing sent and the threshold climbs with the residual.
  const std::size_t n = 4096;
  std::vector<float> g(n);
  double mean_g = 0;
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = 1e-3f * std::pow(10.0f, -2.0f + 2.0f * float(i) / n);
    mean_g += g[i] / n;
  }
  auto run = [&](float scale, int& empty_steps) {
    two_bit_quantizer<execution::simd> q(n, two_bit_options::automatic(scale));
    two_bit_payload p;
    empty_steps = 0;
    for (int t = 0; t < 300; ++t) {
      q.encode(g, p);
      int sent = 0;
      for (auto w : p.words) sent += std::popcount(w & 0xAAAAAAAAu);
      empty_steps += sent == 0;
    }
    return p.threshold / mean_g;
  };
  int empty = 0;
  for (const float scale : {0.5f, 1.0f}) {
    CHECK(run(scale, empty) < 10.0);
    CHECK(empty == 0);
  }
  CHECK(run(3.0f, empty) > 50.0);
  CHECK(empty > 0);
}
