// dgs_server.hpp and the transport-free parts of parameter_server.hpp:
// layer partitions, model updates, the DGS server state (eqs. 1-6), secondary
// compression, the synchronous aggregation, the worker uplink, the named
// update rules and the deterministic simulation (eq. 5 bit for bit against
// plain ASGD, SAMomentum at R = 100% against momentum SGD).
#include <doctest/doctest.h>

#include <gradcomp/dgs_server.hpp>
#include <gradcomp/parameter_server.hpp>
#include <gradcomp/presets/parameter_server_rules.hpp>

#include <support/error_checks.hpp>
#include <support/equality.hpp>
#include <support/ps_fixtures.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

using namespace gradcomp;

namespace {

using test_support::bit_equal;
using test_support::dyadic_gradient;
using test_support::make_theta0;
using test_support::noise;  // uniform in [-1, 1) from (a, b, c)
using test_support::schedule_of;
using test_support::toy_gradient;

const layer_partition three_layers({37, 200, 5});

}  // namespace

TEST_CASE("layer_partition: offsets, slicing and bad sizes") {
  layer_partition p({3, 5, 2});
  CHECK(p.layers() == 3);
  CHECK(p.total() == 10);
  CHECK(p.offset(0) == 0);
  CHECK(p.offset(1) == 3);
  CHECK(p.offset(2) == 8);
  std::vector<float> v(10);
  std::iota(v.begin(), v.end(), 0.0f);
  auto l1 = p.layer(std::span<float>(v), 1);
  CHECK(l1.size() == 5);
  CHECK(l1[0] == 3.0f);
  CHECK(layer_partition::single(7).total() == 7);
  CHECK_THROWS_AS(layer_partition(std::vector<std::size_t>{}), invalid_argument_error);
  CHECK_THROWS_AS(layer_partition({3, 0}), invalid_argument_error);
  CHECK_THROWS_AS(layer_partition({std::size_t{1} << 32}), invalid_argument_error);
  CHECK_THROWS_AS(p.check("x", 9), size_mismatch_error);
  CHECK(layer_partition({3, 5, 2}) == p);
}

TEST_CASE("apply_model_update: assigns, and checks everything before writing") {
  layer_partition p({4, 3});
  std::vector<float> model = {1, 2, 3, 4, 5, 6, 7};
  model_update u;
  u.layers.resize(2);
  u.layers[0].indices = {1, 3};
  u.layers[0].values = {-2, -4};
  u.layers[1].dense = true;
  u.layers[1].values = {50, 60, 70};
  apply_model_update(p, u, std::span<float>(model));
  CHECK(model == std::vector<float>{1, -2, 3, -4, 50, 60, 70});

  const auto before = model;
  auto bad = u;
  bad.layers[0].indices = {1, 4};  // 4 is outside the 4-element layer
  CHECK_THROWS_AS(apply_model_update(p, bad, std::span<float>(model)), invalid_argument_error);
  bad = u;
  bad.layers[0].indices = {3, 1};
  CHECK_THROWS_AS(apply_model_update(p, bad, std::span<float>(model)), invalid_argument_error);
  bad = u;
  bad.layers[0].values = {1};
  CHECK_THROWS_AS(apply_model_update(p, bad, std::span<float>(model)), size_mismatch_error);
  bad = u;
  bad.layers[1].values = {1, 2};
  CHECK_THROWS_AS(apply_model_update(p, bad, std::span<float>(model)), size_mismatch_error);
  bad = u;
  bad.layers[1].indices = {0};
  CHECK_THROWS_AS(apply_model_update(p, bad, std::span<float>(model)), invalid_argument_error);
  bad = u;
  bad.layers.pop_back();
  CHECK_THROWS_AS(apply_model_update(p, bad, std::span<float>(model)), size_mismatch_error);
  std::vector<float> short_model(6);
  CHECK_THROWS_AS(apply_model_update(p, u, std::span<float>(short_model)), size_mismatch_error);
  // A bad layer 1 must not leave layer 0 written.
  bad = u;
  bad.layers[0].values = {100, 200};
  bad.layers[1].values = {1};
  CHECK_THROWS(apply_model_update(p, bad, std::span<float>(model)));
  CHECK(model == before);
}

TEST_CASE("dgs_server_state: construction errors") {
  auto theta0 = make_theta0(three_layers.total(), 1);
  CHECK_THROWS_AS(dgs_server_state<>(three_layers, std::span<const float>(theta0).first(10), 2), size_mismatch_error);
  CHECK_THROWS_AS(dgs_server_state<>(three_layers, theta0, 0), invalid_argument_error);
  CHECK_THROWS_AS(dgs_server_state<>(three_layers, theta0, 2, {.secondary_ratio = 101}), invalid_argument_error);
  CHECK_THROWS_AS(dgs_server_state<>(three_layers, theta0, 2, {.secondary_ratio = -1}), invalid_argument_error);
  CHECK_THROWS_AS(dgs_server_state<>(three_layers, theta0, 2, {.secondary_ratio = std::nan("")}),
                  invalid_argument_error);
  CHECK_THROWS_AS(dgs_server_state<>(three_layers, theta0, 2, {.downlink = ps_downlink::dense, .secondary_ratio = 1}),
                  invalid_argument_error);
  CHECK_THROWS_AS(dgs_server_state<>(three_layers, theta0, 2, {.downlink = static_cast<ps_downlink>(9)}),
                  invalid_argument_error);
  theta0[3] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(dgs_server_state<>(three_layers, theta0, 2), non_finite_error);
}

TEST_CASE("dgs_server_state: eq. 5 - without sparsification every pull yields the server's model, and the run is plain ASGD bit for bit") {
  const int N = 4;
  const float lr = 0.05f;
  auto theta0 = make_theta0(three_layers.total(), 2);
  dgs_server_state<> s(three_layers, theta0, N);
  std::vector<std::vector<float>> models(N, theta0);

  // Plain ASGD: the server holds theta, applies theta -= lr * grad, returns theta.
  std::vector<float> ref_theta = theta0;
  std::vector<std::vector<float>> ref_models(N, theta0);

  for (int step = 0; int k : schedule_of(N, 200, 3)) {
    auto g = toy_gradient(models[std::size_t(k)], k, step);
    std::vector<float> scaled(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) scaled[i] = lr * g[i];
    auto u = s.push(k, scaled);  // eq. 1, then eqs. 3-4
    apply_model_update(three_layers, u, std::span<float>(models[std::size_t(k)]));
    REQUIRE(bit_equal(models[std::size_t(k)], s.model()));    // eq. 5
    REQUIRE(bit_equal(s.replica(k), s.model()));              // eq. 4: v_k = M
    REQUIRE(s.pending(k) == 0);

    auto rg = toy_gradient(ref_models[std::size_t(k)], k, step);
    for (std::size_t i = 0; i < rg.size(); ++i) {
      const volatile float d = lr * rg[i];  // rounded product: no fused multiply-subtract (GCC contracts by default)
      ref_theta[i] -= d;
    }
    ref_models[std::size_t(k)] = ref_theta;
    REQUIRE(bit_equal(ref_theta, s.model()));
    ++step;
  }
  CHECK(s.timestamp() == 200);
  for (int k = 0; k < N; ++k) CHECK(bit_equal(models[std::size_t(k)], ref_models[std::size_t(k)]));
}

TEST_CASE("dgs_server_state: the update holds exactly the entries that changed since the worker's last pull") {
  layer_partition p({6});
  std::vector<float> theta0(6, 1.0f);
  dgs_server_state<> s(p, theta0, 2);
  std::vector<float> g(6, 0.0f);
  g[2] = 0.5f;
  auto u0 = s.push(0, g);
  CHECK(u0.layers[0].indices == std::vector<std::uint32_t>{2});
  CHECK(u0.layers[0].values == std::vector<float>{0.5f});
  g.assign(6, 0.0f);
  g[4] = 0.25f;
  auto u1 = s.push(1, g);  // worker 1 missed worker 0's change at 2 as well
  CHECK(u1.layers[0].indices == std::vector<std::uint32_t>{2, 4});
  CHECK(u1.layers[0].values == std::vector<float>{0.5f, 0.75f});
  CHECK(u1.timestamp == 2);
  // A zero push changes nothing and sends worker 0 only index 4.
  g.assign(6, 0.0f);
  auto u2 = s.push(0, g);
  CHECK(u2.layers[0].indices == std::vector<std::uint32_t>{4});
  // Sign flips of zero count as a change (bitwise): the worker must hold theta exactly.
  std::vector<float> z(6, 0.0f);
  dgs_server_state<> s0(p, z, 1);
  std::vector<float> g0(6, 0.0f);
  g0[1] = 0.0f;  // 0 - 0 = +0: no change
  CHECK(s0.push(0, g0).entries() == 0);
}

TEST_CASE("dgs_server_state: secondary compression delays but never loses (eqs. 6a, 6b)") {
  const int N = 3;
  const double R = 5.0;
  auto theta0 = make_theta0(three_layers.total(), 5);
  for (auto& v : theta0) v = std::round(v * 64.0f) / 64.0f + 0.0f;  // dyadic (and no -0): all sums below are exact
  dgs_server_state<> s(three_layers, theta0, N, {.secondary_ratio = R});
  std::vector<std::vector<float>> models(N, theta0);
  // What each worker has been sent, summed as differences in double; with
  // dyadic data every float operation here is exact, so the check is exact.
  std::vector<std::vector<double>> received(N, std::vector<double>(theta0.size(), 0.0));
  std::vector<double> M(theta0.size(), 0.0);

  for (int step = 0; int k : schedule_of(N, 120, 11)) {
    const auto ku = std::size_t(k);
    auto g = dyadic_gradient(theta0.size(), k, step++);
    for (std::size_t i = 0; i < g.size(); ++i) M[i] -= g[i];  // eq. 1
    const auto before = std::vector<float>(s.replica(k).begin(), s.replica(k).end());
    auto u = s.push(k, g);
    // Per layer: at most k_j = ceil(R% n_j) entries, and they are the largest |G|.
    for (std::size_t j = 0; j < three_layers.layers(); ++j) {
      const auto& l = u.layers[j];
      const std::size_t n = three_layers.size(j);
      const std::size_t kj = sparse_selection_count(n, R);
      REQUIRE(l.indices.size() <= kj);
      auto th = three_layers.layer(s.model(), j);
      auto w0 = three_layers.layer(std::span<const float>(before), j);
      std::vector<float> G(n);
      for (std::size_t i = 0; i < n; ++i) G[i] = th[i] - w0[i];
      std::vector<std::uint32_t> order(n);
      std::iota(order.begin(), order.end(), 0u);
      std::stable_sort(order.begin(), order.end(),
                       [&](auto a, auto b) { return std::fabs(G[a]) > std::fabs(G[b]); });
      std::vector<std::uint32_t> expect;
      for (std::size_t q = 0; q < kj; ++q)
        if (G[order[q]] != 0.0f) expect.push_back(order[q]);
      std::sort(expect.begin(), expect.end());
      REQUIRE(l.indices == expect);
      for (std::size_t q = 0; q < l.indices.size(); ++q) {
        const auto i = l.indices[q];
        REQUIRE(l.values[q] == th[i]);  // the server's value
        received[ku][three_layers.offset(j) + i] += double(th[i]) - double(w0[i]);
      }
    }
    apply_model_update(three_layers, u, std::span<float>(models[ku]));
    REQUIRE(bit_equal(models[ku], s.replica(k)));  // the server tracks the worker exactly
    // v_k + (what was not sent) == M, for every worker, at all times.
    for (int q = 0; q < N; ++q) {
      auto w = s.replica(q);
      for (std::size_t i = 0; i < M.size(); ++i) {
        const double v = double(w[i]) - double(theta0[i]);
        REQUIRE(v == received[std::size_t(q)][i]);
        const double not_sent = double(s.model()[i]) - double(w[i]);
        REQUIRE(v + not_sent == M[i]);
        REQUIRE(double(s.model()[i]) - double(theta0[i]) == M[i]);  // eq. 2
      }
    }
  }
  // Nothing is lost: with zero pushes, every worker reaches theta within
  // ceil(n_j / k_j) pulls per layer.
  std::size_t rounds = 0;
  for (std::size_t j = 0; j < three_layers.layers(); ++j) {
    const std::size_t n = three_layers.size(j);
    rounds = std::max(rounds, (n + sparse_selection_count(n, R) - 1) / sparse_selection_count(n, R));
  }
  std::vector<float> zero(theta0.size(), 0.0f);
  for (int k = 0; k < N; ++k) {
    for (std::size_t r = 0; r < rounds; ++r)
      apply_model_update(three_layers, s.push(k, zero), std::span<float>(models[std::size_t(k)]));
    CHECK(s.pending(k) == 0);
    CHECK(bit_equal(models[std::size_t(k)], s.model()));
  }
}

TEST_CASE("dgs_server_state: memory accounting is N x the model (Sec. 5.6.2); dense downlink keeps no copies") {
  auto theta0 = make_theta0(1000, 6);
  dgs_server_state<> s(layer_partition::single(1000), theta0, 7);
  auto m = s.memory();
  CHECK(m.model_bytes == 4000);
  CHECK(m.replica_bytes == 7 * 4000);
  CHECK(m.extra_bytes() == 7 * 4000);
  CHECK(m.total_bytes() >= m.model_bytes + m.replica_bytes);
  dgs_server_state<> d(layer_partition::single(1000), theta0, 7, {.downlink = ps_downlink::dense});
  CHECK(d.memory().replica_bytes == 0);
  CHECK_THROWS_AS(d.replica(0), state_error);
  auto u = d.update_for(3);
  REQUIRE(u.layers.size() == 1);
  CHECK(u.layers[0].dense);
  CHECK(bit_equal(u.layers[0].values, theta0));
}

TEST_CASE("dgs_server_state: a bad push leaves the state unchanged") {
  auto theta0 = make_theta0(three_layers.total(), 8);
  dgs_server_state<> s(three_layers, theta0, 2, {.secondary_ratio = 10});
  std::vector<float> g(three_layers.total(), 0.01f);
  (void)s.push(0, g);
  const auto model = std::vector<float>(s.model().begin(), s.model().end());
  const auto r0 = std::vector<float>(s.replica(0).begin(), s.replica(0).end());
  const auto r1 = std::vector<float>(s.replica(1).begin(), s.replica(1).end());
  const auto t = s.timestamp();
  auto bad = g;
  bad[100] = std::nanf("");
  CHECK(gradcomp::test_support::non_finite_index_of([&] { (void)s.push(1, bad); }) == 100);
  CHECK_THROWS_AS((void)s.push(1, std::span<const float>(g).first(10)), size_mismatch_error);
  CHECK_THROWS_AS((void)s.push(2, g), invalid_argument_error);
  CHECK_THROWS_AS((void)s.push(-1, g), invalid_argument_error);
  CHECK_THROWS_AS((void)s.update_for(2), invalid_argument_error);
  CHECK_THROWS_AS((void)s.resync(5), invalid_argument_error);
  CHECK(bit_equal(s.model(), model));
  CHECK(bit_equal(s.replica(0), r0));
  CHECK(bit_equal(s.replica(1), r1));
  CHECK(s.timestamp() == t);
}

TEST_CASE("dgs_server_state: apply_sparse is apply() of the dense vector, bit for bit, and checks first") {
  auto theta0 = make_theta0(three_layers.total(), 10);
  theta0[3] = -0.0f;
  dgs_server_state<> a(three_layers, theta0, 1), b(three_layers, theta0, 1);
  for (int step = 0; step < 5; ++step) {
    std::vector<layer_update> g(three_layers.layers());
    std::vector<float> dense(three_layers.total(), 0.0f);
    for (std::size_t j = 0; j < three_layers.layers(); ++j) {
      const std::size_t n = three_layers.size(j);
      if (j == 2) {
        g[j].dense = true;
        for (std::size_t i = 0; i < n; ++i) g[j].values.push_back(noise(step, j, i));
        std::copy(g[j].values.begin(), g[j].values.end(), dense.begin() + long(three_layers.offset(j)));
        continue;
      }
      for (std::uint32_t i = 0; i < n; i += 3 + std::uint32_t(step)) {
        g[j].indices.push_back(i);
        g[j].values.push_back(i == 3 ? -0.0f : noise(step, j, i));
        dense[three_layers.offset(j) + i] = g[j].values.back();
      }
    }
    a.apply_sparse(g);
    b.apply(dense);
    REQUIRE(bit_equal(a.model(), b.model()));
  }
  CHECK(a.timestamp() == 5);
  const auto before = std::vector<float>(a.model().begin(), a.model().end());
  std::vector<layer_update> g(three_layers.layers());
  g[0].indices = {1, 2};
  g[0].values = {1.0f, std::numeric_limits<float>::infinity()};
  CHECK(gradcomp::test_support::non_finite_index_of([&] { a.apply_sparse(g); }) == 2);
  g[0].values = {1.0f, 2.0f};
  g[1].indices = {5, 5};
  g[1].values = {1.0f, 2.0f};
  CHECK_THROWS_AS(a.apply_sparse(g), invalid_argument_error);
  g[1].indices = {5, 200};
  CHECK_THROWS_AS(a.apply_sparse(g), invalid_argument_error);
  g[1].indices = {5};
  CHECK_THROWS_AS(a.apply_sparse(g), size_mismatch_error);
  g[1] = {};
  g[2].dense = true;
  g[2].values = {1, 2};
  CHECK_THROWS_AS(a.apply_sparse(g), size_mismatch_error);
  g.pop_back();
  CHECK_THROWS_AS(a.apply_sparse(g), size_mismatch_error);
  CHECK(bit_equal(a.model(), before));
  CHECK(a.timestamp() == 5);
}

TEST_CASE("dgs_server_state: resync sends the whole model and resets the worker's copy") {
  auto theta0 = make_theta0(three_layers.total(), 9);
  dgs_server_state<> s(three_layers, theta0, 2, {.secondary_ratio = 1});
  std::vector<float> g(three_layers.total(), 0.125f);
  (void)s.push(0, g);
  CHECK(s.pending(1) > 0);
  auto u = s.resync(1);
  CHECK(u.resync);
  std::vector<float> fresh(three_layers.total(), -7.0f);  // a worker with garbage
  apply_model_update(three_layers, u, std::span<float>(fresh));
  CHECK(bit_equal(fresh, s.model()));
  CHECK(s.pending(1) == 0);
}

TEST_CASE("sync_aggregate: the exact average with the dense codec, and every decode path agrees") {
  const std::size_t n = 301;
  const int N = 4;
  dense_codec<> codec;
  std::vector<dense_payload> ps(N);
  for (int k = 0; k < N; ++k) codec.encode(dyadic_gradient(n, k, 0), ps[std::size_t(k)]);
  std::vector<const dense_payload*> ptrs;
  for (auto& p : ps) ptrs.push_back(&p);
  std::vector<float> out(n), scratch;
  sync_aggregate(codec, std::span<const dense_payload* const>(ptrs), std::span<float>(out), true, scratch);
  for (std::size_t i = 0; i < n; ++i) {
    double mean = 0;
    for (auto& p : ps) mean += p.values[i];
    mean /= N;
    REQUIRE(double(out[i]) == mean);  // exact: dyadic inputs, N a power of two
  }
  // Arbitrary floats: the same bits as summing in the given order then dividing.
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  for (auto& p : ps)
    for (auto& v : p.values) v = dist(gen);
  sync_aggregate(codec, std::span<const dense_payload* const>(ptrs), std::span<float>(out), true, scratch);
  for (std::size_t i = 0; i < n; ++i) {
    float s = ps[0].values[i];
    for (int k = 1; k < N; ++k) s += ps[std::size_t(k)].values[i];
    REQUIRE(std::bit_cast<std::uint32_t>(out[i]) == std::bit_cast<std::uint32_t>(s / float(N)));
  }
  // The sum, and the decode-into-scratch path of a codec without decode_add / linearity.
  struct plain_decoder {
    using payload_type = dense_payload;
    void decode(const payload_type& p, std::span<float> o) const { std::copy(p.values.begin(), p.values.end(), o.begin()); }
  };
  std::vector<float> sum1(n), sum2(n);
  sync_aggregate(codec, std::span<const dense_payload* const>(ptrs), std::span<float>(sum1), false, scratch);
  sync_aggregate(plain_decoder{}, std::span<const dense_payload* const>(ptrs), std::span<float>(sum2), false, scratch);
  CHECK(bit_equal(sum1, sum2));
  // Sparse payloads through decode_add.
  sparse_coo_payload a, b;
  a.length = b.length = 4;
  a.indices = {0, 2};
  a.values = {1, 2};
  b.indices = {2, 3};
  b.values = {4, 8};
  std::vector<const sparse_coo_payload*> sp = {&a, &b};
  std::vector<float> o4(4);
  sync_aggregate(ps_detail::coo_decoder{}, std::span<const sparse_coo_payload* const>(sp), std::span<float>(o4), true,
                 scratch);
  CHECK(o4 == std::vector<float>{0.5f, 0, 3, 4});
  // No payloads: zeros. Bad inputs.
  sync_aggregate(codec, std::span<const dense_payload* const>(), std::span<float>(o4), true, scratch);
  CHECK(o4 == std::vector<float>(4, 0.0f));
  std::vector<const dense_payload*> with_null = {&ps[0], nullptr};
  CHECK_THROWS_AS(sync_aggregate(codec, std::span<const dense_payload* const>(with_null), std::span<float>(out), true,
                                 scratch),
                  invalid_argument_error);
  CHECK_THROWS_AS(sync_aggregate(codec, std::span<const dense_payload* const>(ptrs), std::span<float>(o4), true, scratch),
                  size_mismatch_error);
}

namespace {
// A codec that counts how often its state moved: NaN must not move it.
struct counting_codec {
  using payload_type = dense_payload;
  int* encodes;
  void encode(std::span<const float> in, payload_type& p) {
    ++*encodes;
    p.values.assign(in.begin(), in.end());
  }
  void decode(const payload_type& p, std::span<float> out) const { std::copy(p.values.begin(), p.values.end(), out.begin()); }
  std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }
};
}  // namespace

TEST_CASE("ps_uplink: lr * gradient per layer, checked before any codec runs") {
  int encodes = 0;
  ps_uplink<counting_codec> up(layer_partition({2, 3}), [&](std::size_t, std::size_t) { return counting_codec{&encodes}; });
  std::vector<float> g = {1, 2, 3, 4, 5};
  std::vector<dense_payload> out;
  up.encode(g, 0.5f, out);
  REQUIRE(out.size() == 2);
  CHECK(out[0].values == std::vector<float>{0.5f, 1});
  CHECK(out[1].values == std::vector<float>{1.5f, 2, 2.5f});
  CHECK(encodes == 2);
  auto bad = g;
  bad[4] = std::numeric_limits<float>::infinity();
  CHECK(gradcomp::test_support::non_finite_index_of([&] { up.encode(bad, 0.5f, out); }) == 4);
  // A finite gradient that overflows once scaled.
  std::vector<float> big = {1, 1, 1, 3e38f, 1};
  CHECK_THROWS_AS(up.encode(big, 10.0f, out), non_finite_error);
  CHECK_THROWS_AS(up.encode(g, 0.0f, out), invalid_argument_error);
  CHECK_THROWS_AS(up.encode(g, -1.0f, out), invalid_argument_error);
  CHECK_THROWS_AS(up.encode(g, std::nanf(""), out), invalid_argument_error);
  CHECK_THROWS_AS(up.encode(std::span<const float>(g).first(4), 1.0f, out), size_mismatch_error);
  CHECK(encodes == 2);  // no codec ran for any of the bad calls
}

TEST_CASE("simulation: ASGD rule + no sparsification equals plain ASGD bit for bit (eq. 5), through the wire") {
  const int N = 3;
  const float lr = 0.1f;
  auto theta0 = make_theta0(three_layers.total(), 12);
  async_ps_simulation<dense_codec<>> sim(three_layers, theta0, N, asgd_rule<>{});
  // GD-async with R = 100% sends the whole residual (= lr * grad) every step: the same run.
  async_ps_simulation<sparsifier_with_memory<>> gd(three_layers, theta0, N, gd_async_rule<>{.ratio_percent = 100});
  std::vector<float> ref_theta = theta0;
  std::vector<std::vector<float>> ref_models(N, theta0);
  for (int step = 0; int k : schedule_of(N, 90, 13)) {
    auto g = toy_gradient(sim.model(k), k, step);
    auto r = sim.step(k, g, lr);
    REQUIRE(r.status == ps_pull_status::updated);
    REQUIRE(bit_equal(sim.model(k), sim.server().model()));
    auto g2 = toy_gradient(gd.model(k), k, step);
    REQUIRE(gd.step(k, g2, lr).status == ps_pull_status::updated);
    REQUIRE(bit_equal(gd.model(k), sim.model(k)));

    auto rg = toy_gradient(ref_models[std::size_t(k)], k, step);
    for (std::size_t i = 0; i < rg.size(); ++i) {
      const volatile float d = lr * rg[i];  // rounded product: no fused multiply-subtract (GCC contracts by default)
      ref_theta[i] -= d;
    }
    ref_models[std::size_t(k)] = ref_theta;
    REQUIRE(bit_equal(ref_theta, sim.model(k)));
    ++step;
  }
  CHECK(sim.server().stats().pushes == 90);
}

TEST_CASE("simulation: SAMomentum with R = 100% is dense momentum SGD (eq. 16 with T = 1)") {
  const float lr = 0.05f, m = 0.7f;
  auto theta0 = make_theta0(three_layers.total(), 14);
  async_ps_simulation<sa_momentum<>> sim(three_layers, theta0, 1, dgs_rule<>{.ratio_percent = 100, .momentum = m});
  std::vector<float> theta = theta0, u(theta0.size(), 0.0f);
  for (int step = 0; step < 60; ++step) {
    auto g = toy_gradient(sim.model(0), 0, step);
    REQUIRE(sim.step(0, g, lr).status == ps_pull_status::updated);
    auto rg = toy_gradient(theta, 0, step);
    // eq. 8: u = m u + eta grad, theta -= u, with the library's own a*y + b*x
    // kernel (whether a compiler fuses it into an FMA is then the same on both sides).
    std::vector<float> eg(rg.size());
    for (std::size_t i = 0; i < rg.size(); ++i) {
      const volatile float e = lr * rg[i];
      eg[i] = e;
    }
    execution::axpby_update(execution::seq{}, std::span<float>(u), std::span<const float>(eg), m, 1.0f);
    for (std::size_t i = 0; i < theta.size(); ++i) theta[i] -= u[i];
    REQUIRE(bit_equal(theta, sim.model(0)));
  }
}

TEST_CASE("simulation: DGS, GD-async and DGC-async keep every worker equal to the server's copy of it") {
  const int N = 4;
  auto theta0 = make_theta0(three_layers.total(), 15);
  async_ps_options opt;
  opt.secondary_ratio = 10;
  async_ps_simulation<sa_momentum<>> dgs(three_layers, theta0, N, dgs_rule<>{.ratio_percent = 5}, opt);
  async_ps_simulation<sparsifier_with_memory<>> gd(three_layers, theta0, N, gd_async_rule<>{.ratio_percent = 5}, opt);
  async_ps_simulation<sparsifier_with_memory<>> dgc(three_layers, theta0, N, dgc_async_rule<>{.ratio_percent = 5}, opt);
  for (int step = 0; int k : schedule_of(N, 400, 17)) {
    for (auto* s : {&gd, &dgc}) {
      auto g = toy_gradient(s->model(k), k, step);
      REQUIRE(s->step(k, g, 0.02f).status == ps_pull_status::updated);
      REQUIRE(bit_equal(s->model(k), s->server().state().replica(k)));
    }
    auto g = toy_gradient(dgs.model(k), k, step);
    REQUIRE(dgs.step(k, g, 0.02f).status == ps_pull_status::updated);
    REQUIRE(bit_equal(dgs.model(k), dgs.server().state().replica(k)));
    ++step;
  }
  // Uplink and downlink are both sparse: far fewer bytes than the dense model.
  const auto& st = dgs.server().stats();
  const double dense_frame = double(three_layers.total() * 4);
  for (int k = 0; k < N; ++k) {
    const double pushes = double(st.pushes_per_worker[std::size_t(k)]);
    if (pushes == 0) continue;
    CHECK(double(st.bytes_up[std::size_t(k)]) / pushes < dense_frame);
    CHECK(double(st.bytes_down[std::size_t(k)]) / pushes < dense_frame);
  }
  // The learning is real: the loss of the toy quadratic went down.
  auto loss = [&](std::span<const float> th) {
    double l = 0;
    for (std::size_t i = 0; i < th.size(); ++i) {
      const double d = th[i] - 0.5 * noise(99, 0, i);
      l += d * d;
    }
    return l;
  };
  CHECK(loss(dgs.server().model()) < 0.5 * loss(theta0));
  CHECK(loss(gd.server().model()) < 0.5 * loss(theta0));
  CHECK(loss(dgc.server().model()) < 0.5 * loss(theta0));
}
