// Tests of nn1d.hpp: shapes, forward correctness against direct loops,
// adjointness of conv / transposed conv, finite-difference gradients of every
// layer and loss, deterministic initialisation and training, weights
// save/load and every error path.

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <gradcomp/detail/random.hpp>
#include <gradcomp/nn1d.hpp>
#include <gradcomp/wire.hpp>

using namespace gradcomp;
using namespace gradcomp::nn1d;

namespace {

template <class T>
tensor<T> random_tensor(index_type channels, index_type length, index_type batch, std::uint64_t seed) {
  const gradcomp::detail::counter_rng rng(seed);
  const auto s = rng.stream(7);
  tensor<T> t;
  t.resize(channels, length, batch);
  for (index_type i = 0; i < t.data.size(); ++i) t.data.data()[i] = static_cast<T>(2.0 * s.uniform_double(std::uint64_t(i)) - 1.0);
  return t;
}

template <class T>
void randomize(sequential<T>& net, std::uint64_t seed) {
  // Non-zero biases so the bias gradients are exercised too.
  net.initialize(seed);
  const gradcomp::detail::counter_rng rng(seed + 1);
  std::uint64_t c = 0;
  for (auto& p : net.parameters())
    if (p.value.size() > 0)
      for (auto& v : p.value) v += static_cast<T>(0.1 * (2.0 * rng.stream(1).uniform_double(c++) - 1.0));
}

// Direct-loop reference conv1d (PyTorch semantics) using the layer's weight layout.
matrix<double> reference_conv(const conv1d<double>& c, const tensor<double>& x) {
  const index_type lo = c.output_length(x.length), b = x.batch();
  matrix<double> y(c.out_channels(), lo * b);
  for (index_type s = 0; s < b; ++s)
    for (index_type o = 0; o < c.out_channels(); ++o)
      for (index_type t = 0; t < lo; ++t) {
        double acc = c.bias(o);
        for (index_type k = 0; k < c.kernel(); ++k)
          for (index_type i = 0; i < c.in_channels(); ++i) {
            const index_type p = t * c.stride() + k - c.padding();
            if (p >= 0 && p < x.length) acc += c.weight(o, k * c.in_channels() + i) * x.data(i, s * x.length + p);
          }
        y(o, s * lo + t) = acc;
      }
  return y;
}

// Direct-loop reference transposed conv: y[o, t*S + k - P] += W[k,o,i] x[i,t].
matrix<double> reference_conv_transpose(const conv_transpose1d<double>& c, const tensor<double>& x) {
  const index_type lo = c.output_length(x.length), b = x.batch();
  matrix<double> y(c.out_channels(), lo * b);
  for (index_type s = 0; s < b; ++s)
    for (index_type o = 0; o < c.out_channels(); ++o)
      for (index_type p = 0; p < lo; ++p) y(o, s * lo + p) = c.bias(o);
  for (index_type s = 0; s < b; ++s)
    for (index_type t = 0; t < x.length; ++t)
      for (index_type k = 0; k < c.kernel(); ++k)
        for (index_type o = 0; o < c.out_channels(); ++o)
          for (index_type i = 0; i < c.in_channels(); ++i) {
            const index_type p = t * c.stride() + k - c.padding();
            if (p >= 0 && p < lo) y(o, s * lo + p) += c.weight(k * c.out_channels() + o, i) * x.data(i, s * x.length + t);
          }
  return y;
}

// Loss L = sum(r .* net(x)); checks every parameter gradient and the input
// gradient against central differences. Returns the worst relative error.
double gradient_check(sequential<double>& net, tensor<double> x, std::uint64_t seed) {
  const tensor<double>& y0 = net.forward(x);
  tensor<double> r = random_tensor<double>(y0.channels(), y0.length, y0.batch(), seed);
  auto loss = [&](const tensor<double>& in) {
    tensor<double> y;
    net.infer(in, y);
    return (y.data.array() * r.data.array()).sum();
  };
  net.zero_grad();
  net.forward(x);
  tensor<double> dx;
  net.backward(r, &dx);
  const double h = 1e-6;
  double worst = 0.0;
  auto compare = [&](double analytic, double numeric) {
    const double err = std::abs(analytic - numeric) / std::max(1.0, std::abs(numeric));
    worst = std::max(worst, err);
  };
  for (auto& p : net.parameters()) {
    for (std::size_t i = 0; i < p.value.size(); ++i) {
      const double keep = p.value[i];
      p.value[i] = keep + h;
      const double lp = loss(x);
      p.value[i] = keep - h;
      const double lm = loss(x);
      p.value[i] = keep;
      compare(p.grad[i], (lp - lm) / (2 * h));
    }
  }
  for (index_type i = 0; i < x.data.size(); ++i) {
    const double keep = x.data.data()[i];
    x.data.data()[i] = keep + h;
    const double lp = loss(x);
    x.data.data()[i] = keep - h;
    const double lm = loss(x);
    x.data.data()[i] = keep;
    compare(dx.data.data()[i], (lp - lm) / (2 * h));
  }
  return worst;
}

}  // namespace

TEST_CASE("nn1d: output lengths follow PyTorch's formulas and the stride-2 chain halves and doubles") {
  const conv1d<float> c(1, 4, 3, 2, 1);
  CHECK(c.output_length(64) == 32);
  CHECK(c.output_length(63) == 32);
  CHECK(c.output_length(1) == 1);
  const conv_transpose1d<float> d(4, 4, 3, 2, 1, 1);
  CHECK(d.output_length(32) == 64);
  CHECK(d.output_length(1) == 2);
  const conv1d<float> valid(2, 2, 5, 1, 0);
  CHECK(valid.output_length(5) == 1);
  CHECK_THROWS_AS(valid.output_length(4), invalid_argument_error);
  // Four stride-2 convs then four stride-2 transposed convs: back to the input length.
  index_type l = 256;
  for (int i = 0; i < 4; ++i) l = c.output_length(l);
  CHECK(l == 16);
  for (int i = 0; i < 4; ++i) l = d.output_length(l);
  CHECK(l == 256);
}

TEST_CASE("nn1d: conv1d and conv_transpose1d match direct loops") {
  for (auto [in, out, k, s, p] : std::vector<std::array<index_type, 5>>{{1, 3, 3, 2, 1}, {3, 2, 3, 1, 1}, {2, 4, 1, 1, 0},
                                                                   {4, 3, 5, 3, 2}, {2, 2, 2, 2, 0}}) {
    sequential<double> net;
    net.add(conv1d<double>(in, out, k, s, p));
    randomize(net, 11);
    const auto& c = std::get<conv1d<double>>(net.layers()[0]);
    const tensor<double> x = random_tensor<double>(in, 13, 3, 5);
    tensor<double> y;
    net.infer(x, y);
    CHECK((y.data - reference_conv(c, x)).cwiseAbs().maxCoeff() < 1e-12);
  }
  for (auto [in, out, k, s, p, op] : std::vector<std::array<index_type, 6>>{
           {4, 4, 3, 2, 1, 1}, {3, 2, 3, 1, 1, 0}, {2, 3, 1, 1, 0, 0}, {2, 2, 4, 3, 1, 2}, {1, 2, 3, 2, 0, 0}}) {
    sequential<double> net;
    net.add(conv_transpose1d<double>(in, out, k, s, p, op));
    randomize(net, 12);
    const auto& c = std::get<conv_transpose1d<double>>(net.layers()[0]);
    const tensor<double> x = random_tensor<double>(in, 9, 2, 6);
    tensor<double> y;
    net.infer(x, y);
    CHECK((y.data - reference_conv_transpose(c, x)).cwiseAbs().maxCoeff() < 1e-12);
  }
}

TEST_CASE("nn1d: the transposed convolution is the adjoint of the convolution") {
  // <conv(x), y> == <x, convT(y)> when both use the same taps and no bias.
  const index_type in = 3, out = 5, k = 3, s = 2, p = 1, l = 16;
  conv1d<double> c(in, out, k, s, p);
  conv_transpose1d<double> t(out, in, k, s, p, 1);
  const gradcomp::detail::counter_rng rng(3);
  for (index_type o = 0; o < out; ++o)
    for (index_type kk = 0; kk < k; ++kk)
      for (index_type i = 0; i < in; ++i) {
        const double w = 2.0 * rng.stream(0).uniform_double(std::uint64_t((o * k + kk) * in + i)) - 1.0;
        c.weight(o, kk * in + i) = w;
        t.weight(kk * in + i, o) = w;
      }
  const tensor<double> x = random_tensor<double>(in, l, 2, 1);
  const tensor<double> y = random_tensor<double>(out, c.output_length(l), 2, 2);
  tensor<double> cx, ty;
  matrix<double> col;
  c.infer(x, cx, col);
  t.infer(y, ty, col);
  REQUIRE(ty.length == l);
  const double lhs = (cx.data.array() * y.data.array()).sum();
  const double rhs = (x.data.array() * ty.data.array()).sum();
  CHECK(std::abs(lhs - rhs) < 1e-12 * std::max(1.0, std::abs(lhs)));
}

TEST_CASE("nn1d: every layer's gradients match central finite differences") {
  SUBCASE("conv1d, strided and padded") {
    sequential<double> net;
    net.add(conv1d<double>(2, 3, 3, 2, 1));
    randomize(net, 21);
    CHECK(gradient_check(net, random_tensor<double>(2, 11, 2, 1), 31) < 1e-7);
  }
  SUBCASE("conv1d, pointwise") {
    sequential<double> net;
    net.add(conv1d<double>(3, 2, 1, 1, 0));
    randomize(net, 22);
    CHECK(gradient_check(net, random_tensor<double>(3, 7, 2, 2), 32) < 1e-7);
  }
  SUBCASE("conv_transpose1d with output padding") {
    sequential<double> net;
    net.add(conv_transpose1d<double>(3, 2, 3, 2, 1, 1));
    randomize(net, 23);
    CHECK(gradient_check(net, random_tensor<double>(3, 6, 2, 3), 33) < 1e-7);
  }
  SUBCASE("leaky_relu") {
    sequential<double> net;
    net.add(leaky_relu<double>(0.1));
    CHECK(gradient_check(net, random_tensor<double>(2, 9, 2, 4), 34) < 1e-7);
  }
  SUBCASE("a small encoder-decoder stack") {
    sequential<double> net;
    net.add(conv1d<double>(1, 4, 3, 2, 1));
    net.add(leaky_relu<double>(0.01));
    net.add(conv1d<double>(4, 2, 1, 1, 0));
    net.add(conv_transpose1d<double>(2, 3, 3, 1, 1, 0));
    net.add(leaky_relu<double>(0.01));
    net.add(conv_transpose1d<double>(3, 4, 3, 2, 1, 1));
    net.add(leaky_relu<double>(0.01));
    net.add(conv1d<double>(4, 1, 1, 1, 0));
    randomize(net, 24);
    const tensor<double> x = random_tensor<double>(1, 16, 2, 5);
    CHECK(net.output_length(16) == 16);
    CHECK(gradient_check(net, x, 35) < 1e-7);
  }
}

TEST_CASE("nn1d: loss gradients match finite differences") {
  const tensor<double> a = random_tensor<double>(2, 10, 3, 1), b = random_tensor<double>(2, 10, 3, 2);
  const double h = 1e-6;
  SUBCASE("mse_loss, with and without ignored columns") {
    for (index_type valid : {index_type(-1), index_type(17)}) {
      matrix<double> g;
      mse_loss<double>(a.data, b.data, &g, valid);
      matrix<double> p = a.data;
      double worst = 0;
      for (index_type i = 0; i < p.size(); ++i) {
        const double keep = p.data()[i];
        p.data()[i] = keep + h;
        const double lp = mse_loss<double>(p, b.data, nullptr, valid);
        p.data()[i] = keep - h;
        const double lm = mse_loss<double>(p, b.data, nullptr, valid);
        p.data()[i] = keep;
        worst = std::max(worst, std::abs(g.data()[i] - (lp - lm) / (2 * h)));
      }
      CHECK(worst < 1e-8);
    }
    // Ignored columns do not count.
    matrix<double> c = b.data;
    c.rightCols(5).setConstant(100.0);
    CHECK(mse_loss<double>(b.data, c, nullptr, b.data.cols() - 5) == 0.0);
  }
  SUBCASE("similarity_loss (eq. 5)") {
    const index_type k = 3;
    matrix<double> g;
    const double l0 = similarity_loss<double>(a.data, k, &g);
    // Direct evaluation of eq. 5 per element.
    const index_type w = a.data.cols() / k;
    double direct = 0;
    for (index_type i = 0; i < k; ++i)
      for (index_type m = 0; m < k; ++m)
        if (m != i) direct += (a.data.middleCols(i * w, w) - a.data.middleCols(m * w, w)).squaredNorm();
    direct /= double(w * a.data.rows());
    CHECK(l0 == doctest::Approx(direct).epsilon(1e-12));
    matrix<double> p = a.data;
    double worst = 0;
    for (index_type i = 0; i < p.size(); ++i) {
      const double keep = p.data()[i];
      p.data()[i] = keep + h;
      const double lp = similarity_loss<double>(p, k, nullptr);
      p.data()[i] = keep - h;
      const double lm = similarity_loss<double>(p, k, nullptr);
      p.data()[i] = keep;
      worst = std::max(worst, std::abs(g.data()[i] - (lp - lm) / (2 * h)));
    }
    CHECK(worst < 1e-8);
    // Identical blocks have zero similarity loss.
    matrix<double> same(2, 12);
    for (index_type i = 0; i < 3; ++i) same.middleCols(i * 4, 4) = a.data.leftCols(4);
    CHECK(similarity_loss<double>(same, 3, nullptr) == doctest::Approx(0.0).epsilon(1e-12));
  }
}

namespace {
sequential<float> small_autoencoder() {
  sequential<float> net;
  net.add(conv1d<float>(1, 8, 3, 2, 1));
  net.add(leaky_relu<float>(0.01f));
  net.add(conv1d<float>(8, 2, 1, 1, 0));
  net.add(conv_transpose1d<float>(2, 8, 3, 2, 1, 1));
  net.add(leaky_relu<float>(0.01f));
  net.add(conv1d<float>(8, 1, 1, 1, 0));
  return net;
}

template <class Opt>
std::vector<float> train(std::uint64_t seed, Opt opt, int steps, float* first_loss, float* last_loss) {
  sequential<float> net = small_autoencoder();
  net.initialize(seed);
  // A smooth target signal: an autoencoder with 2 code channels at half length can learn it.
  tensor<float> x;
  x.resize(1, 32, 4);
  for (index_type i = 0; i < x.data.cols(); ++i) x.data(0, i) = std::sin(0.3f * float(i % 32) + float(i / 32));
  matrix<float> g;
  for (int s = 0; s < steps; ++s) {
    const auto& y = net.forward(x);
    const float l = mse_loss<float>(y.data, x.data, &g);
    if (s == 0 && first_loss) *first_loss = l;
    if (last_loss) *last_loss = l;
    tensor<float> dy;
    dy.data = g;
    dy.length = y.length;
    net.zero_grad();
    net.backward(dy, nullptr);
    opt.step(net.parameters());
  }
  std::vector<float> w;
  for (auto& p : net.parameters()) w.insert(w.end(), p.value.begin(), p.value.end());
  return w;
}
}  // namespace

TEST_CASE("nn1d: initialisation and training are deterministic for a seed") {
  sequential<float> a = small_autoencoder(), b = small_autoencoder(), c = small_autoencoder();
  a.initialize(5);
  b.initialize(5);
  c.initialize(6);
  std::vector<float> wa, wb, wc;
  for (auto& p : a.parameters()) wa.insert(wa.end(), p.value.begin(), p.value.end());
  for (auto& p : b.parameters()) wb.insert(wb.end(), p.value.begin(), p.value.end());
  for (auto& p : c.parameters()) wc.insert(wc.end(), p.value.begin(), p.value.end());
  CHECK(wa == wb);
  CHECK(wa != wc);
  const auto t1 = train(9, sgd<float>(1e-2f, 0.9f), 30, nullptr, nullptr);
  const auto t2 = train(9, sgd<float>(1e-2f, 0.9f), 30, nullptr, nullptr);
  CHECK(t1 == t2);  // bit-identical
  const auto t3 = train(9, adam<float>(1e-2f), 30, nullptr, nullptr);
  const auto t4 = train(9, adam<float>(1e-2f), 30, nullptr, nullptr);
  CHECK(t3 == t4);
}

TEST_CASE("nn1d: SGD and Adam reduce the reconstruction loss") {
  float first = 0, last = 0;
  train(3, sgd<float>(5e-2f, 0.9f), 200, &first, &last);
  CHECK(last < 0.3f * first);
  train(3, adam<float>(1e-2f), 200, &first, &last);
  CHECK(last < 0.1f * first);
}

TEST_CASE("nn1d: infer and forward agree, and infer reuses a workspace") {
  sequential<float> net = small_autoencoder();
  net.initialize(1);
  tensor<float> x = random_tensor<float>(1, 32, 3, 9);
  tensor<float> y1, y2;
  sequential<float>::workspace ws;
  net.infer(x, y1, ws);
  net.infer(x, y2, ws);
  const auto& y3 = net.forward(x);
  CHECK(y1.data == y2.data);
  CHECK(y1.data == y3.data);
  CHECK(y1.length == 32);
}

TEST_CASE("nn1d: weights round-trip through the wire container and reject the wrong shape or version") {
  sequential<float> net = small_autoencoder();
  net.initialize(42);
  const auto bytes = save_weights(net);
  sequential<float> other = small_autoencoder();
  other.initialize(43);
  load_weights(other, bytes);
  const tensor<float> x = random_tensor<float>(1, 32, 2, 1);
  tensor<float> y1, y2;
  net.infer(x, y1);
  other.infer(x, y2);
  CHECK(y1.data == y2.data);

  SUBCASE("another architecture: invalid_argument_error naming the layer, network untouched") {
    sequential<float> wide;
    wide.add(conv1d<float>(1, 16, 3, 2, 1));
    wide.add(leaky_relu<float>(0.01f));
    wide.add(conv1d<float>(16, 2, 1, 1, 0));
    wide.add(conv_transpose1d<float>(2, 8, 3, 2, 1, 1));
    wide.add(leaky_relu<float>(0.01f));
    wide.add(conv1d<float>(8, 1, 1, 1, 0));
    wide.initialize(1);
    tensor<float> before;
    wide.infer(x, before);
    CHECK_THROWS_WITH_AS(load_weights(wide, bytes), doctest::Contains("layer 0"), invalid_argument_error);
    tensor<float> after;
    wide.infer(x, after);
    CHECK(before.data == after.data);
    sequential<float> shorter;
    shorter.add(conv1d<float>(1, 8, 3, 2, 1));
    CHECK_THROWS_AS(load_weights(shorter, bytes), invalid_argument_error);
  }
  SUBCASE("another weights format version: unsupported_version") {
    auto body = bytes;
    // The body starts right after the 32-byte header with the u16 format version.
    body[wire::header_size] = std::byte{9};
    // Re-seal the checksum so only the version is wrong.
    std::vector<std::byte> inner(body.begin() + wire::header_size, body.end());
    const auto resealed = wire::serialize_state(wire::codec_id::autoencoder, net.parameter_count(),
                                                [&](wire::writer& w) { w.put_bytes(inner); });
    try {
      load_weights(other, resealed);
      FAIL("expected wire_error");
    } catch (const wire::wire_error& e) {
      CHECK(e.code() == wire::wire_errc::unsupported_version);
    }
  }
  SUBCASE("corrupted, truncated, non-finite, a payload instead of a state") {
    auto bad = bytes;
    bad[bad.size() - 1] ^= std::byte{1};
    CHECK_THROWS_AS(load_weights(other, bad), wire::wire_error);
    const std::vector<std::byte> cut(bytes.begin(), bytes.end() - 4);
    CHECK_THROWS_AS(load_weights(other, cut), wire::wire_error);
    std::vector<std::byte> inner(bytes.begin() + wire::header_size, bytes.end());
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(inner.data() + inner.size() - 4, &nan, 4);
    const auto with_nan = wire::serialize_state(wire::codec_id::autoencoder, net.parameter_count(),
                                                [&](wire::writer& w) { w.put_bytes(inner); });
    try {
      load_weights(other, with_nan);
      FAIL("expected wire_error");
    } catch (const wire::wire_error& e) {
      CHECK(e.code() == wire::wire_errc::malformed_body);
    }
    const auto wrong_codec = wire::serialize_state(wire::codec_id::gradiveq, net.parameter_count(),
                                                   [&](wire::writer& w) { w.put_bytes(inner); });
    CHECK_THROWS_AS(load_weights(other, wrong_codec), wire::wire_error);
  }
}

TEST_CASE("nn1d: bad arguments are typed errors") {
  CHECK_THROWS_AS(conv1d<float>(0, 1, 3), invalid_argument_error);
  CHECK_THROWS_AS(conv1d<float>(1, 1, 3, 0), invalid_argument_error);
  CHECK_THROWS_AS(conv1d<float>(1, 1, 3, 1, -1), invalid_argument_error);
  CHECK_THROWS_AS(conv_transpose1d<float>(1, 1, 3, 2, 1, 2), invalid_argument_error);
  CHECK_THROWS_AS(leaky_relu<float>(-0.1f), invalid_argument_error);
  CHECK_THROWS_AS(sgd<float>(0.0f), invalid_argument_error);
  CHECK_THROWS_AS(sgd<float>(1e-3f, 1.0f), invalid_argument_error);
  CHECK_THROWS_AS(adam<float>(-1.0f), invalid_argument_error);
  sequential<float> net = small_autoencoder();
  net.initialize(1);
  tensor<float> y;
  CHECK_THROWS_AS(net.infer(random_tensor<float>(2, 32, 1, 1), y), size_mismatch_error);  // 2 channels, expects 1
  tensor<float> tiny;
  tiny.resize(1, 0, 0);
  CHECK_THROWS_AS(net.infer(tiny, y), invalid_argument_error);
  CHECK_THROWS_AS(net.forward(random_tensor<float>(2, 32, 1, 1)), size_mismatch_error);
  sequential<float> empty;
  CHECK_THROWS_AS(empty.forward(random_tensor<float>(1, 4, 1, 1)), state_error);
  // A gradient of the wrong shape after a forward pass.
  net.forward(random_tensor<float>(1, 32, 1, 1));
  CHECK_THROWS_AS(net.backward(random_tensor<float>(1, 16, 1, 1), nullptr), state_error);
  CHECK_THROWS_AS(similarity_loss<float>(matrix<float>::Zero(2, 7), 3, nullptr), invalid_argument_error);
  CHECK_THROWS_AS(mse_loss<float>(matrix<float>::Zero(1, 4), matrix<float>::Zero(1, 5), nullptr), size_mismatch_error);
}
