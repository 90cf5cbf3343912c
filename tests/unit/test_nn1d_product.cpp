// Tests of nn1d's convolution product without most of im2col
// (detail::conv_product) and of the fused bias + leaky ReLU pass
// (detail::add_bias_activate): both must give the bits of the plain forms
// they replace (im2col + one Eigen GEMM; a bias pass followed by
// (a > 0).select(a, slope * a)).

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <gradcomp/detail/random.hpp>
#include <gradcomp/nn1d.hpp>

using namespace gradcomp;
using namespace gradcomp::nn1d;

namespace {

template <class T>
matrix<T> random_matrix(index_type rows, index_type cols, std::uint64_t seed) {
  const gradcomp::detail::counter_rng rng(seed);
  const auto s = rng.stream(3);
  matrix<T> m(rows, cols);
  for (index_type i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(2.0 * s.uniform_double(std::uint64_t(i)) - 1.0);
  return m;
}

template <class T>
bool same_bits(const matrix<T>& a, const matrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(T) * std::size_t(a.size())) == 0;
}

// Eigen on one thread for the duration of a test (with OpenMP linked, Eigen
// picks its depth blocking differently for products it splits over threads,
// so bit-for-bit claims are about one thread; see conv_product).
struct one_eigen_thread {
  int saved = Eigen::nbThreads();
  one_eigen_thread() { Eigen::setNbThreads(1); }
  ~one_eigen_thread() { Eigen::setNbThreads(saved); }
};

template <class T>
void check_product_shapes() {
  one_eigen_thread guard;
  // {C_in, C_out, kernel, stride, padding, L_in, batch}: the first six take
  // the strided path (the LGC encoder's layers among them), the last three
  // fall back to im2col (too few columns, stride * L_out != L_in, one output row).
  const std::vector<std::array<index_type, 7>> shapes = {
      {1, 64, 3, 2, 1, 1024, 3},  {64, 128, 3, 2, 1, 256, 5}, {48, 32, 3, 2, 1, 128, 23}, {16, 24, 5, 2, 2, 200, 4},
      {8, 16, 3, 1, 1, 96, 3},    {4, 8, 3, 3, 1, 90, 2},     {3, 4, 3, 2, 1, 32, 3},     {8, 16, 4, 2, 1, 101, 3},
      {8, 1, 3, 2, 1, 256, 3}};
  std::uint64_t seed = 5;
  for (const auto& [in, out, k, s, p, l, b] : shapes) {
    CAPTURE(in);
    CAPTURE(out);
    CAPTURE(k);
    CAPTURE(s);
    CAPTURE(l);
    CAPTURE(b);
    const index_type lo = (l + 2 * p - k) / s + 1;
    const matrix<T> w = random_matrix<T>(out, k * in, seed++), x = random_matrix<T>(in, l * b, seed++);
    matrix<T> col, expected, y, scratch;
    nn1d::detail::im2col(x, l, lo, b, k, s, p, col);
    expected.noalias() = w * col;
    // Fill the output and the scratch with garbage first: every column must be written.
    y = matrix<T>::Constant(out, lo * b, T(7));
    scratch = matrix<T>::Constant(3, 3, T(9));
    nn1d::detail::conv_product(w, x, l, lo, b, k, s, p, y, scratch);
    CHECK(same_bits(y, expected));
    // With the caller's im2col (the training pass), the same bits again.
    y.setConstant(T(7));
    nn1d::detail::conv_product(w, x, l, lo, b, k, s, p, y, scratch, &col);
    CHECK(same_bits(y, expected));
  }
}

template <class T>
void check_bias_activate() {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const T special[] = {T(0), -T(0), inf, -inf, nan, std::numeric_limits<T>::denorm_min(), -std::numeric_limits<T>::denorm_min(),
                       T(1), T(-1)};
  for (index_type rows : {1, 3, 4, 7, 8, 15, 16, 17, 31, 33, 64}) {
    CAPTURE(rows);
    matrix<T> y = random_matrix<T>(rows, 5, std::uint64_t(rows));
    vector<T> bias = random_matrix<T>(rows, 1, std::uint64_t(rows) + 100);
    for (index_type i = 0; i < y.size(); i += 3) y.data()[i] = special[std::size_t(i / 3) % 9];
    bias(0) = T(0);  // so -0 + 0 and friends reach the activation
    for (T slope : {T(0.01), T(0), T(0.5)}) {
      matrix<T> expected = y, got = y;
      for (index_type j = 0; j < expected.cols(); ++j) {
        auto c = expected.col(j).array();
        c += bias.array();
        c = (c > T(0)).select(c, slope * c);
      }
      nn1d::detail::add_bias_activate(got, bias, &slope);
      bool ok = true;
      for (index_type i = 0; i < got.size(); ++i) {
        const T a = got.data()[i], e = expected.data()[i];
        ok = ok && ((std::isnan(a) && std::isnan(e)) || std::memcmp(&a, &e, sizeof(T)) == 0);
      }
      CHECK(ok);
      // Without an activation: the bias alone.
      matrix<T> plain = y, ref = y;
      ref.colwise() += bias;
      nn1d::detail::add_bias_activate(plain, bias, static_cast<const T*>(nullptr));
      CHECK(((plain.array() == ref.array()) || (plain.array().isNaN() && ref.array().isNaN())).all());
    }
  }
}

}  // namespace

TEST_CASE("nn1d: the convolution product without im2col has the bits of im2col + one GEMM") {
  check_product_shapes<float>();
  check_product_shapes<double>();
}

TEST_CASE("nn1d: the fused bias + leaky ReLU pass has the bits of the bias pass and select, NaN and -0 included") {
  check_bias_activate<float>();
  check_bias_activate<double>();
}

TEST_CASE("nn1d: conv1d infer and forward agree bit for bit on a shape that takes the strided product") {
  conv1d<float> c(64, 128, 3, 2, 1);
  c.initialize(gradcomp::detail::counter_rng(3).stream(0), 0.01);
  c.bias = random_matrix<float>(128, 1, 4);
  tensor<float> x;
  x.length = 256;
  x.data = random_matrix<float>(64, 256 * 5, 6);
  tensor<float> y1, y2;
  matrix<float> col;
  c.infer(x, y1, col);
  c.forward(x, y2);
  CHECK(same_bits(y1.data, y2.data));
  CHECK(y1.length == 128);
  // And the strided product is a convolution: one column against a direct sum.
  const index_type b = 3, t = 0, o = 5;  // a sample's first column (its window starts in the zero padding)
  double acc = double(c.bias(o));
  for (index_type k = 0; k < 3; ++k)
    for (index_type i = 0; i < 64; ++i) {
      const index_type p = t * 2 + k - 1;
      if (p >= 0 && p < 256) acc += double(c.weight(o, k * 64 + i)) * double(x.data(i, b * 256 + p));
    }
  CHECK(std::abs(double(y1.data(o, b * 128 + t)) - acc) < 1e-4);
}
