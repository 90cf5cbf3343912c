#pragma once
/// \file exchange/auto_collectives.hpp
/// auto_collectives: the exchange's sum rounds on the schedule the cost
/// model (schedules/cost_model.hpp) predicts fastest for each buffer length.
/// The first time a length is summed, rank 0 decides and broadcasts (after a
/// one-time calibration: ping-pong and addition cost, rank 0's values), so
/// every rank sums in the same order whatever its own timings; the
/// decisions and the calibrated model are part of the exchange's checkpoint
/// (save_state), so a resumed run sums exactly as before. A user can force
/// one schedule for every round.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/exchange/schedule_collectives.hpp>
#include <gradcomp/schedules.hpp>

namespace gradcomp::exchange {

/// Options of auto_collectives.
struct auto_collectives_options {
  /// The model's parameters: given, or the starting point of the calibration.
  /// Its group_size and chunk_elements are the schedules' too.
  cost_model model{};
  /// Measure the links (2-rank ping-pong) and the addition at the first round.
  bool calibrate = true;
  /// Every sum round on this schedule (the choice is still recorded).
  std::optional<schedule_kind> forced;
};

/// One agreed choice: the sum rounds of buffers of this length and element run on `decision.kind`.
struct round_schedule {
  std::size_t length = 0;
  buffer_element element = buffer_element::float32;
  schedule_decision decision;
};

GRADCOMP_ABI_NAMESPACE_BEGIN
/// RoundCollectives choosing the schedule of each sum round by the cost model
/// (see the file comment). Agreement messages use the round's tag + 2 (the
/// exchange's all-gather tag, between rounds: never mixed with a round's).
template <ExecutionPolicy Policy = execution::seq>
class auto_collectives {
 public:
  explicit auto_collectives(auto_collectives_options options = {}) : o_(options), model_(options.model) {}

  template <Transport T>
  void sum(T& t, std::span<float> data, buffer_element e, int tag, wire_counters& c) {
    detail::schedule_sum<Policy>(t, data, e, tag, c, options_for(t, data.size(), e, tag));
  }
  template <Transport T>
  void sum(T& t, std::span<float> data, int tag, wire_counters& c) {
    sum(t, data, buffer_element::float32, tag, c);
  }
  template <Transport T>
  void max(T& t, std::span<float> data, buffer_element e, int tag, wire_counters& c) {
    // The same messages as a sum of the same length (float32 cells): the same choice.
    detail::schedule_max<Policy>(t, data, e, tag, c, options_for(t, data.size(), buffer_element::float32, tag));
  }
  template <Transport T>
  void max(T& t, std::span<float> data, int tag, wire_counters& c) {
    max(t, data, buffer_element::float32, tag, c);
  }
  template <Transport T>
  std::vector<std::vector<std::byte>> all_gather(T& t, std::vector<std::byte> mine, int tag, wire_counters& c) {
    c.schedule = "all_gather";
    return all_gather_round(t, std::move(mine), tag, c);
  }

  /// Every agreed choice so far, in the order they were made (the same on every rank).
  const std::vector<round_schedule>& decisions() const noexcept { return decisions_; }
  /// The schedule of the last sum round, if any.
  std::optional<schedule_kind> last_schedule() const noexcept { return last_; }
  /// The model in use (calibrated once rounds have run; the same on every rank).
  const cost_model& model() const noexcept { return model_; }
  bool calibrated() const noexcept { return calibrated_; }

  /// The model and the decisions as bytes (part of model_exchange::save_state).
  std::vector<std::byte> save_state() const {
    std::vector<std::byte> b;
    auto put = [&](const void* p, std::size_t n) {
      const auto* q = static_cast<const std::byte*>(p);
      b.insert(b.end(), q, q + n);
    };
    // Version 3: the model's message_s after message_overhead_s. Version 2
    // (without it) and version 1 (before the direct schedule: five
    // predictions) are still read.
    const std::uint32_t magic = 0x43534347u, version = 3;  // "GCSC"
    put(&magic, 4);
    put(&version, 4);
    const double md[] = {model_.inter.latency_s, model_.inter.seconds_per_byte, model_.intra.latency_s,
                         model_.intra.seconds_per_byte, model_.add_s, model_.message_overhead_s, model_.message_s};
    put(md, sizeof md);
    const std::int64_t mi[] = {model_.group_size, static_cast<std::int64_t>(model_.chunk_elements), calibrated_ ? 1 : 0,
                               static_cast<std::int64_t>(decisions_.size())};
    put(mi, sizeof mi);
    for (const auto& r : decisions_) {
      const std::uint64_t len = r.length;
      const std::uint8_t small[] = {static_cast<std::uint8_t>(r.element), static_cast<std::uint8_t>(r.decision.kind),
                                    static_cast<std::uint8_t>(r.decision.forced ? 1 : 0)};
      put(&len, 8);
      put(small, 3);
      put(r.decision.predicted.data(), sizeof(double) * schedule_kind_count);
    }
    return b;
  }
  /// Restores save_state() bytes; state_error on malformed bytes (nothing changed then).
  void restore_state(std::span<const std::byte> b) {
    std::size_t at = 0;
    auto get = [&](void* p, std::size_t n) {
      if (b.size() - at < n) throw state_error("auto_collectives::restore_state: truncated state");
      std::memcpy(p, b.data() + at, n);
      at += n;
    };
    std::uint32_t magic = 0, version = 0;
    get(&magic, 4);
    get(&version, 4);
    if (magic != 0x43534347u || version < 1 || version > 3)
      throw state_error("auto_collectives::restore_state: not a schedule state");
    // Version 1 predates schedule_kind::direct: five predictions, direct unpriced (+inf).
    const std::size_t kinds = version == 1 ? 5 : schedule_kind_count;
    double md[7] = {};
    std::int64_t mi[4];
    get(md, sizeof(double) * (version >= 3 ? 7 : 6));  // before version 3: message_s 0 (not modelled)
    get(mi, sizeof mi);
    if (mi[3] < 0 || mi[0] < 0 || mi[1] < 0) throw state_error("auto_collectives::restore_state: bad counts");
    cost_model m;
    m.inter = {md[0], md[1]};
    m.intra = {md[2], md[3]};
    m.add_s = md[4];
    m.message_overhead_s = md[5];
    m.message_s = md[6];
    m.group_size = static_cast<int>(mi[0]);
    m.chunk_elements = static_cast<std::size_t>(mi[1]);
    m.max_chunks = model_.max_chunks;  // a setting of this process, not agreed state: changes no bit
    m.allgather_radix = model_.allgather_radix;  // the same
    std::vector<round_schedule> ds;
    for (std::int64_t i = 0; i < mi[3]; ++i) {
      round_schedule r;
      std::uint64_t len = 0;
      std::uint8_t small[3];
      get(&len, 8);
      get(small, 3);
      r.decision.predicted.fill(std::numeric_limits<double>::infinity());
      get(r.decision.predicted.data(), sizeof(double) * kinds);
      if (small[0] > 3 || small[1] >= kinds) throw state_error("auto_collectives::restore_state: bad entry");
      r.length = static_cast<std::size_t>(len);
      r.element = static_cast<buffer_element>(small[0]);
      r.decision.kind = static_cast<schedule_kind>(small[1]);
      r.decision.forced = small[2] != 0;
      ds.push_back(r);
    }
    if (at != b.size()) throw state_error("auto_collectives::restore_state: trailing bytes");
    model_ = m;
    calibrated_ = mi[2] != 0;
    decisions_ = std::move(ds);
    last_.reset();
  }

 private:
  /// The schedule options of a round of `length` cells of `e` (tags `tag`,
  /// `tag` + 1; the agreement on `tag` + 2).
  template <Transport T>
  schedule_options options_for(T& t, std::size_t length, buffer_element e, int tag) {
    const schedule_decision& d = decide(t, length, e, tag + 2);
    schedule_options so{.kind = d.kind, .chunk_elements = model_.chunk_elements, .group_size = model_.group_size};
    so.max_chunks = model_.max_chunks;
    so.allgather_radix = model_.allgather_radix;
    so.workspace = &workspace_;
    return so;
  }
  template <Transport T>
  const schedule_decision& decide(T& t, std::size_t length, buffer_element e, int tag) {
    for (const auto& r : decisions_)
      if (r.length == length && r.element == e) {
        last_ = r.decision.kind;
        return r.decision;
      }
    if (o_.calibrate && !calibrated_ && !o_.forced) {
      model_ = calibrate<Policy>(t, model_, tag);
      calibrated_ = true;
    }
    cost_problem p;
    p.elements = length;
    p.ranks = static_cast<int>(t.size());
    // 16-bit cells put half the bytes of float32 on the wire (additions priced at add_s all the same).
    // The codec's encode and decode run outside the round, the same for every schedule: no part of the choice.
    p.cell_bytes = double(element_bytes(e));
    decisions_.push_back(round_schedule{length, e, agree_schedule(t, model_, p, o_.forced, tag)});
    last_ = decisions_.back().decision.kind;
    return decisions_.back().decision;
  }

  auto_collectives_options o_;
  cost_model model_;
  bool calibrated_ = false;
  std::vector<round_schedule> decisions_;
  std::optional<schedule_kind> last_;
  schedule_workspace workspace_;  ///< the rounds' scratch, reused (see schedule_workspace)
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
