#pragma once
/// \file exchange/bucket_factory.hpp
/// The bucket codecs of a plan, one per bucket in plan order: the codec
/// kind the plan gave the bucket, its layers' lengths, and the per-layer
/// seeds mixed from the plan's seed (plan_options::seed) and the layer
/// index, and the rank where a codec's draws must differ between ranks
/// (QSGD, top-k) or not at all (homomorphic: one seed, the worker index).
/// The bucket layer (exchange/bucket_layer.hpp) builds its buckets, and
/// rebuilds them for a restore, with it.

#include <cstddef>
#include <memory>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/exchange/bucket_codecs.hpp>
#include <gradcomp/exchange/gradiveq_bucket.hpp>
#include <gradcomp/exchange/model.hpp>
#include <gradcomp/exchange/powersgd_bucket.hpp>
#include <gradcomp/exchange/scalar_buckets.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/two_bit.hpp>

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Every bucket's codec for `rank` of `ranks`; the GradiVeQ buckets share
/// `life` and are also listed, in plan order, in `gradiveq` (replaced).
template <ExecutionPolicy Policy>
std::vector<std::unique_ptr<bucket_codec>> make_bucket_codecs(const plan& p, int rank, int ranks, gradiveq_lifecycle& life,
                                                              std::vector<gradiveq_bucket<Policy>*>& gradiveq) {
  const auto& o = p.options();
  std::vector<std::unique_ptr<bucket_codec>> out;
  gradiveq.clear();
  for (const auto& b : p.buckets()) {
    std::vector<std::size_t> lengths;
    for (auto i : b.layers) lengths.push_back(p.model()[i].shape.size());
    auto layer_of = [&b](std::size_t j) { return b.layers[j]; };
    switch (b.kind) {
      case codec_kind::custom: {
        auto c = o.custom_factory(p, b, rank, ranks);
        if (!c) throw invalid_argument_error("exchange: plan_options::custom_factory returned no bucket codec");
        out.push_back(std::move(c));
        break;
      }
      case codec_kind::lgc_ring:
      case codec_kind::lgc_ps: {  // plan_options::lgc_factory (exchange/lgc_bucket.hpp): LGC needs zlib
        auto c = o.lgc_factory(p, b, rank, ranks);
        if (!c) throw invalid_argument_error("exchange: plan_options::lgc_factory returned no bucket codec");
        out.push_back(std::move(c));
        break;
      }
      case codec_kind::dense: out.push_back(std::make_unique<dense_bucket>(lengths)); break;
      case codec_kind::fp16: out.push_back(std::make_unique<half_bucket<summable_element::float16>>(lengths)); break;
      case codec_kind::bf16: out.push_back(std::make_unique<half_bucket<summable_element::bfloat16>>(lengths)); break;
      case codec_kind::homomorphic:
        out.push_back(std::make_unique<homomorphic_bucket<Policy>>(lengths, ranks, [&](std::size_t j) {
          homomorphic_options h = o.homomorphic;  // one seed on every rank, this rank's worker index: stratified draws
          h.seed = mixed_seed(o.seed, h.seed, -1, layer_of(j));
          h.worker = static_cast<std::size_t>(rank);
          return h;
        }));
        break;
      case codec_kind::gradiveq: {
        auto g = std::make_unique<gradiveq_bucket<Policy>>(p, b, rank, ranks, life);
        gradiveq.push_back(g.get());
        out.push_back(std::move(g));
        break;
      }
      case codec_kind::powersgd: out.push_back(std::make_unique<powersgd_bucket<Policy>>(p, b)); break;
      case codec_kind::two_bit:
        out.push_back(std::make_unique<gather_bucket<two_bit_quantizer<Policy>>>(
            "two_bit", lengths, [&](std::size_t, std::size_t n) { return two_bit_quantizer<Policy>(n, o.two_bit); }));
        break;
      case codec_kind::qsgd:
        out.push_back(std::make_unique<gather_bucket<qsgd<Policy>>>("qsgd", lengths, [&](std::size_t j, std::size_t) {
          qsgd_options q = o.qsgd;
          q.seed = mixed_seed(o.seed, q.seed, rank, layer_of(j));
          return qsgd<Policy>(q);
        }));
        break;
      case codec_kind::top_k:
        out.push_back(std::make_unique<gather_bucket<sparsifier_with_memory<Policy>>>(
            "top_k", lengths, [&](std::size_t j, std::size_t n) {
              sparsifier_options s = o.top_k;
              s.seed = mixed_seed(o.seed, s.seed, rank, layer_of(j));
              return sparsifier_with_memory<Policy>(n, s);
            }));
        break;
    }
  }
  return out;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
