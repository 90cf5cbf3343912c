// execution::thrust<P> (system/thrust/): every codec under thrust_omp and
// thrust_cpp produces the seq codec's payload bytes, decoded output and saved
// state, step after step; the same with 1, 2 and 3 OpenMP threads; the top-k
// kernels select what seq selects (ties, every path of the exact selection);
// the GradiVeQ products agree with seq within float rounding and are
// bit-identical across systems and thread counts; bad input is rejected as
// under seq. Built with every configuration; without gradcomp::thrust the
// one test case left is skipped.
#include <doctest/doctest.h>

#if defined(GRADCOMP_HAS_THRUST)

#include <gradcomp/detail/random.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/samomentum.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/two_bit.hpp>
#include <gradcomp/wire.hpp>

#include <support/equality.hpp>
#include <support/random_vectors.hpp>

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <numbers>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace gradcomp;
namespace ex = gradcomp::execution;

namespace {

static_assert(ExecutionPolicy<ex::thrust_omp> && ExecutionPolicy<ex::thrust_cpp>);
static_assert(std::is_base_of_v<ex::seq, ex::thrust_omp> && std::is_base_of_v<ex::seq, ex::thrust_cpp>);
static_assert(std::is_same_v<ex::thrust_omp::thrust_policy_type, std::remove_cvref_t<decltype(::thrust::omp::par)>>);
static_assert(ex::thrust_system_uses_host_memory<ex::thrust_omp::thrust_policy_type>);
static_assert(ex::thrust_system_uses_host_memory<ex::thrust_cpp::thrust_policy_type>);
static_assert(ex::thrust_available);

using test_support::normal_floats;  // Normal(0, sigma) from stream 0 of the counter RNG

// Many exact ties: multiples of 1/4 in [-2, 2], about a third of them zero.
std::vector<float> tied_floats(std::size_t n, std::uint64_t seed) {
  const auto s = detail::counter_rng(seed).stream(1);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = s.below(i, 24);
    v[i] = b < 8 ? 0.0f : (static_cast<float>(b) - 16.0f) * 0.25f;
  }
  return v;
}

std::vector<std::vector<float>> gradients(std::size_t n, std::size_t steps, std::uint64_t seed, bool ties = false) {
  std::vector<std::vector<float>> g;
  for (std::size_t t = 0; t < steps; ++t) g.push_back(ties ? tied_floats(n, seed + t) : normal_floats(n, seed + t));
  return g;
}

using test_support::bit_equal;

// What a codec produced over a run: per step the serialized payload, decode
// and decode_add (onto the gradient), and the saved state at the end.
struct run_record {
  std::vector<std::vector<std::byte>> payloads;
  std::vector<std::vector<float>> decoded, added;
  std::vector<std::byte> state;
};

template <class Codec>
run_record run_codec(Codec& codec, const std::vector<std::vector<float>>& grads) {
  run_record rec;
  typename Codec::payload_type p;
  for (const auto& g : grads) {
    codec.encode(g, p);
    rec.payloads.push_back(wire::serialize(p));
    std::vector<float> out(g.size(), -1.0f), acc = g;
    codec.decode(p, out);
    codec.decode_add(p, acc);
    rec.decoded.push_back(std::move(out));
    rec.added.push_back(std::move(acc));
  }
  rec.state = codec.save_state();
  return rec;
}

void check_same(const run_record& a, const run_record& b) {
  REQUIRE(a.payloads.size() == b.payloads.size());
  for (std::size_t t = 0; t < a.payloads.size(); ++t) {
    CAPTURE(t);
    CHECK(a.payloads[t] == b.payloads[t]);
    CHECK(bit_equal(a.decoded[t], b.decoded[t]));
    CHECK(bit_equal(a.added[t], b.added[t]));
  }
  CHECK(a.state == b.state);
}

// Runs make<Policy>() over grads for seq, thrust_cpp and thrust_omp (with
// each OpenMP thread count of `threads`; 0 = the default, OMP_NUM_THREADS or
// the core count), and checks every record equals seq's.
template <class Make>
void check_policies_agree(Make make, const std::vector<std::vector<float>>& grads,
                          std::initializer_list<int> threads = {0}) {
  auto seq_codec = make.template operator()<ex::seq>();
  const run_record ref = run_codec(seq_codec, grads);
  {
    auto c = make.template operator()<ex::thrust_cpp>();
    INFO("thrust_cpp");
    check_same(ref, run_codec(c, grads));
  }
  const int saved = omp_get_max_threads();
  for (int t : threads) {
    omp_set_num_threads(t > 0 ? t : saved);
    auto c = make.template operator()<ex::thrust_omp>();
    INFO("thrust_omp, threads = " << omp_get_max_threads());
    check_same(ref, run_codec(c, grads));
  }
  omp_set_num_threads(saved);
}

template <class Codec>
std::string encode_error(Codec& c, std::span<const float> g) {
  typename Codec::payload_type p;
  try {
    c.encode(g, p);
  } catch (const gradcomp::error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("thrust kernels: the counter-based draws equal detail::counter_stream") {
  for (std::uint64_t seed : {0ull, 7ull, 0xDEADBEEFCAFEull}) {
    const auto stream = detail::counter_rng(seed).stream(seed * 3 + 1);
    const ex::thrust_detail::counter_draws draws{stream.key()};
    for (std::uint64_t i : {0ull, 1ull, 15ull, 4096ull, 0xFFFFFFFFull, 0x100000000ull, 0x123456789ABull}) {
      CHECK(draws.bits32(i) == stream.bits32(i));
      CHECK(draws.uniform_float(i) == stream.uniform_float(i));
      for (std::uint64_t bound : {1ull, 7ull, 1000003ull, 0xFFFFFFFFFull})
        CHECK(draws.below(i, bound) == stream.below(i, bound));
    }
  }
}

TEST_CASE("thrust kernels: add_into and find_non_finite equal seq") {
  for (std::size_t n : {0u, 1u, 17u, 4096u, 4097u, 20000u}) {
    CAPTURE(n);
    auto a = normal_floats(n, 1), b = a;
    const auto x = normal_floats(n, 2);
    ex::add_into(ex::seq{}, std::span<float>(a), std::span<const float>(x));
    ex::add_into(ex::thrust_omp{}, std::span<float>(b), std::span<const float>(x));
    CHECK(bit_equal(a, b));
    CHECK(ex::find_non_finite(ex::thrust_omp{}, std::span<const float>(x)) == n);
  }
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (const float v : bad)
    for (std::size_t pos : {0u, 4095u, 4096u, 12345u, 19999u}) {
      auto x = normal_floats(20000, 3);
      x[pos] = v;
      x[19999] = v;  // a later one must not win
      CHECK(ex::find_non_finite(ex::thrust_omp{}, std::span<const float>(x)) == pos);
      CHECK(ex::find_non_finite(ex::thrust_cpp{}, std::span<const float>(x)) == pos);
    }
}

TEST_CASE("thrust two-bit quantizer equals seq: payloads, decodes, residual") {
  for (std::size_t n : {0u, 1u, 15u, 16u, 17u, 1023u, 1025u, 70001u}) {
    CAPTURE(n);
    const auto g = gradients(n, 4, 10 + n);
    check_policies_agree([n]<class P>() { return two_bit_quantizer<P>(n, two_bit_options::fixed(0.7f)); }, g);
    check_policies_agree([n]<class P>() { return two_bit_quantizer<P>(n, two_bit_options::automatic(0.8f)); }, g);
  }
}

TEST_CASE("thrust two-bit prescan equals seq, including the canonical sum") {
  for (std::size_t n : {1u, 1000u, 1024u, 5000u, 70001u}) {
    const auto g = normal_floats(n, 5), r = normal_floats(n, 6, 0.1);
    const auto a = ex::two_bit_prescan(ex::seq{}, std::span<const float>(g), std::span<const float>(r));
    const auto b = ex::two_bit_prescan(ex::thrust_omp{}, std::span<const float>(g), std::span<const float>(r));
    CHECK(a.first_non_finite == b.first_non_finite);
    CHECK(std::bit_cast<std::uint32_t>(a.max_abs_gradient) == std::bit_cast<std::uint32_t>(b.max_abs_gradient));
    CHECK(std::bit_cast<std::uint64_t>(a.sum_abs_accumulated) == std::bit_cast<std::uint64_t>(b.sum_abs_accumulated));
  }
}

TEST_CASE("thrust QSGD equals seq for every width and bucket size") {
  for (unsigned bits : {2u, 4u, 8u})
    for (std::size_t bucket : {1u, 7u, 512u, 100000u})
      for (std::size_t n : {0u, 5u, 257u, 33333u}) {
        CAPTURE(bits);
        CAPTURE(bucket);
        CAPTURE(n);
        const auto g = gradients(n, 3, 100 + n);
        check_policies_agree([&]<class P>() { return qsgd<P>(qsgd_options{bits, 0, bucket, 42}); }, g);
        check_policies_agree(
            [&]<class P>() { return qsgd<P>(qsgd_options{bits, 0, bucket, 42, gradcomp::execution::qsgd_norm::max}); }, g);
      }
}

TEST_CASE("thrust QSGD: tiny and huge buckets take seq's other norm routes") {
  auto g = normal_floats(3000, 9);
  for (std::size_t i = 0; i < 512; ++i) g[i] *= 1e-33f;     // max |x| < 2^-100: norm 0
  for (std::size_t i = 512; i < 1024; ++i) g[i] *= 1e-20f;  // below 2^-40: double route
  for (std::size_t i = 1024; i < 1536; ++i) g[i] *= 1e15f;  // above 2^40: double route
  check_policies_agree(
      []<class P>() {
        return qsgd<P>(qsgd_options{4, 0, 512, 1});
      },
      std::vector<std::vector<float>>{g, g});
}

TEST_CASE("thrust QSGD with the max norm: tiny buckets flush to 0 as seq's") {
  auto g = normal_floats(3000, 10);
  for (std::size_t i = 0; i < 512; ++i) g[i] *= 1e-33f;  // max |x| < 2^-100: scale 0
  check_policies_agree([]<class P>() { return qsgd<P>(qsgd_options{4, 0, 512, 1, gradcomp::execution::qsgd_norm::max}); },
                       std::vector<std::vector<float>>{g, g});
}

TEST_CASE("thrust sparsifier_with_memory equals seq: exact, sampled, DGC, ties") {
  struct config {
    std::size_t n;
    double ratio;
    threshold_mode mode;
    bool dgc;
    bool ties;
  };
  const config configs[] = {
      {1, 50.0, threshold_mode::exact, false, false},       {1000, 1.0, threshold_mode::exact, false, false},
      {9000, 10.0, threshold_mode::exact, false, true},     {100003, 1.0, threshold_mode::exact, false, false},
      {100003, 1.0, threshold_mode::sampled, false, false}, {100003, 0.1, threshold_mode::exact, true, false},
      {100003, 0.5, threshold_mode::sampled, true, false},  {60000, 5.0, threshold_mode::exact, false, true},
      {60000, 5.0, threshold_mode::sampled, false, true},   {20000, 100.0, threshold_mode::exact, false, false},
      {300000, 0.01, threshold_mode::exact, false, true},
  };
  for (const auto& c : configs) {
    CAPTURE(c.n);
    CAPTURE(c.ratio);
    CAPTURE(static_cast<int>(c.mode));
    CAPTURE(c.dgc);
    CAPTURE(c.ties);
    sparsifier_options o;
    o.ratio_percent = c.ratio;
    o.mode = c.mode;
    o.seed = 5;
    o.scale = 0.5f;
    o.dgc_momentum = c.dgc;
    check_policies_agree([&]<class P>() { return sparsifier_with_memory<P>(c.n, o); }, gradients(c.n, 4, 7, c.ties));
  }
}

TEST_CASE("thrust sa_momentum equals seq: velocity rescaling, exact and sampled") {
  for (threshold_mode mode : {threshold_mode::exact, threshold_mode::sampled})
    for (double ratio : {0.1, 1.0, 25.0, 100.0})
      for (bool ties : {false, true}) {
        CAPTURE(static_cast<int>(mode));
        CAPTURE(ratio);
        CAPTURE(ties);
        sa_momentum_options o;
        o.ratio_percent = ratio;
        o.momentum = 0.7f;
        o.learning_rate = 0.1f;
        o.mode = mode;
        o.seed = 11;
        check_policies_agree([&]<class P>() { return sa_momentum<P>(50021, o); }, gradients(50021, 4, 21, ties));
      }
}

TEST_CASE("thrust_omp: every codec gives the same bytes with 1, 2 and 3 OpenMP threads (and equals seq)") {
  const std::size_t n = 150001;  // several work items, compaction chunks and histogram chunks
  const auto g = gradients(n, 3, 31);
  const auto tied = gradients(n, 3, 41, true);
  check_policies_agree([n]<class P>() { return two_bit_quantizer<P>(n, two_bit_options::automatic()); }, g, {1, 2, 3});
  check_policies_agree([]<class P>() { return qsgd<P>(qsgd_options{4, 0, 512, 3}); }, g, {1, 2, 3});
  sparsifier_options so;
  so.ratio_percent = 1.0;
  so.dgc_momentum = true;
  check_policies_agree([&]<class P>() { return sparsifier_with_memory<P>(n, so); }, tied, {1, 2, 3});
  sa_momentum_options mo;
  mo.ratio_percent = 0.5;
  mo.mode = threshold_mode::sampled;
  check_policies_agree([&]<class P>() { return sa_momentum<P>(n, mo); }, g, {1, 2, 3});
  mo.mode = threshold_mode::exact;
  check_policies_agree([&]<class P>() { return sa_momentum<P>(n, mo); }, tied, {1, 2, 3});
}

// Data whose stratified sample sees only large values: the sampled bracket
// holds fewer than k entries, so the exact mode must fall back to the radix
// select on the updated state (the path random data almost never takes).
TEST_CASE("thrust sparsifier: the exact mode's fallback when the sampled bracket misses") {
  const std::size_t n = 200000;
  sparsifier_options o;
  o.ratio_percent = 2.0;  // k = 4000
  o.seed = 3;
  const std::size_t k = sparse_selection_count(n, o.ratio_percent);
  const auto plan = ex::topk_plan_sample(n, k);
  REQUIRE_FALSE(plan.use_exact);
  REQUIRE(plan.rank < k);
  std::vector<float> g = normal_floats(n, 4, 1e-3);
  const auto rng = ex::topk_detail::sample_stream(o.seed, 0);
  for (std::size_t j = 0; j < plan.samples; ++j)
    g[ex::topk_detail::sample_position(n, plan.samples, j, rng)] = 10.0f + static_cast<float>(j % 97);
  // The generic kernel takes the fallback here: fewer than k entries reach t.
  {
    std::vector<float> y(n, 0.0f);
    std::vector<std::uint32_t> keys(plan.samples);
    ex::axpby_sample_keys(ex::seq{}, std::span<const float>(y), std::span<const float>(g), 1.0f, 1.0f, o.seed, 0,
                          std::span<std::uint32_t>(keys));
    std::vector<std::uint32_t> scratch;
    const auto t = ex::topk_select_keys(ex::seq{}, std::span<std::uint32_t>(keys), plan.rank, scratch).key;
    std::size_t above = 0;
    for (const float v : g) above += ex::topk_key(v) >= t;
    REQUIRE(above < k);
  }
  check_policies_agree([&]<class P>() { return sparsifier_with_memory<P>(n, o); }, std::vector<std::vector<float>>{g});
  sa_momentum_options so;
  so.ratio_percent = 2.0;
  so.seed = 3;
  check_policies_agree([&]<class P>() { return sa_momentum<P>(n, so); }, std::vector<std::vector<float>>{g});
}

TEST_CASE("thrust top-k kernels select what seq selects") {
  for (bool ties : {false, true})
    for (std::size_t n : {1u, 100u, 5000u, 140000u}) {
      const auto x = ties ? tied_floats(n, n) : normal_floats(n, n);
      for (std::size_t k : std::vector<std::size_t>{0, 1, 7, n / 100, n / 3, n - 1, n, n + 5}) {
        CAPTURE(ties);
        CAPTURE(n);
        CAPTURE(k);
        ex::topk_workspace ws_seq, ws_thrust;
        std::vector<std::uint32_t> a, b;
        ex::topk_radix(ex::seq{}, std::span<const float>(x), k, a, ws_seq);
        ex::topk_radix(ex::thrust_omp{}, std::span<const float>(x), k, b, ws_thrust);
        CHECK(a == b);
        ex::topk_exact(ex::seq{}, std::span<const float>(x), k, a, ws_seq, 9, 2);
        ex::topk_exact(ex::thrust_omp{}, std::span<const float>(x), k, b, ws_thrust, 9, 2);
        CHECK(a == b);
        const std::size_t ca = ex::topk_sampled(ex::seq{}, std::span<const float>(x), k, 9, 2, a, ws_seq);
        const std::size_t cb = ex::topk_sampled(ex::thrust_cpp{}, std::span<const float>(x), k, 9, 2, b, ws_thrust);
        CHECK(ca == cb);
        CHECK(a == b);
      }
    }
}

TEST_CASE("thrust encoders reject non-finite gradients like seq, state untouched") {
  const std::size_t n = 40000;
  for (std::size_t pos : {0u, 4095u, 20000u, 39999u}) {
    CAPTURE(pos);
    auto g = normal_floats(n, 8);
    g[pos] = std::numeric_limits<float>::quiet_NaN();
    g[n - 1] = std::numeric_limits<float>::infinity();
    const auto warm = normal_floats(n, 9);

    two_bit_quantizer<ex::seq> ts(n, two_bit_options::automatic());
    two_bit_quantizer<ex::thrust_omp> tt(n, two_bit_options::automatic());
    two_bit_payload tp;
    ts.encode(warm, tp);
    tt.encode(warm, tp);
    const auto before = tt.save_state();
    CHECK_THROWS_AS(tt.encode(g, tp), non_finite_error);
    CHECK(encode_error(tt, g) == encode_error(ts, g));
    CHECK(tt.save_state() == before);

    qsgd<ex::seq> qs(qsgd_options{4, 0, 512, 1});
    qsgd<ex::thrust_omp> qt(qsgd_options{4, 0, 512, 1});
    CHECK(encode_error(qt, g) == encode_error(qs, g));
    CHECK(qt.step() == 0);

    sparsifier_with_memory<ex::seq> ss(n);
    sparsifier_with_memory<ex::thrust_omp> st(n);
    CHECK(encode_error(st, g) == encode_error(ss, g));
    CHECK(st.steps() == 0);

    sa_momentum<ex::seq> ms(n);
    sa_momentum<ex::thrust_omp> mt(n);
    CHECK(encode_error(mt, g) == encode_error(ms, g));
    CHECK(mt.steps() == 0);
  }
  // A bucket whose norm overflows float: the same bucket is named.
  auto big = normal_floats(4096, 10);
  for (std::size_t i = 1536; i < 1600; ++i) big[i] = 3.0e38f;
  qsgd<ex::seq> qs(qsgd_options{8, 0, 512, 1});
  qsgd<ex::thrust_omp> qt(qsgd_options{8, 0, 512, 1});
  const std::string msg = encode_error(qt, big);
  CHECK(msg.find("bucket 3") != std::string::npos);
  CHECK(msg == encode_error(qs, big));
}

namespace {

// Low-rank gradients plus noise, so the PCA basis has a few strong directions.
std::vector<float> structured_gradient(std::size_t m, std::size_t k, std::uint64_t seed) {
  const auto basis = normal_floats(4 * k, 1234);
  const auto mix = normal_floats(4 * (m / k + 1), seed);
  auto noise = normal_floats(m, seed + 1, 0.01);
  for (std::size_t i = 0; i < m; ++i) {
    const std::size_t slice = i / k, c = i % k;
    float v = 0.5f;
    for (std::size_t r = 0; r < 4; ++r) v += mix[4 * slice + r] * basis[r * k + c];
    noise[i] += v;
  }
  return noise;
}

float max_abs(std::span<const float> v) {
  float m = 0.0f;
  for (const float x : v) m = std::max(m, std::fabs(x));
  return m;
}
float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float m = 0.0f;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

template <class P>
linear_compressor<P> fitted_compressor(std::size_t m, const gradiveq_options& o) {
  linear_compressor<P> c(m, o);
  for (std::uint64_t s = 0; s < 6; ++s) c.add_sample(structured_gradient(m, o.slice_size, 500 + s));
  c.fit();
  return c;
}

}  // namespace

TEST_CASE("thrust GradiVeQ: products within rounding of seq, bit-identical across systems and threads") {
  const std::size_t m = 64 * 700 + 13;  // a tail of 13 elements
  gradiveq_options o;
  o.slice_size = 64;
  o.summands = 3;
  auto cs = fitted_compressor<ex::seq>(m, o);
  auto cc = fitted_compressor<ex::thrust_cpp>(m, o);
  auto co = fitted_compressor<ex::thrust_omp>(m, o);
  REQUIRE(cs.dimension() > 0);
  CHECK(cs.fingerprint() == co.fingerprint());
  CHECK(cs.fingerprint() == cc.fingerprint());
  for (std::uint64_t step = 0; step < 3; ++step) {
    CAPTURE(step);
    const auto g = structured_gradient(m, o.slice_size, 900 + step);
    gradiveq_payload ps, pc, po1, po2;
    cs.encode(g, ps);
    cc.encode(g, pc);
    omp_set_num_threads(1);
    co.encode(g, po1);
    omp_set_num_threads(2);
    co.encode(g, po2);
    CHECK(wire::serialize(pc) == wire::serialize(po1));
    CHECK(wire::serialize(po1) == wire::serialize(po2));
    REQUIRE(ps.coefficients.size() == po1.coefficients.size());
    CHECK(bit_equal(ps.tail, po1.tail));
    CHECK(ps.fingerprint == po1.fingerprint);
    CHECK(max_abs_diff(ps.coefficients, po1.coefficients) <= 1e-5f * max_abs(ps.coefficients));
    // Decode (and decode_add) the seq payload under both policies.
    std::vector<float> ds(m), dO1(m), dO2(m), dc(m);
    cs.decode(ps, ds);
    cc.decode(ps, dc);
    omp_set_num_threads(1);
    co.decode(ps, dO1);
    omp_set_num_threads(2);
    co.decode(ps, dO2);
    CHECK(bit_equal(dc, dO1));
    CHECK(bit_equal(dO1, dO2));
    CHECK(max_abs_diff(ds, dO1) <= 1e-5f * max_abs(ds));
    std::vector<float> as = g, ao = g;
    cs.decode_add(ps, as);
    co.decode_add(ps, ao);
    CHECK(max_abs_diff(as, ao) <= 1e-5f * max_abs(as));
    // Compressed-domain sum (add_into): element-wise, so bit-identical.
    gradiveq_payload sum_s = ps, sum_o = ps;
    cs.accumulate(sum_s, ps);
    co.accumulate(sum_o, ps);
    CHECK(wire::serialize(sum_s) == wire::serialize(sum_o));
  }
  // Non-finite input is rejected with the same index.
  auto bad = structured_gradient(m, o.slice_size, 77);
  bad[64 * 300 + 5] = std::numeric_limits<float>::infinity();
  CHECK(encode_error(co, bad) == encode_error(cs, bad));
  bad[m - 2] = std::numeric_limits<float>::quiet_NaN();  // in the tail: found first
  CHECK(encode_error(co, bad) == encode_error(cs, bad));
}

TEST_CASE("thrust GradiVeQ kernels: d = 0, accumulate into out, odd sizes") {
  for (std::size_t k : {1u, 7u, 8u, 33u, 300u})
    for (std::size_t d : {0u, 1u, 3u, 5u}) {
      CAPTURE(k);
      CAPTURE(d);
      const std::size_t slices = 37;
      const auto x = normal_floats(slices * k, 1), u = normal_floats(k * d, 2), off = normal_floats(d, 3);
      const auto mu = normal_floats(k, 4);
      std::vector<float> ys(slices * d, 9.0f), yo(slices * d, 9.0f);
      ex::gradiveq_compress_slices(ex::seq{}, x.data(), slices, k, u.data(), d, off.data(), ys.data());
      ex::gradiveq_compress_slices(ex::thrust_omp{}, x.data(), slices, k, u.data(), d, off.data(), yo.data());
      const float scale_y = std::max(1.0f, max_abs(ys)) * static_cast<float>(k);
      CHECK(max_abs_diff(ys, yo) <= 1e-6f * scale_y);
      for (bool add : {false, true}) {
        std::vector<float> os = normal_floats(slices * k, 5), oo = os;
        ex::gradiveq_expand_slices(ex::seq{}, ys.data(), slices, d, u.data(), k, mu.data(), 0.5f, add, os.data());
        ex::gradiveq_expand_slices(ex::thrust_omp{}, ys.data(), slices, d, u.data(), k, mu.data(), 0.5f, add,
                                   oo.data());
        const float scale_o = std::max(1.0f, max_abs(os)) * static_cast<float>(d + 2);
        CHECK(max_abs_diff(os, oo) <= 1e-6f * scale_o);
      }
    }
}

TEST_CASE("thrust GradiVeQ kernels: a narrow basis (binary16, int8 with column scales) gives seq's float bits") {
  // The host systems run the generic row kernels on their items, reading the
  // narrow copy where the build widens it: the same bits as seq on the float
  // copy of the same values, whatever the item split.
  const std::size_t k = 264, d = 13, slices = 37;
  const auto x = normal_floats(slices * k, 1), off = normal_floats(d, 3), mu = normal_floats(k, 4);
  std::vector<float> u16 = normal_floats(k * d, 2), u8 = u16;
  std::vector<std::uint16_t> half(u16.size());
  ex::floats_to_half_portable(u16, half);
  ex::half_to_floats_portable(half, u16);
  std::vector<std::int8_t> q;
  std::vector<float> q_scale;
  gradcomp::detail::round_basis_to_int8(u8, k, q, q_scale);
  const std::pair<const std::vector<float>*, ex::gradiveq_narrow_basis> cases[] = {
      {&u16, ex::gradiveq_narrow_basis(half.data())}, {&u8, ex::gradiveq_narrow_basis(q.data(), q_scale.data())}};
  for (const auto& [u, narrow] : cases) {
    std::vector<float> ys(slices * d), yo(slices * d);
    ex::gradiveq_compress_slices(ex::seq{}, x.data(), slices, k, u->data(), d, off.data(), ys.data());
    ex::gradiveq_compress_slices(ex::thrust_omp{}, x.data(), slices, k, u->data(), d, off.data(), yo.data(), narrow);
    CHECK(ys == yo);
    for (bool add : {false, true}) {
      std::vector<float> os = normal_floats(slices * k, 5), oo = os;
      ex::gradiveq_expand_slices(ex::seq{}, ys.data(), slices, d, u->data(), k, mu.data(), 0.5f, add, os.data());
      ex::gradiveq_expand_slices(ex::thrust_omp{}, ys.data(), slices, d, u->data(), k, mu.data(), 0.5f, add,
                                 oo.data(), narrow);
      CHECK(os == oo);
    }
  }
}

#else  // !GRADCOMP_HAS_THRUST

TEST_CASE("thrust backend (skipped: gradcomp::thrust is not configured; build with -DGRADCOMP_WITH_THRUST=ON)" *
          doctest::skip()) {
  // Never runs: the Thrust kernels are not compiled in this configuration.
}

#endif
