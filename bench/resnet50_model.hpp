#pragma once
// ResNet-50 (torchvision): every parameter tensor in its real shape, in
// order (about 25.6M floats): the model of bench_model_exchange and of the
// simulated-cluster bench (bench/smpi).
#include <cstddef>
#include <string>

#include <gradcomp/model_exchange.hpp>

namespace gradcomp::bench {

inline exchange::model_description resnet50_model() {
  exchange::model_description m;
  auto bn = [&](const std::string& n, std::size_t c) { m.add_dense(n + ".weight", c, 1).add_dense(n + ".bias", c, 1); };
  m.add_conv("conv1", 64, 3, 7, 7);
  bn("bn1", 64);
  const std::size_t blocks[4] = {3, 4, 6, 3}, widths[4] = {64, 128, 256, 512};
  std::size_t in = 64;
  for (int l = 0; l < 4; ++l)
    for (std::size_t b = 0; b < blocks[l]; ++b) {
      const std::string p = "layer" + std::to_string(l + 1) + "." + std::to_string(b);
      const std::size_t w = widths[l];
      m.add_conv(p + ".conv1", w, in, 1, 1);
      bn(p + ".bn1", w);
      m.add_conv(p + ".conv2", w, w, 3, 3);
      bn(p + ".bn2", w);
      m.add_conv(p + ".conv3", 4 * w, w, 1, 1);
      bn(p + ".bn3", 4 * w);
      if (b == 0) {
        m.add_conv(p + ".downsample", 4 * w, in, 1, 1);
        bn(p + ".downsample.bn", 4 * w);
      }
      in = 4 * w;
    }
  m.add_dense("fc.weight", 1000 * 2048).add_dense("fc.bias", 1000, 1);
  return m;
}

}  // namespace gradcomp::bench
