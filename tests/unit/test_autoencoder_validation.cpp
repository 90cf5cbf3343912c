// Tests of the LGC validation policy and hygiene (issue 19): decode never
// yields Inf/NaN (codes near the float limit are a typed error, the output is
// left unchanged), the caller-supplied decode workspace gives the same bits
// as a fresh one, and the protocol forms take their tags from the registry
// (tags.hpp) and refuse a tag_base that collides with another piece.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include <gradcomp/autoencoder.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/detail/random.hpp>
#include <gradcomp/protocols/lgc.hpp>
#include <gradcomp/tags.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <support/error_checks.hpp>
#include <support/lgc_fixtures.hpp>

using namespace gradcomp;

namespace {

using test_support::small_arch;  // window 32 -> 16 code floats

static_assert(Codec<autoencoder_codec<execution::seq>>);
static_assert(!LinearCodec<autoencoder_codec<execution::seq>>);

std::vector<float> smooth(std::size_t n, double phase = 0.0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(0.01 * std::sin(0.3 * double(i) + phase) + 0.002 * std::cos(1.7 * double(i)));
  return v;
}

bool all_finite(std::span<const float> v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

const std::vector<std::size_t> model = {50, 6000, 4000, 300};  // alpha 1%: mu = 100

lgc_options small_options(std::uint64_t full, std::uint64_t train) {
  lgc_options o;
  o.alpha_percent = 1.0;
  o.window = 32;
  o.architecture = small_arch();
  o.schedule = {full, train};
  o.momentum = 0.9f;
  o.seed = 5;
  return o;
}

std::vector<std::vector<float>> gradient(int rank, std::uint64_t step) {
  return test_support::ranked_gradient(rank, step, model);
}

}  // namespace

TEST_CASE("lgc validation: codes near the float limit are a typed error, never Inf or NaN") {
  auto net = std::make_shared<const lgc_network>(lgc_form::ring, 1, 32, small_arch(), 3);
  autoencoder_codec<> codec(net, 70);
  const auto v = smooth(70);
  lgc_code_payload p;
  codec.encode(v, p);
  std::vector<float> good(70);
  codec.decode(p, good);
  CHECK(all_finite(good));

  // Every code at 3e38 (finite, so the wire accepts it) ...
  lgc_code_payload huge = p;
  for (std::size_t i = 0; i < huge.codes.size(); ++i) huge.codes[i] = (i % 3 == 0 ? -3e38f : 3e38f);
  const auto parsed = wire::parse<lgc_code_payload>(wire::serialize(huge));
  CHECK(parsed.codes == huge.codes);
  // ... makes the decoder network itself overflow: without the check, decode returned Inf/NaN.
  {
    nn1d::tensor<float> code, y;
    code.length = nn1d::index_type(net->code_positions());
    code.data = Eigen::Map<const nn1d::matrix<float>>(huge.codes.data(), nn1d::index_type(small_arch().code_channels),
                                                      nn1d::index_type(huge.codes.size() / small_arch().code_channels));
    lgc_network::workspace nws;
    net->decode(0, code, nullptr, y, nws);
    CHECK_FALSE(all_finite(std::span<const float>(y.data.data(), std::size_t(y.data.size()))));
  }
  std::vector<float> out(70, 7.0f);
  CHECK_THROWS_AS(codec.decode(parsed, out), non_finite_error);
  for (float x : out) CHECK(x == 7.0f);  // the output is untouched
  autoencoder_codec<>::workspace ws;
  CHECK_THROWS_AS(codec.decode(parsed, out, ws), non_finite_error);
  CHECK_THROWS_AS(codec.decode(std::span<const float>(parsed.codes), p.scales, out, ws), non_finite_error);
  for (float x : out) CHECK(x == 7.0f);
  // The codec is unchanged: the original payload still decodes to the same bits.
  std::vector<float> again(70);
  codec.decode(p, again, ws);
  CHECK(again == good);

  // Non-finite codes that did not come through the parser.
  std::vector<float> codes(p.codes);
  codes[17] = std::numeric_limits<float>::quiet_NaN();
  CHECK(test_support::non_finite_index_of([&] { codec.decode(std::span<const float>(codes), p.scales, out); }) == 17);
  codes[17] = p.codes[17];
  codes[40] = -std::numeric_limits<float>::infinity();
  CHECK(test_support::non_finite_index_of([&] { codec.decode(std::span<const float>(codes), p.scales, out, ws); }) == 40);
  lgc_code_payload in_memory = p;
  in_memory.codes[5] = std::numeric_limits<float>::infinity();
  CHECK(test_support::non_finite_index_of([&] { codec.decode(in_memory, out); }) == 5);
  for (float x : out) CHECK(x == 7.0f);

  // The parameter-server decoder: a non-finite innovation is refused too.
  auto ps_net = std::make_shared<const lgc_network>(lgc_form::parameter_server, 2, 32, small_arch(), 3);
  autoencoder_codec<> ps(ps_net, 70);
  lgc_code_payload q;
  ps.encode(v, q);
  std::vector<float> h(70, 0.0f);
  h[3] = std::numeric_limits<float>::infinity();
  CHECK(test_support::non_finite_index_of([&] { ps.decode(q, 1, h, out); }) == 3);
  lgc_code_payload ps_huge = q;
  for (std::size_t i = 0; i < ps_huge.codes.size(); ++i) ps_huge.codes[i] = (i % 3 == 0 ? -3e38f : 3e38f);
  h[3] = 0.0f;
  CHECK_THROWS_AS(ps.decode(ps_huge, 1, h, out), non_finite_error);
  for (float x : out) CHECK(x == 7.0f);
}

TEST_CASE("lgc validation: a caller's decode workspace gives the same bits as a fresh one") {
  auto net = std::make_shared<const lgc_network>(lgc_form::ring, 1, 32, small_arch(), 11);
  autoencoder_codec<> codec(net, 100);
  lgc_code_payload p1, p2;
  codec.encode(smooth(100, 0.0), p1);
  codec.encode(smooth(100, 1.0), p2);
  std::vector<float> fresh1(100), fresh2(100), warm(100);
  codec.decode(p1, fresh1);
  codec.decode(p2, fresh2);
  autoencoder_codec<>::workspace ws;
  for (int round = 0; round < 3; ++round) {
    codec.decode(p1, warm, ws);
    CHECK(warm == fresh1);
    codec.decode(p2, warm, ws);
    CHECK(warm == fresh2);
    codec.decode(std::span<const float>(p1.codes), p1.scales, warm, ws);
    CHECK(warm == fresh1);
  }
  // Parameter-server decoders with an innovation channel.
  auto ps_net = std::make_shared<const lgc_network>(lgc_form::parameter_server, 3, 32, small_arch(), 11);
  autoencoder_codec<> ps(ps_net, 100);
  lgc_code_payload q;
  ps.encode(smooth(100, 2.0), q);
  auto h = smooth(100, 3.0);
  for (std::size_t i = 0; i < h.size(); i += 2) h[i] = 0.0f;
  for (std::size_t k = 0; k < 3; ++k) {
    std::vector<float> a(100), b(100);
    ps.decode(q, k, h, a);
    ps.decode(q, k, h, b, ws);  // the same workspace, another network shape before
    CHECK(a == b);
  }
  // Concurrent const decodes, each with its own workspace, agree with the sequential one.
  std::vector<std::vector<float>> outs(4, std::vector<float>(100));
  {
    std::vector<std::jthread> threads;
    for (std::size_t t = 0; t < outs.size(); ++t)
      threads.emplace_back([&, t] {
        autoencoder_codec<>::workspace own;
        for (int i = 0; i < 5; ++i) codec.decode(p1, outs[t], own);
      });
  }
  for (const auto& o : outs) CHECK(o == fresh1);
}

TEST_CASE("lgc validation: the forms take their tags from the registry and refuse a colliding tag_base") {
  lgc_options o = small_options(1, 1);
  CHECK(o.tag_base == tags::lgc.first);
  CHECK(lgc_tag_width <= tags::lgc.count);
  o.validate();
  auto collide = [&](int base) {
    lgc_options b = o;
    b.tag_base = base;
    return b;
  };
  // Into the parameter servers', the ring's, the exchange's range; past MPI's bound; negative.
  for (int base : {tags::parameter_server.first, tags::parameter_server.first - 5, tags::ring.first + 1,
                   tags::ring.first - lgc_tag_width + 1, tags::exchange.first, tags::powersgd.first + 100,
                   tags::mpi_tag_upper_bound - 3, -1}) {
    CAPTURE(base);
    const lgc_options b = collide(base);
    CHECK_THROWS_AS(b.validate(), invalid_argument_error);
    CHECK_THROWS_AS(lgc_ring_node<>(0, 2, model, b), invalid_argument_error);
    CHECK_THROWS_AS(lgc_ps_worker<>(0, 2, model, b), invalid_argument_error);
    CHECK_THROWS_AS(lgc_ps_server<>(2, model, b), invalid_argument_error);
  }
  CHECK_THROWS_WITH_AS(collide(tags::parameter_server.first).validate(), doctest::Contains("the parameter servers"),
                       invalid_argument_error);
  // The user's range and the rest of LGC's own range are fine.
  for (int base : {0, 1000, tags::user.end() - lgc_tag_width, tags::lgc.first + 4, tags::lgc.end() - lgc_tag_width})
    CHECK_NOTHROW(collide(base).validate());
}

TEST_CASE("lgc validation: moving the ring form's tags changes no result") {
  // Two ranks, one full, one training and two compressed steps, with the
  // default tags and with tags moved into the user range: same bits.
  auto run = [](int tag_base) {
    lgc_options o = small_options(1, 1);
    o.tag_base = tag_base;
    std::vector<std::vector<float>> result(2);
    transport::run_workers(2, [&](transport::inproc_endpoint& ep) {
      const int r = static_cast<int>(ep.rank());
      lgc_ring_node<> node(r, 2, model, o);
      for (std::uint64_t s = 0; s < 4; ++s) {
        auto g = gradient(r, s);
        std::vector<std::span<float>> layers(g.begin(), g.end());
        node.step(ep, layers);
        for (const auto& l : g) result[std::size_t(r)].insert(result[std::size_t(r)].end(), l.begin(), l.end());
      }
    });
    return result;
  };
  const auto a = run(tags::lgc.first), b = run(1200);
  CHECK(a[0] == b[0]);
  CHECK(a[1] == b[1]);
  CHECK(a[0] == a[1]);  // every node holds the same aggregate
}
