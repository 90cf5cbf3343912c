#pragma once
/// \file exchange/model_exchange.hpp
/// model_exchange: one call per step over one of gradcomp's transports. It
/// drives the bucket layer's rounds with the collectives of
/// exchange/collectives.hpp (sums on the ring driver, all-gathers and max
/// rounds as rings of payloads) and adds the wire to the statistics.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/exchange/bucket_layer.hpp>
#include <gradcomp/exchange/collectives.hpp>
#include <gradcomp/tags.hpp>

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Options of model_exchange.
struct exchange_options {
  failure_policy on_failure = failure_policy::skip;
  /// Tags tag_base, tag_base + 1 (sum and max rounds) and tag_base + 2 (all-gather rounds, agreements).
  int tag_base = tags::exchange.first;
};

/// One round of a step, as its collectives ran it.
struct round_record {
  std::size_t bucket = 0;  ///< the plan's bucket the round belongs to
  round_op op = round_op::sum;
  buffer_element element = buffer_element::float32;  ///< sum and max rounds
  std::size_t size = 0;  ///< sum and max: the buffer's cells; all_gather: this rank's payload bytes
  /// The schedule the collectives report (wire_counters::schedule: "ring",
  /// "rabenseifner", "direct", "library", "all_gather", ...); "" where they report none.
  std::string schedule;
};

/// Statistics of one step: the bucket layer's report plus the wire.
struct step_stats : step_report {
  wire_counters wire;
  /// Every round of the step in order (step_report::rounds of them), with
  /// the schedule it ran on (a step of auto_collectives shows the agreed
  /// choices here).
  std::vector<round_record> round_log;
  /// Bytes this rank contributed per phase name (a phase's buckets summed).
  std::vector<std::pair<std::string, std::size_t>> phase_bytes;
};

/// The whole-model exchange over a Transport (docs/exchange.md). Its rounds
/// run on `Collectives` (gradcomp's ring by default; another schedule plugs
/// in as any RoundCollectives type).
template <Transport T, ExecutionPolicy Policy = execution::seq, class Collectives = ring_collectives<Policy>>
  requires RoundCollectives<Collectives, T>
class model_exchange {
 public:
  model_exchange(T& transport, plan p, exchange_options options = {}, Collectives collectives = {})
      : t_(&transport),
        opt_(options),
        coll_(std::move(collectives)),
        layer_(std::move(p), static_cast<int>(transport.rank()), static_cast<int>(transport.size()),
               bucket_layer_options{options.on_failure}) {
    tags::check_tag_base(tags::exchange, opt_.tag_base, 3, "exchange::model_exchange");
  }

  /// One step: `gradients` (one span per layer, model order) hold this rank's
  /// gradients on entry and the aggregate (mean or sum) on return. Returns
  /// the step's statistics; `skipped` says every rank skipped the step (the
  /// gradients are then unchanged: do not apply them). With the throw policy
  /// a failed step throws exchange_failure_error on every rank.
  const step_stats& step(std::span<const std::span<float>> gradients, bool request_skip = false) {
    std::vector<std::span<const float>> in(gradients.begin(), gradients.end());
    wire_counters wc;
    std::vector<round_record> log;
    layer_.begin_step(in, request_skip);
    while (pending_round* r = layer_.next_round()) {
      round_record rec{r->bucket, r->spec.op, r->spec.element, r->spec.op == round_op::all_gather ? r->payload.size() : r->buffer.size(), {}};
      wc.schedule = nullptr;
      switch (r->spec.op) {
        case round_op::sum: coll_.sum(*t_, r->buffer, r->spec.element, opt_.tag_base, wc); layer_.complete_round(); break;
        case round_op::max: coll_.max(*t_, r->buffer, r->spec.element, opt_.tag_base, wc); layer_.complete_round(); break;
        case round_op::all_gather:
          layer_.complete_round(coll_.all_gather(*t_, std::move(r->payload), opt_.tag_base + 2, wc));
          break;
      }
      if (wc.schedule != nullptr) rec.schedule = wc.schedule;
      log.push_back(std::move(rec));
    }
    static_cast<step_report&>(stats_) = layer_.finish_step(gradients);
    wc.schedule = nullptr;
    stats_.wire = wc;
    stats_.round_log = std::move(log);
    stats_.phase_bytes.clear();
    for (std::size_t b = 0; b < stats_.bucket_phase.size() && b < stats_.bucket_bytes.size(); ++b) {
      auto it = std::find_if(stats_.phase_bytes.begin(), stats_.phase_bytes.end(),
                             [&](const auto& p) { return p.first == stats_.bucket_phase[b]; });
      if (it == stats_.phase_bytes.end())
        stats_.phase_bytes.emplace_back(stats_.bucket_phase[b], stats_.bucket_bytes[b]);
      else
        it->second += stats_.bucket_bytes[b];
    }
    return stats_;
  }

  /// Statistics of the last step.
  const step_stats& stats() const noexcept { return stats_; }
  const plan& layout() const noexcept { return layer_.layout(); }
  /// Completed (not skipped) steps.
  std::uint64_t steps() const noexcept { return layer_.steps(); }
  /// The bucket layer (codec states, the GradiVeQ schedule).
  const bucket_layer<Policy>& buckets() const noexcept { return layer_; }
  /// The collectives (auto_collectives: the agreed schedule choices).
  const Collectives& collectives() const noexcept { return coll_; }
  /// The whole state as bytes (bucket_layer::save_state; for collectives
  /// with a state of their own, auto_collectives' schedule choices, that
  /// state follows, then its length as a native uint64).
  std::vector<std::byte> save_state() const {
    std::vector<std::byte> s = layer_.save_state();
    if constexpr (requires(const Collectives& c) { { c.save_state() } -> std::same_as<std::vector<std::byte>>; }) {
      const std::vector<std::byte> c = coll_.save_state();
      const std::uint64_t n = c.size();
      s.insert(s.end(), c.begin(), c.end());
      const auto* p = reinterpret_cast<const std::byte*>(&n);
      s.insert(s.end(), p, p + sizeof n);
    }
    return s;
  }
  /// Restores save_state() bytes of the same plan, world size and rank.
  void restore_state(std::span<const std::byte> bytes) {
    if constexpr (requires(Collectives& c) { c.restore_state(bytes); }) {
      std::uint64_t n = 0;
      if (bytes.size() < sizeof n) throw state_error("exchange::model_exchange::restore_state: truncated state");
      std::memcpy(&n, bytes.data() + bytes.size() - sizeof n, sizeof n);
      if (n > bytes.size() - sizeof n) throw state_error("exchange::model_exchange::restore_state: truncated state");
      const std::size_t layer_bytes = bytes.size() - sizeof n - static_cast<std::size_t>(n);
      Collectives restored = coll_;
      restored.restore_state(bytes.subspan(layer_bytes, static_cast<std::size_t>(n)));
      layer_.restore_state(bytes.first(layer_bytes));
      coll_ = std::move(restored);
    } else {
      layer_.restore_state(bytes);
    }
  }

 private:
  T* t_;
  exchange_options opt_;
  Collectives coll_;
  bucket_layer<Policy> layer_;
  step_stats stats_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
