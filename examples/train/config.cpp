// The configurations of the demo: names, descriptions, parsing (common.hpp,
// exchange.hpp).
#include <string>
#include <string_view>

#include <gradcomp/errors.hpp>
#include <cmath>

#include "common.hpp"
#include "exchange.hpp"

namespace train {

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

std::optional<momentum_mode> parse_momentum_mode(std::string_view s) noexcept {
  if (s == "optimizer") return momentum_mode::optimizer;
  if (s == "dgc" || s == "local" || s == "correction") return momentum_mode::correction;
  if (s == "plain") return momentum_mode::plain;
  return std::nullopt;
}

std::optional<config_id> parse_config(std::string_view name) noexcept {
  for (auto c : all_configs)
    if (config_name(c) == name) return c;
  return std::nullopt;
}

std::string config_unavailable(config_id c) {
  for (auto k : all_configs)
    if (k == c) return {};  // every configuration builds wherever the demo builds (libtorch, zlib)
  return "unknown configuration";
}

void check_option_ranges(config_id c, const run_options& o) {
  using gradcomp::invalid_argument_error;
  if (!parse_momentum_mode(o.two_bit_momentum) || !parse_momentum_mode(o.topk_momentum) ||
      !parse_momentum_mode(o.lgc_momentum))
    throw invalid_argument_error("momentum modes are optimizer, dgc (or local) and plain");
  if (parse_momentum_mode(o.lgc_momentum) == momentum_mode::optimizer)
    throw invalid_argument_error("lgc: --lgc-momentum is dgc or plain (the node returns a corrected update)");
  if (c == config_id::two_bit && !std::isfinite(o.two_bit_threshold))
    throw invalid_argument_error("two_bit: threshold must be finite");
  if (c == config_id::qsgd4 && o.qsgd_bits != 2 && o.qsgd_bits != 4 && o.qsgd_bits != 8)
    throw invalid_argument_error("qsgd4: --qsgd-bits must be 2, 4 or 8, got " + std::to_string(o.qsgd_bits));
  if (c == config_id::topk && !(o.topk_percent > 0 && o.topk_percent <= 100))
    throw invalid_argument_error("topk: --topk-percent must be in (0, 100], got " + std::to_string(o.topk_percent));
  if (c == config_id::lgc && !(o.lgc_topk_percent > 0 && o.lgc_topk_percent <= 100))
    throw invalid_argument_error("lgc: --lgc-topk-percent must be in (0, 100]");
  if (c == config_id::dgs && !(o.dgs_sparsity >= 0 && o.dgs_sparsity < 100))
    throw invalid_argument_error("dgs: --dgs-sparsity must be in [0, 100), got " + std::to_string(o.dgs_sparsity));
  if (c == config_id::dgs && !(o.dgs_momentum > 0 && o.dgs_momentum < 1))
    throw invalid_argument_error("dgs: --dgs-momentum must be in (0, 1), got " + std::to_string(o.dgs_momentum));
}

}  // namespace train
