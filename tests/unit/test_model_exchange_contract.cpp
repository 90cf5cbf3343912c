// The bucket contract with a codec the library does not ship: a two-round
// agreed-scale quantizer (a max round of the per-layer scales, then a sum
// round of integer codes, the pattern of issue 22's homomorphic quantizer)
// plugged in through plan_options::custom_factory and bucket_codec_model.
// The control block then rides in a max round.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include <gradcomp/model_exchange.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <support/equality.hpp>

namespace gx = gradcomp::exchange;
using gradcomp::test_support::bit_equal;
using gradcomp::transport::inproc_endpoint;

namespace {

/// Round 0: max over ranks of each layer's max |g|; round 1: the sum of
/// round(g / scale * 127) as floats; decode: sum * scale / 127.
struct agreed_scale_codec {
  std::vector<std::size_t> lengths;
  std::size_t total = 0;
  std::vector<std::span<const float>> in;
  std::vector<float> scale;
  std::span<const float> sums;
  std::uint64_t steps = 0, undo = 0;

  void begin(const gx::step_context&) {}
  void prepare(const gx::step_context&, std::span<const std::span<const float>> g) {
    in.assign(g.begin(), g.end());
    undo = steps++;
  }
  std::size_t rounds() const { return 2; }
  gx::round_spec round(std::size_t r) const {
    if (r == 0) return {gx::round_op::max, gx::buffer_element::float32, lengths.size(), gx::after_reduce_check::finite};
    return {gx::round_op::sum, gx::buffer_element::float32, total, gx::after_reduce_check::finite};
  }
  void contribute(std::size_t r, std::span<float> buf) {
    std::size_t at = 0;
    for (std::size_t j = 0; j < in.size(); ++j) {
      if (r == 0) {
        float m = 0.0f;
        for (float v : in[j]) m = std::max(m, std::abs(v));
        buf[j] = m;
      } else {
        for (float v : in[j]) buf[at++] = scale[j] > 0.0f ? std::round(v / scale[j] * 127.0f) : 0.0f;
      }
    }
  }
  std::vector<std::byte> contribute(std::size_t) { throw gradcomp::state_error("no all-gather round"); }
  void absorb(std::size_t r, std::span<const float> x) {
    if (r == 0) scale.assign(x.begin(), x.end());
    else sums = x;
  }
  void absorb(std::size_t, std::span<const std::vector<std::byte>>) { throw gradcomp::state_error("no all-gather round"); }
  void finish(std::span<const std::span<float>> out) {
    std::size_t at = 0;
    for (std::size_t j = 0; j < out.size(); ++j)
      for (auto& v : out[j]) v = sums[at++] * scale[j] / 127.0f;
  }
  void abandon() { steps = undo; }
  bool vote() const { return false; }
  std::uint64_t digest() const { return steps; }
  std::vector<std::byte> save_state() const {
    std::vector<std::byte> b(8);
    std::memcpy(b.data(), &steps, 8);
    return b;
  }
  void restore_state(std::span<const std::byte> b) {
    if (b.size() != 8) throw gradcomp::layout_error("agreed_scale_codec: bad state");
    std::memcpy(&steps, b.data(), 8);
  }
};
static_assert(gx::BucketCodec<agreed_scale_codec>);

gx::plan custom_plan() {
  gx::model_description m;
  m.add_dense("emb", 300).add_dense("fc", 200).add_dense("bias", 10, 1);
  gx::plan_options o;
  o.rules.small_below = 16;
  o.rules.explicit_choices = {{"emb", gx::codec_kind::custom}, {"fc", gx::codec_kind::custom}};
  o.custom_name = "agreed_scale_127";
  o.custom_factory = [](const gx::plan& p, const gx::bucket_desc& b, int, int) {
    agreed_scale_codec c;
    for (auto i : b.layers) c.lengths.push_back(p.model()[i].shape.size());
    for (auto n : c.lengths) c.total += n;
    return std::make_unique<gx::bucket_codec_model<agreed_scale_codec>>(std::move(c), b.layers.size(), "agreed_scale");
  };
  return gx::plan(std::move(m), o);
}

std::vector<std::vector<float>> gradients(const gx::model_description& m, int rank, int step) {
  std::vector<std::vector<float>> g;
  for (const auto& l : m.layers()) {
    std::vector<float> v(l.shape.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.3f * float(i) + float(rank) + 0.1f * float(step));
    g.push_back(std::move(v));
  }
  return g;
}

}  // namespace

TEST_CASE("contract: a two-round custom codec (max, then sum) runs inside the exchange") {
  const int n = 3;
  const auto plan = custom_plan();
  REQUIRE(plan.buckets().front().kind == gx::codec_kind::custom);  // the control block rides in its max round
  std::vector<std::vector<std::vector<float>>> out(n);
  std::vector<gx::step_stats> st(n);
  gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, plan);
    auto g = gradients(plan.model(), ep.rank(), 0);
    std::vector<std::span<float>> s(g.begin(), g.end());
    st[std::size_t(ep.rank())] = ex.step(s);
    out[std::size_t(ep.rank())] = g;
  });
  for (int r = 1; r < n; ++r)
    for (std::size_t l = 0; l < 3; ++l) CHECK(bit_equal(out[std::size_t(r)][l], out[0][l]));
  CHECK(st[0].rounds == 3);  // max + sum for the custom bucket, one sum for the dense bucket
  CHECK(st[0].bucket_phase.front() == "agreed_scale");
  // Every element within N * (scale / 127) / 2 of the mean (scale <= 1), divided by N.
  std::vector<std::vector<std::vector<float>>> g(n);
  for (int r = 0; r < n; ++r) g[std::size_t(r)] = gradients(plan.model(), r, 0);
  for (std::size_t l = 0; l < 2; ++l)
    for (std::size_t i = 0; i < g[0][l].size(); ++i) {
      float mean = 0.0f;
      for (int r = 0; r < n; ++r) mean += g[std::size_t(r)][l][i];
      mean /= float(n);
      CHECK(std::abs(out[0][l][i] - mean) <= 0.5f / 127.0f + 1e-6f);
    }
}

TEST_CASE("contract: a failure is agreed through a max round, and the custom state rolls back") {
  const int n = 4;
  const auto plan = custom_plan();
  std::vector<int> ok(n, 0);
  gradcomp::transport::run_workers(n, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, plan);
    auto g = gradients(plan.model(), ep.rank(), 0);
    std::vector<std::span<float>> s(g.begin(), g.end());
    ex.step(s);
    const auto before = ex.save_state();
    auto h = gradients(plan.model(), ep.rank(), 1);
    if (ep.rank() == 0) h[1][7] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::span<float>> t(h.begin(), h.end());
    const auto& st = ex.step(t);
    ok[std::size_t(ep.rank())] = st.skipped && st.failures.size() == 1 && st.failures[0].rank == 0 &&
                                 st.failures[0].layer == 1 && ex.save_state() == before;
  });
  for (int r = 0; r < n; ++r) CHECK(ok[std::size_t(r)] == 1);
}

/// Another schedule plugs in as a RoundCollectives type: here gradcomp's ring, counting its calls.
struct counting_collectives {
  int* sums;
  int* maxes;
  int* gathers;
  gx::ring_collectives<> ring;
  template <class T>
  void sum(T& t, std::span<float> d, gx::buffer_element e, int tag, gx::wire_counters& c) {
    ++*sums;
    ring.sum(t, d, e, tag, c);
  }
  template <class T>
  void max(T& t, std::span<float> d, gx::buffer_element e, int tag, gx::wire_counters& c) {
    ++*maxes;
    ring.max(t, d, e, tag, c);
  }
  template <class T>
  std::vector<std::vector<std::byte>> all_gather(T& t, std::vector<std::byte> b, int tag, gx::wire_counters& c) {
    ++*gathers;
    return ring.all_gather(t, std::move(b), tag, c);
  }
};

TEST_CASE("contract: the exchange's collectives are a plug-in point") {
  const auto plan = custom_plan();
  std::vector<int> sums(2, 0), maxes(2, 0), gathers(2, 0);
  gradcomp::transport::run_workers(2, [&](inproc_endpoint& ep) {
    const auto r = std::size_t(ep.rank());
    gx::model_exchange<inproc_endpoint, gradcomp::execution::seq, counting_collectives> ex(
        ep, plan, {}, counting_collectives{&sums[r], &maxes[r], &gathers[r], {}});
    auto g = gradients(plan.model(), ep.rank(), 0);
    std::vector<std::span<float>> s(g.begin(), g.end());
    CHECK_FALSE(ex.step(s).skipped);
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(sums[std::size_t(r)] == 2);  // the custom bucket's sum round and the dense bucket's
    CHECK(maxes[std::size_t(r)] == 1);
    CHECK(gathers[std::size_t(r)] == 0);
  }
}

TEST_CASE("contract: custom layers without a factory are refused") {
  gx::model_description m;
  m.add_dense("a", 100);
  gx::plan_options o;
  o.rules.small_below = 0;
  o.rules.fallback = gx::codec_kind::custom;
  CHECK_THROWS_AS(gx::plan(m, o), gradcomp::invalid_argument_error);
}

TEST_CASE("statistics: the ring's sum rounds report their wait on the transport") {
  static_assert(gradcomp::Transport<gx::wait_timing_transport<inproc_endpoint>>);
  gx::model_description m;
  m.add_dense("a", 1000).add_dense("b", 3000);
  gx::plan_options o;
  o.rules.small_below = 0;
  const gx::plan plan(m, o);
  std::vector<double> wait(3, -1.0), wire(3, -1.0);
  gradcomp::transport::run_workers(3, [&](inproc_endpoint& ep) {
    gx::model_exchange ex(ep, plan);
    std::vector<std::vector<float>> g = {std::vector<float>(1000, 1.0f), std::vector<float>(3000, 2.0f)};
    if (ep.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others wait for rank 0
    std::vector<std::span<float>> s(g.begin(), g.end());
    const auto& st = ex.step(s);
    CHECK(g[1][7] == 2.0f);
    wait[std::size_t(ep.rank())] = st.wire.wait_seconds;
    wire[std::size_t(ep.rank())] = st.wire.wire_seconds;
  });
  for (int r = 0; r < 3; ++r) CHECK(wait[std::size_t(r)] <= wire[std::size_t(r)]);
  CHECK(wait[1] > 0.02);  // rank 1 receives from rank 0, which started 50 ms late
}
