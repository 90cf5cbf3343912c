// The gradient exchange of each configuration (see exchange.hpp).
#include "exchange.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/ring_allreduce.hpp>

namespace train {

using policy = gradcomp::execution::simd;  // falls back to seq without xsimd

// ---------------------------------------------------------------------------
// Configurations.

std::string_view config_name(config_id c) noexcept {
  switch (c) {
    case config_id::msgd_single: return "msgd_single";
    case config_id::baseline: return "baseline";
    case config_id::gradiveq: return "gradiveq";
    case config_id::gradiveq_plus: return "gradiveq_plus";
    case config_id::qsgd4: return "qsgd4";
    case config_id::two_bit: return "two_bit";
    case config_id::topk: return "topk";
    case config_id::dgs: return "dgs";
    case config_id::lgc: return "lgc";
  }
  return "?";
}

std::string_view config_description(config_id c) noexcept {
  switch (c) {
    case config_id::msgd_single: return "one worker, global batch, momentum SGD (seed 001's reference)";
    case config_id::baseline: return "N workers, uncompressed float32 ring all-reduce";
    case config_id::gradiveq: return "GradiVeQ on conv layers, compressed-domain ring, paper recipe (seed 002)";
    case config_id::gradiveq_plus: return "GradiVeQ with the header's best linear improvements";
    case config_id::qsgd4: return "QSGD 4-bit, decode-and-sum";
    case config_id::two_bit: return "two-bit quantizer with residual, automatic threshold (seed 003)";
    case config_id::topk: return "top-R% sparsifier with memory, synchronous (seed 001 Alg. 1)";
    case config_id::dgs: return "DGS: asynchronous parameter server, SAMomentum, 99% sparsity, secondary compression";
    case config_id::lgc: return "LGC ring form: top-k + online autoencoder, averaged codes (seed 004)";
  }
  return "?";
}

std::optional<config_id> parse_config(std::string_view name) noexcept {
  for (auto c : all_configs)
    if (config_name(c) == name) return c;
  return std::nullopt;
}

std::string config_unavailable(config_id c) {
  switch (c) {
    case config_id::msgd_single:
    case config_id::baseline: return {};
    case config_id::gradiveq:
    case config_id::gradiveq_plus: return "not wired in this build yet (waits for include/gradcomp/gradiveq.hpp)";
    case config_id::qsgd4: return "not wired in this build yet (waits for include/gradcomp/qsgd.hpp)";
    case config_id::two_bit: return "not wired in this build yet (waits for include/gradcomp/two_bit.hpp)";
    case config_id::topk: return "not wired in this build yet (waits for include/gradcomp/sparsify.hpp)";
    case config_id::dgs:
      return "not wired in this build yet (waits for include/gradcomp/parameter_server.hpp and samomentum.hpp)";
    case config_id::lgc: return "not wired in this build yet (waits for include/gradcomp/autoencoder.hpp)";
  }
  return "unknown configuration";
}

// ---------------------------------------------------------------------------
// Collectives over the control transport.

std::vector<std::vector<std::byte>> allgather_bytes(counted_transport& t, std::vector<std::byte> mine, int tag) {
  const int n = t.size(), r = t.rank();
  std::vector<std::vector<std::byte>> all(static_cast<std::size_t>(n));
  all[static_cast<std::size_t>(r)] = mine;
  if (n == 1) return all;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // Step s forwards the block of rank (r - s) mod n.
  std::vector<any_send_handle> sends;
  sends.push_back(t.isend(next, tag, std::move(mine)));
  for (int s = 1; s < n; ++s) {
    gradcomp::message m = t.irecv(prev, tag).wait();
    const int owner = ((r - s) % n + n) % n;
    all[static_cast<std::size_t>(owner)] = m.bytes;
    if (s + 1 < n) sends.push_back(t.isend(next, tag, std::move(m.bytes)));
  }
  for (auto& h : sends) h.wait();
  return all;
}

std::vector<std::vector<double>> allgather_doubles(counted_transport& t, std::span<const double> mine, int tag) {
  std::vector<std::byte> bytes(mine.size_bytes());
  if (!mine.empty()) std::memcpy(bytes.data(), mine.data(), bytes.size());
  auto all = allgather_bytes(t, std::move(bytes), tag);
  std::vector<std::vector<double>> out(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].size() != mine.size_bytes())
      throw gradcomp::transport_error("allgather_doubles: rank " + std::to_string(i) + " sent " +
                                      std::to_string(all[i].size()) + " bytes, expected " +
                                      std::to_string(mine.size_bytes()));
    out[i].resize(mine.size());
    if (!mine.empty()) std::memcpy(out[i].data(), all[i].data(), all[i].size());
  }
  return out;
}

void barrier(counted_transport& t, int tag) { allgather_bytes(t, {}, tag); }

// ---------------------------------------------------------------------------
// Exchanges.

namespace {

constexpr int tag_dense = 32000;  // ring_allreduce uses tag_dense and tag_dense + 1

/// Adds a layer's byte accounting to the counters.
void count(codec_counters& c, std::size_t elements, std::size_t encoded, bool target) {
  c.raw_bytes += 4 * elements;
  c.encoded_bytes += encoded;
  if (target) {
    c.target_raw_bytes += 4 * elements;
    c.target_encoded_bytes += encoded;
  }
}

/// One worker: nothing to exchange.
class single_exchanger final : public exchanger {
 public:
  void exchange(std::size_t, double, std::span<const std::span<float>>) override {}
  std::string target_label() const override { return "none"; }
};

/// Uncompressed ring all-reduce (mean), one call per layer. Bytes on the wire
/// are raw floats: the encoded size of a layer is its float32 size.
class baseline_exchanger final : public exchanger {
 public:
  explicit baseline_exchanger(counted_transport& t) : t_(t) {}
  void exchange(std::size_t, double, std::span<const std::span<float>> layers) override {
    for (auto layer : layers) {
      gradcomp::ring_allreduce(policy{}, t_, layer, {.average = true, .tag_base = tag_dense});
      count(counters, layer.size(), 4 * layer.size(), true);
    }
  }

 private:
  counted_transport& t_;
};

}  // namespace

void validate_codec_options(config_id c, const run_options& o, std::span<const layer_desc>) {
  (void)o;
  if (auto why = config_unavailable(c); !why.empty())
    throw gradcomp::invalid_argument_error(std::string(config_name(c)) + ": " + why);
}

std::unique_ptr<exchanger> make_exchanger(config_id c, const run_options& o, counted_transport& data,
                                          std::span<const layer_desc> layers, std::size_t total_steps) {
  validate_codec_options(c, o, layers);
  (void)total_steps;
  switch (c) {
    case config_id::msgd_single: return std::make_unique<single_exchanger>();
    case config_id::baseline: return std::make_unique<baseline_exchanger>(data);
    default: break;
  }
  throw gradcomp::invalid_argument_error(std::string(config_name(c)) + ": " + config_unavailable(c));
}

}  // namespace train
