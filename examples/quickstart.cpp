// gradcomp quickstart: four in-process workers sum their gradients with a
// ring all-reduce, check the result against a serial sum, and show what a
// codec payload looks like on the wire.
//
//   ./quickstart [workers [floats]]     defaults: 4 workers, 1048576 floats
// Exit code 0 when every check passes, 1 when one fails, 2 on bad arguments.
#include <gradcomp/dense.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <gradcomp/wire.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

namespace {

int workers = 4;
std::size_t gradient_length = std::size_t{1} << 20;  // 1M floats = 4 MiB per worker

// Deterministic pseudo-random gradient values in [-1, 1) for worker `rank`.
std::vector<float> make_gradient(int rank) {
  std::vector<float> g(gradient_length);
  std::uint64_t state = 0x9E3779B97F4A7C15ull * std::uint64_t(rank + 1);
  for (auto& v : g) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;  // 64-bit LCG
    v = float(std::int32_t(state >> 32)) * 0x1.0p-31f;
  }
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  using gradcomp::transport::inproc_endpoint;
  using gradcomp::transport::inproc_fabric;
  bool ok = true;
  if (argc > 1) workers = std::atoi(argv[1]);
  if (argc > 2) gradient_length = std::strtoull(argv[2], nullptr, 10);
  if (argc > 3 || workers < 2 || workers > 64 || gradient_length < 1) {
    std::fprintf(stderr, "usage: %s [workers (2..64) [floats per worker (>= 1)]]\n", argv[0]);
    return 2;
  }

  std::printf("gradcomp quickstart: %d in-process workers, %zu floats (%.1f MiB) of gradient each\n\n", workers,
              gradient_length, double(gradient_length * sizeof(float)) / (1 << 20));

  // --- 1. Every worker has its own gradient. ---------------------------------
  std::vector<std::vector<float>> gradients;
  for (int r = 0; r < workers; ++r) gradients.push_back(make_gradient(r));

  // The reference: a serial sum in double precision.
  std::vector<double> reference(gradient_length, 0.0), magnitude(gradient_length, 0.0);
  for (const auto& g : gradients)
    for (std::size_t i = 0; i < gradient_length; ++i) {
      reference[i] += g[i];
      magnitude[i] += std::abs(double(g[i]));
    }

  // --- 2. Ring all-reduce: one thread per worker, summing in place. ----------
  inproc_fabric fabric(workers);
  const auto t0 = std::chrono::steady_clock::now();
  fabric.run([&](inproc_endpoint& ep) { gradcomp::ring_allreduce(ep, gradients[std::size_t(ep.rank())]); });
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  std::printf("ring all-reduce (sum) took %.2f ms\n", ms);
  std::printf("  %-8s %16s %16s %10s\n", "worker", "bytes sent", "bytes received", "messages");
  for (int r = 0; r < workers; ++r) {
    auto& ep = fabric.endpoint(r);
    std::printf("  %-8d %16llu %16llu %10llu\n", r, (unsigned long long)ep.bytes_sent(),
                (unsigned long long)ep.bytes_received(), (unsigned long long)ep.messages_sent());
  }
  std::printf("  (a ring all-reduce sends 2(N-1)/N = %.2f x the gradient per worker: ~%.0f of %zu bytes)\n\n",
              2.0 * (workers - 1) / workers, 2.0 * (workers - 1) / workers * double(gradient_length * sizeof(float)),
              gradient_length * sizeof(float));

  // --- 3. Check: bit-identical on every worker, and equal to the serial sum. -
  bool identical = true;
  for (int r = 1; r < workers; ++r)
    identical = identical && std::memcmp(gradients[std::size_t(r)].data(), gradients[0].data(),
                                         gradient_length * sizeof(float)) == 0;
  double worst = 0.0;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < gradient_length; ++i) {
    const double err = std::abs(double(gradients[0][i]) - reference[i]);
    // N-1 float additions: each rounds by at most 2^-24 of the running magnitude.
    const double bound = workers * 0x1.0p-24 * magnitude[i] + 1e-30;
    worst = std::max(worst, err / bound);
    if (err > bound) ++bad;
  }
  std::printf("check: results bit-identical on all %d workers ........ %s\n", workers, identical ? "yes" : "NO");
  std::printf("check: equal to the serial sum within float rounding ... %s (worst error %.2f of the bound)\n\n",
              bad == 0 ? "yes" : "NO", worst);
  ok = ok && identical && bad == 0;

  // --- 4. A codec payload on the wire. ---------------------------------------
  // dense_codec is the identity codec (uncompressed float32), the baseline every
  // compressing codec is measured against. Worker 0 encodes its result,
  // serialises it (versioned header + CRC-32C) and sends it to worker 1, which
  // validates and decodes it.
  {
    gradcomp::dense_codec<> codec;
    std::vector<float> decoded(gradient_length);
    std::size_t wire_bytes = 0;
    fabric.endpoint(0).reset_counters();
    fabric.run([&](inproc_endpoint& ep) {
      if (ep.rank() == 0) {
        gradcomp::dense_payload payload;
        codec.encode(gradients[0], payload);
        wire_bytes = codec.encoded_bytes(payload);
        ep.isend(1, 0, gradcomp::wire::serialize(payload)).wait();
      } else if (ep.rank() == 1) {
        gradcomp::message m = ep.irecv(0, 0).wait();
        auto payload = gradcomp::wire::parse<gradcomp::dense_payload>(m.bytes);  // throws on any defect
        codec.decode(payload, decoded);
      }
    });
    const bool same = std::memcmp(decoded.data(), gradients[0].data(), gradient_length * sizeof(float)) == 0;
    const std::size_t raw = gradient_length * sizeof(float);
    std::printf("dense_codec through the wire format:\n");
    std::printf("  gradient            %10zu bytes (%zu floats)\n", raw, gradient_length);
    std::printf("  on the wire         %10zu bytes (%zu-byte header + body), measured %llu\n", wire_bytes,
                gradcomp::wire::header_size, (unsigned long long)fabric.endpoint(0).bytes_sent());
    std::printf("  compression ratio   %10.6f (compressing codecs go below 1)\n", double(wire_bytes) / double(raw));
    std::printf("check: decoded payload equals what was sent ............ %s\n\n", same ? "yes" : "NO");
    ok = ok && same && wire_bytes == fabric.endpoint(0).bytes_sent();
  }

  std::printf("%s\n", ok ? "quickstart: all checks passed" : "quickstart: FAILED");
  return ok ? 0 : 1;
}
