// schedules.hpp over mpi_transport under mpirun (2, 3, 4 and 5 ranks from
// ctest): every dense schedule (pipelined ring, Rabenseifner with the fold of
// non-powers of two, hierarchical, the MPI library's own all-reduce) leaves
// the same bits on every rank and the sum; GradiVeQ on Rabenseifner (one
// layer, and two buckets as one codec_group); the
// library capability (float sum, words, max); max rounds on every schedule;
// a rank that stops
// mid-Rabenseifner gives the others a timeout_error; float16 and bfloat16
// cells travel packed (2 bytes each) with the same bits; Rabenseifner and
// direct give the same bits with any max_chunks, Rabenseifner with any
// all-gather radix; a rank waiting for
// a late peer does not spin a core yet honours its deadline; and direct with
// mismatched lengths is a transport_error on every rank (batched waits).
#include <doctest/doctest.h>

#include <gradcomp/dense.hpp>
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/model_exchange.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/mpi.hpp>

#include <support/equality.hpp>
#include <support/exchange_fixtures.hpp>
#include <support/mpi_fixtures.hpp>
#include <support/ring_fixtures.hpp>

#include <mpi.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

using namespace gradcomp;
using namespace std::chrono_literals;
using namespace gradcomp::test_support;

static_assert(LibraryAllreduceTransport<transport::mpi_transport>);
static_assert(LibraryMaxTransport<transport::mpi_transport> && LibraryWordsTransport<transport::mpi_transport>);

namespace {

using vec = std::vector<float>;

// True on every rank iff every rank holds the same bits in `x` (rank 0's
// bits broadcast and compared).
bool same_on_every_rank(std::span<const float> x) {
  vec root(x.begin(), x.end());
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int mine = bit_equal(x, root) ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}


double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace

TEST_CASE("mpi schedules: every schedule sums, the same bits on every rank, awkward lengths") {
  const int n = world_size(), r = world_rank();
  for (int with_deadline = 0; with_deadline < 2; ++with_deadline) {
    auto opts = with_timeout(with_deadline ? 60000ms : 0ms);
    opts.library_timeout = with_deadline != 0;  // the library's MPI_Iallreduce waited with the deadline
    transport::mpi_transport t(MPI_COMM_WORLD, opts);
    for (std::size_t len : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(7), std::size_t(1001), std::size_t(70001)})
      for (schedule_kind kind : {schedule_kind::ring, schedule_kind::pipelined_ring, schedule_kind::rabenseifner,
                                 schedule_kind::hierarchical, schedule_kind::library, schedule_kind::direct})
        for (bool average : {false, true}) {
          CAPTURE(len);
          const std::string kind_name = to_string(kind);
          CAPTURE(kind_name);
          CAPTURE(average);
          CAPTURE(with_deadline);
          const auto x = inputs(n, len, 21 + len);
          vec mine = x[std::size_t(r)];
          schedule_options o{.kind = kind, .average = average, .chunk_elements = 4096};
          if (kind == schedule_kind::hierarchical) o.group_size = n % 2 == 0 && n > 2 ? 2 : 0;
          allreduce(t, std::span<float>(mine), o);
          vec want = exact_sum(x);
          if (average)
            for (float& v : want) v /= float(n);
          CHECK(same_on_every_rank(mine));
          CHECK(max_rel(mine, want) < 1e-5);
        }
  }
}

TEST_CASE("mpi schedules: the pipelined ring is the ring bit for bit") {
  const int n = world_size(), r = world_rank();
  transport::mpi_transport t(MPI_COMM_WORLD);
  const auto x = inputs(n, 50001, 4);
  vec a = x[std::size_t(r)], b = a;
  ring_allreduce(t, std::span<float>(a));
  pipelined_ring_allreduce(t, std::span<float>(b), {.chunk_elements = 1000});
  CHECK(bit_equal(a, b));
}

TEST_CASE("mpi schedules: Rabenseifner and direct give the same bits with any cap on the messages per exchange") {
  const int n = world_size(), r = world_rank();
  transport::mpi_transport t(MPI_COMM_WORLD);
  const auto x = inputs(n, 30011, 8);
  for (schedule_kind kind : {schedule_kind::rabenseifner, schedule_kind::direct}) {
    const std::string kind_name = to_string(kind);
    CAPTURE(kind_name);
    vec all = x[std::size_t(r)];
    allreduce(t, std::span<float>(all), {.kind = kind, .chunk_elements = 256, .max_chunks = 0});
    CHECK(same_on_every_rank(all));
    CHECK(max_rel(all, exact_sum(x)) < 1e-5);
    for (std::size_t w : {1, 2, 7}) {
      CAPTURE(w);
      vec got = x[std::size_t(r)];
      allreduce(t, std::span<float>(got), {.kind = kind, .chunk_elements = 256, .max_chunks = w});
      CHECK(bit_equal(got, all));
    }
  }
}

TEST_CASE("mpi schedules: Rabenseifner's all-gather in groups gives doubling's bits with every radix") {
  const int n = world_size(), r = world_rank();
  transport::mpi_transport t(MPI_COMM_WORLD);
  const auto x = inputs(n, 20011, 12);
  vec doubling = x[std::size_t(r)];
  allreduce(t, std::span<float>(doubling), {.kind = schedule_kind::rabenseifner, .chunk_elements = 256, .allgather_radix = 2});
  CHECK(same_on_every_rank(doubling));
  CHECK(max_rel(doubling, exact_sum(x)) < 1e-5);
  for (int radix : {0, 4, 8}) {
    CAPTURE(radix);
    vec got = x[std::size_t(r)];
    allreduce(t, std::span<float>(got), {.kind = schedule_kind::rabenseifner, .chunk_elements = 256, .allgather_radix = radix});
    CHECK(bit_equal(got, doubling));
  }
}

TEST_CASE("mpi schedules: GradiVeQ on Rabenseifner, the hierarchical ring and direct, the same bits everywhere, close to the ring's") {
  const int n = world_size(), r = world_rank();
  transport::mpi_transport t(MPI_COMM_WORLD);
  const low_rank_layer layer(16, 3, 16 * (3 * std::size_t(n) + 1) + 5, 40 + std::uint64_t(n));
  const auto codec = fitted_codec(layer, static_cast<std::size_t>(n));
  const std::vector<vec> x = rank_samples(layer, n, 5000);
  const vec reference = compressed_domain_sum(codec, x);
  vec rab = x[std::size_t(r)], ring = rab;
  auto mine = codec;
  allreduce_linear(t, mine, std::span<float>(rab), {.kind = schedule_kind::rabenseifner});
  ring_allreduce_linear(t, mine, std::span<float>(ring));
  CHECK(same_on_every_rank(rab));
  CHECK(rel_error(rab, reference) < 1e-5);
  CHECK(rel_error(rab, ring) < 1e-5);
  // Its messages (a length, then the bytes, into buffers kept in the
  // workspace across calls): the same bits on every call, and the buffers
  // keep their capacity.
  schedule_workspace ws;
  for (int call = 0; call < 3; ++call) {
    vec again = x[std::size_t(r)];
    schedule_options o{.kind = schedule_kind::rabenseifner};
    o.workspace = &ws;
    allreduce_linear(t, mine, std::span<float>(again), o);
    CHECK(again == rab);
  }
  if (n > 1) {
    CHECK(ws.bytes(0).capacity() > 0);  // what arrived
    CHECK(ws.bytes(1).capacity() > 0);  // the first message sent
  }
  // Small chunks: the halving steps in pieces (16 floats' worth: 2-4 pieces
  // per step here) and the last doubling half in two messages, with exact
  // receives and no length messages (GradiVeQ knows its payload sizes): the
  // same bits, with the same workspace.
  for (std::size_t cap : {std::size_t(0), std::size_t(2)}) {
    vec pieces = x[std::size_t(r)];
    schedule_options o{.kind = schedule_kind::rabenseifner, .chunk_elements = 16, .max_chunks = cap};
    o.workspace = &ws;
    allreduce_linear(t, mine, std::span<float>(pieces), o);
    CHECK(pieces == rab);
  }
  // The compressed hierarchical ring, groups of 2 where N is even (else one level: the ring).
  vec hier = x[std::size_t(r)];
  allreduce_linear(t, mine, std::span<float>(hier), {.kind = schedule_kind::hierarchical, .group_size = n % 2 == 0 ? 2 : 0});
  CHECK(same_on_every_rank(hier));
  CHECK(rel_error(hier, reference) < 1e-5);
  // The compressed direct schedule (a length, then the bytes, to and from every peer), twice with one workspace.
  for (int call = 0; call < 2; ++call) {
    vec direct = x[std::size_t(r)];
    schedule_options o{.kind = schedule_kind::direct};
    o.workspace = &ws;
    const ring_stats st = allreduce_linear(t, mine, std::span<float>(direct), o);
    CHECK(same_on_every_rank(direct));
    CHECK(rel_error(direct, reference) < 1e-5);
    CHECK(st.messages_sent == std::size_t(2 * (n - 1)));
  }
}

TEST_CASE("mpi schedules: two GradiVeQ buckets as one codec_group on Rabenseifner: each bucket's sum, the same bits, whole or in pieces") {
  const int n = world_size(), r = world_rank();
  transport::mpi_transport t(MPI_COMM_WORLD);
  const low_rank_layer a(16, 3, 16 * (2 * std::size_t(n) + 1) + 5, 80 + std::uint64_t(n));
  const low_rank_layer b(16, 3, 16 * (3 * std::size_t(n) + 2), 90 + std::uint64_t(n));
  auto ca = fitted_codec(a, static_cast<std::size_t>(n)), cb = fitted_codec(b, static_cast<std::size_t>(n));
  const std::vector<vec> xa = rank_samples(a, n, 6000), xb = rank_samples(b, n, 7000);
  codec_group<linear_compressor<>> group;
  group.add(ca, a.length);
  group.add(cb, b.length);
  vec mine = xa[std::size_t(r)];
  mine.insert(mine.end(), xb[std::size_t(r)].begin(), xb[std::size_t(r)].end());
  vec whole = mine, pieces = mine;
  allreduce_linear(t, group, std::span<float>(whole), {.kind = schedule_kind::rabenseifner, .chunk_elements = 0});
  allreduce_linear(t, group, std::span<float>(pieces), {.kind = schedule_kind::rabenseifner, .chunk_elements = 16});
  CHECK(same_on_every_rank(whole));
  CHECK(pieces == whole);
  const vec ra = compressed_domain_sum(ca, xa), rb = compressed_domain_sum(cb, xb);
  CHECK(rel_error(std::span<const float>(whole).first(a.length), ra) < 1e-5);
  CHECK(rel_error(std::span<const float>(whole).subspan(a.length), rb) < 1e-5);
}

TEST_CASE("mpi schedules: GradiVeQ and dense buckets as one codec_group on Rabenseifner: each bucket's sum, exact receives, whole or in pieces") {
  const int n = world_size(), r = world_rank();
  transport::mpi_transport t(MPI_COMM_WORLD);
  const low_rank_layer a(16, 3, 16 * (2 * std::size_t(n) + 1) + 5, 180 + std::uint64_t(n));
  auto ca = fitted_codec(a, static_cast<std::size_t>(n));
  const std::vector<vec> xa = rank_samples(a, n, 6100);
  const std::size_t dense_length = 700;
  std::vector<vec> xd;
  for (int k = 0; k < n; ++k) xd.push_back(counter_gaussian(dense_length, 500 + std::uint64_t(k)));
  gradcomp::dense_codec<> plain;
  codec_group<linear_compressor<>, gradcomp::dense_codec<>> group;  // dense knows its sizes: exact receives
  group.add(plain, dense_length);
  group.add(ca, a.length);
  vec mine = xd[std::size_t(r)];
  mine.insert(mine.end(), xa[std::size_t(r)].begin(), xa[std::size_t(r)].end());
  vec whole = mine, pieces = mine;
  allreduce_linear(t, group, std::span<float>(whole), {.kind = schedule_kind::rabenseifner, .chunk_elements = 0});
  allreduce_linear(t, group, std::span<float>(pieces), {.kind = schedule_kind::rabenseifner, .chunk_elements = 16});
  CHECK(same_on_every_rank(whole));
  CHECK(pieces == whole);
  vec dense_sum(dense_length, 0.0f);
  for (const auto& v : xd)
    for (std::size_t i = 0; i < dense_length; ++i) dense_sum[i] += v[i];
  CHECK(rel_error(std::span<const float>(whole).first(dense_length), dense_sum) < 1e-5);
  CHECK(rel_error(std::span<const float>(whole).subspan(dense_length), compressed_domain_sum(ca, xa)) < 1e-5);
}

TEST_CASE("mpi schedules: the library capability sums words modulo 2^32 and takes the max") {
  const int n = world_size(), r = world_rank();
  for (int deadline = 0; deadline < 2; ++deadline) {
  auto opts = with_timeout(30000ms);
  opts.library_timeout = deadline != 0;
  transport::mpi_transport t(MPI_COMM_WORLD, opts);
  std::vector<std::uint32_t> w = {0xFFFFFFFFu, std::uint32_t(r), 7u};
  t.library_allreduce_sum(std::span<std::uint32_t>(w));
  CHECK(w[0] == std::uint32_t(0xFFFFFFFFull * std::uint64_t(n)));
  CHECK(w[1] == std::uint32_t(n * (n - 1) / 2));
  CHECK(w[2] == 7u * std::uint32_t(n));
  vec m = {float(r), -float(r), 0.5f};
  t.library_allreduce_max(std::span<float>(m));
  CHECK(m[0] == float(n - 1));
  CHECK(m[1] == 0.0f);
  CHECK(m[2] == 0.5f);
  }
}

TEST_CASE("mpi schedules: a rank that stops mid-Rabenseifner makes the others fail with timeout_error" *
          doctest::skip(gradcomp::transport::mpi_simulated)) {
  const int n = world_size(), r = world_rank(), dead = n - 1;
  for (int sends : {0, 1}) {
    CAPTURE(sends);
    transport::mpi_transport t(MPI_COMM_WORLD, with_timeout(600ms));
    stopping_transport st{&t, r == dead ? sends : 1 << 30};
    vec x(40, float(r + 1));
    const auto t0 = std::chrono::steady_clock::now();
    const auto [died, timed_out, other] =
        run_until_stopped([&] { rabenseifner_allreduce(st, std::span<float>(x), {.chunk_elements = 8}); });
    if (r == dead) {
      CHECK(died);
    } else if (n > 2 || sends == 0) {
      // With two ranks a partner that dies after its one halving send leaves
      // the survivor waiting in the doubling: a timeout too.
      CHECK(timed_out);
      CHECK_FALSE(other);
      CHECK(std::chrono::steady_clock::now() - t0 < 30s);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("mpi schedules: waiting 300 ms for a late peer uses little CPU, and the deadline holds" *
          doctest::skip(gradcomp::transport::mpi_simulated)) {
  const int r = world_rank();
  {
    transport::mpi_transport t(MPI_COMM_WORLD, with_timeout(20000ms));
    MPI_Barrier(MPI_COMM_WORLD);
    if (r == 1) {
      std::this_thread::sleep_for(300ms);
      t.isend(0, 5, std::vector<std::byte>(16)).wait();
    } else if (r == 0) {
      const double cpu0 = thread_cpu_seconds();
      const auto w0 = std::chrono::steady_clock::now();
      auto h = t.irecv(1, 5);
      const message m = h.wait();
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
      const double cpu = thread_cpu_seconds() - cpu0;
      CHECK(m.bytes.size() == 16);
      CHECK(wall > 0.2);
      MESSAGE("waited " << wall * 1e3 << " ms using " << cpu * 1e3 << " ms of CPU");
      CHECK(cpu < 0.25 * wall);  // a spinning wait would use all of it
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  {
    transport::mpi_transport t(MPI_COMM_WORLD, with_timeout(150ms));
    if (r == 0) {
      vec buf(4);
      auto h = t.irecv_into(1, 6, std::as_writable_bytes(std::span<float>(buf)));
      const auto w0 = std::chrono::steady_clock::now();
      CHECK_THROWS_AS(h.wait(), timeout_error);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
      CHECK(waited >= 0.14);
      CHECK(waited < 0.5);  // the deadline plus at most one sleep, with room for a loaded machine
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("mpi schedules: float16 and bfloat16 cells travel as 2 bytes on every schedule, with the 4-byte wire's bits") {
  namespace gx = gradcomp::exchange;
  const int n = world_size(), r = world_rank();
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int tag = tags::exchange.first;
  for (auto e : {summable_element::float16, summable_element::bfloat16})
    for (std::size_t len : {std::size_t(1), std::size_t(7), std::size_t(1001), std::size_t(70001)})
      for (schedule_kind kind : {schedule_kind::ring, schedule_kind::pipelined_ring, schedule_kind::rabenseifner,
                                 schedule_kind::hierarchical, schedule_kind::library, schedule_kind::direct}) {
        CAPTURE(static_cast<int>(e));
        CAPTURE(len);
        const std::string kind_name = to_string(kind);
        CAPTURE(kind_name);
        const auto x = inputs(n, len, 31 + len);
        vec packed = x[std::size_t(r)];
        summable::round_cells(e, packed);
        vec wide = packed;
        schedule_options o{.kind = kind, .chunk_elements = 4096};
        if (kind == schedule_kind::hierarchical) o.group_size = n % 2 == 0 && n > 2 ? 2 : 0;
        // The exchange's sum (zero-copy MPI path, packed cells)...
        gx::schedule_collectives<> c(o);
        gx::wire_counters w;
        c.sum(t, std::span<float>(packed), e, tag, w);
        // ...and the same schedule with 4-byte cells (an addition that declares no element).
        auto wide_add = [e](std::span<float> acc, std::span<const float> in) { summable::add_into(e, acc, in); };
        o.kind = kind == schedule_kind::library ? schedule_kind::rabenseifner : kind;  // 16-bit: not the library's
        o.tag_base = tag + 2;
        o.tag_owner = tags::exchange;
        const ring_stats st = detail::allreduce_with<execution::seq>(t, std::span<float>(wide), o, wide_add);
        CHECK(same_on_every_rank(packed));
        CHECK(bit_equal(packed, wide));
        CHECK(2 * w.bytes_sent == st.bytes_sent);
        if (len > 1) CHECK(w.bytes_sent > 0);
      }
}

TEST_CASE("mpi schedules: max rounds on every schedule (the library's max for float32), max_round's bits on every rank") {
  namespace gx = gradcomp::exchange;
  const int n = world_size(), r = world_rank();
  transport::mpi_transport t(MPI_COMM_WORLD);
  const int tag = tags::exchange.first;
  for (auto e : {summable_element::float32, summable_element::float16, summable_element::bfloat16})
    for (std::size_t len : {std::size_t(1), std::size_t(1001), std::size_t(70001)})
      for (schedule_kind kind : {schedule_kind::ring, schedule_kind::pipelined_ring, schedule_kind::rabenseifner,
                                 schedule_kind::hierarchical, schedule_kind::library, schedule_kind::direct}) {
        CAPTURE(static_cast<int>(e));
        CAPTURE(len);
        const std::string kind_name = to_string(kind);
        CAPTURE(kind_name);
        vec on_schedule = inputs(n, len, 57 + len)[std::size_t(r)], reference = on_schedule;
        schedule_options o{.kind = kind, .chunk_elements = 4096};
        if (kind == schedule_kind::hierarchical) o.group_size = n % 2 == 0 && n > 2 ? 2 : 0;
        gx::schedule_collectives<> c(o);
        gx::wire_counters w, wr;
        c.max(t, std::span<float>(on_schedule), e, tag, w);
        gx::ring_collectives<>{}.max(t, std::span<float>(reference), e, tag + 2, wr);  // all-gather, then the max in rank order
        CHECK(same_on_every_rank(on_schedule));
        CHECK(bit_equal(on_schedule, reference));
      }
}

TEST_CASE("mpi schedules: the exchange on Rabenseifner, the library and the cost model's choice, the same bits everywhere") {
  namespace gx = gradcomp::exchange;
  const int r = world_rank();
  auto run = [&](auto collectives) {
    transport::mpi_transport t(MPI_COMM_WORLD);
    const gx::plan p = gradcomp::test_support::every_codec_plan(3);
    gx::model_exchange ex(t, p, {}, std::move(collectives));
    std::vector<vec> g;
    for (std::uint64_t step = 0; step < 9; ++step) {  // through GradiVeQ's sampling and compressed phases
      g.clear();
      for (std::size_t l = 0; l < p.model().layers().size(); ++l)
        g.push_back(counter_gaussian(p.model().layers()[l].shape.size(), 1000 * step + 10 * std::uint64_t(r) + l, 0.1f));
      std::vector<std::span<float>> sp(g.begin(), g.end());
      const auto& st = ex.step(sp);
      CHECK_FALSE(st.skipped);
    }
    return std::make_pair(g, ex.save_state().size());
  };
  const auto ring = run(gx::ring_collectives<>{}).first;
  const auto rab = run(gx::rabenseifner_collectives<>{}).first;
  const auto lib = run(gx::library_collectives<>{}).first;
  gx::auto_collectives_options o;
  o.model.group_size = world_size() % 2 == 0 && world_size() > 2 ? 2 : 0;
  const auto chosen = run(gx::auto_collectives<>(o));
  CHECK(chosen.second > 0);
  for (std::size_t l = 0; l < ring.size(); ++l) {
    CAPTURE(l);
    CHECK(same_on_every_rank(rab[l]));
    CHECK(same_on_every_rank(lib[l]));
    CHECK(same_on_every_rank(chosen.first[l]));
    CHECK(rel_error(rab[l], ring[l]) < 1e-3);
    CHECK(rel_error(lib[l], ring[l]) < 1e-3);
    CHECK(rel_error(chosen.first[l], ring[l]) < 1e-3);
  }
}

TEST_CASE("mpi schedules: direct with ranks that pass different lengths fails on every rank, batched waits, no timeout") {
  // Rank 0's segments are one float shorter than everyone else's: every rank
  // receives a copy of the wrong length from rank 0 (or, rank 0, from
  // everyone) in the reduce-scatter, waited with one MPI_Waitall (no
  // deadline): a longer one is MPI's truncation, a shorter one the link's
  // length check, both a transport_error; nobody reaches the all-gather.
  transport::mpi_transport t(MPI_COMM_WORLD, transport::mpi_transport_options{.timeout = std::chrono::milliseconds(0)});
  const std::size_t n = static_cast<std::size_t>(t.size());
  vec x(t.rank() == 0 ? 20 * n : 21 * n, 1.0f);
  CHECK_THROWS_AS(allreduce(execution::seq{}, t, std::span<float>(x), {.kind = schedule_kind::direct}), transport_error);
  t.barrier();
}
