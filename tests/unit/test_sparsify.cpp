// sparsifier_with_memory and sparse_coo_payload: residual conservation, exact
// top-k per step, sampled density, DGC mode against a reference, simd == seq,
// wire round trips with both index encodings, corrupted payloads, state
// save/restore, bad inputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gradcomp/samomentum.hpp>
#include <gradcomp/sparsify.hpp>

#include <support/error_checks.hpp>
#include <support/equality.hpp>
#include <support/random_vectors.hpp>
#include <support/topk_reference.hpp>

namespace {

using namespace gradcomp;

static_assert(Codec<sparsifier_with_memory<>>);
static_assert(DecodeAddCodec<sparsifier_with_memory<>>);
static_assert(StatefulCodec<sparsifier_with_memory<>>);
static_assert(StatefulCodec<sparsifier_with_memory<execution::simd>>);
static_assert(!LinearCodec<sparsifier_with_memory<>>);
static_assert(wire::WirePayload<sparse_coo_payload>);

using test_support::is_exact_top;
using test_support::reference_topk;  // the k largest |x|, lower index first among ties (full sort)

struct gradient_source {
  std::mt19937 gen;
  explicit gradient_source(std::uint32_t seed) : gen(seed) {}
  std::vector<float> next(std::size_t n, float scale = 1.0f) { return test_support::mt_normal(gen, n, scale); }
};

using test_support::bit_equal;

bool same_payload(const sparse_coo_payload& a, const sparse_coo_payload& b) {
  return a.length == b.length && a.indices == b.indices && bit_equal(a.values, b.values);
}

/// A message with a hand-made sparse_coo body and a valid header and CRC.
std::vector<std::byte> message_with_body(std::uint64_t element_count, const std::vector<std::uint8_t>& body) {
  std::vector<std::byte> out;
  wire::detail::serialize_message(out, wire::codec_id::sparse_coo, wire::flag_none, element_count, body.size(),
                                  [&](wire::writer& w) {
                                    for (auto b : body) w.put<std::uint8_t>(b);
                                  });
  return out;
}

wire::wire_errc parse_error(std::span<const std::byte> bytes) {
  try {
    (void)wire::parse<sparse_coo_payload>(bytes);
  } catch (const wire::wire_error& e) {
    return e.code();
  }
  return wire::wire_errc{};
}

}  // namespace

TEST_CASE("selection count k = max(1, ceil(R% n)), at most n") {
  CHECK(sparse_selection_count(10000000, 0.1) == 10000);
  CHECK(sparse_selection_count(1000000, 1.0) == 10000);
  CHECK(sparse_selection_count(100, 1.0) == 1);
  CHECK(sparse_selection_count(1000, 0.01) == 1);
  CHECK(sparse_selection_count(7, 50.0) == 4);
  CHECK(sparse_selection_count(10, 100.0) == 10);
  CHECK(sparse_selection_count(3, 1e-4) == 1);
  CHECK(sparse_selection_count(0, 10.0) == 0);
  CHECK(sparse_selection_count(1001, 10.0) == 101);
}

TEST_CASE("residual conservation: sum of decoded + final residual == sum of inputs") {
  for (auto mode : {threshold_mode::exact, threshold_mode::sampled}) {
    for (float eta : {1.0f, 0.5f}) {
      const std::size_t n = 20000;
      sparsifier_options o;
      o.ratio_percent = 1.0;
      o.mode = mode;
      o.scale = eta;
      sparsifier_with_memory<execution::simd> codec(n, o);
      gradient_source src(3);
      std::vector<double> sent(n, 0.0), input(n, 0.0), abs_input(n, 0.0);
      std::vector<float> decoded(n);
      sparse_coo_payload p;
      const int steps = 30;
      for (int t = 0; t < steps; ++t) {
        const auto g = src.next(n, t % 3 == 0 ? 1e-3f : 1.0f);
        codec.encode(g, p);
        codec.decode(p, decoded);
        for (std::size_t i = 0; i < n; ++i) {
          sent[i] += decoded[i];
          input[i] += double(eta) * g[i];
          abs_input[i] += std::fabs(double(eta) * g[i]);
        }
      }
      double worst = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        const double err = std::fabs(sent[i] + codec.residual()[i] - input[i]);
        // Only the additions r + eta*g round: at most one half-ulp of |r| per step.
        worst = std::max(worst, err / (steps * 1e-7 * abs_input[i] + 1e-30));
      }
      CAPTURE(int(mode));
      CHECK(worst <= 1.0);
    }
  }
}

TEST_CASE("exact mode sends exactly the k largest |r + g| and keeps the rest") {
  const std::size_t n = 5003;
  sparsifier_options o;
  o.ratio_percent = 2.5;
  sparsifier_with_memory<> codec(n, o);
  const std::size_t k = sparse_selection_count(n, 2.5);
  CHECK(codec.selection_size() == k);
  gradient_source src(4);
  std::vector<float> r(n, 0.0f);
  sparse_coo_payload p;
  for (int t = 0; t < 12; ++t) {
    const auto g = src.next(n);
    for (std::size_t i = 0; i < n; ++i) r[i] = r[i] + g[i];
    codec.encode(g, p);
    const auto want = reference_topk(r, k);
    REQUIRE(p.indices == want);
    CHECK(p.length == n);
    CHECK(codec.last_selected() == k);
    for (std::size_t j = 0; j < want.size(); ++j) {
      CHECK(p.values[j] == r[want[j]]);
      r[want[j]] = 0.0f;
    }
    CHECK(bit_equal(r, codec.residual()));
  }
}

TEST_CASE("exact mode stays exact when the sampled bracket misses (radix fallback)") {
  // Large values exactly at the positions the step-0 sample reads: the
  // sampled threshold admits only those 4096 entries (< k), so the codec must
  // fall back to the radix select on the updated residual.
  const std::size_t n = 200000;
  sparsifier_options o;
  o.ratio_percent = 5.0;
  o.seed = 77;
  const std::size_t k = sparse_selection_count(n, o.ratio_percent);
  const auto pos = test_support::sample_positions(n, k, o.seed, 0);
  REQUIRE(pos.size() < k);
  auto g = gradient_source(12).next(n);
  for (auto i : pos) g[i] = 50.0f;
  sparsifier_with_memory<execution::seq> a(n, o);
  sparsifier_with_memory<execution::simd> b(n, o);
  sparse_coo_payload pa, pb;
  a.encode(g, pa);
  b.encode(g, pb);
  CHECK(pa.indices == reference_topk(g, k));
  CHECK(same_payload(pa, pb));
  CHECK(bit_equal(a.residual(), b.residual()));
  // The sampled mode takes the candidates only.
  o.mode = threshold_mode::sampled;
  sparsifier_with_memory<execution::simd> c(n, o);
  c.encode(g, pb);
  CHECK(pb.nnz() == pos.size());
  CHECK(is_exact_top(g, pb.indices));
}

TEST_CASE("sampled mode: achieved density near R, each selection the exact top of its size") {
  const std::size_t n = 200000;
  for (double ratio : {1.0, 0.1}) {
    sparsifier_options o;
    o.ratio_percent = ratio;
    o.mode = threshold_mode::sampled;
    o.seed = 99;
    sparsifier_with_memory<execution::simd> codec(n, o);
    const std::size_t k = codec.selection_size();
    gradient_source src(5);
    std::vector<float> r(n, 0.0f);
    sparse_coo_payload p;
    double density_sum = 0.0;
    const int steps = 8;
    for (int t = 0; t < steps; ++t) {
      const auto g = src.next(n);
      for (std::size_t i = 0; i < n; ++i) r[i] = r[i] + g[i];
      codec.encode(g, p);
      REQUIRE(p.nnz() <= k);
      CHECK(is_exact_top(r, p.indices));
      CHECK(codec.last_density() == doctest::Approx(double(p.nnz()) / n));
      for (auto i : p.indices) r[i] = 0.0f;
      density_sum += codec.last_density();
    }
    CAPTURE(ratio);
    CHECK(density_sum / steps >= 0.95 * ratio / 100.0);
    CHECK(density_sum / steps <= ratio / 100.0 + 1e-12);
  }
}

TEST_CASE("DGC mode: momentum correction and momentum-factor masking") {
  const std::size_t n = 3001;
  sparsifier_options o;
  o.ratio_percent = 1.0;
  o.dgc_momentum = true;
  o.momentum = 0.9f;
  o.scale = 0.25f;
  sparsifier_with_memory<execution::simd> codec(n, o);
  const std::size_t k = codec.selection_size();
  std::vector<float> u(n, 0.0f), v(n, 0.0f);
  gradient_source src(6);
  sparse_coo_payload p;
  for (int t = 0; t < 15; ++t) {
    const auto g = src.next(n);
    for (std::size_t i = 0; i < n; ++i) {
      volatile float mu = 0.9f * u[i];  // volatile: no FMA contraction (GCC fuses across statements)
      volatile float eg = 0.25f * g[i];
      u[i] = mu + eg;
      v[i] = v[i] + u[i];
    }
    codec.encode(g, p);
    const auto want = reference_topk(v, k);
    REQUIRE(p.indices == want);
    for (std::size_t j = 0; j < k; ++j) {
      CHECK(p.values[j] == v[want[j]]);
      u[want[j]] = 0.0f;
      v[want[j]] = 0.0f;
    }
    CHECK(bit_equal(v, codec.residual()));
    CHECK(bit_equal(u, codec.velocity()));
  }
}

TEST_CASE("simd kernels equal seq kernels bit for bit") {
  for (auto mode : {threshold_mode::exact, threshold_mode::sampled}) {
    for (bool dgc : {false, true}) {
      const std::size_t n = 250007;
      sparsifier_options o;
      o.ratio_percent = 0.3;
      o.mode = mode;
      o.seed = 1234;
      o.dgc_momentum = dgc;
      o.scale = 0.1f;
      sparsifier_with_memory<execution::seq> a(n, o);
      sparsifier_with_memory<execution::simd> b(n, o);
      gradient_source src(7);
      sparse_coo_payload pa, pb;
      for (int t = 0; t < 5; ++t) {
        const auto g = src.next(n, 1e-2f);
        a.encode(g, pa);
        b.encode(g, pb);
        CHECK(same_payload(pa, pb));
        CHECK(bit_equal(a.residual(), b.residual()));
        CHECK(bit_equal(a.velocity(), b.velocity()));
      }
    }
  }
}

TEST_CASE("COO payload round-trips through wire with both index encodings") {
  gradient_source src(8);
  for (double ratio : {0.5, 30.0}) {
    const std::size_t n = 10001;
    sparsifier_options o;
    o.ratio_percent = ratio;
    sparsifier_with_memory<> codec(n, o);
    sparse_coo_payload p;
    codec.encode(src.next(n), p);
    // Automatic choice is the smaller block.
    const auto chosen = p.encoding();
    CHECK(chosen == (p.bitmap_index_bytes() < p.delta_varint_index_bytes() ? index_encoding::bitmap
                                                                            : index_encoding::delta_varint));
    CHECK(chosen == (ratio > 20 ? index_encoding::bitmap : index_encoding::delta_varint));
    for (auto forced : {std::optional<index_encoding>{}, std::optional{index_encoding::delta_varint},
                        std::optional{index_encoding::bitmap}}) {
      p.forced_encoding = forced;
      const auto bytes = wire::serialize(p);
      CHECK(bytes.size() == codec.encoded_bytes(p));
      CHECK(bytes[wire::header_size] == std::byte(static_cast<std::uint8_t>(p.encoding())));
      const auto q = wire::parse<sparse_coo_payload>(bytes);
      CHECK(same_payload(p, q));
      std::vector<float> a(n), b(n);
      codec.decode(p, a);
      codec.decode(q, b);
      CHECK(bit_equal(a, b));
    }
  }
  // Edge cases: empty layer, nothing sent, everything sent, index 0 and n-1.
  for (auto forced : {index_encoding::delta_varint, index_encoding::bitmap}) {
    std::vector<sparse_coo_payload> cases(4);
    cases[0].length = 0;
    cases[1].length = 17;
    cases[2].length = 9;
    cases[2].indices = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    cases[2].values = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    cases[3].length = 1u << 20;
    cases[3].indices = {0, 300, (1u << 20) - 1};
    cases[3].values = {-1.5f, 0.0f, 3.0f};
    for (auto& c : cases) {
      c.forced_encoding = forced;
      const auto bytes = wire::serialize(c);
      CHECK(bytes.size() == wire::serialized_size(c));
      CHECK(same_payload(c, wire::parse<sparse_coo_payload>(bytes)));
    }
  }
}

TEST_CASE("exact byte counts of the index encodings") {
  sparse_coo_payload p;
  p.length = 1000;
  p.indices = {0, 127, 128, 500, 999};  // varints of 0, 127, 1, 372, 499: 1+1+1+2+2 bytes
  p.values = {1, 2, 3, 4, 5};
  CHECK(p.delta_varint_index_bytes() == 7);
  CHECK(p.bitmap_index_bytes() == 125);
  CHECK(p.body_size() == 1 + 1 + 7 + 20);
  p.forced_encoding = index_encoding::bitmap;
  CHECK(p.body_size() == 1 + 1 + 125 + 20);
  CHECK(wire::serialize(p).size() == wire::header_size + p.body_size());
}

TEST_CASE("corrupted payloads are rejected") {
  using wire::wire_errc;
  // Valid reference: 10 elements, entries at 2 and 5.
  const std::vector<std::uint8_t> values = {0, 0, 0x80, 0x3F, 0, 0, 0, 0x40};  // 1.0f, 2.0f
  auto body = [&](std::vector<std::uint8_t> head, bool with_values = true) {
    if (with_values) head.insert(head.end(), values.begin(), values.end());
    return head;
  };
  CHECK(parse_error(message_with_body(10, body({0, 2, 2, 3}))) == wire_errc{});
  const auto ok = wire::parse<sparse_coo_payload>(message_with_body(10, body({0, 2, 2, 3})));
  CHECK(ok.indices == std::vector<std::uint32_t>{2, 5});
  CHECK(parse_error(message_with_body(10, body({1, 2, 0x24, 0x00}))) == wire_errc{});  // bitmap 2, 5

  // Bad index order: a zero difference repeats an index.
  CHECK(parse_error(message_with_body(10, body({0, 2, 2, 0}))) == wire_errc::malformed_body);
  // Index out of range: 2 + 8 = 10 >= 10; a first index of 10; a difference that wraps.
  CHECK(parse_error(message_with_body(10, body({0, 2, 2, 8}))) == wire_errc::malformed_body);
  CHECK(parse_error(message_with_body(10, body({0, 2, 10, 1}))) == wire_errc::malformed_body);
  CHECK(parse_error(message_with_body(
            10, body({0, 2, 2, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}))) ==
        wire_errc::malformed_body);
  // Truncated varint: continuation bits run off the end of the body.
  CHECK(parse_error(message_with_body(10, {0, 1, 0x80, 0x80, 0x80, 0x80, 0x80})) == wire_errc::truncated);
  // Count larger than the element count, and a count the body cannot hold.
  CHECK(parse_error(message_with_body(10, body({0, 11, 2, 3}))) == wire_errc::malformed_body);
  CHECK(parse_error(message_with_body(1000000, {0, 0xC0, 0x84, 0x3D, 1})) == wire_errc::truncated);
  // Unknown encoding.
  CHECK(parse_error(message_with_body(10, body({2, 2, 2, 3}))) == wire_errc::malformed_body);
  // Bitmap: a bit beyond the element count, popcount above and below the count.
  CHECK(parse_error(message_with_body(10, body({1, 2, 0x24, 0x04}))) == wire_errc::malformed_body);
  CHECK(parse_error(message_with_body(10, body({1, 2, 0x25, 0x00}))) == wire_errc::malformed_body);
  CHECK(parse_error(message_with_body(10, body({1, 2, 0x04, 0x00}))) == wire_errc::malformed_body);
  // Bitmap cut short.
  CHECK(parse_error(message_with_body(100, {1, 0, 0x24})) == wire_errc::truncated);
  // Values missing, or trailing bytes.
  CHECK(parse_error(message_with_body(10, {0, 2, 2, 3, 0, 0})) == wire_errc::truncated);
  auto extra = body({0, 2, 2, 3});
  extra.push_back(0);
  CHECK(parse_error(message_with_body(10, extra)) == wire_errc::malformed_body);
  // Non-finite value.
  CHECK(parse_error(message_with_body(10, {0, 1, 4, 0, 0, 0xC0, 0x7F})) == wire_errc::malformed_body);
  // Element count above 2^32-1.
  CHECK(parse_error(message_with_body(std::uint64_t{1} << 33, {0, 0})) == wire_errc::malformed_body);
  // Any flipped byte of a real payload is caught (checksum or validation).
  sparse_coo_payload p;
  p.length = 64;
  p.indices = {1, 9, 63};
  p.values = {1.f, -2.f, 3.f};
  const auto good = wire::serialize(p);
  for (std::size_t i = 0; i < good.size(); ++i) {
    auto bad = good;
    bad[i] ^= std::byte{0x10};
    CHECK(parse_error(bad) != wire_errc{});
  }
}

TEST_CASE("decode and decode_add") {
  sparsifier_with_memory<> codec(6);
  sparse_coo_payload p;
  p.length = 6;
  p.indices = {1, 4};
  p.values = {2.0f, -3.0f};
  std::vector<float> out(6, 7.0f);
  codec.decode(p, out);
  CHECK(out == std::vector<float>{0, 2, 0, 0, -3, 0});
  codec.decode_add(p, out);
  CHECK(out == std::vector<float>{0, 4, 0, 0, -6, 0});
  std::vector<float> wrong(5);
  CHECK_THROWS_AS(codec.decode(p, wrong), size_mismatch_error);
  CHECK_THROWS_AS(codec.decode_add(p, wrong), size_mismatch_error);
  // Malformed in-memory payloads never scatter out of bounds.
  auto bad = p;
  bad.indices = {4, 1};
  CHECK_THROWS_AS(codec.decode(bad, out), invalid_argument_error);
  CHECK_THROWS_AS(wire::serialize(bad), invalid_argument_error);
  bad.indices = {1, 6};
  CHECK_THROWS_AS(codec.decode_add(bad, out), invalid_argument_error);
  bad.indices = {1};
  CHECK_THROWS_AS(codec.decode(bad, out), invalid_argument_error);
}

TEST_CASE("state save/restore resumes bit-exactly") {
  for (auto mode : {threshold_mode::exact, threshold_mode::sampled}) {
    for (bool dgc : {false, true}) {
      const std::size_t n = 100003;
      sparsifier_options o;
      o.ratio_percent = 0.2;
      o.mode = mode;
      o.seed = 5;
      o.dgc_momentum = dgc;
      sparsifier_with_memory<execution::simd> a(n, o);
      gradient_source src(10);
      sparse_coo_payload pa, pb;
      for (int t = 0; t < 3; ++t) a.encode(src.next(n), pa);
      a.set_scale(0.5f);  // a schedule value: restored from the state
      const auto state2 = a.save_state();
      sparsifier_with_memory<execution::seq> b(n, o);
      b.restore_state(state2);
      CHECK(b.options().scale == 0.5f);
      CHECK(b.steps() == 3);
      // Another configuration cannot take this state.
      for (int which = 0; which < 4; ++which) {
        auto other = o;
        if (which == 0) other.ratio_percent = 0.3;
        if (which == 1) other.mode = mode == threshold_mode::exact ? threshold_mode::sampled : threshold_mode::exact;
        if (which == 2) other.seed = 6;
        if (which == 3) other.dgc_momentum = !dgc;
        sparsifier_with_memory<> c(n, other);
        CHECK_THROWS_AS(c.restore_state(state2), state_error);
      }
      for (int t = 0; t < 3; ++t) {
        const auto g = src.next(n);
        a.encode(g, pa);
        b.encode(g, pb);
        CHECK(same_payload(pa, pb));
      }
      CHECK(bit_equal(a.residual(), b.residual()));
      CHECK(bit_equal(a.velocity(), b.velocity()));
    }
  }
}

TEST_CASE("restore_state rejects bad states and changes nothing") {
  const std::size_t n = 1000;
  sparsifier_with_memory<> a(n);
  gradient_source src(11);
  sparse_coo_payload p;
  a.encode(src.next(n), p);
  const auto state = a.save_state();
  sparsifier_with_memory<> b(n);
  b.encode(src.next(n), p);
  const std::vector<float> before(b.residual().begin(), b.residual().end());

  sparsifier_with_memory<> other(n + 1);
  CHECK_THROWS_AS(other.restore_state(state), size_mismatch_error);
  sa_momentum<> sam(n);
  CHECK_THROWS_AS(b.restore_state(sam.save_state()), state_error);
  auto truncated = state;
  truncated.resize(truncated.size() - 4);
  CHECK_THROWS_AS(b.restore_state(truncated), wire::wire_error);
  auto flipped = state;
  flipped[wire::header_size + 40] ^= std::byte{1};
  CHECK_THROWS_AS(b.restore_state(flipped), wire::wire_error);
  CHECK_THROWS_AS(b.restore_state(wire::serialize(p)), wire::wire_error);
  // A state claiming R = 0, and one holding a NaN residual (valid checksums).
  auto rebuild = [&](auto edit) {
    std::vector<std::byte> body(state.begin() + wire::header_size, state.end());
    edit(body);
    std::vector<std::byte> out;
    wire::detail::serialize_message(out, wire::codec_id::sparse_coo, wire::flag_codec_state, n, body.size(),
                                    [&](wire::writer& w) { w.put_bytes(body); });
    return out;
  };
  const auto zero_ratio = rebuild([](std::vector<std::byte>& body) {
    const double zero = 0.0;
    std::memcpy(body.data() + 4, &zero, 8);
  });
  CHECK_THROWS_AS(b.restore_state(zero_ratio), wire::wire_error);
  const auto nan_residual = rebuild([](std::vector<std::byte>& body) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(body.data() + 36, &nan, 4);
  });
  CHECK_THROWS_AS(b.restore_state(nan_residual), wire::wire_error);
  CHECK(bit_equal(before, b.residual()));
  CHECK(b.steps() == 1);
}

TEST_CASE("bad parameters and inputs") {
  auto with_ratio = [](double r) {
    sparsifier_options o;
    o.ratio_percent = r;
    return o;
  };
  CHECK_THROWS_AS(sparsifier_with_memory<>(10, with_ratio(0.0)), invalid_argument_error);
  CHECK_THROWS_AS(sparsifier_with_memory<>(10, with_ratio(-1.0)), invalid_argument_error);
  CHECK_THROWS_AS(sparsifier_with_memory<>(10, with_ratio(100.5)), invalid_argument_error);
  CHECK_THROWS_AS(sparsifier_with_memory<>(10, with_ratio(std::nan(""))), invalid_argument_error);
  CHECK_NOTHROW(sparsifier_with_memory<>(10, with_ratio(100.0)));
  sparsifier_options o;
  o.scale = 0.0f;
  CHECK_THROWS_AS(sparsifier_with_memory<>(10, o), invalid_argument_error);
  o.scale = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(sparsifier_with_memory<>(10, o), invalid_argument_error);
  o = {};
  o.dgc_momentum = true;
  for (float m : {0.0f, 1.0f, -0.5f, 1.5f, std::nanf("")}) {
    o.momentum = m;
    CHECK_THROWS_AS(sparsifier_with_memory<>(10, o), invalid_argument_error);
  }
  o = {};
  o.mode = static_cast<threshold_mode>(7);
  CHECK_THROWS_AS(sparsifier_with_memory<>(10, o), invalid_argument_error);
  CHECK_THROWS_AS(sparsifier_with_memory<>(std::size_t{1} << 33), invalid_argument_error);

  sparsifier_with_memory<execution::simd> codec(100);
  sparse_coo_payload p;
  std::vector<float> g(99, 1.0f);
  CHECK_THROWS_AS(codec.encode(g, p), size_mismatch_error);
  CHECK_THROWS_AS(codec.set_scale(-1.0f), invalid_argument_error);
  // Non-finite gradients are rejected before the residual changes.
  g.assign(100, 0.5f);
  codec.encode(g, p);
  const std::vector<float> before(codec.residual().begin(), codec.residual().end());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    g[63] = bad;
    CHECK(gradcomp::test_support::non_finite_index_of([&] { codec.encode(g, p); }) == 63);
  }
  CHECK(bit_equal(before, codec.residual()));
  CHECK(codec.steps() == 1);
}

TEST_CASE("a zero-length layer encodes to an empty payload") {
  sparsifier_with_memory<> codec(0);
  sparse_coo_payload p;
  codec.encode({}, p);
  CHECK(p.nnz() == 0);
  CHECK(p.length == 0);
  CHECK(wire::parse<sparse_coo_payload>(wire::serialize(p)).length == 0);
}

TEST_CASE("restore_state with other options throws option_mismatch_error naming the option, and changes nothing") {
  const std::size_t n = 500;
  sparsifier_options o;
  o.ratio_percent = 2.0;
  o.seed = 3;
  o.dgc_momentum = true;
  o.momentum = 0.8f;
  sparsifier_with_memory<> a(n, o);
  gradient_source src(12);
  sparse_coo_payload p;
  a.encode(src.next(n), p);
  const auto state = a.save_state();
  const std::vector<std::pair<const char*, sparsifier_options>> cases = {
      {"ratio_percent", [&] { auto x = o; x.ratio_percent = 3.0; return x; }()},
      {"mode", [&] { auto x = o; x.mode = threshold_mode::sampled; return x; }()},
      {"seed", [&] { auto x = o; x.seed = 4; return x; }()},
      {"dgc_momentum", [&] { auto x = o; x.dgc_momentum = false; return x; }()},
      {"momentum", [&] { auto x = o; x.momentum = 0.5f; return x; }()},
  };
  for (const auto& [name, other] : cases) {
    CAPTURE(name);
    sparsifier_with_memory<> b(n, other);
    b.encode(src.next(n), p);
    const std::vector<float> before(b.residual().begin(), b.residual().end());
    test_support::check_restore_names_option(b, state, name);
    CHECK(bit_equal(b.residual(), before));
    CHECK(b.steps() == 1);
  }
  // eta is a schedule value, not an option that must agree.
  auto scaled = o;
  scaled.scale = 0.25f;
  sparsifier_with_memory<> c(n, scaled);
  CHECK_NOTHROW(c.restore_state(state));
}
