// Program for the "Ring segments (Algorithm 1)" block of docs/codecs.md: the
// segments a ring driver asks for cover the layer, and decoding the sum of two
// encodes of each segment gives twice its projection.
#include <gradcomp/gradiveq.hpp>

#include <cmath>
#include <span>
#include <vector>

int main() {
  const std::size_t N = 3, length = 4096 + 100;  // 16 slices of 256 and a 100-value tail
  gradcomp::linear_compressor<> codec(length, {.slice_size = 256, .summands = 2});
  std::vector<float> grad(length);
  for (int sample = 0; sample < 8; ++sample) {
    for (std::size_t j = 0; j < length; ++j) grad[j] = float(std::sin(0.01 * double(j * (sample + 1))));
    codec.add_sample(grad);
  }
  codec.fit();
  std::vector<float> decoded;
  // @snippet
  if (decoded.size() != length) return 1;
  std::vector<float> whole(length);
  gradcomp::gradiveq_payload p, acc;
  codec.encode(grad, acc);
  codec.encode(grad, p);
  codec.accumulate(acc, p);
  codec.decode(acc, whole);
  for (std::size_t j = 0; j < length; ++j)
    if (std::abs(whole[j] - decoded[j]) > 1e-4f * (1.0f + std::abs(whole[j]))) return 1;
  return 0;
}
