// parameter_server.hpp over mpi_transport under mpirun (2, 3 and 4 ranks from
// ctest): rank 0 serves, ranks 1..N-1 are the workers. The synchronous
// server with dense_codec delivers the exact average; the asynchronous DGS
// server in the deterministic (scheduled) mode is bit for bit the
// single-threaded async_ps_simulation, which every rank recomputes locally,
// also when a worker sends garbage bytes on the push tag (rejected, the run
// goes on); the free-running server loses nothing whatever the arrival order,
// and every worker's model after a final pull equals the server's.
#include <doctest/doctest.h>

#include <gradcomp/parameter_server.hpp>
#include <gradcomp/presets/parameter_server_rules.hpp>
#include <gradcomp/transport/mpi.hpp>

#include <support/equality.hpp>
#include <support/ps_fixtures.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

using namespace gradcomp;

namespace {

// bit_equal, make_theta0, toy_gradient, dyadic_*, schedule_of, count_of, noise.
using namespace test_support;

// Bytes no frame parser accepts (no valid control message at the front).
std::vector<std::byte> garbage(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(splitmix(seed + i) & 0xFF);
  return b;
}

// True on every rank iff `flag` is true on every rank.
bool all_ranks(bool flag) {
  int mine = flag ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all != 0;
}

const layer_partition layers3({37, 200, 5});

}  // namespace

TEST_CASE("mpi sync PS with the dense codec: every worker receives the exact average") {
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int N = t.size() - 1, rounds = 5;
  bool ok = true;
  if (t.rank() == 0) {
    sync_ps_server<dense_codec<>> server(layers3, N, asgd_rule<>{});
    server.serve(t);
    CHECK(server.rounds() == std::uint64_t(rounds));  // the leaves make no round
    for (int k = 0; k < N; ++k) CHECK(server.status(k) == ps_worker_status::left);
    ok = server.rounds() == std::uint64_t(rounds);
  } else {
    const int k = t.rank() - 1;
    sync_ps_worker<dense_codec<>> w(layers3, asgd_rule<>{});
    for (int r = 0; r < rounds; ++r) {
      auto g = dyadic_gradient(layers3.total(), k, r);
      const auto res = w.exchange(t, std::span<float>(g));
      CHECK(res.contributors == std::uint32_t(N));
      CHECK_FALSE(res.rejected);
      CHECK(res.round == std::uint64_t(r));
      std::vector<float> want(layers3.total());
      for (std::size_t i = 0; i < want.size(); ++i) {
        double mean = 0;
        for (int q = 0; q < N; ++q) mean += dyadic_gradient(layers3.total(), q, r)[i];
        want[i] = float(mean / N);  // exact: dyadic values
      }
      CHECK(bit_equal(g, want));
      ok = ok && bit_equal(g, want);
    }
    w.leave(t);
  }
  CHECK(all_ranks(ok));
}

TEST_CASE("mpi async DGS server, deterministic schedule: bit for bit the simulation, a garbage push rejected") {
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int N = t.size() - 1;
  const float lr = 0.05f;
  const auto theta0 = make_theta0(layers3.total(), 1);
  const auto sched = schedule_of(N, 12 * N, 2);
  const dgs_rule<> rule{.ratio_percent = 5, .momentum = 0.7f};
  async_ps_options opt;
  opt.secondary_ratio = 10;
  // Worker 0's third request is garbage bytes on the push tag instead of a push.
  const int bad_worker = 0, bad_request = 2;
  const auto junk = garbage(300, 77);

  // Reference on every rank: the same schedule in one thread; the garbage
  // frame goes to the server's handle(), the worker encodes nothing for it.
  async_ps_simulation<sa_momentum<>> sim(layers3, theta0, N, rule, opt);
  {
    std::vector<int> local(N, 0);
    for (int k : sched) {
      const int c = local[std::size_t(k)]++;
      if (k == bad_worker && c == bad_request) {
        const ps_handled h = sim.server().handle(k, std::span<const std::byte>(junk));
        CHECK(h.event == ps_event::rejected);
        CHECK(sim.worker(k).apply_reply(std::span<const std::byte>(h.reply), sim.model(k)).status ==
              ps_pull_status::rejected);
        continue;
      }
      auto g = toy_gradient(sim.model(k), k, c);
      CHECK(sim.step(k, g, lr).status == ps_pull_status::updated);
    }
  }
  CHECK(sim.server().stats().rejected == 1);

  opt.schedule = sched;
  bool ok = true;
  if (t.rank() == 0) {
    async_ps_server<sa_momentum<>> server(layers3, theta0, N, rule, opt);
    const auto& st = server.serve(t);
    CHECK(st.rejected == 1);
    CHECK(st.pushes == std::uint64_t(sched.size() - 1));
    CHECK(server.state().timestamp() == sched.size() - 1);
    CHECK(bit_equal(server.model(), sim.server().model()));
    for (int k = 0; k < N; ++k) {
      CHECK(server.status(k) == ps_worker_status::left);
      CHECK(bit_equal(server.state().replica(k), sim.server().state().replica(k)));
    }
    CHECK(st.bytes_down == sim.server().stats().bytes_down);
    ok = st.rejected == 1 && bit_equal(server.model(), sim.server().model());
  } else {
    const int k = t.rank() - 1;
    async_ps_worker<sa_momentum<>> w(layers3, rule);
    std::vector<float> model = theta0;
    for (int c = 0; c < count_of(sched, k); ++c) {
      if (k == bad_worker && c == bad_request) {
        t.isend(0, ps_default_tag_up, std::vector<std::byte>(junk)).wait();
        message m = t.irecv(0, ps_default_tag_down).wait();
        const ps_reply r = w.apply_reply(std::span<const std::byte>(m.bytes), model);
        CHECK(r.status == ps_pull_status::rejected);
        CHECK(r.reason == ps_reject_reason::malformed);
        continue;
      }
      auto g = toy_gradient(model, k, c);
      CHECK(w.step(t, g, lr, model).status == ps_pull_status::updated);
    }
    w.leave(t);
    CHECK(bit_equal(model, sim.model(k)));
    ok = bit_equal(model, sim.model(k));
  }
  CHECK(all_ranks(ok));
}

TEST_CASE("mpi async server, free-running: nothing lost, and a final pull gives every worker the server's model") {
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int N = t.size() - 1, steps = 20;
  const auto theta0 = dyadic_theta0(layers3.total());
  async_ps_options opt;
  opt.secondary_ratio = 20;
  const gd_async_rule<> rule{.ratio_percent = 10};
  const std::size_t n = layers3.total();

  // Workers only: they finish pushing before anyone pulls the final model.
  MPI_Comm workers_comm;
  MPI_Comm_split(MPI_COMM_WORLD, t.rank() == 0 ? 0 : 1, t.rank(), &workers_comm);

  std::vector<float> final_model(n, 0.0f);
  std::vector<double> residual_sum(n, 0.0), residual(n, 0.0);
  if (t.rank() == 0) {
    async_ps_server<sparsifier_with_memory<>> server(layers3, theta0, N, rule, opt);
    const auto& st = server.serve(t);
    CHECK(st.pushes == std::uint64_t(N * steps));
    CHECK(st.rejected == 1);  // worker 0's garbage
    CHECK(st.joins == std::uint64_t(N));
    for (int k = 0; k < N; ++k) CHECK(server.status(k) == ps_worker_status::left);
    final_model.assign(server.model().begin(), server.model().end());
  } else {
    const int k = t.rank() - 1;
    async_ps_worker<sparsifier_with_memory<>> w(layers3, rule);
    std::vector<float> model = theta0;
    for (int c = 0; c < steps; ++c) {
      // Garbage on the push tag in the middle of the free-running pushes too.
      if (k == 0 && c == 7) {
        t.isend(0, ps_default_tag_up, garbage(64, 5)).wait();
        message m = t.irecv(0, ps_default_tag_down).wait();
        CHECK(w.apply_reply(std::span<const std::byte>(m.bytes), model).status == ps_pull_status::rejected);
      }
      (void)w.step(t, dyadic_gradient(n, k, c), 1.0f, model);
    }
    MPI_Barrier(workers_comm);  // every push applied: the server's model is final
    CHECK(w.join(t, model).status == ps_pull_status::resynced);
    w.leave(t);
    final_model = model;
    for (std::size_t j = 0, i = 0; j < layers3.layers(); ++j)
      for (float v : w.uplink().codec(j).residual()) residual[i++] = v;
  }
  MPI_Comm_free(&workers_comm);

  // Every worker's pulled model is the server's final model, bit for bit.
  std::vector<float> server_model = final_model;
  MPI_Bcast(server_model.data(), int(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
  CHECK(bit_equal(final_model, server_model));
  // Pushed = gradients - residuals, so theta_T - sum of residuals =
  // theta_0 - sum of all gradients, exactly (dyadic values: every sum is
  // exact in any order).
  MPI_Reduce(residual.data(), residual_sum.data(), int(n), MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  if (t.rank() == 0) {
    std::vector<double> expect(theta0.begin(), theta0.end());
    for (int k = 0; k < N; ++k)
      for (int c = 0; c < steps; ++c) {
        const auto g = dyadic_gradient(n, k, c);
        for (std::size_t i = 0; i < n; ++i) expect[i] -= g[i];
      }
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (double(server_model[i]) - residual_sum[i] != expect[i]) ++wrong;
    CHECK(wrong == 0);
  }
}

TEST_CASE("mpi PS: a communicator of the wrong size is a typed error") {
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int N = t.size() - 1;
  if (t.rank() == 0) {
    sync_ps_server<dense_codec<>> sync_server(layers3, N + 1, asgd_rule<>{});
    CHECK_THROWS_AS(sync_server.serve(t), invalid_argument_error);
    async_ps_server<sparsifier_with_memory<>> async_server(layers3, dyadic_theta0(layers3.total()), N + 2,
                                                           gd_async_rule<>{.ratio_percent = 10});
    CHECK_THROWS_AS(async_server.serve(t), invalid_argument_error);
  } else {
    sync_ps_server<dense_codec<>> sync_server(layers3, N, asgd_rule<>{});
    CHECK_THROWS_AS(sync_server.serve(t), invalid_argument_error);  // not rank 0
  }
  t.barrier();
}

TEST_CASE("mpi sync PS: a rejected push (codec mismatch) is an error on its worker only; a layout mismatch a layout_error") {
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int N = t.size() - 1;
  bool ok = true;
  // Round 0: worker 0 pushes dense layers to a server that expects sparse
  // COO ones. Round 1 (a second server run): every worker has another layout.
  if (t.rank() == 0) {
    sync_ps_server<sparsifier_with_memory<>> server(layers3, N, gd_async_rule<>{.ratio_percent = 100});
    server.serve(t);
    CHECK(server.stats().rejected == 1);
    ok = server.stats().rejected == 1;
  } else {
    const int k = t.rank() - 1;
    const auto g0 = dyadic_gradient(layers3.total(), k, 0);
    auto g = g0;
    if (k == 0) {
      sync_ps_worker<dense_codec<>> w(layers3, asgd_rule<>{});
      bool threw = false;
      try {
        (void)w.exchange(t, std::span<float>(g));
      } catch (const ps_push_rejected_error& e) {
        threw = e.result().rejected && e.result().contributors == std::uint32_t(N - 1);
      }
      CHECK(threw);
      CHECK(bit_equal(g, g0));
      ok = threw && bit_equal(g, g0);
      w.leave(t);
    } else {
      sync_ps_worker<sparsifier_with_memory<>> w(layers3, gd_async_rule<>{.ratio_percent = 100});
      const auto r = w.exchange(t, std::span<float>(g));
      CHECK_FALSE(r.rejected);
      CHECK(r.contributors == std::uint32_t(N - 1));
      ok = !r.rejected && r.contributors == std::uint32_t(N - 1);
      w.leave(t);
    }
  }
  CHECK(all_ranks(ok));

  ok = true;
  const layer_partition other({37, 205});
  if (t.rank() == 0) {
    sync_ps_server<dense_codec<>> server(layers3, N, asgd_rule<>{});
    server.serve(t);
    CHECK(server.stats().rejected == std::uint64_t(N));
    ok = server.stats().rejected == std::uint64_t(N);
  } else {
    sync_ps_worker<dense_codec<>> w(other, asgd_rule<>{});
    auto g = dyadic_gradient(other.total(), t.rank() - 1, 0);
    const auto before = g;
    CHECK_THROWS_AS((void)w.exchange(t, std::span<float>(g)), layout_error);
    CHECK(bit_equal(g, before));
    ok = bit_equal(g, before);
    w.leave(t);
  }
  CHECK(all_ranks(ok));
}
