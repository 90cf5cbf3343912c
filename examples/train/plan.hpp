#pragma once
/// \file plan.hpp
/// The plan of gradcomp's whole-model exchange for each synchronous
/// configuration (config.cpp), used by exchange.cpp. No libtorch.

#include <cstddef>
#include <span>

#include <gradcomp/execution.hpp>
#include <gradcomp/model_exchange.hpp>

#include "common.hpp"

namespace train {

using policy = gradcomp::execution::simd;  // falls back to seq without xsimd

/// The plan of synchronous configuration `c`: which codec each layer gets and
/// every codec's options from the command line. `total_steps` sets
/// PowerSGD's uncompressed start period (a percentage of the run).
gradcomp::exchange::plan plan_for(config_id c, const run_options& o, std::span<const layer_desc> layers,
                                  std::size_t total_steps);

}  // namespace train
