#pragma once
/// \file presets/parameter_server_rules.hpp
/// The worker update rules of seed 001 (DGS) Table 5 as factories for the
/// parameter servers (parameter_server.hpp): rule(j, n) builds layer j's
/// uplink codec, which ps_uplink feeds with eta * grad.
///
///   asgd_rule       ASGD: dense_codec                         (Table 5 row 1)
///   gd_async_rule   GD-async: sparsifier_with_memory          (Alg. 1, residual)
///   dgc_async_rule  DGC-async: sparsifier_with_memory, DGC mode (momentum correction, factor masking)
///   dgs_rule        DGS: sa_momentum                          (Alg. 3, eqs. 14-15)
///
/// These name concrete codecs, so they live in the third layer (presets/),
/// above both the codecs and the drivers; this header includes both, so one
/// include gives the servers, the workers and the rules:
///
///     #include <gradcomp/presets/parameter_server_rules.hpp>
///     gradcomp::async_ps_worker<gradcomp::sa_momentum<>> w(layers, gradcomp::dgs_rule<>{.ratio_percent = 1});

#include <cstddef>
#include <cstdint>

#include <gradcomp/dense.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/parameter_server.hpp>
#include <gradcomp/samomentum.hpp>
#include <gradcomp/sparsify.hpp>

namespace gradcomp {

// ---------------------------------------------------------------------------
// Worker update rules: the four rows of seed 001 Table 5

namespace presets_detail {
GRADCOMP_ABI_NAMESPACE_BEGIN
/// Layer j's sampling seed under a rule's `seed`: distinct layers draw
/// distinct samples.
inline std::uint64_t layer_seed(std::uint64_t seed, std::size_t layer) noexcept {
  return seed ^ (0x9E3779B97F4A7C15ull * (layer + 1));
}

/// The options every top-R% rule shares (R, threshold mode, layer j's seed),
/// for sparsifier_options or sa_momentum_options.
template <class Options, class Rule>
Options sparse_rule_options(const Rule& rule, std::size_t layer) {
  Options o;
  o.ratio_percent = rule.ratio_percent;
  o.mode = rule.mode;
  o.seed = layer_seed(rule.seed, layer);
  return o;
}
GRADCOMP_ABI_NAMESPACE_END
}  // namespace presets_detail

/// ASGD (Table 5 row 1): the dense gradient eta * grad, no momentum, no
/// sparsification. A factory for ps_uplink: rule(j, n) builds layer j's codec.
template <ExecutionPolicy Policy = execution::seq>
struct asgd_rule {
  using codec_type = dense_codec<Policy>;
  codec_type operator()(std::size_t, std::size_t) const { return {}; }
};

/// GD-async (Table 5, "GD-async / DGS without SAMomentum"): top-R% per layer
/// of the residual r <- r + eta * grad, the rest kept (Alg. 1 lines 6-12).
template <ExecutionPolicy Policy = execution::seq>
struct gd_async_rule {
  using codec_type = sparsifier_with_memory<Policy>;
  double ratio_percent = 1.0;
  threshold_mode mode = threshold_mode::exact;
  std::uint64_t seed = 0;
  codec_type operator()(std::size_t layer, std::size_t n) const {
    auto o = presets_detail::sparse_rule_options<sparsifier_options>(*this, layer);
    o.scale = 1.0f;  // ps_uplink feeds eta * grad
    return codec_type(n, o);
  }
};

/// DGC-async (Table 5): vanilla momentum with DGC's momentum correction and
/// momentum-factor masking (u <- m u + eta grad, v <- v + u, send top-R% of v,
/// clear u and v where sent).
template <ExecutionPolicy Policy = execution::seq>
struct dgc_async_rule {
  using codec_type = sparsifier_with_memory<Policy>;
  double ratio_percent = 1.0;
  float momentum = 0.7f;
  threshold_mode mode = threshold_mode::exact;
  std::uint64_t seed = 0;
  codec_type operator()(std::size_t layer, std::size_t n) const {
    auto o = presets_detail::sparse_rule_options<sparsifier_options>(*this, layer);
    o.scale = 1.0f;
    o.dgc_momentum = true;
    o.momentum = momentum;
    return codec_type(n, o);
  }
};

/// DGS (Table 5): SAMomentum (Alg. 3, eqs. 14-15), no residual accumulation.
template <ExecutionPolicy Policy = execution::seq>
struct dgs_rule {
  using codec_type = sa_momentum<Policy>;
  double ratio_percent = 1.0;
  float momentum = 0.7f;
  threshold_mode mode = threshold_mode::exact;
  std::uint64_t seed = 0;
  codec_type operator()(std::size_t layer, std::size_t n) const {
    auto o = presets_detail::sparse_rule_options<sa_momentum_options>(*this, layer);
    o.momentum = momentum;
    o.learning_rate = 1.0f;
    return codec_type(n, o);
  }
};

}  // namespace gradcomp
