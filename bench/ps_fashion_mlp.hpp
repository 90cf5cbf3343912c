#pragma once
// Helpers of bench_ps_convergence: a Fashion-MNIST reader (the gzip'd idx
// files of Debian's dataset-fashion-mnist, read with zlib, every header field
// checked) and a two-layer MLP 784-128-10 with ReLU and softmax cross-entropy,
// written with Eigen, whose parameters are one flat float vector (the layout a
// parameter server moves: W1, b1, W2, b2).

#include "common.hpp"

#include <zlib.h>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace ps_bench {

// ---------------------------------------------------------------------------
// Fashion-MNIST

struct dataset {
  std::vector<float> images;         // n x 784, row-major, standardised
  std::vector<std::uint8_t> labels;  // n, in [0, 10)
  std::size_t n = 0;
  static constexpr std::size_t pixels = 784;
};

inline std::vector<std::uint8_t> read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path + " (package dataset-fashion-mnist)");
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  for (;;) {
    const int got = gzread(f, buf, sizeof buf);
    if (got < 0) {
      gzclose(f);
      throw std::runtime_error("zlib error while reading " + path);
    }
    if (got == 0) break;
    out.insert(out.end(), buf, buf + got);
    if (out.size() > (std::size_t{1} << 28)) {
      gzclose(f);
      throw std::runtime_error(path + " is larger than any Fashion-MNIST file");
    }
  }
  gzclose(f);
  return out;
}

inline std::uint32_t be32(const std::vector<std::uint8_t>& b, std::size_t at) {
  if (at + 4 > b.size()) throw std::runtime_error("idx file truncated in its header");
  return (std::uint32_t(b[at]) << 24) | (std::uint32_t(b[at + 1]) << 16) | (std::uint32_t(b[at + 2]) << 8) | b[at + 3];
}

/// Loads `prefix`-images-idx3-ubyte.gz and `prefix`-labels-idx1-ubyte.gz from `dir`.
inline dataset load_fashion_mnist(const std::string& dir, const std::string& prefix) {
  const auto img = read_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz");
  const auto lab = read_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz");
  if (be32(img, 0) != 0x00000803u) throw std::runtime_error("images: bad idx magic");
  if (be32(lab, 0) != 0x00000801u) throw std::runtime_error("labels: bad idx magic");
  const std::size_t n = be32(img, 4), rows = be32(img, 8), cols = be32(img, 12);
  if (rows != 28 || cols != 28) throw std::runtime_error("images: not 28 x 28");
  if (be32(lab, 4) != n) throw std::runtime_error("labels and images disagree on the count");
  if (img.size() != 16 + n * 784) throw std::runtime_error("images: wrong file length");
  if (lab.size() != 8 + n) throw std::runtime_error("labels: wrong file length");
  dataset d;
  d.n = n;
  d.images.resize(n * 784);
  // Fashion-MNIST's pixel mean and standard deviation (0.2860, 0.3530).
  for (std::size_t i = 0; i < n * 784; ++i) d.images[i] = (float(img[16 + i]) / 255.0f - 0.2860f) / 0.3530f;
  d.labels.assign(lab.begin() + 8, lab.end());
  for (auto l : d.labels)
    if (l >= 10) throw std::runtime_error("labels: a label outside [0, 10)");
  return d;
}

// ---------------------------------------------------------------------------
// The MLP

struct mlp {
  static constexpr int in = 784, hidden = 128, out = 10;
  using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  /// The tensors' sizes: W1 (hidden x in), b1, W2 (out x hidden), b2.
  static std::vector<std::size_t> layer_sizes() {
    return {std::size_t(hidden) * in, std::size_t(hidden), std::size_t(out) * hidden, std::size_t(out)};
  }
  static std::size_t parameters() { return std::size_t(hidden) * in + hidden + std::size_t(out) * hidden + out; }

  /// He-uniform weights from a counter-based hash of (seed, index); zero biases.
  static std::vector<float> init(std::uint64_t seed) {
    std::vector<float> t(parameters(), 0.0f);
    auto fill = [&](std::size_t from, std::size_t count, float limit) {
      for (std::size_t i = 0; i < count; ++i) {
        const double u = double(gradcomp::bench::splitmix(seed * 0x100000001B3ull + from + i) >> 11) * 0x1.0p-53;
        t[from + i] = float((2.0 * u - 1.0) * limit);
      }
    };
    fill(0, std::size_t(hidden) * in, std::sqrt(6.0f / in));
    fill(std::size_t(hidden) * in + hidden, std::size_t(out) * hidden, std::sqrt(6.0f / hidden));
    return t;
  }

  /// Scratch of one gradient evaluation (so a step allocates nothing once warm).
  /// Eigen's products round differently depending on how their operands are
  /// aligned, so theta and the gradient go through Eigen-owned (always
  /// aligned) buffers: the result then does not depend on heap addresses.
  struct workspace {
    row_matrix x, h, z, dz, dh;
    Eigen::VectorXf theta, grad;
  };

  /// Mean cross-entropy over the batch and its gradient (into `grad`, the
  /// same layout as theta) at `theta`, for the samples `idx` of `d`.
  static float gradient(std::span<const float> theta_in, const dataset& d, std::span<const std::uint32_t> idx,
                        std::span<float> grad_out, workspace& ws) {
    const int B = int(idx.size());
    ws.theta = Eigen::Map<const Eigen::VectorXf>(theta_in.data(), Eigen::Index(theta_in.size()));
    ws.grad.resize(Eigen::Index(theta_in.size()));
    const float* p = ws.theta.data();
    Eigen::Map<const row_matrix> W1(p, hidden, in);
    Eigen::Map<const Eigen::VectorXf> b1(p + hidden * in, hidden);
    Eigen::Map<const row_matrix> W2(p + hidden * in + hidden, out, hidden);
    Eigen::Map<const Eigen::VectorXf> b2(p + hidden * in + hidden + out * hidden, out);
    float* g = ws.grad.data();
    Eigen::Map<row_matrix> gW1(g, hidden, in);
    Eigen::Map<Eigen::VectorXf> gb1(g + hidden * in, hidden);
    Eigen::Map<row_matrix> gW2(g + hidden * in + hidden, out, hidden);
    Eigen::Map<Eigen::VectorXf> gb2(g + hidden * in + hidden + out * hidden, out);

    ws.x.resize(B, in);
    for (int b = 0; b < B; ++b)
      std::memcpy(ws.x.row(b).data(), d.images.data() + std::size_t(idx[std::size_t(b)]) * 784, 784 * sizeof(float));
    ws.h.noalias() = ws.x * W1.transpose();
    ws.h.rowwise() += b1.transpose();
    ws.h = ws.h.cwiseMax(0.0f);
    ws.z.noalias() = ws.h * W2.transpose();
    ws.z.rowwise() += b2.transpose();
    float loss = 0.0f;
    ws.dz.resize(B, out);
    for (int b = 0; b < B; ++b) {
      const float m = ws.z.row(b).maxCoeff();
      float s = 0.0f;
      for (int c = 0; c < out; ++c) s += std::exp(ws.z(b, c) - m);
      const int y = d.labels[idx[std::size_t(b)]];
      loss += std::log(s) - (ws.z(b, y) - m);
      for (int c = 0; c < out; ++c) ws.dz(b, c) = (std::exp(ws.z(b, c) - m) / s - (c == y ? 1.0f : 0.0f)) / float(B);
    }
    gW2.noalias() = ws.dz.transpose() * ws.h;
    gb2 = ws.dz.colwise().sum().transpose();
    ws.dh.noalias() = ws.dz * W2;
    ws.dh = ws.dh.cwiseProduct((ws.h.array() > 0.0f).cast<float>().matrix());
    gW1.noalias() = ws.dh.transpose() * ws.x;
    gb1 = ws.dh.colwise().sum().transpose();
    std::copy(ws.grad.data(), ws.grad.data() + ws.grad.size(), grad_out.begin());
    return loss / float(B);
  }

  /// Top-1 accuracy (percent) on all of `d`.
  static double accuracy(std::span<const float> theta_in, const dataset& d) {
    const Eigen::VectorXf theta = Eigen::Map<const Eigen::VectorXf>(theta_in.data(), Eigen::Index(theta_in.size()));
    const float* p = theta.data();
    Eigen::Map<const row_matrix> W1(p, hidden, in);
    Eigen::Map<const Eigen::VectorXf> b1(p + hidden * in, hidden);
    Eigen::Map<const row_matrix> W2(p + hidden * in + hidden, out, hidden);
    Eigen::Map<const Eigen::VectorXf> b2(p + hidden * in + hidden + out * hidden, out);
    std::size_t correct = 0;
    const std::size_t chunk = 1000;
    for (std::size_t from = 0; from < d.n; from += chunk) {
      const int B = int(std::min(chunk, d.n - from));
      const row_matrix X = Eigen::Map<const row_matrix>(d.images.data() + from * 784, B, in);  // aligned copy
      row_matrix h = X * W1.transpose();
      h.rowwise() += b1.transpose();
      h = h.cwiseMax(0.0f);
      row_matrix z = h * W2.transpose();
      z.rowwise() += b2.transpose();
      for (int b = 0; b < B; ++b) {
        Eigen::Index arg = 0;
        z.row(b).maxCoeff(&arg);
        correct += std::size_t(arg) == d.labels[from + std::size_t(b)];
      }
    }
    return 100.0 * double(correct) / double(d.n);
  }
};

}  // namespace ps_bench
