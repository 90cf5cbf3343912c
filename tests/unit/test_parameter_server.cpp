// parameter_server.hpp over a transport: the asynchronous server in the
// deterministic (scheduled) and free-running modes, the synchronous server,
// the message format and its validation, and failures injected with the
// fault-injecting transport (a dropped worker, corrupted payloads, a slow
// worker, a lost reply). Runs under TSan in CI.
#include <doctest/doctest.h>

#include <gradcomp/parameter_server.hpp>
#include <gradcomp/presets/parameter_server_rules.hpp>
#include <gradcomp/transport/fault_injection.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/tags.hpp>
#include <gradcomp/two_bit.hpp>

#include <support/equality.hpp>
#include <support/ps_fixtures.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

using namespace gradcomp;
using namespace std::chrono_literals;
using transport::fault_plan;
using transport::fault_injecting;
using transport::inproc_endpoint;
using transport::inproc_fabric;
namespace faults = transport::faults;

namespace {

// bit_equal, make_theta0, toy_gradient, dyadic_*, schedule_of, count_of, noise.
using namespace test_support;

const layer_partition layers3({37, 200, 5});

// Runs `server` on rank 0 of an in-process fabric of N + 1 ranks, and
// `worker(k, ep)` on rank k + 1 for the workers k = 0..N-1.
template <class Server, class Worker>
void serve_and_work(int N, Server& server, Worker worker) {
  inproc_fabric fabric(N + 1);
  fabric.run([&](inproc_endpoint& ep) {
    if (ep.rank() == 0) {
      server.serve(ep);
      return;
    }
    worker(ep.rank() - 1, ep);
  });
}

// A control message with an arbitrary body and a valid header/CRC.
struct raw_control {
  static constexpr wire::codec_id wire_codec = wire::codec_id::control;
  std::vector<std::byte> body;
  std::uint64_t elements = 0;
  std::uint64_t element_count() const { return elements; }
  std::size_t body_size() const { return body.size(); }
  void write_body(wire::writer& w) const { w.put_bytes(body); }
  static raw_control read_body(wire::reader&, const wire::header&) { return {}; }
};

}  // namespace

TEST_CASE("async PS over inproc, deterministic schedule: bit for bit the single-threaded simulation") {
  const int N = 3;
  const float lr = 0.05f;
  const auto theta0 = make_theta0(layers3.total(), 1);
  const auto sched = schedule_of(N, 60, 2);
  const dgs_rule<> rule{.ratio_percent = 5, .momentum = 0.7f};
  async_ps_options opt;
  opt.secondary_ratio = 10;

  async_ps_simulation<sa_momentum<>> sim(layers3, theta0, N, rule, opt);
  std::vector<int> local(N, 0);
  for (int k : sched) {
    auto g = toy_gradient(sim.model(k), k, local[std::size_t(k)]++);
    REQUIRE(sim.step(k, g, lr).status == ps_pull_status::updated);
  }

  opt.schedule = sched;
  async_ps_server<sa_momentum<>> server(layers3, theta0, N, rule, opt);
  std::vector<std::vector<float>> models(N, theta0);
  std::vector<std::vector<ps_pull_status>> statuses(N);
  serve_and_work(N, server, [&](int k, inproc_endpoint& ep) {
    async_ps_worker<sa_momentum<>> w(layers3, rule);
    auto& model = models[std::size_t(k)];
    for (int c = 0; c < count_of(sched, k); ++c) {
      auto g = toy_gradient(model, k, c);
      statuses[std::size_t(k)].push_back(w.step(ep, g, lr, model).status);
    }
    w.leave(ep);
  });
  CHECK(bit_equal(server.model(), sim.server().model()));
  CHECK(server.state().timestamp() == 60);
  for (int k = 0; k < N; ++k) {
    CHECK(bit_equal(models[std::size_t(k)], sim.model(k)));
    CHECK(server.status(k) == ps_worker_status::left);
    for (auto s : statuses[std::size_t(k)]) CHECK(s == ps_pull_status::updated);
  }
  CHECK(server.stats().bytes_down == sim.server().stats().bytes_down);
  for (int k = 0; k < N; ++k)  // the same pushes, plus one leave frame (two 32-byte halves)
    CHECK(server.stats().bytes_up[std::size_t(k)] == sim.server().stats().bytes_up[std::size_t(k)] + 64);
}

TEST_CASE("async PS over inproc, free-running: nothing lost whatever the arrival order") {
  const int N = 4, steps = 25;
  const auto theta0 = dyadic_theta0(layers3.total());
  async_ps_options opt;
  opt.secondary_ratio = 20;
  const gd_async_rule<> rule{.ratio_percent = 10};
  async_ps_server<sparsifier_with_memory<>> server(layers3, theta0, N, rule, opt);
  std::vector<std::vector<float>> models(N, theta0), residuals(N);
  serve_and_work(N, server, [&](int k, inproc_endpoint& ep) {
    async_ps_worker<sparsifier_with_memory<>> w(layers3, rule);
    auto& model = models[std::size_t(k)];
    for (int c = 0; c < steps; ++c) CHECK(w.step(ep, dyadic_gradient(model.size(), k, c), 1.0f, model).status == ps_pull_status::updated);
    w.leave(ep);
    for (std::size_t j = 0; j < layers3.layers(); ++j) {
      auto r = w.uplink().codec(j).residual();
      residuals[std::size_t(k)].insert(residuals[std::size_t(k)].end(), r.begin(), r.end());
    }
  });
  CHECK(server.stats().pushes == std::uint64_t(N * steps));
  // theta_T = theta_0 - (everything pushed) and pushed + residual = sum of
  // gradients, per worker; with dyadic data both hold exactly in any order.
  std::vector<double> expect(theta0.begin(), theta0.end());
  for (int k = 0; k < N; ++k)
    for (int c = 0; c < steps; ++c) {
      auto g = dyadic_gradient(theta0.size(), k, c);
      for (std::size_t i = 0; i < g.size(); ++i) expect[i] -= g[i];
    }
  for (std::size_t i = 0; i < theta0.size(); ++i) {
    double v = server.model()[i];
    for (int k = 0; k < N; ++k) v -= residuals[std::size_t(k)][i];
    REQUIRE(v == expect[i]);
  }
  for (int k = 0; k < N; ++k) {
    CHECK(bit_equal(models[std::size_t(k)], server.state().replica(k)));
    CHECK(server.status(k) == ps_worker_status::left);
  }
  auto mem = server.memory();
  CHECK(mem.replica_bytes == std::size_t(N) * layers3.total() * sizeof(float));
}

TEST_CASE("async PS: two-bit uplink with a dense downlink (MXNet dist_async)") {
  const int N = 2, steps = 10;
  const auto theta0 = dyadic_theta0(layers3.total());
  auto rule = [](std::size_t, std::size_t n) { return two_bit_quantizer<>(n, two_bit_options::fixed(0.5f)); };
  async_ps_options opt;
  opt.downlink = ps_downlink::dense;
  async_ps_server<two_bit_quantizer<>> server(layers3, theta0, N, rule, opt);
  std::vector<std::vector<float>> residuals(N);
  std::vector<std::uint64_t> down(N);
  serve_and_work(N, server, [&](int k, inproc_endpoint& ep) {
    async_ps_worker<two_bit_quantizer<>> w(layers3, rule);
    std::vector<float> model(layers3.total(), 0.0f);
    w.join(ep, model);
    for (int c = 0; c < steps; ++c) CHECK(w.step(ep, dyadic_gradient(model.size(), k, c), 1.0f, model).status == ps_pull_status::updated);
    w.leave(ep);
    for (std::size_t j = 0; j < layers3.layers(); ++j) {
      auto r = w.uplink().codec(j).residual();
      residuals[std::size_t(k)].insert(residuals[std::size_t(k)].end(), r.begin(), r.end());
    }
    down[std::size_t(k)] = w.stats().bytes_down;
  });
  CHECK(server.memory().replica_bytes == 0);
  std::vector<double> expect(theta0.begin(), theta0.end());
  for (int k = 0; k < N; ++k)
    for (int c = 0; c < steps; ++c) {
      auto g = dyadic_gradient(theta0.size(), k, c);
      for (std::size_t i = 0; i < g.size(); ++i) expect[i] -= g[i];
    }
  for (std::size_t i = 0; i < theta0.size(); ++i) {
    double v = server.model()[i];
    for (int k = 0; k < N; ++k) v -= residuals[std::size_t(k)][i];
    REQUIRE(v == expect[i]);
  }
  // Every reply (the join's resync and each update) carries the dense model.
  const std::size_t dense_frame = 64 + layers3.layers() * 32 + layers3.total() * 4;
  for (int k = 0; k < N; ++k) CHECK(down[std::size_t(k)] == (steps + 1) * dense_frame);
}

TEST_CASE("async PS: QSGD uplink (a codec the server decodes with its own instances), dense downlink") {
  const auto theta0 = make_theta0(layers3.total(), 13);
  auto rule = [](std::size_t j, std::size_t) { return qsgd<>(qsgd_options{.bits = 4, .levels = 0, .bucket_size = 64, .seed = j}); };
  async_ps_options opt;
  opt.downlink = ps_downlink::dense;
  async_ps_server<qsgd<>> server(layers3, theta0, 2, rule, opt);
  std::vector<async_ps_worker<qsgd<>>> ws;
  ws.emplace_back(layers3, rule);
  ws.emplace_back(layers3, rule);
  std::vector<std::vector<float>> models(2, theta0);
  std::vector<float> ref = theta0;  // theta_0 minus every decoded push, in order
  qsgd<> decoder;
  for (int t = 0; t < 10; ++t) {
    const int k = t % 2;
    auto frame = ws[std::size_t(k)].make_push(toy_gradient(models[std::size_t(k)], k, t), 0.1f);
    const auto f = ps_split_frame(frame, layers3.layers());
    for (std::size_t j = 0; j < layers3.layers(); ++j) {
      const auto p = ps_parse_layer<qsgd_payload>(f.layers[j], layers3.size(j));
      std::vector<float> d(layers3.size(j));
      decoder.decode(p, d);
      for (std::size_t i = 0; i < d.size(); ++i) ref[layers3.offset(j) + i] -= d[i];
    }
    auto h = server.handle(k, frame);
    REQUIRE(h.event == ps_event::pushed);
    REQUIRE(ws[std::size_t(k)].apply_reply(h.reply, models[std::size_t(k)]).status == ps_pull_status::updated);
    REQUIRE(bit_equal(models[std::size_t(k)], server.model()));
    REQUIRE(bit_equal(ref, server.model()));
  }
  // A QSGD payload whose body contradicts itself is rejected, state unchanged.
  auto frame = ws[0].make_push(toy_gradient(models[0], 0, 99), 0.1f);
  const auto before = std::vector<float>(server.model().begin(), server.model().end());
  frame.resize(frame.size() - 4);
  CHECK(server.handle(0, frame).event == ps_event::rejected);
  CHECK(bit_equal(before, server.model()));
}

TEST_CASE("sync PS with the dense codec: every worker receives the exact average") {
  const int N = 4, rounds = 5;
  std::vector<std::vector<std::vector<float>>> got(N);
  sync_ps_server<dense_codec<>> server(layers3, N, asgd_rule<>{});
  serve_and_work(N, server, [&](int k, inproc_endpoint& ep) {
    sync_ps_worker<dense_codec<>> w(layers3, asgd_rule<>{});
    for (int r = 0; r < rounds; ++r) {
      auto g = dyadic_gradient(layers3.total(), k, r);
      auto res = w.exchange(ep, std::span<float>(g));
      if (res.contributors != N || res.rejected || res.round != std::uint64_t(r)) g.clear();
      got[std::size_t(k)].push_back(g);
    }
    w.leave(ep);
  });
  CHECK(server.rounds() == rounds);  // the leaves make no round
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < N; ++k) {
      REQUIRE(got[std::size_t(k)][std::size_t(r)].size() == layers3.total());
      CHECK(bit_equal(got[std::size_t(k)][std::size_t(r)], got[0][std::size_t(r)]));
    }
    for (std::size_t i = 0; i < layers3.total(); ++i) {
      double mean = 0;
      for (int k = 0; k < N; ++k) mean += dyadic_gradient(layers3.total(), k, r)[i];
      REQUIRE(double(got[0][std::size_t(r)][i]) == mean / N);
    }
  }
  for (int k = 0; k < N; ++k) CHECK(server.status(k) == ps_worker_status::left);
}

TEST_CASE("sync PS with sparse uplink and a re-encoded sparse downlink: nothing lost") {
  const int N = 3, rounds = 6;
  const gd_async_rule<> up{.ratio_percent = 20};
  auto down = [](std::size_t, std::size_t n) {
    sparsifier_options o;
    o.ratio_percent = 30;
    return sparsifier_with_memory<>(n, o);
  };
  sync_ps_options opt;
  opt.average = false;
  sync_ps_server<sparsifier_with_memory<>, sparsifier_with_memory<>> server(layers3, N, up, down, opt);
  std::vector<std::vector<double>> received(N, std::vector<double>(layers3.total(), 0.0));
  std::vector<std::vector<float>> residual(N);
  serve_and_work(N, server, [&](int k, inproc_endpoint& ep) {
    sync_ps_worker<sparsifier_with_memory<>, sparsifier_with_memory<>> w(layers3, up, down);
    for (int r = 0; r < rounds; ++r) {
      auto g = dyadic_gradient(layers3.total(), k, r);
      CHECK_FALSE(w.exchange(ep, std::span<float>(g)).rejected);
      for (std::size_t i = 0; i < g.size(); ++i) received[std::size_t(k)][i] += g[i];
    }
    w.leave(ep);
    for (std::size_t j = 0; j < layers3.layers(); ++j) {
      auto rr = w.uplink().codec(j).residual();
      residual[std::size_t(k)].insert(residual[std::size_t(k)].end(), rr.begin(), rr.end());
    }
  });
  // received + server residual = sum of all pushed = sum of gradients - worker residuals (exact, dyadic).
  for (std::size_t j = 0; j < layers3.layers(); ++j) {
    auto sr = server.down_codec(j).residual();
    for (std::size_t i = 0; i < layers3.size(j); ++i) {
      const std::size_t at = layers3.offset(j) + i;
      double total = 0;
      for (int k = 0; k < N; ++k) {
        for (int r = 0; r < rounds; ++r) total += dyadic_gradient(layers3.total(), k, r)[at];
        total -= residual[std::size_t(k)][at];
      }
      for (int k = 0; k < N; ++k) REQUIRE(received[std::size_t(k)][at] + sr[i] == total);
    }
  }
  CHECK_THROWS_AS((sync_ps_server<dense_codec<>>(layers3, N, asgd_rule<>{}).down_codec(0)), state_error);
}

TEST_CASE("faults, sync PS: a dead worker is dropped from later rounds; a corrupted push is left out") {
  const int N = 3, rounds = 5;
  std::vector<std::vector<ps_sync_result>> res(N);
  std::vector<std::vector<std::vector<float>>> got(N);
  sync_ps_server<dense_codec<>> server(layers3, N, asgd_rule<>{});
  serve_and_work(N, server, [&](int k, inproc_endpoint& ep) {
    fault_plan plan(3);
    if (k == 2) plan.kill_after_sends(2);                      // pushes rounds 0 and 1, then dies
    if (k == 1) plan.flip_random_bits(faults::nth_send(3), 2);  // its round-3 push is corrupted
    fault_injecting<inproc_endpoint> t(ep, plan);
    sync_ps_worker<dense_codec<>> w(layers3, asgd_rule<>{});
    try {
      for (int r = 0; r < rounds; ++r) {
        auto g = dyadic_gradient(layers3.total(), k, r);
        try {
          res[std::size_t(k)].push_back(w.exchange(t, std::span<float>(g)));
        } catch (const ps_push_rejected_error& e) {
          // The rejected push's round: the gradient is left as it was, the
          // error carries the round and the worker the others' aggregate.
          CHECK(bit_equal(g, dyadic_gradient(layers3.total(), k, r)));
          res[std::size_t(k)].push_back(e.result());
          g.assign(w.aggregate().begin(), w.aggregate().end());
        }
        got[std::size_t(k)].push_back(g);
      }
      w.leave(t);
    } catch (const transport_error&) {
    }
  });
  CHECK(res[2].size() == 1);  // its round-1 aggregate could not reach it
  CHECK(server.status(2) == ps_worker_status::gone);
  REQUIRE(res[0].size() == std::size_t(rounds));
  REQUIRE(res[1].size() == std::size_t(rounds));
  const std::vector<std::uint32_t> expect_count = {3, 3, 2, 1, 2};
  for (int r = 0; r < rounds; ++r) {
    CHECK(res[0][std::size_t(r)].contributors == expect_count[std::size_t(r)]);
    CHECK(res[1][std::size_t(r)].rejected == (r == 3));
    CHECK(bit_equal(got[0][std::size_t(r)], got[1][std::size_t(r)]));
  }
  // Round 3 is worker 0's gradient alone; round 2 the mean of workers 0 and 1.
  CHECK(bit_equal(got[0][3], dyadic_gradient(layers3.total(), 0, 3)));
  for (std::size_t i = 0; i < layers3.total(); ++i)
    REQUIRE(double(got[0][2][i]) ==
            (double(dyadic_gradient(layers3.total(), 0, 2)[i]) + double(dyadic_gradient(layers3.total(), 1, 2)[i])) / 2);
  CHECK(server.stats().rejected == 1);
}

TEST_CASE("ps_control: every malformed field is rejected") {
  ps_control good;
  good.kind = ps_kind::push;
  good.layers = 2;
  good.elements = 10;
  good.sequence = 7;
  const auto bytes = wire::serialize(good);
  const auto back = wire::parse<ps_control>(bytes);
  CHECK(back.kind == ps_kind::push);
  CHECK(back.layers == 2);
  CHECK(back.sequence == 7);
  CHECK(back.elements == 10);
  const std::vector<std::byte> body(bytes.begin() + 32, bytes.end());
  auto reject = [&](std::size_t at, std::uint8_t value, std::uint64_t elements = 10) {
    raw_control r{body, elements};
    r.body[at] = std::byte(value);
    try {
      (void)wire::parse<ps_control>(wire::serialize(r));
      return false;
    } catch (const wire::wire_error& e) {
      return e.code() == wire::wire_errc::malformed_body;
    }
  };
  CHECK(reject(0, 0x51));       // protocol id
  CHECK(reject(1, 0));          // kind 0
  CHECK(reject(1, 8));          // kind 8
  CHECK(reject(2, 1));          // detail on a push
  CHECK(reject(3, 1));          // reserved byte
  CHECK(reject(4, 0));          // push with 0 layers
  CHECK(reject(8, 1));          // count on a push
  CHECK(reject(12, 1));         // reserved word
  CHECK(reject(4, 11));         // more layers than elements
  CHECK(reject(1, 1));          // a join carrying layers
  CHECK(reject(1, 6));          // a reject carrying layers
  {
    raw_control r{body, 10};
    r.body.pop_back();
    CHECK_THROWS_AS((void)wire::parse<ps_control>(wire::serialize(r)), wire::wire_error);
    r.body.push_back(std::byte{0});
    r.body.push_back(std::byte{0});
    CHECK_THROWS_AS((void)wire::parse<ps_control>(wire::serialize(r)), wire::wire_error);
  }
  // A reject with an unknown reason, an aggregate with detail 2.
  ps_control rj;
  rj.kind = ps_kind::reject;
  rj.detail = 5;
  CHECK_THROWS_AS((void)wire::parse<ps_control>(wire::serialize(rj)), wire::wire_error);
  ps_control ag;
  ag.kind = ps_kind::aggregate;
  ag.layers = 1;
  ag.elements = 1;
  ag.detail = 2;
  CHECK_THROWS_AS((void)wire::parse<ps_control>(wire::serialize(ag)), wire::wire_error);
  ag.detail = 1;
  ag.count = 3;
  CHECK(wire::parse<ps_control>(wire::serialize(ag)).count == 3);
}

TEST_CASE("async server: every corrupted or malformed push is rejected and the state is unchanged") {
  const layer_partition L({5, 3});
  const auto theta0 = make_theta0(L.total(), 3);
  async_ps_options opt;
  opt.secondary_ratio = 50;
  async_ps_server<dense_codec<>> server(L, theta0, 2, asgd_rule<>{}, opt);
  async_ps_worker<dense_codec<>> w(L, asgd_rule<>{});
  std::vector<float> model = theta0;
  auto warm = server.handle(0, w.make_push(toy_gradient(model, 0, 0), 0.1f));
  REQUIRE(warm.event == ps_event::pushed);
  CHECK(w.apply_reply(warm.reply, model).status == ps_pull_status::updated);

  auto snapshot = [&] {
    std::vector<float> s(server.model().begin(), server.model().end());
    for (int k = 0; k < 2; ++k) s.insert(s.end(), server.state().replica(k).begin(), server.state().replica(k).end());
    s.push_back(float(server.state().timestamp()));
    return s;
  };
  const auto before = snapshot();
  const auto frame = w.make_push(toy_gradient(model, 0, 1), 0.1f);
  auto expect_rejected = [&](std::span<const std::byte> bytes, ps_reject_reason why) {
    auto h = server.handle(0, bytes);
    if (h.event != ps_event::rejected) return false;
    auto c = wire::parse<ps_control>(h.reply);
    return c.kind == ps_kind::reject && c.detail == std::uint8_t(why);
  };
  // Every single-bit flip anywhere in the frame.
  for (std::size_t bit = 0; bit < frame.size() * 8; ++bit) {
    auto bad = frame;
    bad[bit / 8] ^= std::byte(1u << (bit % 8));
    REQUIRE(expect_rejected(bad, ps_reject_reason::malformed));
  }
  // Every truncation, and trailing bytes.
  for (std::size_t n = 0; n < frame.size(); ++n)
    REQUIRE(expect_rejected(std::span<const std::byte>(frame).first(n), ps_reject_reason::malformed));
  auto longer = frame;
  longer.push_back(std::byte{0});
  CHECK(expect_rejected(longer, ps_reject_reason::malformed));
  CHECK(server.apply_push(0, frame).sequence == w.sequence());  // the intact frame is fine...
  const auto after_good = snapshot();
  CHECK(after_good != before);
  // ...and after it, well-formed frames with bad content.
  ps_frame_builder b;
  ps_control c;
  c.kind = ps_kind::push;
  c.layers = 2;
  c.elements = 8;
  b.start(c);
  b.append(dense_payload{{1, 2, 3, std::nanf(""), 5}});
  b.append(dense_payload{{1, 2, 3}});
  // NaN/Inf in a payload body is rejected when the layer is parsed (one
  // validation policy for every payload, payloads/dense.hpp): malformed.
  CHECK(expect_rejected(b.take(), ps_reject_reason::malformed));
  b.start(c);
  b.append(dense_payload{{1, 2, 3, 4}});  // layer 0 has 5 elements
  b.append(dense_payload{{1, 2, 3, 4}});
  CHECK(expect_rejected(b.take(), ps_reject_reason::malformed));
  b.start(c);
  sparse_coo_payload sp;
  sp.length = 5;
  b.append(sp);  // a sparse layer to a dense-codec server: wrong codec
  b.append(dense_payload{{1, 2, 3}});
  CHECK(expect_rejected(b.take(), ps_reject_reason::malformed));
  ps_control one = c;
  one.layers = 1;
  one.elements = 5;
  b.start(one);
  b.append(dense_payload{{1, 2, 3, 4, 5}});
  CHECK(expect_rejected(b.take(), ps_reject_reason::bad_shape));
  ps_control wrong_total = c;
  wrong_total.elements = 9;
  b.start(wrong_total);
  b.append(dense_payload{{1, 2, 3, 4, 5}});
  b.append(dense_payload{{1, 2, 3}});
  CHECK(expect_rejected(b.take(), ps_reject_reason::bad_shape));
  ps_control upd = c;
  upd.kind = ps_kind::update;
  b.start(upd);
  b.append(dense_payload{{1, 2, 3, 4, 5}});
  b.append(dense_payload{{1, 2, 3}});
  CHECK(expect_rejected(b.take(), ps_reject_reason::protocol));
  CHECK(snapshot() == after_good);
  // The typed errors of the low-level call.
  b.start(c);
  b.append(dense_payload{{1, 2, 3, std::nanf(""), 5}});
  b.append(dense_payload{{1, 2, 3}});
  CHECK_THROWS_AS(server.apply_push(1, b.take()), wire::wire_error);
  b.start(one);
  b.append(dense_payload{{1, 2, 3, 4, 5}});
  CHECK_THROWS_AS(server.apply_push(1, b.take()), size_mismatch_error);
  CHECK_THROWS_AS(server.apply_push(1, std::span<const std::byte>(frame).first(40)), wire::wire_error);
  CHECK_THROWS_AS(server.apply_push(1, w.make_join()), wire::wire_error);
  CHECK_THROWS_AS(server.handle(2, frame), invalid_argument_error);
  CHECK(snapshot() == after_good);
  CHECK(server.stats().rejected >= frame.size() * 8 + frame.size());
}

TEST_CASE("async worker: malformed and stale replies") {
  const layer_partition L({4, 4});
  const auto theta0 = make_theta0(L.total(), 4);
  async_ps_server<dense_codec<>> server(L, theta0, 1, asgd_rule<>{});
  async_ps_worker<dense_codec<>> w(L, asgd_rule<>{});
  std::vector<float> model = theta0;
  auto h1 = server.handle(0, w.make_push(toy_gradient(model, 0, 0), 0.1f));
  auto h2 = server.handle(0, w.make_push(toy_gradient(model, 0, 1), 0.1f));
  // The reply to push 1 is stale now: ignored.
  const auto before = model;
  CHECK(w.apply_reply(h1.reply, model).status == ps_pull_status::stale);
  CHECK(model == before);
  // Corrupted replies throw and leave the model alone.
  for (std::size_t bit = 0; bit < h2.reply.size() * 8; bit += 7) {
    auto bad = h2.reply;
    bad[bit / 8] ^= std::byte(1u << (bit % 8));
    CHECK_THROWS_AS((void)w.apply_reply(bad, model), wire::wire_error);
    REQUIRE(model == before);
  }
  CHECK_THROWS_AS((void)w.apply_reply(w.make_push(toy_gradient(model, 0, 2), 0.1f), model), wire::wire_error);
  std::vector<float> short_model(7);
  CHECK_THROWS_AS((void)w.apply_reply(h2.reply, short_model), size_mismatch_error);
  // A reject answering an unparseable request (sequence 0) answers the latest request.
  auto rej = ps_detail::serialize_reject(0, ps_reject_reason::malformed);
  auto r = w.apply_reply(rej, model);
  CHECK(r.status == ps_pull_status::rejected);
  CHECK(r.reason == ps_reject_reason::malformed);
  CHECK(model == before);
  CHECK_THROWS_AS((async_ps_worker<dense_codec<>>(L, asgd_rule<>{}, {.max_rejoins = -1})), invalid_argument_error);
}

TEST_CASE("async server: construction and serve errors") {
  const auto theta0 = make_theta0(layers3.total(), 5);
  async_ps_options bad_sched;
  bad_sched.schedule = {0, 3};
  CHECK_THROWS_AS((async_ps_server<dense_codec<>>(layers3, theta0, 3, asgd_rule<>{}, bad_sched)), invalid_argument_error);
  async_ps_options same_tags;
  same_tags.tag_down = same_tags.tag_up;
  CHECK_THROWS_AS((async_ps_server<dense_codec<>>(layers3, theta0, 3, asgd_rule<>{}, same_tags)), invalid_argument_error);
  async_ps_options idle;
  idle.idle_timeout = 0ns;
  CHECK_THROWS_AS((async_ps_server<dense_codec<>>(layers3, theta0, 3, asgd_rule<>{}, idle)), invalid_argument_error);
  async_ps_server<dense_codec<>> server(layers3, theta0, 3, asgd_rule<>{});
  inproc_fabric f3(3);
  CHECK_THROWS_AS(server.serve(f3.endpoint(0)), invalid_argument_error);  // 3 ranks for 3 workers + server
  inproc_fabric f4(4);
  CHECK_THROWS_AS(server.serve(f4.endpoint(1)), invalid_argument_error);  // not rank 0
  CHECK_THROWS_AS((sync_ps_server<dense_codec<>>(layers3, 0, asgd_rule<>{})), invalid_argument_error);
  sync_ps_server<dense_codec<>> sync(layers3, 2, asgd_rule<>{});
  CHECK_THROWS_AS(sync.serve(f4.endpoint(0)), invalid_argument_error);
  std::vector<std::vector<std::byte>> frames(3);
  CHECK_THROWS_AS(sync.round(frames), size_mismatch_error);
}

TEST_CASE("faults: a worker that dies mid-run stalls neither the server nor the others") {
  const int N = 3, steps = 10;
  const auto theta0 = make_theta0(layers3.total(), 6);
  const dgs_rule<> rule{.ratio_percent = 10};
  async_ps_options opt;
  opt.secondary_ratio = 20;
  async_ps_server<sa_momentum<>> server(layers3, theta0, N, rule, opt);
  std::vector<std::vector<float>> models(N, theta0);
  std::vector<int> done(N, 0);
  serve_and_work(N, server, [&](int k, inproc_endpoint& ep) {
    fault_plan plan;
    if (k == 2) plan.kill_after_sends(4);  // dies right after its 4th push
    fault_injecting<inproc_endpoint> t(ep, plan);
    async_ps_worker<sa_momentum<>> w(layers3, rule);
    auto& model = models[std::size_t(k)];
    try {
      for (int c = 0; c < steps; ++c) {
        (void)w.step(t, toy_gradient(model, k, c), 0.05f, model);
        ++done[std::size_t(k)];
      }
      w.leave(t);
    } catch (const transport_error&) {
      // the dead worker: its transport refuses everything now
    }
  });
  CHECK(done[0] == steps);
  CHECK(done[1] == steps);
  CHECK(done[2] == 3);  // its 4th push was applied but the reply never reached it
  CHECK(server.status(0) == ps_worker_status::left);
  CHECK(server.status(1) == ps_worker_status::left);
  CHECK(server.status(2) == ps_worker_status::gone);
  CHECK(server.stats().pushes == 2 * steps + 4);
  // The reply to the 4th push fails when the worker is already dead (1), or,
  // where the server replied between that push and the worker's death (a
  // loaded machine), lands in a dead inbox and the probe after the next
  // receive timeout finds the worker gone (0). Either way it is `gone`.
  CHECK(server.stats().send_failures <= 1);
  for (int k = 0; k < 2; ++k) CHECK(bit_equal(models[std::size_t(k)], server.state().replica(k)));
}

TEST_CASE("faults: a worker dead from the start is found by the probe after a receive timeout") {
  const int N = 3;
  const auto theta0 = make_theta0(layers3.total(), 7);
  async_ps_server<dense_codec<>> server(layers3, theta0, N, asgd_rule<>{});
  inproc_fabric fabric(N + 1);
  fabric.endpoint(0).set_recv_timeout(100ms);
  fabric.run([&](inproc_endpoint& ep) {
    if (ep.rank() == 0) {
      server.serve(ep);
      return;
    }
    const int k = ep.rank() - 1;
    fault_plan plan;
    if (k == 1) plan.kill_after_sends(0);
    fault_injecting<inproc_endpoint> t(ep, plan);
    if (t.killed()) return;
    async_ps_worker<dense_codec<>> w(layers3, asgd_rule<>{});
    std::vector<float> model = theta0;
    for (int c = 0; c < 3; ++c) (void)w.step(t, toy_gradient(model, k, c), 0.05f, model);
    w.leave(t);
  });
  CHECK(server.status(0) == ps_worker_status::left);
  CHECK(server.status(1) == ps_worker_status::gone);
  CHECK(server.status(2) == ps_worker_status::left);
  CHECK(server.stats().pushes == 6);
}

TEST_CASE("faults: a corrupted push is rejected, the run goes on, and equals the run without that push") {
  const int N = 3;
  const float lr = 0.05f;
  const auto theta0 = make_theta0(layers3.total(), 8);
  const auto sched = schedule_of(N, 45, 9);
  const dgc_async_rule<> rule{.ratio_percent = 10, .momentum = 0.7f};
  async_ps_options opt;
  opt.secondary_ratio = 25;
  // Reference: worker 1's third push is encoded (its codec state moves on) but never arrives.
  async_ps_simulation<sparsifier_with_memory<>> sim(layers3, theta0, N, rule, opt);
  std::vector<int> local(N, 0);
  for (int k : sched) {
    const int c = local[std::size_t(k)]++;
    auto g = toy_gradient(sim.model(k), k, c);
    if (k == 1 && c == 2)
      (void)sim.worker(k).make_push(g, lr);
    else
      (void)sim.step(k, g, lr);
  }
  opt.schedule = sched;
  async_ps_server<sparsifier_with_memory<>> server(layers3, theta0, N, rule, opt);
  std::vector<std::vector<float>> models(N, theta0);
  std::vector<std::vector<ps_pull_status>> statuses(N);
  serve_and_work(N, server, [&](int k, inproc_endpoint& ep) {
    fault_plan plan(5);
    if (k == 1) plan.flip_random_bits(faults::nth_send(2), 3);
    fault_injecting<inproc_endpoint> t(ep, plan);
    async_ps_worker<sparsifier_with_memory<>> w(layers3, rule);
    auto& model = models[std::size_t(k)];
    for (int c = 0; c < count_of(sched, k); ++c)
      statuses[std::size_t(k)].push_back(w.step(t, toy_gradient(model, k, c), lr, model).status);
    w.leave(t);
  });
  CHECK(server.stats().rejected == 1);
  REQUIRE(statuses[1].size() > 2);
  CHECK(statuses[1][2] == ps_pull_status::rejected);
  CHECK(std::count(statuses[1].begin(), statuses[1].end(), ps_pull_status::rejected) == 1);
  CHECK(bit_equal(server.model(), sim.server().model()));
  for (int k = 0; k < N; ++k) {
    CHECK(bit_equal(models[std::size_t(k)], sim.model(k)));
    CHECK(bit_equal(models[std::size_t(k)], server.state().replica(k)));
  }
}

TEST_CASE("faults: a slow worker does not hold the others back, and finishes too") {
  const int N = 3, steps = 6;
  const auto theta0 = make_theta0(layers3.total(), 10);
  const dgs_rule<> rule{.ratio_percent = 10};
  async_ps_server<sa_momentum<>> server(layers3, theta0, N, rule);
  std::vector<std::vector<float>> models(N, theta0);
  serve_and_work(N, server, [&](int k, inproc_endpoint& ep) {
    fault_plan plan;
    if (k == 0) plan.delay(faults::every_send(), 20ms);
    fault_injecting<inproc_endpoint> t(ep, plan);
    async_ps_worker<sa_momentum<>> w(layers3, rule);
    auto& model = models[std::size_t(k)];
    for (int c = 0; c < steps; ++c) (void)w.step(t, toy_gradient(model, k, c), 0.05f, model);
    w.leave(t);
  });
  CHECK(server.stats().pushes == std::uint64_t(N * steps));
  for (int k = 0; k < N; ++k) {
    CHECK(server.status(k) == ps_worker_status::left);
    CHECK(server.stats().pushes_per_worker[std::size_t(k)] == std::uint64_t(steps));
    CHECK(bit_equal(models[std::size_t(k)], server.state().replica(k)));
  }
}

TEST_CASE("faults: a lost reply makes the worker rejoin and receive a dense resync") {
  const int N = 2, steps = 5;
  const auto theta0 = make_theta0(layers3.total(), 11);
  const gd_async_rule<> rule{.ratio_percent = 10};
  async_ps_server<sparsifier_with_memory<>> server(layers3, theta0, N, rule);
  std::vector<std::vector<float>> models(N, theta0);
  std::vector<std::vector<ps_pull_status>> statuses(N);
  std::vector<ps_worker_stats> wstats(N);
  inproc_fabric fabric(N + 1);
  fabric.run([&](inproc_endpoint& ep) {
    if (ep.rank() == 0) {
      fault_plan plan;
      plan.drop([](const transport::send_info& s) { return s.dest == 2; }, 1);  // worker 1's first reply
      fault_injecting<inproc_endpoint> t(ep, plan);
      server.serve(t);
      return;
    }
    const int k = ep.rank() - 1;
    ep.set_recv_timeout(400ms);
    async_ps_worker<sparsifier_with_memory<>> w(layers3, rule);
    auto& model = models[std::size_t(k)];
    for (int c = 0; c < steps; ++c) statuses[std::size_t(k)].push_back(w.step(ep, toy_gradient(model, k, c), 0.05f, model).status);
    w.leave(ep);
    wstats[std::size_t(k)] = w.stats();
  });
  CHECK(statuses[1][0] == ps_pull_status::resynced);
  CHECK(wstats[1].rejoins == 1);
  CHECK(wstats[1].resyncs == 1);
  CHECK(std::count(statuses[0].begin(), statuses[0].end(), ps_pull_status::updated) == steps);
  CHECK(server.stats().joins == 1);
  for (int k = 0; k < N; ++k) CHECK(bit_equal(models[std::size_t(k)], server.state().replica(k)));
}

TEST_CASE("async PS: a worker that left and comes back gets a dense resync") {
  const layer_partition L({6, 2});
  const auto theta0 = make_theta0(L.total(), 12);
  async_ps_simulation<sa_momentum<>> sim(L, theta0, 2, dgs_rule<>{.ratio_percent = 50});
  for (int c = 0; c < 4; ++c) (void)sim.step(c % 2, toy_gradient(sim.model(c % 2), c % 2, c), 0.1f);
  auto& server = sim.server();
  CHECK(server.handle(1, sim.worker(1).make_leave()).event == ps_event::left);
  CHECK(server.status(1) == ps_worker_status::left);
  (void)sim.step(0, toy_gradient(sim.model(0), 0, 9), 0.1f);
  // A push from a worker that left is applied and answered with a resync.
  auto r = sim.step(1, toy_gradient(sim.model(1), 1, 9), 0.1f);
  CHECK(r.status == ps_pull_status::resynced);
  CHECK(bit_equal(sim.model(1), server.model()));
  CHECK(server.status(1) == ps_worker_status::active);
  server.mark_gone(0);
  CHECK(server.status(0) == ps_worker_status::gone);
  std::fill(sim.model(0).begin(), sim.model(0).end(), 123.0f);
  CHECK(sim.join(0).status == ps_pull_status::resynced);
  CHECK(bit_equal(sim.model(0), server.model()));
  CHECK(server.status(0) == ps_worker_status::active);
}

TEST_CASE("PS tags: defaults from the registry's parameter-server range; a tag in another piece's range is refused") {
  static_assert(ps_default_tag_up == tags::parameter_server.first);
  static_assert(ps_default_tag_down == tags::parameter_server.first + 1);
  CHECK(tags::parameter_server.contains(sync_ps_options{}.tag_up));
  CHECK(tags::parameter_server.contains(async_ps_options{}.tag_down));
  CHECK(async_ps_worker_options{}.tag_up == 31000);
  CHECK(async_ps_worker_options{}.tag_down == 31001);
  const auto theta0 = make_theta0(layers3.total(), 5);
  for (int bad : {tags::ring.first, tags::lgc.first + 3, tags::exchange.first, -1, 40000}) {
    CAPTURE(bad);
    async_ps_options a;
    a.tag_up = bad;
    CHECK_THROWS_AS((async_ps_server<dense_codec<>>(layers3, theta0, 2, asgd_rule<>{}, a)), invalid_argument_error);
    sync_ps_options s;
    s.tag_down = bad;
    CHECK_THROWS_AS((sync_ps_server<dense_codec<>>(layers3, 2, asgd_rule<>{}, {}, s)), invalid_argument_error);
    async_ps_worker_options w;
    w.tag_down = bad;
    CHECK_THROWS_AS((async_ps_worker<dense_codec<>>(layers3, asgd_rule<>{}, w)), invalid_argument_error);
    CHECK_THROWS_AS((sync_ps_worker<dense_codec<>>(layers3, asgd_rule<>{}, {}, w)), invalid_argument_error);
  }
  // Tags moved into the user's range (or elsewhere in the PS range) work.
  sync_ps_options moved;
  moved.tag_up = 100;
  moved.tag_down = tags::parameter_server.first + 7;
  sync_ps_server<dense_codec<>> server(layers3, 2, asgd_rule<>{}, {}, moved);
  std::vector<std::vector<float>> got(2);
  serve_and_work(2, server, [&](int k, inproc_endpoint& ep) {
    sync_ps_worker<dense_codec<>> w(layers3, asgd_rule<>{}, {},
                                    {.tag_up = moved.tag_up, .tag_down = moved.tag_down});
    auto g = dyadic_gradient(layers3.total(), k, 0);
    CHECK(w.exchange(ep, std::span<float>(g)).contributors == 2);
    got[std::size_t(k)] = g;
    w.leave(ep);
  });
  CHECK(bit_equal(got[0], got[1]));
}

TEST_CASE("sync PS: a push the server rejects (codec mismatch) throws ps_push_rejected_error, gradient unchanged") {
  // The server expects sparse COO layers (GD-async uplink); worker 0 sends
  // dense ones: its push is left out and it must not take the others' mean
  // for its own result.
  const int N = 2;
  sync_ps_server<sparsifier_with_memory<>> server(layers3, N, gd_async_rule<>{.ratio_percent = 100});
  std::vector<float> aggregate_seen_by_0, aggregate_of_1;
  serve_and_work(N, server, [&](int k, inproc_endpoint& ep) {
    const auto g0 = dyadic_gradient(layers3.total(), k, 0);
    auto g = g0;
    if (k == 0) {
      sync_ps_worker<dense_codec<>> w(layers3, asgd_rule<>{});
      bool threw = false;
      try {
        (void)w.exchange(ep, std::span<float>(g));
      } catch (const ps_push_rejected_error& e) {
        threw = true;
        CHECK(e.result().rejected);
        CHECK(e.result().contributors == 1);
        CHECK(e.result().round == 0);
      }
      CHECK(threw);
      CHECK(bit_equal(g, g0));  // not overwritten
      CHECK(w.stats().rejected == 1);
      aggregate_seen_by_0.assign(w.aggregate().begin(), w.aggregate().end());
      w.leave(ep);
    } else {
      sync_ps_worker<sparsifier_with_memory<>> w(layers3, gd_async_rule<>{.ratio_percent = 100});
      const auto r = w.exchange(ep, std::span<float>(g));
      CHECK_FALSE(r.rejected);
      CHECK(r.contributors == 1);
      CHECK(bit_equal(g, g0));  // the mean of its own push alone (R = 100%: all of it)
      aggregate_of_1 = g;
      w.leave(ep);
    }
  });
  CHECK(bit_equal(aggregate_seen_by_0, aggregate_of_1));
  CHECK(server.stats().rejected == 1);
  CHECK(server.stats().last_error.find("codec") != std::string::npos);
}

TEST_CASE("sync PS: a layer-layout mismatch is a layout_error on both sides, not a wire error") {
  // Same total, other layer count; and same count and total, other sizes.
  for (const auto& other : {layer_partition({37, 205}), layer_partition({40, 197, 5})}) {
    CAPTURE(other.layers());
    sync_ps_server<dense_codec<>> server(layers3, 1, asgd_rule<>{});
    serve_and_work(1, server, [&](int, inproc_endpoint& ep) {
      sync_ps_worker<dense_codec<>> w(other, asgd_rule<>{});
      auto g = dyadic_gradient(other.total(), 0, 0);
      const auto before = g;
      CHECK_THROWS_AS((void)w.exchange(ep, std::span<float>(g)), layout_error);
      CHECK(bit_equal(g, before));
      w.leave(ep);
    });
    CHECK(server.stats().rejected == 1);
    CHECK(server.stats().last_error.find("the model has") != std::string::npos);
  }
  // The transport-free half too: an aggregate of the server's layout.
  sync_ps_server<dense_codec<>> server(layers3, 1, asgd_rule<>{});
  sync_ps_worker<dense_codec<>> w(layer_partition({40, 197, 5}), asgd_rule<>{});
  std::vector<float> g = dyadic_gradient(layers3.total(), 0, 0);
  std::vector<std::vector<std::byte>> frames(1);
  frames[0] = w.make_push(g);
  const auto replies = server.round(frames);
  REQUIRE(replies[0].size() > 0);
  const auto before = g;
  CHECK_THROWS_AS((void)w.apply_aggregate(replies[0], std::span<float>(g)), layout_error);
  CHECK(bit_equal(g, before));
}
