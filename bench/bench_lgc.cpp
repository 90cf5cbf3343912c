// LGC (seed 004) at ResNet-50 scale: the cost of the autoencoder against the
// time to send what it replaces, the cost of the online training, and the
// compression ratios of the ring and parameter-server forms at alpha = 0.1%.
//
// Model: the 53 conv weight tensors and the fc weight of torchvision's
// ResNet-50 (25.50M weights; batch-norm and bias vectors left out, as the
// paper's n_l = k_h k_w f_{l-1} f_l counts conv kernels). First layer dense,
// fc top-k only, the rest through the autoencoder of Tables I-II (window
// 1024; mu = 23.5k values per iteration, 23 windows).
//
// 1. Encoder and decoder time per iteration (mu values, one node), best
//    thread-CPU time of interleaved rounds (Eigen runs single-threaded, set in
//    main even when OpenMP is linked, and
//    CPU time is not inflated by preemption on the shared 2-core VM), against
//    the time to send the uncompressed top-k vector (a dense float32 payload
//    of the mu values, header included) at 1 Gbit/s, computed from its bytes.
// 2. One online-training step (ring loss over K = 4 vectors; parameter-server
//    loss with 4 decoders), CPU time; the 300-step phase is projected from it.
// 3. The protocols over the in-process transport, 4 nodes (4 workers + a
//    server for the parameter server), a short schedule (1 training and 2
//    compressed iterations: enough to reach the steady state, the ratios do
//    not depend on how well the autoencoder is trained; a full iteration
//    sends one dense payload of 32 + 4n bytes per node, checked exactly by
//    the tests, and is left out to keep the bench short), exact bytes from the
//    nodes' lgc_traffic. RESULT ratios are those of a compressed iteration,
//    summed over the nodes (the leader's index set counted once); the whole
//    run with the paper's schedule is projected from the measured per-phase
//    bytes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <vector>

#include <Eigen/Dense>

#include <gradcomp/autoencoder.hpp>
#include <gradcomp/protocols/lgc.hpp>
#include <gradcomp/detail/random.hpp>
#include <gradcomp/transport/inproc.hpp>

#include "common.hpp"

namespace gb = gradcomp::bench;
using namespace gradcomp;

namespace {

using gb::interleaved_best;  // best thread CPU time of each function over interleaved rounds

/// Weight tensors of torchvision's ResNet-50 (conv1, the bottlenecks with
/// their downsample convs, fc), in forward order.
std::vector<std::size_t> resnet50_layers() {
  std::vector<std::size_t> l = {64 * 3 * 7 * 7};
  std::size_t in = 64;
  const int blocks[4] = {3, 4, 6, 3};
  const std::size_t widths[4] = {64, 128, 256, 512};
  for (int s = 0; s < 4; ++s)
    for (int b = 0; b < blocks[s]; ++b) {
      const std::size_t w = widths[s];
      l.push_back(in * w);          // 1x1
      l.push_back(w * w * 9);       // 3x3
      l.push_back(w * 4 * w);       // 1x1 expand
      if (b == 0) l.push_back(in * 4 * w);  // downsample
      in = 4 * w;
    }
  l.push_back(2048 * 1000);  // fc
  return l;
}

/// Synthetic gradient of node `rank` at `step`: a shared component plus a 30%
/// per-node innovation, per-layer scale 1/sqrt(n_l) (counter-based, cheap).
void synthetic_gradient(int rank, std::uint64_t step, const std::vector<std::size_t>& sizes,
                        std::vector<std::vector<float>>& g) {
  const gradcomp::detail::counter_rng rng(2024);
  g.resize(sizes.size());
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    const auto shared = rng.stream(step * 128 + l), own = rng.stream((step * 128 + l) * 64 + std::uint64_t(rank) + 1);
    const float scale = 1.0f / std::sqrt(float(sizes[l]));
    g[l].resize(sizes[l]);
    for (std::size_t i = 0; i < sizes[l]; ++i)
      g[l][i] = scale * ((2.0f * shared.uniform_float(i) - 1.0f) + 0.3f * (2.0f * own.uniform_float(i) - 1.0f));
  }
}

struct phase_bytes {
  double original = 0, payload = 0;
};

}  // namespace

int main() {
  // Eigen single-threaded for the whole run, encoder and baseline alike.
  // Linking gradcomp::thrust adds -fopenmp, and Eigen's GEMM then splits
  // every product over omp_get_max_threads() = 2 threads; the timings below
  // are the calling thread's CPU time, which then sees half of each GEMM
  // plus however long it spins at the barrier for the other thread (it
  // depends on whether the second core is free: on the shared VM the same
  // GEMMs measured 2-3x their single-thread CPU time). One thread makes the
  // CPU time the whole cost, and the same for both sides of
  // lgc_encoder_vs_gemm.
  Eigen::setNbThreads(1);
  const std::vector<std::size_t> layers = resnet50_layers();
  const int nodes = 4;
  lgc_options o;  // alpha 0.1%, window 1024, Tables I-II, SGD 1e-3, momentum 0.9
  const lgc_layout layout(layers, o);
  std::size_t total = 0;
  for (auto n : layers) total += n;
  std::printf("LGC on ResNet-50 weight tensors: %zu tensors, %zu weights; alpha = %.2f%%\n", layers.size(), total,
              o.alpha_percent);
  std::printf("first layer dense (%zu), fc top-k only (%zu values), autoencoder input mu = %zu values, %zu windows of %zu\n",
              layout.dense_values, layout.topk_values, layout.mu, layout.windows(o.window), o.window);

  // ---- 1. encoder / decoder time vs the wire time of the top-k vector at 1 Gbit/s
  auto net = std::make_shared<lgc_network>(lgc_form::ring, 1, o.window, o.architecture, 1);
  std::printf("autoencoder (Tables I-II, deconv1 at stride 1): %zu parameters, code %zu floats per window of %zu\n",
              net->parameter_count(), net->code_length(), net->window());
  autoencoder_codec<> codec(net, layout.mu);
  std::vector<std::vector<float>> g;
  synthetic_gradient(0, 0, layers, g);
  std::vector<float> values;
  for (std::size_t l = 0; l < layers.size(); ++l)
    if (layout.roles[l] == lgc_layer_role::autoencoder)
      for (std::size_t j = 0; j < layout.k[l]; ++j) values.push_back(g[l][(j * 7919) % layers[l]]);
  lgc_code_payload code;
  std::vector<float> decoded(layout.mu);
  autoencoder_codec<>::workspace decode_ws;  // the decoder's scratch, warm after the first call
  // Same-run baseline of the encoder: one Eigen GEMM per encoder layer with
  // the shape of that layer's im2col product (C_out x C_in k) * (C_in k x
  // windows L_out), the pointwise code layer likewise: the rate the encoder
  // would reach if its convolutions were nothing but their GEMMs. Timed in
  // the same interleaved rounds as encode and decode, so that a change of
  // load during the run reaches both sides of lgc_encoder_vs_gemm alike.
  std::vector<Eigen::MatrixXf> gemm_w, gemm_col, gemm_out;
  {
    std::size_t len = o.window, in = 1;
    const auto batch = static_cast<Eigen::Index>(layout.windows(o.window));
    auto add_layer = [&](std::size_t c_out, std::size_t depth, std::size_t l_out) {
      gemm_w.push_back(Eigen::MatrixXf::Random(Eigen::Index(c_out), Eigen::Index(depth)));
      gemm_col.push_back(Eigen::MatrixXf::Random(Eigen::Index(depth), batch * Eigen::Index(l_out)));
      gemm_out.emplace_back(Eigen::Index(c_out), batch * Eigen::Index(l_out));
    };
    for (auto c : o.architecture.encoder_channels) {
      len /= 2;
      add_layer(c, in * o.architecture.kernel, len);
      in = c;
    }
    add_layer(o.architecture.code_channels, in, len);
  }
  const auto t = interleaved_best(5, {[&] { codec.encode(values, code); }, [&] { codec.decode(code, decoded, decode_ws); },
                                      [&] {
                                        for (std::size_t i = 0; i < gemm_w.size(); ++i)
                                          gemm_out[i].noalias() = gemm_w[i] * gemm_col[i];
                                      }});
  const double enc = t[0], dec = t[1], gemm_time = t[2];
  const std::size_t topk_bytes = wire::serialized_size(dense_payload{values});
  const std::size_t coo_bytes = topk_bytes + 4 * layout.mu;  // with a 32-bit index per value
  const double wire_1g = double(topk_bytes) * 8.0 / 1e9;
  std::printf("\n%-44s %10.3f ms\n", "encode (scales + E_c), one node", enc * 1e3);
  std::printf("%-44s %10.3f ms\n", "decode (D_c + scales), once per iteration", dec * 1e3);
  std::printf("%-44s %10.3f ms  (%zu bytes)\n", "send top-k values at 1 Gbit/s", wire_1g * 1e3, topk_bytes);
  std::printf("%-44s %10.3f ms  (%zu bytes)\n", "send top-k values + int32 indices at 1 Gbit/s",
              double(coo_bytes) * 8.0 / 1e9 * 1e3, coo_bytes);
  std::printf("%-44s %10zu bytes (%.2f x smaller than the values)\n", "code payload", wire::serialized_size(code),
              double(topk_bytes) / double(wire::serialized_size(code)));
  const double gflop_enc = [&] {
    // multiply-adds of the encoder per window, x2 flops
    double f = 0, len = double(o.window), in = 1;
    for (auto c : o.architecture.encoder_channels) {
      len /= 2;
      f += len * double(c) * in * double(o.architecture.kernel);
      in = double(c);
    }
    f += len * double(o.architecture.code_channels) * in;
    return 2 * f * double(layout.windows(o.window)) / 1e9;
  }();
  std::printf("%-44s %10.2f GFLOP/s (%.2f GFLOP per encode)\n", "encoder throughput", gflop_enc / enc, gflop_enc);
  std::printf("%-44s %10.3f ms (%.2f GFLOP/s)\n", "same-shape GEMMs (Eigen), one node", gemm_time * 1e3,
              gflop_enc / gemm_time);
  // Break-even link rate: the autoencoder pays when its encode + decode take
  // less than the wire time of the bytes it saves (the values' payload minus
  // the code's), i.e. below (saved bits) / (encode + decode) bit/s.
  const double saved_bits = 8.0 * (double(topk_bytes) - double(wire::serialized_size(code)));
  const double breakeven_mbit = saved_bits / (enc + dec) / 1e6;
  std::printf("%-44s %10.1f Mbit/s\n", "break-even link rate (LGC pays below it)", breakeven_mbit);

  // ---- 2. online training step
  std::vector<std::vector<float>> vecs(nodes, values);
  for (int k = 1; k < nodes; ++k)
    for (std::size_t i = 0; i < vecs[std::size_t(k)].size(); ++i) vecs[std::size_t(k)][i] *= 1.0f + 0.01f * float(k);
  std::vector<std::span<const float>> views(vecs.begin(), vecs.end());
  lgc_trainer ring_trainer(*net, lgc_optimizer::sgd, 1e-3f);
  lgc_trainer ps_trainer(lgc_network(lgc_form::parameter_server, nodes, o.window, o.architecture, 1), lgc_optimizer::sgd, 1e-3f);
  std::vector<std::vector<float>> inn(nodes, std::vector<float>(layout.mu, 0.0f));
  for (int k = 0; k < nodes; ++k)
    for (std::size_t i = 0; i < layout.mu; i += 10) inn[std::size_t(k)][i] = vecs[std::size_t(k)][i];
  std::vector<std::span<const float>> iviews(inn.begin(), inn.end());
  const auto tt = interleaved_best(2, {[&] { ring_trainer.step_ring(views); }, [&] { ps_trainer.step_ps(views, iviews, 0); }});
  std::printf("\n%-44s %10.1f ms  (300 steps: %.0f s)\n", "training step, ring loss, K = 4", tt[0] * 1e3, 300 * tt[0]);
  std::printf("%-44s %10.1f ms  (300 steps: %.0f s)\n", "training step, PS loss, 4 decoders", tt[1] * 1e3, 300 * tt[1]);
  std::printf("%-44s %10.1f x\n", "ring training step / (encode + decode)", tt[0] / (enc + dec));

  // ---- 3. protocols
  lgc_options po = o;
  po.schedule = {0, 1};
  const std::uint64_t steps = 3;
  std::vector<std::vector<lgc_traffic>> ring_t(nodes, std::vector<lgc_traffic>(steps));
  std::vector<lgc_traffic> ring_total(nodes);
  lgc_index_payload last_index_set;
  double ring_wall = 0;
  std::mutex mu;
  // Runs the iterations of `node` (a ring node or a PS worker) on its rank's
  // synthetic gradients, keeping each iteration's traffic in traffic[rank].
  auto run_steps = [&](auto& node, transport::inproc_endpoint& ep, std::vector<std::vector<lgc_traffic>>& traffic) {
    std::vector<std::vector<float>> grad;
    for (std::uint64_t s = 0; s < steps; ++s) {
      synthetic_gradient(ep.rank(), s, layers, grad);
      std::vector<std::span<float>> sp(grad.begin(), grad.end());
      node.step(ep, sp);
      std::lock_guard<std::mutex> lock(mu);
      traffic[std::size_t(ep.rank())][s] = node.last_traffic();
    }
  };
  {
    const auto t0 = gb::clock::now();
    transport::run_workers(nodes, [&](transport::inproc_endpoint& ep) {
      lgc_ring_node<execution::simd> node(ep.rank(), nodes, layers, po);
      run_steps(node, ep, ring_t);
      std::lock_guard<std::mutex> lock(mu);
      ring_total[std::size_t(ep.rank())] = node.total_traffic();
      if (ep.rank() == 0) last_index_set = node.last_index_set();
    });
    ring_wall = std::chrono::duration<double>(gb::clock::now() - t0).count();
  }
  std::vector<std::vector<lgc_traffic>> ps_t(nodes, std::vector<lgc_traffic>(steps));
  lgc_traffic ps_server;
  double ps_wall = 0;
  {
    const auto t0 = gb::clock::now();
    transport::run_workers(nodes + 1, [&](transport::inproc_endpoint& ep) {
      if (ep.rank() == nodes) {
        lgc_ps_server<execution::simd> server(nodes, layers, po);
        for (std::uint64_t s = 0; s < steps; ++s) server.step(ep);
        std::lock_guard<std::mutex> lock(mu);
        ps_server = server.total_traffic();
        return;
      }
      lgc_ps_worker<execution::simd> w(ep.rank(), nodes, layers, po);
      run_steps(w, ep, ps_t);
    });
    ps_wall = std::chrono::duration<double>(gb::clock::now() - t0).count();
  }
  auto sum_step = [&](const std::vector<std::vector<lgc_traffic>>& tr, std::uint64_t s) {
    lgc_traffic x;
    for (const auto& n : tr) x += n[s];
    return x;
  };
  std::printf("\nprotocol runs (%d nodes, %llu iterations: 1 training, 2 compressed): ring %.1f s, PS %.1f s wall\n",
              nodes, (unsigned long long)steps, ring_wall, ps_wall);
  std::printf("%-10s %-12s %14s %14s %14s %10s\n", "form", "iteration", "original B", "payload B", "wire B", "ratio");
  for (std::uint64_t s = 0; s < steps; ++s) {
    const auto r = sum_step(ring_t, s), p = sum_step(ps_t, s);
    const char* ph = s < 1 ? "top-k+train" : (s == 1 ? "compressed*" : "compressed");
    std::printf("%-10s %-12s %14llu %14llu %14llu %9.1fx\n", "ring", ph, (unsigned long long)r.original_bytes,
                (unsigned long long)r.payload_bytes, (unsigned long long)r.wire_bytes, r.compression_ratio());
    std::printf("%-10s %-12s %14llu %14llu %14llu %9.1fx\n", "ps", ph, (unsigned long long)p.original_bytes,
                (unsigned long long)p.payload_bytes, (unsigned long long)p.wire_bytes, p.compression_ratio());
  }
  std::printf("(* weights distributed at the first compressed iteration: ring %zu B to each node, PS encoder %llu B "
              "to the common worker)\n",
              net->save().size(), (unsigned long long)ps_server.payload_bytes);
  const std::uint64_t last = steps - 1;
  const lgc_traffic ring_c = sum_step(ring_t, last), ps_c = sum_step(ps_t, last);
  std::printf("ring, compressed iteration, per node: ");
  for (int k = 0; k < nodes; ++k) std::printf("%.0fx ", ring_t[std::size_t(k)][last].compression_ratio());
  std::printf("(the leader also sends the index set)\n");
  std::printf("ps, compressed iteration: common worker %.0fx, other workers %.0fx (paper's two figures)\n",
              ps_t[0][last].compression_ratio(), ps_t[1][last].compression_ratio());
  // Same-run baseline: plain top-k (DGC-style) at the same indices, every node
  // sending a sparse_coo_payload (values + delta-varint indices) per sparsified
  // layer and the first layer dense.
  std::size_t coo_node = wire::header_size + 4 * layout.dense_values;
  for (std::size_t j = 0; j < last_index_set.indices.size(); ++j) {
    sparse_coo_payload p;
    p.length = last_index_set.layer_lengths[j];
    p.indices = last_index_set.indices[j];
    p.values.assign(p.indices.size(), 1.0f);
    coo_node += wire::serialized_size(p);
  }
  const double coo_ratio = double(ring_c.original_bytes) / (double(nodes) * double(coo_node));
  std::printf("%-44s %10.0fx (%zu B per node; LGC ring / top-k: %.2f x)\n", "top-k COO baseline, same indices", coo_ratio,
              coo_node, ring_c.compression_ratio() / coo_ratio);

  // Whole runs with the paper's schedule (200 full, 300 training, then
  // compressed), projected from the measured per-phase bytes of this run.
  auto project = [&](const std::vector<std::vector<lgc_traffic>>& tr, double weights, double iterations) {
    const auto tk = sum_step(tr, 0), c = sum_step(tr, last);
    const double full_payload = double(nodes) * double(wire::header_size + 4 * total);  // one dense payload per node
    const double orig = iterations * double(tk.original_bytes);
    const double pay = 200.0 * full_payload + 300.0 * double(tk.payload_bytes) +
                       (iterations - 500.0) * double(c.payload_bytes) + weights;
    return orig / pay;
  };
  const double ring_w = double(sum_step(ring_t, 1).payload_bytes) - double(sum_step(ring_t, 2).payload_bytes);
  for (double iters : {5000.0, 450000.0})
    std::printf("whole run, 200 full + 300 training + %.0f compressed (projected): ring %.0fx, PS %.0fx\n", iters - 500,
                project(ring_t, std::max(0.0, ring_w), iters), project(ps_t, double(ps_server.payload_bytes), iters));
  lgc_traffic rt;
  for (const auto& x : ring_total) rt += x;
  std::printf("%-44s ring %.1fx over these %llu iterations\n", "whole run measured", rt.compression_ratio(),
              (unsigned long long)steps);

  gb::result("lgc_ring_compression_ratio", ring_c.compression_ratio(), "x");
  gb::result("lgc_ps_compression_ratio", ps_c.compression_ratio(), "x");
  gb::result("lgc_encode_vs_wire_1gbit", (enc + dec) / wire_1g, "x");
  gb::result("lgc_encoder_vs_gemm", gemm_time / enc, "x");
  gb::result("lgc_breakeven_mbit", breakeven_mbit, "Mbit/s");
  return 0;
}
