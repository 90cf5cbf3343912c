// The whole-model exchange over mpi_transport under mpirun (2, 3 and 4 ranks
// from ctest): every codec of a mixed plan gives the same bits on every rank;
// a NaN on the last rank is agreed by every rank in the same step (skip, and
// throw within 1 s); a run stopped and resumed from its checkpoint continues
// bit for bit.
#include <doctest/doctest.h>

#include <gradcomp/model_exchange.hpp>
#include <gradcomp/transport/mpi.hpp>

#include <support/equality.hpp>
#include <support/exchange_fixtures.hpp>

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace gx = gradcomp::exchange;
using gradcomp::mpi_transport;

// The sum rounds time their waits through a decorator that keeps MPI's zero-copy path.
static_assert(gradcomp::ZeroCopyTransport<gx::wait_timing_transport<mpi_transport>>);

namespace {

gx::plan mixed_plan() { return gradcomp::test_support::every_codec_plan(0); }

std::vector<std::vector<float>> gradients(const gx::model_description& m, int rank, std::uint64_t step) {
  std::vector<std::vector<float>> g;
  std::uint64_t x = 0x9E3779B97F4A7C15ull * (std::uint64_t(rank) + 5) ^ (step * 0xBF58476D1CE4E5B9ull);
  auto next = [&x] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return float((x >> 40) & 0xFFFFFF) / float(1 << 24) - 0.5f;
  };
  for (const auto& l : m.layers()) {
    std::vector<float> v(l.shape.size());
    const float a = next();
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = a * std::sin(0.05f * float(i % 29)) + 0.05f * next();
    g.push_back(std::move(v));
  }
  return g;
}

std::uint64_t hash_of(const std::vector<std::vector<float>>& g) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& v : g) {
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    for (std::size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

bool same_on_every_rank(std::uint64_t h) {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<std::uint64_t> all(static_cast<std::size_t>(n));
  MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (auto v : all)
    if (v != all[0]) return false;
  return true;
}

std::vector<std::span<float>> spans(std::vector<std::vector<float>>& g) { return {g.begin(), g.end()}; }

}  // namespace

TEST_CASE("mpi model_exchange: every codec gives the same bits on every rank") {
  mpi_transport t(MPI_COMM_WORLD);
  gx::model_exchange ex(t, mixed_plan());
  for (std::uint64_t step = 0; step < 9; ++step) {
    auto g = gradients(ex.layout().model(), t.rank(), step);
    const auto& st = ex.step(spans(g));
    CHECK_FALSE(st.skipped);
    CHECK(same_on_every_rank(hash_of(g)));
  }
  CHECK(ex.buckets().schedule().phase() == gradcomp::gradiveq_phase::sampling);
}

TEST_CASE("mpi model_exchange: a NaN on the last rank is agreed in the same step") {
  mpi_transport t(MPI_COMM_WORLD);
  const int last = t.size() - 1;
  {
    gx::model_exchange ex(t, mixed_plan());
    auto g = gradients(ex.layout().model(), t.rank(), 0);
    if (t.rank() == last) g[4][3] = std::numeric_limits<float>::quiet_NaN();
    const auto& st = ex.step(spans(g));
    CHECK(st.skipped);
    REQUIRE(st.failures.size() == 1);
    CHECK(st.failures[0].rank == last);
    CHECK(st.failures[0].layer == 4);
    CHECK(ex.steps() == 0);
  }
  {
    gx::exchange_options eo;
    eo.on_failure = gx::failure_policy::throw_error;
    gx::model_exchange ex(t, mixed_plan(), eo);
    auto g = gradients(ex.layout().model(), t.rank(), 0);
    if (t.rank() == last) g[0][0] = std::numeric_limits<float>::infinity();
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      ex.step(spans(g));
    } catch (const gx::exchange_failure_error& e) {
      what = e.what();
      CHECK(e.rank() == last);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    CHECK(ms < 1000.0);
    CHECK(what.find("rank " + std::to_string(last)) != std::string::npos);
    CHECK(same_on_every_rank(std::hash<std::string>{}(what)));
  }
}

TEST_CASE("mpi model_exchange: stopped and resumed from the checkpoint continues bit for bit") {
  mpi_transport t(MPI_COMM_WORLD);
  const auto plan = mixed_plan();
  const auto& m = plan.model();
  std::vector<std::vector<float>> straight, resumed;
  std::vector<std::byte> saved;
  {
    gx::model_exchange ex(t, plan);
    for (std::uint64_t step = 0; step < 10; ++step) {
      if (step == 4) saved = ex.save_state();
      auto g = gradients(m, t.rank(), step);
      ex.step(spans(g));
      straight = g;
    }
  }
  {
    gx::model_exchange ex(t, plan);
    ex.restore_state(saved);
    for (std::uint64_t step = 4; step < 10; ++step) {
      auto g = gradients(m, t.rank(), step);
      ex.step(spans(g));
      resumed = g;
    }
  }
  for (std::size_t l = 0; l < m.size(); ++l) CHECK(gradcomp::test_support::bit_equal(resumed[l], straight[l]));
}
