// layout.hpp: the GradiVeQ conv flattening (seed 002, Fig. 3a) and its inverse.
#include <doctest/doctest.h>

#include <gradcomp/layout.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

using namespace gradcomp;

namespace {

// Tags every framework element with its own index, so the flattened vector
// says exactly where each element went.
std::vector<float> iota_tensor(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

}  // namespace

TEST_CASE("layout: conv flattening follows Fig. 3a (filters together, then depth, width, height)") {
  // Shapes chosen so every extent differs and the tiles (32) split some of them.
  const std::size_t shapes[][4] = {{3, 2, 3, 3}, {16, 16, 3, 3}, {40, 3, 5, 7}, {1, 1, 1, 1}, {33, 35, 1, 2}, {2, 1, 7, 1}};
  for (const auto& sh : shapes) {
    const auto s = layer_shape::conv(sh[0], sh[1], sh[2], sh[3]);
    CAPTURE(sh[0]);
    CAPTURE(sh[1]);
    CAPTURE(sh[2]);
    CAPTURE(sh[3]);
    REQUIRE(s.size() == sh[0] * sh[1] * sh[2] * sh[3]);
    const auto in = iota_tensor(s.size());
    std::vector<float> flat(s.size(), -1.0f), back(s.size(), -1.0f);
    flatten_gradiveq(s, in, flat);

    // Element by element against the definition of both orders.
    std::size_t expected_pos = 0;
    for (std::size_t h = 0; h < s.height; ++h)
      for (std::size_t w = 0; w < s.width; ++w)
        for (std::size_t d = 0; d < s.depth; ++d)
          for (std::size_t f = 0; f < s.filters; ++f) {
            REQUIRE(gradiveq_index(s, f, d, h, w) == expected_pos);
            REQUIRE(flat[expected_pos] == static_cast<float>(framework_index(s, f, d, h, w)));
            // framework_index is the row-major [F, D, H, W] offset.
            REQUIRE(framework_index(s, f, d, h, w) == ((f * s.depth + d) * s.height + h) * s.width + w);
            ++expected_pos;
          }

    // An exact permutation: every source index appears once.
    auto sorted = flat;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == in);

    unflatten_gradiveq(s, flat, back);
    CHECK(back == in);
  }
}

TEST_CASE("layout: layer_shape::conv takes (F, D, H, W), the framework's [out, in, kH, kW] order") {
  // The example of the header's comment: 64 filters over 3 input channels, 5 x 7 kernels.
  const auto s = layer_shape::conv(64, 3, 5, 7);
  CHECK(s.kind == layer_kind::conv);
  CHECK(s.filters == 64);
  CHECK(s.depth == 3);
  CHECK(s.height == 5);
  CHECK(s.width == 7);
  CHECK(s.size() == 64u * 3u * 5u * 7u);
  CHECK(s.default_slice_size() == 7u * 3u * 64u);  // K = W*D*F
  CHECK(s.slice_granularity() == 3u * 64u);        // F*D
  // Framework element (f, d, h, w) of a [64, 3, 5, 7] tensor: w varies fastest.
  CHECK(framework_index(s, 0, 0, 0, 1) == 1);
  CHECK(framework_index(s, 0, 0, 1, 0) == 7);
  CHECK(framework_index(s, 0, 1, 0, 0) == 35);
  CHECK(framework_index(s, 1, 0, 0, 0) == 105);
  // The paper's "(3,3,16,16)" (H, W, D, F) layer is conv(16, 16, 3, 3).
  CHECK(layer_shape::conv(16, 16, 3, 3).default_slice_size() == 768);
}

TEST_CASE("layout: flatten/unflatten are inverse on arbitrary values, both ways round") {
  const auto s = layer_shape::conv(8, 5, 3, 4);
  std::vector<float> x(s.size());
  std::uint64_t state = 12345;
  for (auto& v : x) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<std::int64_t>(state >> 11) % 20001 - 10000) / 1000.0f;
  }
  std::vector<float> a(s.size()), b(s.size());
  flatten_gradiveq(s, x, a);
  unflatten_gradiveq(s, a, b);
  CHECK(b == x);
  unflatten_gradiveq(s, x, a);
  flatten_gradiveq(s, a, b);
  CHECK(b == x);
}

TEST_CASE("layout: slices of K = multiple of F*D hold whole spatial positions") {
  const auto s = layer_shape::conv(16, 16, 3, 3);
  CHECK(s.slice_granularity() == 256);
  CHECK(s.default_slice_size() == 768);  // W*D*F, the paper's choice for (3,3,16,16)
  const auto in = iota_tensor(s.size());
  std::vector<float> flat(s.size());
  flatten_gradiveq(s, in, flat);
  for (std::size_t K : {s.slice_granularity(), s.default_slice_size()}) {
    CAPTURE(K);
    REQUIRE(s.size() % K == 0);
    for (std::size_t m = 0; m < s.size() / K; ++m) {
      // Which (h, w) positions does slice m cover? Exactly K/(F*D) whole positions:
      // each appears with all F*D of its (f, d) pairs.
      std::vector<std::size_t> count(s.height * s.width, 0);
      for (std::size_t i = m * K; i < (m + 1) * K; ++i) {
        const auto src = static_cast<std::size_t>(flat[i]);
        const std::size_t w = src % s.width, h = (src / s.width) % s.height;
        ++count[h * s.width + w];
      }
      std::size_t whole = 0;
      for (auto c : count) {
        CHECK((c == 0 || c == s.filters * s.depth));
        whole += c != 0;
      }
      CHECK(whole == K / (s.filters * s.depth));
    }
  }
  // K = W*D*F: slice m is kernel row h = m.
  const std::size_t K = s.default_slice_size();
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto src = static_cast<std::size_t>(flat[i]);
    CHECK((src / s.width) % s.height == i / K);
  }
}

TEST_CASE("layout: dense layers pass through unchanged") {
  const auto s = layer_shape::dense(37);
  CHECK(s.slice_granularity() == 1);
  CHECK(s.default_slice_size() == 37);
  CHECK(layer_shape::dense(5000).default_slice_size() == 1024);
  const auto in = iota_tensor(37);
  std::vector<float> out(37, 0.0f), back(37, 0.0f);
  flatten_gradiveq(s, in, out);
  CHECK(out == in);
  unflatten_gradiveq(s, out, back);
  CHECK(back == in);
}

TEST_CASE("layout: bad input") {
  CHECK_THROWS_AS(layer_shape::conv(0, 1, 1, 1), invalid_argument_error);
  CHECK_THROWS_AS(layer_shape::conv(1, 1, 0, 1), invalid_argument_error);
  const std::size_t big = std::size_t{1} << 40;
  CHECK_THROWS_AS(layer_shape::conv(big, big, 1, 1), invalid_argument_error);

  const auto s = layer_shape::conv(2, 2, 2, 2);
  std::vector<float> a(16), b(15), c(16);
  CHECK_THROWS_AS(flatten_gradiveq(s, a, b), size_mismatch_error);
  CHECK_THROWS_AS(flatten_gradiveq(s, b, a), size_mismatch_error);
  CHECK_THROWS_AS(unflatten_gradiveq(s, a, b), size_mismatch_error);
  CHECK_THROWS_AS(unflatten_gradiveq(s, b, a), size_mismatch_error);
  // In place would silently corrupt a permutation: rejected.
  CHECK_THROWS_AS(flatten_gradiveq(s, a, a), invalid_argument_error);
  CHECK_THROWS_AS(unflatten_gradiveq(s, std::span<const float>(a).subspan(0, 16), std::span<float>(a)),
                  invalid_argument_error);
  CHECK_NOTHROW(flatten_gradiveq(s, a, c));
}
