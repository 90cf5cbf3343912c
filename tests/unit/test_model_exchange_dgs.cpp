// The asynchronous DGS parameter server as a sibling of model_exchange
// (exchange/dgs_exchange.hpp): the same models as the drivers it wraps, bit
// for bit (deterministic round-robin schedule); the model difference; every
// worker pulls the server's final model; typed errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <gradcomp/exchange/dgs_exchange.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <support/equality.hpp>

namespace gx = gradcomp::exchange;
using gradcomp::test_support::bit_equal;
using gradcomp::transport::inproc_endpoint;

namespace {

using grads = std::vector<std::vector<float>>;

gx::model_description small_model() {
  gx::model_description m;
  m.add_conv("conv", 8, 4, 3, 3).add_dense("conv.bias", 8, 1).add_dense("fc", 400);
  return m;
}

grads initial_model(const gx::model_description& m) {
  grads w;
  for (std::size_t l = 0; l < m.size(); ++l) {
    w.emplace_back(m[l].shape.size());
    for (std::size_t i = 0; i < w.back().size(); ++i) w.back()[i] = 0.01f * std::sin(float(i + 7 * l));
  }
  return w;
}

grads gradients(const gx::model_description& m, int rank, std::uint64_t step) {
  grads g;
  for (std::size_t l = 0; l < m.size(); ++l) {
    g.emplace_back(m[l].shape.size());
    for (std::size_t i = 0; i < g.back().size(); ++i)
      g.back()[i] = std::cos(0.1f * float(i) + float(step) + 0.7f * float(rank + 3 * l)) + 0.01f * float(rank);
  }
  return g;
}

std::vector<std::span<const float>> views(const grads& g) { return {g.begin(), g.end()}; }
std::vector<std::span<float>> spans(grads& g) { return {g.begin(), g.end()}; }

std::vector<float> flat(const grads& g) {
  std::vector<float> f;
  for (const auto& l : g) f.insert(f.end(), l.begin(), l.end());
  return f;
}

const gx::dgs_options options{.ratio_percent = 5.0, .momentum = 0.7f, .seed = 3, .secondary_ratio = 10.0};

/// Blocks until every worker (ranks 1..N of `ep`) has called it.
void worker_barrier(inproc_endpoint& ep) {
  for (int r = 1; r < ep.size(); ++r)
    if (r != ep.rank()) ep.isend(r, 7, {}).wait();
  for (int r = 1; r < ep.size(); ++r)
    if (r != ep.rank()) ep.irecv(r, 7).wait();
}

}  // namespace

TEST_CASE("dgs exchange: the same models as async_ps_worker / async_ps_server, bit for bit (3 workers)") {
  const int workers = 3;
  const std::uint64_t steps = 6;
  const auto m = small_model();
  const auto w0 = initial_model(m);
  const float lr = 0.05f;
  // [worker][step] -> the model after the step; [worker] -> the final model after finish().
  std::vector<std::vector<std::vector<float>>> mine(workers), ref(workers);
  std::vector<std::vector<float>> mine_final(workers);
  std::vector<float> server_model;
  gradcomp::transport::run_workers(workers + 1, [&](inproc_endpoint& ep) {
    if (ep.rank() == 0) {
      gx::dgs_server<> server(m, views(w0), workers, options, gx::dgs_server<>::round_robin(workers, steps));
      const auto& st = server.serve(ep);
      CHECK(st.pushes == std::uint64_t(workers) * steps);
      CHECK(st.rejected == 0);
      server_model.assign(server.model().begin(), server.model().end());
      return;
    }
    gx::dgs_exchange<inproc_endpoint> ex(ep, m, views(w0), options);
    for (std::uint64_t s = 0; s < steps; ++s) {
      auto g = gradients(m, ep.rank(), s);
      const std::vector<float> before(ex.model().begin(), ex.model().end());
      const auto& st = ex.step(spans(g), lr);
      CHECK(st.step == s + 1);
      CHECK(st.bytes_up > 0);
      const auto after = ex.model();
      const auto diff = flat(g);  // the model difference, written into the gradients
      for (std::size_t i = 0; i < diff.size(); ++i) REQUIRE(diff[i] == after[i] - before[i]);
      mine[std::size_t(ep.rank() - 1)].emplace_back(after.begin(), after.end());
    }
    worker_barrier(ep);
    ex.finish();
    mine_final[std::size_t(ep.rank() - 1)].assign(ex.model().begin(), ex.model().end());
  });
  // The reference: the drivers with the dgs_rule preset, driven by hand.
  const gradcomp::dgs_rule<> rule{.ratio_percent = 5.0, .momentum = 0.7f, .seed = 3};
  const gradcomp::layer_partition parts({m[0].shape.size(), m[1].shape.size(), m[2].shape.size()});
  gradcomp::transport::run_workers(workers + 1, [&](inproc_endpoint& ep) {
    if (ep.rank() == 0) {
      gradcomp::async_ps_options o;
      o.secondary_ratio = 10.0;
      o.schedule = gx::dgs_server<>::round_robin(workers, steps);
      gradcomp::async_ps_server<gradcomp::sa_momentum<>> server(parts, flat(w0), workers, rule, o);
      server.serve(ep);
      return;
    }
    gradcomp::async_ps_worker<gradcomp::sa_momentum<>> w(parts, rule);
    auto model = flat(w0);
    for (std::uint64_t s = 0; s < steps; ++s) {
      const auto g = flat(gradients(m, ep.rank(), s));
      REQUIRE(w.step(ep, g, lr, model).status == gradcomp::ps_pull_status::updated);
      ref[std::size_t(ep.rank() - 1)].push_back(model);
    }
    worker_barrier(ep);
    w.join(ep, model);
    w.leave(ep);
  });
  for (int k = 0; k < workers; ++k) {
    for (std::uint64_t s = 0; s < steps; ++s) CHECK(bit_equal(mine[std::size_t(k)][s], ref[std::size_t(k)][s]));
    CHECK(bit_equal(mine_final[std::size_t(k)], server_model));  // every worker pulled the final model
  }
}

TEST_CASE("dgs exchange: layers of another model and the server's rank are refused with typed errors") {
  const auto m = small_model();
  const auto w0 = initial_model(m);
  gradcomp::transport::run_workers(2, [&](inproc_endpoint& ep) {
    if (ep.rank() == 0) {
      CHECK_THROWS_AS(gx::dgs_exchange<inproc_endpoint>(ep, m, views(w0), options), gradcomp::invalid_argument_error);
      return;
    }
    gx::dgs_exchange<inproc_endpoint> ex(ep, m, views(w0), options);
    grads wrong = gradients(m, 1, 0);
    wrong.pop_back();
    CHECK_THROWS_AS(ex.step(spans(wrong), 0.1f), gradcomp::layout_error);
    wrong = gradients(m, 1, 0);
    wrong[2].resize(3);
    CHECK_THROWS_AS(ex.step(spans(wrong), 0.1f), gradcomp::layout_error);
    CHECK(ex.stats().step == 0);  // nothing sent
    grads short_init = w0;
    short_init[0].pop_back();
    CHECK_THROWS_AS(gx::dgs_exchange<inproc_endpoint>(ep, m, views(short_init), options), gradcomp::layout_error);
  });
}
