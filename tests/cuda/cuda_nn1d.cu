// nn1d and the LGC autoencoder on the GPU (nn1d/cuda.hpp, lgc/cuda.hpp),
// part of the CUDA check program (see test_cuda_thrust.cu): every layer kind
// and the whole LGC networks of both forms, device next to the CPU
// (nn1d::sequential::infer, lgc_network::encode / decode), within float
// rounding (cuBLAS sums in its own order).
#include <gradcomp/lgc/cuda.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cuda_check.hpp"

using namespace gradcomp;
namespace nc = gradcomp::nn1d::cuda;

namespace {

using tensor = nn1d::tensor<float>;

tensor random_tensor(nn1d::index_type channels, nn1d::index_type length, nn1d::index_type batch, std::uint64_t seed) {
  tensor t;
  t.resize(channels, length, batch);
  const auto v = cuda_check::normal_floats(std::size_t(t.data.size()), seed);
  std::copy(v.begin(), v.end(), t.data.data());
  return t;
}

// Largest |a - b| over the largest |a|: the relative error of the device result.
float relative_difference(const tensor& a, const tensor& b) {
  if (a.data.rows() != b.data.rows() || a.data.cols() != b.data.cols() || a.length != b.length) return INFINITY;
  float worst = 0.0f, scale = 1e-30f;
  for (nn1d::index_type i = 0; i < a.data.size(); ++i) {
    worst = std::fmax(worst, std::fabs(a.data.data()[i] - b.data.data()[i]));
    scale = std::fmax(scale, std::fabs(a.data.data()[i]));
  }
  return worst / scale;
}

// Non-zero biases, so the bias pass is checked too (initialize leaves them 0).
void randomize_biases(nn1d::sequential<float>& net, std::uint64_t seed) {
  for (auto& layer : net.layers())
    std::visit(
        [&](auto& l) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(l)>, nn1d::leaky_relu<float>>) {
            const auto v = cuda_check::normal_floats(std::size_t(l.bias.size()), seed++);
            for (nn1d::index_type i = 0; i < l.bias.size(); ++i) l.bias[i] = 0.1f * v[std::size_t(i)];
          }
        },
        layer);
}

}  // namespace

void cuda_check::compare_nn1d() {
  // Every layer kind: strided conv + fused leaky ReLU, pointwise conv, a leaky
  // ReLU after a leaky ReLU (run on its own), stride-1 and stride-2
  // transposed convolutions with output padding.
  nn1d::sequential<float> net;
  net.add(nn1d::conv1d<float>(3, 16, 3, 2, 1));
  net.add(nn1d::leaky_relu<float>(0.01f));
  net.add(nn1d::leaky_relu<float>(0.2f));
  net.add(nn1d::conv1d<float>(16, 8, 1, 1, 0));
  net.add(nn1d::conv_transpose1d<float>(8, 12, 3, 1, 1, 0));
  net.add(nn1d::leaky_relu<float>(0.01f));
  net.add(nn1d::conv_transpose1d<float>(12, 5, 3, 2, 1, 1));
  net.add(nn1d::conv1d<float>(5, 2, 5, 1, 2));
  net.initialize(11);
  randomize_biases(net, 100);
  const tensor x = random_tensor(3, 64, 7, 21);
  tensor want, got;
  net.infer(x, want);
  nc::device_sequential dev(net);
  nc::device_sequential::workspace ws;
  nc::device_tensor dx, dy;
  dev.infer(x, got, ws, dx, dy);
  const float err = relative_difference(want, got);
  std::printf("nn1d: %zu device layers, output %ldx%ld, max relative difference %g\n", dev.layers(),
              long(got.data.rows()), long(got.data.cols()), err);
  expect(err <= 1e-5f, "nn1d device_sequential against sequential::infer");
  expect(dev.output_length(64) == net.output_length(64), "nn1d device output length");

  // Refreshed weights reach the device; another shape is refused.
  std::get<nn1d::conv1d<float>>(net.layers()[0]).weight *= 2.0f;
  net.infer(x, want);
  dev.upload(net);
  dev.infer(x, got, ws, dx, dy);
  expect(relative_difference(want, got) <= 1e-5f, "nn1d device_sequential after upload");
  nn1d::sequential<float> other;
  other.add(nn1d::conv1d<float>(3, 4, 3, 2, 1));
  bool refused = false;
  try {
    dev.upload(other);
  } catch (const layout_error&) {
    refused = true;
  }
  expect(refused, "nn1d device_sequential refuses a network of other shapes");
}

void cuda_check::compare_lgc() {
  lgc_architecture arch;  // Tables I-II: 64-128-256-64 encoder, 4 code channels
  const std::size_t window = 256, windows = 6;
  for (lgc_form form : {lgc_form::ring, lgc_form::parameter_server}) {
    const std::size_t decoders = form == lgc_form::ring ? 1 : 3;
    lgc_network net(form, decoders, window, arch, 5);
    lgc_device_network dev(net);
    lgc_network::workspace ws;
    lgc_device_network::workspace dws;
    const tensor x = random_tensor(1, nn1d::index_type(window), nn1d::index_type(windows), 31);
    tensor code, dcode_host;
    net.encode(x, code, ws);
    nc::device_tensor dx, dcode, dy, dinnov;
    dx.upload(x);
    dev.encode(dx.ptr(), windows, dcode, dws);
    dcode.download(dcode_host);
    const float e_enc = relative_difference(code, dcode_host);
    // Decode the CPU's code on both sides, so the decoder is compared alone.
    dcode.upload(code);
    float e_dec = 0.0f;
    for (std::size_t k = 0; k < decoders; ++k) {
      tensor y, y_dev;
      nn1d::matrix<float> innovation;
      const float* dinn = nullptr;
      if (form == lgc_form::parameter_server) {
        const tensor h = random_tensor(1, nn1d::index_type(window), nn1d::index_type(windows), 40 + k);
        innovation = h.data;
        dinnov.upload(h);
        dinn = dinnov.ptr();
      }
      net.decode(k, code, form == lgc_form::parameter_server ? &innovation : nullptr, y, ws);
      dev.decode(k, dcode, dinn, dy, dws);
      dy.download(y_dev);
      e_dec = std::fmax(e_dec, relative_difference(y, y_dev));
    }
    const char* name = form == lgc_form::ring ? "ring" : "parameter server";
    std::printf("lgc (%s form): encode max relative difference %g, decode %g\n", name, e_enc, e_dec);
    expect(e_enc <= 1e-4f, form == lgc_form::ring ? "lgc ring encode" : "lgc ps encode");
    expect(e_dec <= 1e-4f, form == lgc_form::ring ? "lgc ring decode" : "lgc ps decode");
    bool refused = false;
    try {
      // The wrong argument for each form: a (non-null) device buffer for the
      // ring form, none for the parameter-server form.
      dev.decode(0, dcode, form == lgc_form::ring ? dx.ptr() : nullptr, dy, dws);
    } catch (const invalid_argument_error&) {
      refused = true;
    }
    expect(refused, "lgc device decode checks the innovation argument against the form");
  }
}
