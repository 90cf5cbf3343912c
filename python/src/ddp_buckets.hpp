// gradcomp._core.DDPBuckets: every parameter's bucket layer, keyed by name,
// and the DDP buckets over them, run with ONE call per DDP bucket and round
// (docs/python.md, "How a DDP bucket is exchanged"). Included by
// gradcomp_core.cpp only (it uses that file's options_from and helpers).
//
//     reqs = ex.begin(bucket_id, flat)          # checks, encodes every parameter, first round's requests
//     while reqs:                               # [(op, element, array)]: the collectives of this round
//         ... one collective per request, in order (sum/max in place; all_gather: every rank's array)
//         reqs = ex.complete(gathered)          # absorbs, the next round's requests ([] when done)
//     failures = ex.finish(flat)                # writes the mean; None, or the failed parameters
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

/// A 64-bit seed from the state's seed and a parameter name (FNV-1a), the
/// same as gradcomp.torch used before this class: checkpoints stay valid.
std::uint64_t name_seed(std::uint64_t seed, const std::string& name) {
  std::uint64_t h = 0xCBF29CE484222325ull ^ seed;
  for (const unsigned char b : name) h = (h ^ b) * 0x100000001B3ull;
  return h;
}

std::size_t round_up64(std::size_t n) { return (n + 63) / 64 * 64; }

/// One layer per parameter (a one-layer plan whose seed mixes the parameter
/// name), the DDP buckets (lists of parameters) over them, and one step of
/// one bucket at a time, driven with one call per round.
class ddp_buckets {
 public:
  static constexpr std::size_t history_steps = 16;  // packed all-gather sizes that set the capacity
  static constexpr std::size_t size_header = 8;     // bytes: u64 packed size, in front of every rank's payloads

  ddp_buckets(const nb::dict& plan_options, std::uint64_t seed, int rank, int ranks, bool matrix_view, bool defer_fits)
      : options_(options_from(plan_options)),
        seed_(seed),
        rank_(rank),
        ranks_(ranks),
        matrix_view_(matrix_view),
        defer_fits_(defer_fits) {
    if (ranks < 1 || rank < 0 || rank >= ranks) invalid("DDPBuckets: need 0 <= rank < ranks");
  }
  ddp_buckets(const ddp_buckets&) = delete;
  ddp_buckets& operator=(const ddp_buckets&) = delete;

  /// Registers a DDP bucket (its parameters' names and shapes, in bucket
  /// order) and returns its id; the same names give the same id. Layers are
  /// made on first use; a saved state waiting for a name is restored then.
  std::size_t bucket(const std::vector<std::string>& names, const std::vector<std::vector<std::size_t>>& shapes) {
    if (names.size() != shapes.size()) throw gradcomp::size_mismatch_error("DDPBuckets::bucket: shapes", names.size(), shapes.size());
    if (auto it = bucket_ids_.find(names); it != bucket_ids_.end()) return it->second;
    ddp_bucket b;
    for (std::size_t i = 0; i < names.size(); ++i) {
      b.params.push_back(slot(names[i], shapes[i]));
      b.total += slots_[b.params.back()].size;
    }
    buckets_.push_back(std::move(b));
    bucket_ids_.emplace(names, buckets_.size() - 1);
    return buckets_.size() - 1;
  }

  /// Starts a step of bucket `id` on `flat` (its float32 values, in place):
  /// one bad value anywhere flags every parameter of the bucket on this rank.
  nb::list begin(nb::handle self, std::size_t id, farray flat) {
    if (cur_) throw gradcomp::state_error("DDPBuckets::begin: a bucket step is already running (a collective failed?)");
    if (id >= buckets_.size()) invalid("DDPBuckets::begin: unknown bucket id");
    ddp_bucket& b = buckets_[id];
    if (flat.size() != b.total)
      throw gradcomp::layout_error("gradcomp: a DDP bucket holds " + std::to_string(flat.size()) +
                                   " floats for parameters of " + std::to_string(b.total));
    float* data = flat.data();
    bool flag = false;
    for (std::size_t i = 0; i < b.total; ++i) flag |= !std::isfinite(data[i]);
    std::size_t at = 0;
    std::size_t begun = 0;
    try {
      for (auto p : b.params) {
        const std::span<const float> g(data + at, slots_[p].size);
        slots_[p].layer->begin_step(std::span<const std::span<const float>>(&g, 1), flag);
        at += slots_[p].size;
        ++begun;
      }
    } catch (...) {
      if (begun) mark_broken();  // earlier layers are inside a step that cannot finish
      throw;
    }
    cur_ = &b;
    held_ = flat;
    data_ = data;
    return collect(self);
  }

  /// Completes the round whose requests `begin`/`complete` returned: the sum
  /// and max arrays were reduced in place; `gathered` holds every rank's
  /// all-gather array (rank order) when there was an all-gather request.
  /// Returns the next requests: the all-gather again with a larger capacity
  /// when some rank's payloads did not fit, the next round's, or [] when done.
  nb::list complete(nb::handle self, std::optional<std::vector<u8array>> gathered) {
    if (!cur_) throw gradcomp::state_error("DDPBuckets::complete: no bucket step is running");
    if (!reduced_) {
      for (auto& g : reduces_) {
        std::size_t at = 0;
        for (auto& m : g.members) {
          std::memcpy(m.round->buffer.data(), g.joined.data() + at, m.round->buffer.size() * sizeof(float));
          at += m.round->buffer.size();
          slots_[m.slot].layer->complete_round();
        }
      }
      reduced_ = true;
    }
    if (!gather_.members.empty()) {
      if (!gathered || gathered->size() != static_cast<std::size_t>(ranks_))
        throw gradcomp::size_mismatch_error("DDPBuckets::complete: gathered arrays", ranks_, gathered ? gathered->size() : 0);
      std::vector<std::uint64_t> sizes;
      std::uint64_t need = 0;
      for (const auto& a : *gathered) {
        if (a.size() != send_.size())
          throw gradcomp::size_mismatch_error("DDPBuckets::complete: gathered array bytes", send_.size(), a.size());
        std::uint64_t n;
        std::memcpy(&n, a.data(), sizeof n);
        sizes.push_back(n);
        need = std::max(need, n);
      }
      if (need > capacity_) {  // some rank did not fit: every rank saw it, all repeat once, larger
        ++extra_collectives_;
        fill_send(round_up64(need));
        nb::list out;
        out.append(nb::make_tuple("all_gather", "", view_u8(self)));
        return out;
      }
      auto& hist = cur_->history[gather_.members.size()];
      hist.push_back(need);
      if (hist.size() > history_steps) hist.erase(hist.begin());
      const std::size_t k = gather_.members.size();
      std::vector<std::vector<std::vector<std::byte>>> per(k, std::vector<std::vector<std::byte>>(gathered->size()));
      for (std::size_t r = 0; r < gathered->size(); ++r) {
        const auto* d = reinterpret_cast<const std::byte*>((*gathered)[r].data()) + size_header;
        if (sizes[r] < 4 * k) gradcomp::wire::reader::fail(gradcomp::wire::wire_errc::truncated, "gradcomp: a rank's packed payloads are shorter than their lengths");
        std::size_t at = 4 * k;
        for (std::size_t j = 0; j < k; ++j) {
          std::uint32_t n;
          std::memcpy(&n, d + 4 * j, 4);
          if (at + n > sizes[r]) gradcomp::wire::reader::fail(gradcomp::wire::wire_errc::truncated, "gradcomp: a rank's packed payloads overrun their size");
          per[j][r].assign(d + at, d + at + n);
          at += n;
        }
      }
      for (std::size_t j = 0; j < k; ++j) slots_[gather_.members[j].slot].layer->complete_round(std::move(per[j]));
    }
    return collect(self);
  }

  /// Ends the step: writes the mean into `flat` (the array given to begin).
  /// Returns None, or (when a step was skipped on every rank) a list of
  /// (name, failures [(rank, reason, layer)], local_detail) of every parameter.
  nb::object finish(farray flat) {
    if (!cur_) throw gradcomp::state_error("DDPBuckets::finish: no bucket step is running");
    if (flat.data() != data_ || !pending_done_) throw gradcomp::state_error("DDPBuckets::finish: rounds are pending, or another array");
    ddp_bucket& b = *cur_;
    std::size_t at = 0;
    bool skipped = false;
    std::vector<gx::step_report> reps;
    reps.reserve(b.params.size());
    for (auto p : b.params) {
      std::span<float> o(data_ + at, slots_[p].size);
      reps.push_back(slots_[p].layer->finish_step(std::span<const std::span<float>>(&o, 1)));
      at += slots_[p].size;
      skipped |= reps.back().skipped;
      encode_seconds_ += reps.back().encode_seconds;
      decode_seconds_ += reps.back().decode_seconds;
    }
    end_step();
    if (!skipped) return nb::none();
    nb::list out;
    for (std::size_t i = 0; i < reps.size(); ++i)
      out.append(nb::make_tuple(slots_[b.params[i]].name, failure_list(reps[i].failures), reps[i].local_detail));
    return out;
  }

  /// name -> the layer's checkpoint (and states loaded for layers not made yet).
  nb::dict save_states() const {
    nb::dict d;
    for (const auto& [name, blob] : pending_) d[nb::str(name.c_str())] = nb::bytes(blob.data(), blob.size());
    for (const auto& s : slots_) {
      if (s.broken) continue;
      const auto st = s.layer->save_state();
      d[nb::str(s.name.c_str())] = nb::bytes(reinterpret_cast<const char*>(st.data()), st.size());
    }
    return d;
  }

  /// Restores a parameter's checkpoint now, or when its layer is made.
  void restore(const std::string& name, const nb::bytes& blob) {
    if (auto it = slot_ids_.find(name); it != slot_ids_.end()) {
      slots_[it->second].layer->restore_state(
          std::span<const std::byte>(static_cast<const std::byte*>(blob.data()), blob.size()));
      slots_[it->second].broken = false;
    } else {
      pending_[name] = std::string(static_cast<const char*>(blob.data()), blob.size());
    }
  }

  void clear_history() {
    for (auto& b : buckets_) b.history.clear();
  }

  nb::dict phases() const {
    nb::dict d;
    for (const auto& s : slots_) d[nb::str(s.name.c_str())] = s.layer->bucket(0).phase();
    return d;
  }

  /// name -> (eq. 7 loss, energy) of this rank's last step, for every
  /// parameter whose GradiVeQ layer was encoded (L_c) in it; empty otherwise.
  nb::dict gradiveq_losses() const {
    nb::dict d;
    for (const auto& s : slots_) {
      const auto& l = s.layer->gradiveq_loss();
      if (l.energy > 0.0 || l.loss > 0.0) d[nb::str(s.name.c_str())] = nb::make_tuple(l.loss, l.energy);
    }
    return d;
  }

  // --- fits shared by the ranks of a host (defer_fits; gradcomp.torch's fit_sharing="host")

  /// [(name, work)] of every parameter whose GradiVeQ fit is pending, in
  /// name order; work: the fit's relative cost, the same on every rank.
  nb::list pending_fits() const {
    std::vector<std::pair<std::string, double>> v;
    for (const auto& s : slots_)
      if (s.layer->fit_pending()) v.emplace_back(s.name, s.layer->fit_work());
    std::sort(v.begin(), v.end());
    nb::list out;
    for (const auto& [name, work] : v) out.append(nb::make_tuple(name, work));
    return out;
  }

  /// Runs a parameter's pending fit here; returns its bases for adopt_fit on the other ranks.
  nb::bytes fit(const std::string& name) {
    layer_t& l = pending_layer(name, "DDPBuckets::fit");
    const auto bases = l.fit_bases();
    decode_seconds_ += l.fit_seconds();
    return nb::bytes(reinterpret_cast<const char*>(bases.data()), bases.size());
  }

  /// Instead of fit: the bases another rank's fit returned (checked: another
  /// parameter's, step's or configuration's raise, and nothing changes).
  void adopt_fit(const std::string& name, const nb::bytes& bases) {
    layer_t& l = pending_layer(name, "DDPBuckets::adopt_fit");
    l.adopt_bases(std::span<const std::byte>(static_cast<const std::byte*>(bases.data()), bases.size()));
    decode_seconds_ += l.fit_seconds();
  }

  double encode_seconds() const { return encode_seconds_; }
  double decode_seconds() const { return decode_seconds_; }
  std::size_t extra_collectives() const { return extra_collectives_; }
  bool running() const { return cur_ != nullptr; }

  /// Drops a step that cannot finish (a collective raised): the bucket's
  /// layers keep the state before it only through a later load; the ones
  /// inside a step are marked broken and are rebuilt fresh on next use.
  void abandon() {
    if (cur_) mark_broken();
    end_step();
  }

 private:
  struct param_slot {
    std::string name;
    std::size_t size = 0;
    std::vector<std::size_t> shape;
    std::unique_ptr<layer_t> layer;
    bool broken = false;
  };
  struct ddp_bucket {
    std::vector<std::size_t> params;
    std::size_t total = 0;
    std::map<std::size_t, std::vector<std::size_t>> history;  // gather group size -> last packed sizes
  };
  struct member {
    std::size_t slot;
    gx::pending_round* round;
  };
  struct reduce_group {
    gx::round_op op;
    gx::buffer_element element;
    std::vector<member> members;
    std::vector<float> joined;
  };
  struct gather_group {
    std::vector<member> members;
    std::vector<std::byte> packed;
  };

  layer_t& pending_layer(const std::string& name, const char* where) {
    const auto it = slot_ids_.find(name);
    if (it == slot_ids_.end()) throw gradcomp::layout_error(std::string(where) + ": no parameter '" + name + "'");
    layer_t& l = *slots_[it->second].layer;
    if (!l.fit_pending()) throw gradcomp::state_error(std::string(where) + ": parameter '" + name + "' has no fit pending");
    return l;
  }

  std::size_t slot(const std::string& name, const std::vector<std::size_t>& shape) {
    if (auto it = slot_ids_.find(name); it != slot_ids_.end()) {
      if (slots_[it->second].shape != shape)
        throw gradcomp::layout_error("gradcomp: parameter '" + name + "' changed its shape");
      return it->second;
    }
    param_slot s;
    s.name = name;
    s.shape = shape;
    s.size = 1;
    for (auto d : shape) s.size *= d;
    s.layer = make_layer(s);
    if (auto it = pending_.find(name); it != pending_.end()) {
      s.layer->restore_state(std::span<const std::byte>(reinterpret_cast<const std::byte*>(it->second.data()), it->second.size()));
      pending_.erase(it);
    }
    slots_.push_back(std::move(s));
    slot_ids_.emplace(name, slots_.size() - 1);
    return slots_.size() - 1;
  }

  std::unique_ptr<layer_t> make_layer(const param_slot& s) const {
    gx::model_description md;
    if (s.shape.size() == 4) md.add_conv(s.name, s.shape[0], s.shape[1], s.shape[2], s.shape[3]);
    else if (s.shape.size() == 2 && matrix_view_) md.add_matrix(s.name, s.shape[0], s.shape[1]);
    else md.add_dense(s.name, s.size, s.shape.size() <= 1 ? 1 : 2);
    gx::plan_options o = options_;
    o.seed = name_seed(seed_, s.name);
    gx::bucket_layer_options lo;
    lo.on_failure = gx::failure_policy::skip;
    lo.defer_fits = defer_fits_;
    return std::make_unique<layer_t>(gx::plan(std::move(md), std::move(o)), rank_, ranks_, lo);
  }

  void mark_broken() {
    for (auto p : cur_ ? cur_->params : std::vector<std::size_t>{}) {
      slots_[p].layer = make_layer(slots_[p]);
      slots_[p].broken = true;
    }
  }

  void end_step() {
    cur_ = nullptr;
    data_ = nullptr;
    held_ = farray();
    reduces_.clear();
    gather_ = {};
    send_.clear();
    reduced_ = true;
    pending_done_ = false;
  }

  // The next round of every live layer of the bucket, grouped: one request
  // per (op, element) of the sum/max rounds in first-seen order, then one
  // all-gather of every payload packed together.
  nb::list collect(nb::handle self) {
    reduces_.clear();
    gather_ = {};
    reduced_ = false;
    for (auto p : cur_->params) {
      gx::pending_round* r = slots_[p].layer->next_round();
      if (!r) continue;
      if (r->spec.op == gx::round_op::all_gather) {
        gather_.members.push_back({p, r});
        continue;
      }
      auto g = std::find_if(reduces_.begin(), reduces_.end(),
                            [&](const reduce_group& x) { return x.op == r->spec.op && x.element == r->spec.element; });
      if (g == reduces_.end()) {
        reduces_.push_back({r->spec.op, r->spec.element, {}, {}});
        g = reduces_.end() - 1;
      }
      g->members.push_back({p, r});
    }
    nb::list out;
    if (reduces_.empty() && gather_.members.empty()) {
      pending_done_ = true;
      return out;
    }
    for (auto& g : reduces_) {
      std::size_t n = 0;
      for (auto& m : g.members) n += m.round->buffer.size();
      g.joined.resize(n);
      std::size_t at = 0;
      for (auto& m : g.members) {
        std::memcpy(g.joined.data() + at, m.round->buffer.data(), m.round->buffer.size() * sizeof(float));
        at += m.round->buffer.size();
      }
    }
    for (auto& g : reduces_) {
      const std::size_t shape[1] = {g.joined.size()};
      out.append(nb::make_tuple(op_name(g.op), std::string(gradcomp::summable::to_string(g.element)),
                                nb::ndarray<nb::numpy, float, nb::ndim<1>>(g.joined.data(), 1, shape, self)));
    }
    if (!gather_.members.empty()) {
      const std::size_t k = gather_.members.size();
      std::size_t bytes = 4 * k;
      for (auto& m : gather_.members) bytes += m.round->payload.size();
      gather_.packed.resize(bytes);
      std::size_t at = 4 * k;
      for (std::size_t j = 0; j < k; ++j) {
        const auto& pl = gather_.members[j].round->payload;
        const auto n = static_cast<std::uint32_t>(pl.size());
        std::memcpy(gather_.packed.data() + 4 * j, &n, 4);
        if (!pl.empty()) std::memcpy(gather_.packed.data() + at, pl.data(), pl.size());
        at += pl.size();
      }
      std::size_t capacity = 0;
      const auto& hist = cur_->history[k];
      if (!hist.empty()) {
        const std::size_t top = *std::max_element(hist.begin(), hist.end());
        capacity = round_up64(top + top / 16);
      } else {  // agreed without a collective: the dense size plus headers and control block
        capacity = 4 * k;
        for (auto& m : gather_.members) capacity += 4 * slots_[m.slot].size + 256 + 12 * static_cast<std::size_t>(ranks_);
        capacity = round_up64(capacity);
      }
      fill_send(capacity);
      out.append(nb::make_tuple("all_gather", "", view_u8(self)));
    }
    return out;
  }

  void fill_send(std::size_t capacity) {
    capacity_ = capacity;
    send_.assign(size_header + capacity, std::uint8_t{0});
    const std::uint64_t n = gather_.packed.size();
    std::memcpy(send_.data(), &n, sizeof n);
    if (n <= capacity && n) std::memcpy(send_.data() + size_header, gather_.packed.data(), n);
  }

  nb::object view_u8(nb::handle self) {
    const std::size_t shape[1] = {send_.size()};
    return nb::cast(nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<1>>(send_.data(), 1, shape, self));
  }

  gx::plan_options options_;
  std::uint64_t seed_;
  int rank_;
  int ranks_;
  bool matrix_view_;
  bool defer_fits_;
  std::vector<param_slot> slots_;
  std::map<std::string, std::size_t> slot_ids_;
  std::map<std::string, std::string> pending_;
  std::deque<ddp_bucket> buckets_;  // stable addresses: cur_ points into it
  std::map<std::vector<std::string>, std::size_t> bucket_ids_;
  // the running bucket step
  ddp_bucket* cur_ = nullptr;
  farray held_;  // the bucket's array, alive until finish (the layers hold spans of it)
  float* data_ = nullptr;
  std::vector<reduce_group> reduces_;
  gather_group gather_;
  std::vector<std::uint8_t> send_;
  std::size_t capacity_ = 0;
  bool reduced_ = true;
  bool pending_done_ = false;
  // statistics
  double encode_seconds_ = 0.0;
  double decode_seconds_ = 0.0;
  std::size_t extra_collectives_ = 0;
};

}  // namespace
