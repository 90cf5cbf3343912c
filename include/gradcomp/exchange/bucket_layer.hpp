#pragma once
/// \file exchange/bucket_layer.hpp
/// The bucket layer: the whole-model exchange without a transport. It runs
/// every bucket's codec lifecycle, hands the caller one round at a time (a
/// buffer to sum or max in place, or a payload to all-gather), takes the
/// result back, and writes the aggregated gradients. The first round of a
/// step carries the control block (exchange/contract.hpp), so every rank
/// learns in that round which ranks failed and all take the same decision.
///
///     bucket_layer<> layer(plan, rank, ranks);
///     layer.begin_step(gradients);
///     while (auto* r = layer.next_round()) {
///       if (r->spec.op == round_op::all_gather) layer.complete_round(my_all_gather(r->payload));
///       else { my_all_reduce(r->buffer, r->spec.op); layer.complete_round(); }
///     }
///     step_report rep = layer.finish_step(gradients);   // rep.skipped: do not apply

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/abi.hpp>
#include <gradcomp/dense.hpp>
#include <gradcomp/exchange/bucket_codecs.hpp>
#include <gradcomp/exchange/bucket_factory.hpp>
#include <gradcomp/exchange/contract.hpp>
#include <gradcomp/exchange/gradiveq_bucket.hpp>
#include <gradcomp/exchange/model.hpp>
#include <gradcomp/exchange/powersgd_bucket.hpp>
#include <gradcomp/exchange/scalar_buckets.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/two_bit.hpp>

namespace gradcomp::exchange {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// What every rank does when some rank cannot take part in a step.
enum class failure_policy : std::uint8_t {
  skip = 0,         ///< every rank skips the step: state as before it, step_report::skipped
  throw_error = 1,  ///< every rank throws the same exchange_failure_error (state as before the step)
};

/// One round handed to the caller.
struct pending_round {
  std::size_t bucket = 0;        ///< bucket index in the plan
  std::size_t index = 0;         ///< round of that bucket
  round_spec spec;               ///< length includes the control block when carries_control
  bool carries_control = false;  ///< the step's first round: the control block rides in it
  /// sum/max: reduce it in place across the ranks, as summable cells of
  /// spec.element (payloads/summable.hpp: pack, reduce in that type, unpack).
  std::span<float> buffer;
  std::vector<std::byte> payload;  ///< all_gather: this rank's bytes
};

/// Statistics of one step (bucket layer part; the exchange adds the wire).
struct step_report {
  bool skipped = false;
  std::vector<rank_failure> failures;  ///< every failed rank (and rank -1 for a non-finite sum)
  std::string local_detail;            ///< this rank's own failure, in its words (empty on healthy ranks)
  std::size_t stale_votes = 0;         ///< eq. 7 votes of this step
  std::uint64_t step = 0;              ///< completed steps after this one
  std::vector<std::size_t> layer_bytes;   ///< per layer: payload or buffer bytes this rank contributed
  std::vector<std::size_t> bucket_bytes;  ///< per bucket: the same, summed (control block in bucket 0)
  std::vector<std::string> bucket_phase;  ///< per bucket: "dense", "gradiveq:compressed", ...
  std::size_t rounds = 0;                 ///< rounds (collectives) of the step
  double encode_seconds = 0.0;  ///< checks, encodes and buffer fills
  double decode_seconds = 0.0;  ///< absorbs, decodes, the mean, schedule and fits
};

/// Options of the bucket layer.
struct bucket_layer_options {
  failure_policy on_failure = failure_policy::skip;
  /// The GradiVeQ fit that ends L_t is left to the caller instead of being
  /// run inside finish_step (fit_pending()): one rank runs fit_bases() and
  /// hands its bytes to the others, which adopt_bases() them, bit for bit
  /// the basis they would have fitted. Ranks that share a host then fit once
  /// between them (gradcomp.torch's fit_sharing="host", docs/python.md).
  bool defer_fits = false;
};

/// The transport-free bucket layer (see the file comment).
template <ExecutionPolicy Policy = execution::seq>
class bucket_layer {
 public:
  bucket_layer(plan p, int rank, int ranks, bucket_layer_options options = {})
      : plan_(std::move(p)), rank_(rank), ranks_(ranks), opt_(options) {
    if (ranks < 1 || rank < 0 || rank >= ranks)
      throw invalid_argument_error("exchange::bucket_layer: need 0 <= rank < ranks");
    build(buckets_, life_);
  }

  const plan& layout() const noexcept { return plan_; }
  int rank() const noexcept { return rank_; }
  int ranks() const noexcept { return ranks_; }
  /// Completed (not skipped) steps.
  std::uint64_t steps() const noexcept { return step_; }
  /// The GradiVeQ schedule shared by the plan's GradiVeQ layers.
  const gradiveq_schedule& schedule() const noexcept { return life_->schedule; }
  /// This rank's eq. 7 loss over its GradiVeQ layers in the last step (zero outside L_c).
  const local_loss_value& gradiveq_loss() const noexcept { return life_->loss; }
  /// The bucket codec of bucket b.
  const bucket_codec& bucket(std::size_t b) const { return *buckets_.at(b); }

  /// Starts a step: checks the gradients (one span per layer, model order),
  /// encodes every bucket; a local failure becomes this rank's flag. Set
  /// `request_skip` to make every rank skip this step. The gradients must stay
  /// valid and unchanged until finish_step (they may be its output spans).
  void begin_step(std::span<const std::span<const float>> gradients, bool request_skip = false) {
    if (state_ != state::idle) throw state_error("exchange::bucket_layer::begin_step: a step is already running");
    require_no_pending_fit("begin_step");
    const auto t0 = clock::now();
    report_ = {};
    rounds_.clear();
    gathered_.clear();
    prepared_.assign(buckets_.size(), false);
    cursor_ = {0, 0};
    local_ = {};
    local_message_.clear();
    life_->loss = {};
    const step_context ctx{rank_, ranks_, step_};
    for (auto& b : buckets_) b->begin(ctx);
    local_ = check(gradients, request_skip);
    if (local_.reason == failure_reason::none) {
      std::size_t b = 0;
      try {
        for (; b < buckets_.size(); ++b) {
          buckets_[b]->prepare(ctx, layer_spans(gradients, b));
          prepared_[b] = true;
        }
      } catch (const std::exception& e) {
        local_ = {rank_, failure_reason::codec_error, static_cast<std::ptrdiff_t>(plan_.buckets()[b].layers.front())};
        local_message_ = e.what();
        buckets_[b]->abandon();
        abandon_all();
      }
    }
    const bool vote = local_.reason == failure_reason::none && plan_.uses_gradiveq() &&
                      life_->schedule.phase() == gradiveq_phase::compressed && life_->schedule.vote(life_->loss);
    control_.assign(control_block::length(ranks_), 0.0f);
    float* mine = control_.data() + control_block::slots_per_rank * static_cast<std::size_t>(rank_);
    mine[control_block::failure_slot] = control_block::failure_value(local_.reason, local_.layer);
    mine[control_block::vote_slot] = vote ? 1.0f : 0.0f;
    mine[control_block::digest_slot] = float(1 + digest() % control_block::digest_modulus);
    state_ = state::rounds;
    report_.encode_seconds += seconds_since(t0);
  }

  /// The next round, or nullptr when the step needs no more (then call finish_step).
  pending_round* next_round() {
    if (state_ != state::rounds) return nullptr;
    while (cursor_.bucket < buckets_.size() && buckets_[cursor_.bucket]->rounds() == 0) ++cursor_.bucket;
    if (cursor_.bucket >= buckets_.size()) return nullptr;
    const auto t0 = clock::now();
    bucket_codec& b = *buckets_[cursor_.bucket];
    round_ = {};
    round_.bucket = cursor_.bucket;
    round_.index = cursor_.round;
    round_.spec = b.round(cursor_.round);
    round_.carries_control = rounds_.empty();
    const std::size_t ctrl = round_.carries_control ? control_.size() : 0;
    const bool mine = prepared_[cursor_.bucket];
    if (round_.spec.op == round_op::all_gather) {
      std::vector<std::byte> body;
      if (mine) body = b.contribute(cursor_.round);
      round_.payload.resize(ctrl * sizeof(float) + body.size());
      if (ctrl) std::memcpy(round_.payload.data(), control_.data(), ctrl * sizeof(float));
      if (!body.empty()) std::memcpy(round_.payload.data() + ctrl * sizeof(float), body.data(), body.size());
      own_bytes(cursor_.bucket, round_.payload.size());
      rounds_.emplace_back();
    } else {
      // Any element type: the control block is encoded so that its sum (or
      // max) with the other ranks' zeros stays exact (control_block::encode).
      const buffer_element el = round_.spec.element;
      const std::size_t n = round_.spec.length;
      const std::size_t cells = round_.carries_control ? control_block::cells(el, ranks_) : 0;
      rounds_.emplace_back(n + cells, 0.0f);  // zero cells: 0.0f, the word 0
      std::span<float> buf(rounds_.back());
      if (mine) b.contribute(cursor_.round, buf.first(n));
      if (cells) control_block::encode(el, control_, buf.subspan(n));
      round_.spec.length = n + cells;
      round_.buffer = buf;
      own_bytes(cursor_.bucket, buf.size() * element_bytes(el));
    }
    ++report_.rounds;
    report_.encode_seconds += seconds_since(t0);
    return &round_;
  }

  /// Completes a sum or max round: round().buffer now holds the reduction.
  void complete_round() {
    require_round(false);
    const auto t0 = clock::now();
    const buffer_element el = round_.spec.element;
    const std::size_t ctrl = round_.carries_control ? control_block::cells(el, ranks_) : 0;
    const std::span<const float> all(round_.buffer);
    if (ctrl) {
      std::vector<float> block(control_.size());
      control_block::decode(el, all.last(ctrl), block);
      if (!agree(block)) return;
    }
    const auto part = all.first(all.size() - ctrl);
    if (round_.spec.check == after_reduce_check::finite && !reduced_finite(el, part)) {
      fail({rank_failure{-1, failure_reason::non_finite_sum, -1}},
           "the reduced buffer of bucket " + std::to_string(round_.bucket) + " is not finite" +
               (el == buffer_element::float32 ? "" : " (or saturated at the largest " + std::string(summable::to_string(el)) + ")"));
      return;
    }
    if (round_.spec.check == after_reduce_check::lane_range) {
      // The codec's absorb checks the lanes; the reduced buffer is the same
      // on every rank, so a lane out of range fails every rank alike.
      try {
        buckets_[round_.bucket]->absorb(round_.index, part);
      } catch (const error& e) {
        fail({rank_failure{-1, failure_reason::non_finite_sum, -1}},
             "the reduced buffer of bucket " + std::to_string(round_.bucket) + " is out of range: " + e.what());
        return;
      }
    } else {
      buckets_[round_.bucket]->absorb(round_.index, part);
    }
    advance();
    report_.decode_seconds += seconds_since(t0);
  }

  /// Completes an all-gather round: every rank's payload, in rank order.
  void complete_round(std::vector<std::vector<std::byte>> gathered) {
    require_round(true);
    const auto t0 = clock::now();
    if (gathered.size() != static_cast<std::size_t>(ranks_))
      throw size_mismatch_error("exchange::bucket_layer::complete_round: gathered payloads", ranks_, gathered.size());
    if (round_.carries_control) {
      const std::size_t cb = control_.size() * sizeof(float);
      std::vector<float> sum(control_.size(), 0.0f), one(control_.size());
      for (std::size_t r = 0; r < gathered.size(); ++r) {
        if (gathered[r].size() < cb)
          wire::reader::fail(wire::wire_errc::truncated, "exchange: all-gather payload of rank " + std::to_string(r) +
                                                             " shorter than the control block");
        std::memcpy(one.data(), gathered[r].data(), cb);
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += one[i];
        gathered[r].erase(gathered[r].begin(), gathered[r].begin() + static_cast<std::ptrdiff_t>(cb));
      }
      if (!agree(sum)) return;
    }
    gathered_.push_back(std::make_unique<std::vector<std::vector<std::byte>>>(std::move(gathered)));
    buckets_[round_.bucket]->absorb(round_.index, std::span<const std::vector<std::byte>>(*gathered_.back()));
    advance();
    report_.decode_seconds += seconds_since(t0);
  }

  /// Ends the step: writes the aggregate (the mean over ranks, or the sum
  /// with plan_options::average false) into `out` (one span per layer; may
  /// be the gradients themselves). A skipped step leaves `out` untouched.
  step_report finish_step(std::span<const std::span<float>> out) {
    if (state_ == state::skipped) {
      state_ = state::idle;
      report_.step = step_;
      return report_;
    }
    if (state_ != state::rounds || cursor_.bucket < buckets_.size())
      throw state_error("exchange::bucket_layer::finish_step: rounds are still pending");
    const auto t0 = clock::now();
    if (out.size() != plan_.model().size())
      throw layout_error("exchange: " + std::to_string(out.size()) + " output spans for a model of " +
                         std::to_string(plan_.model().size()) + " layers");
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      std::vector<std::span<float>> o;
      for (auto i : plan_.buckets()[b].layers) {
        if (out[i].size() != plan_.model()[i].shape.size())
          throw layout_error("exchange: output of layer '" + plan_.model()[i].name + "' has " +
                             std::to_string(out[i].size()) + " elements, expected " +
                             std::to_string(plan_.model()[i].shape.size()));
        o.push_back(out[i]);
      }
      buckets_[b]->finish(o);
      if (plan_.options().average && ranks_ > 1)
        for (auto& s : o)
          for (auto& v : s) v /= float(ranks_);
    }
    if (plan_.uses_gradiveq()) {
      const bool compressed = life_->schedule.phase() == gradiveq_phase::compressed;
      const gradiveq_step next = compressed ? life_->schedule.advance(report_.stale_votes, std::size_t(ranks_))
                                            : life_->schedule.advance();
      if (next.fit_basis) {
        if (opt_.defer_fits) fit_pending_ = true;
        else
          for (auto* g : gradiveq_buckets_) g->fit();
      }
    }
    ++step_;
    state_ = state::idle;
    rounds_.clear();
    gathered_.clear();
    report_.step = step_;
    for (auto& b : buckets_) report_.bucket_phase.push_back(b->phase());
    report_.layer_bytes.assign(plan_.model().size(), 0);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const auto lb = buckets_[b]->layer_bytes();
      for (std::size_t j = 0; j < lb.size(); ++j) report_.layer_bytes[plan_.buckets()[b].layers[j]] = lb[j];
    }
    report_.decode_seconds += seconds_since(t0);
    return report_;
  }

  /// A GradiVeQ fit is due and was left to the caller (options defer_fits):
  /// fit_bases() or adopt_bases() before the next step.
  bool fit_pending() const noexcept { return fit_pending_; }

  /// The pending fit's cost, relative (linear_compressor::fit_work); the
  /// same on every rank, so ranks sharing fits can balance them alike.
  double fit_work() const noexcept {
    double w = 0.0;
    for (const auto* g : gradiveq_buckets_) w += g->fit_work();
    return w;
  }

  /// Runs the pending fit here and returns the fitted bases (every GradiVeQ
  /// bucket's codec states) for the ranks that adopt them.
  std::vector<std::byte> fit_bases() {
    if (!fit_pending_) throw state_error("exchange::bucket_layer::fit_bases: no fit is pending");
    const auto t0 = clock::now();
    for (auto* g : gradiveq_buckets_) g->fit();
    fit_pending_ = false;
    std::vector<std::vector<std::byte>> parts;
    for (const auto* g : gradiveq_buckets_) parts.push_back(g->fitted_state());
    fit_seconds_ = seconds_since(t0);
    return detail::pack_blobs(parts);
  }

  /// Instead of fit_bases(): another rank's fit_bases() bytes of the same
  /// plan and step. Bases of another plan, layer or step: state_error (or
  /// option_mismatch_error), damaged bytes wire_error, and nothing changes.
  void adopt_bases(std::span<const std::byte> bytes) {
    if (!fit_pending_) throw state_error("exchange::bucket_layer::adopt_bases: no fit is pending");
    const auto t0 = clock::now();
    const auto parts = detail::unpack_blobs(bytes, gradiveq_buckets_.size(), "exchange::bucket_layer::adopt_bases");
    std::vector<std::vector<linear_compressor<Policy>>> fitted;
    for (std::size_t i = 0; i < gradiveq_buckets_.size(); ++i) fitted.push_back(gradiveq_buckets_[i]->parse_fitted_state(parts[i]));
    for (std::size_t i = 0; i < gradiveq_buckets_.size(); ++i) gradiveq_buckets_[i]->adopt(std::move(fitted[i]));
    fit_pending_ = false;
    fit_seconds_ = seconds_since(t0);
  }

  /// Seconds the last fit_bases() or adopt_bases() took.
  double fit_seconds() const noexcept { return fit_seconds_; }

  /// The whole state (every codec's state, the schedule, the step counter),
  /// tied to this plan, world size and rank.
  std::vector<std::byte> save_state() const {
    if (state_ != state::idle) throw state_error("exchange::bucket_layer::save_state: inside a step");
    require_no_pending_fit("save_state");
    std::vector<std::vector<std::byte>> parts;
    parts.push_back(life_->schedule.save_state());
    for (const auto& b : buckets_) parts.push_back(b->save_state());
    const auto body = detail::pack_blobs(parts);
    return wire::serialize_state(wire::codec_id::control, 0, [&](wire::writer& w) {
      w.put<std::uint32_t>(checkpoint_magic);
      w.put<std::uint32_t>(plan_.fingerprint());
      w.put<std::uint32_t>(static_cast<std::uint32_t>(ranks_));
      w.put<std::uint32_t>(static_cast<std::uint32_t>(rank_));
      w.put<std::uint64_t>(step_);
      w.put_bytes(body);
    });
  }

  /// Restores a save_state() of the same plan, world size and rank (strong
  /// guarantee). Another plan: layout_error; another world size or rank:
  /// option_mismatch_error; damaged bytes: wire_error.
  void restore_state(std::span<const std::byte> bytes) {
    if (state_ != state::idle) throw state_error("exchange::bucket_layer::restore_state: inside a step");
    const char* where = "exchange::bucket_layer::restore_state";
    wire::reader r = wire::parse_state(bytes, wire::codec_id::control);
    if (r.get<std::uint32_t>() != checkpoint_magic) throw layout_error(std::string(where) + ": not an exchange checkpoint");
    if (r.get<std::uint32_t>() != plan_.fingerprint())
      throw layout_error(std::string(where) + ": the checkpoint was made with another plan (layers, codecs, buckets or options)");
    if (r.get<std::uint32_t>() != static_cast<std::uint32_t>(ranks_)) throw option_mismatch_error(where, "world size");
    if (r.get<std::uint32_t>() != static_cast<std::uint32_t>(rank_)) throw option_mismatch_error(where, "rank");
    const auto step = r.get<std::uint64_t>();
    const auto rest = bytes.subspan(bytes.size() - r.remaining());
    const auto parts = detail::unpack_blobs(rest, 1 + buckets_.size(), where);
    std::vector<std::unique_ptr<bucket_codec>> fresh;
    std::unique_ptr<gradiveq_lifecycle> life;
    std::vector<gradiveq_bucket<Policy>*> gq;
    std::swap(gq, gradiveq_buckets_);
    try {
      build(fresh, life);
      life->schedule.restore_state(parts[0]);
      for (std::size_t b = 0; b < fresh.size(); ++b) fresh[b]->restore_state(parts[1 + b]);
    } catch (...) {
      gradiveq_buckets_ = std::move(gq);
      throw;
    }
    buckets_ = std::move(fresh);
    life_ = std::move(life);
    step_ = step;
    fit_pending_ = false;  // a checkpoint is saved with no fit pending
  }

 private:
  using clock = std::chrono::steady_clock;
  enum class state : std::uint8_t { idle, rounds, skipped };
  struct cursor_t {
    std::size_t bucket = 0;
    std::size_t round = 0;
  };
  static constexpr std::uint32_t checkpoint_magic = 0x45584347u;  // "GCXE"

  void require_no_pending_fit(const char* where) const {
    if (fit_pending_)
      throw state_error(std::string("exchange::bucket_layer::") + where +
                        ": a GradiVeQ fit is pending (defer_fits): call fit_bases() or adopt_bases() first");
  }

  static double seconds_since(clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
  }

  void build(std::vector<std::unique_ptr<bucket_codec>>& out, std::unique_ptr<gradiveq_lifecycle>& life) {
    life = std::make_unique<gradiveq_lifecycle>(gradiveq_lifecycle{gradiveq_schedule(plan_.options().gradiveq_schedule), {}});
    out = make_bucket_codecs<Policy>(plan_, rank_, ranks_, *life, gradiveq_buckets_);
  }

  // after_reduce_check::finite: float32 finite; float16 / bfloat16 finite
  // and below the type's largest value (a saturated sum is an overflow).
  static bool reduced_finite(buffer_element el, std::span<const float> x) {
    if (el == buffer_element::float32) return find_non_finite(Policy{}, x) == x.size();
    if (el == buffer_element::int32_words) return true;
    const float top = summable::max_finite(el);
    bool ok = true;
    for (const float v : x) ok &= std::fabs(v) < top;
    return ok;
  }

  std::vector<std::span<const float>> layer_spans(std::span<const std::span<const float>> g, std::size_t b) const {
    std::vector<std::span<const float>> v;
    for (auto i : plan_.buckets()[b].layers) v.push_back(g[i]);
    return v;
  }

  rank_failure check(std::span<const std::span<const float>> g, bool request_skip) {
    const auto& m = plan_.model();
    if (g.size() != m.size()) {
      local_message_ = std::to_string(g.size()) + " gradients for " + std::to_string(m.size()) + " layers";
      return {rank_, failure_reason::layout_mismatch, -1};
    }
    for (std::size_t i = 0; i < m.size(); ++i)
      if (g[i].size() != m[i].shape.size()) {
        local_message_ = "layer '" + m[i].name + "' has " + std::to_string(g[i].size()) + " elements";
        return {rank_, failure_reason::layout_mismatch, static_cast<std::ptrdiff_t>(i)};
      }
    for (std::size_t i = 0; i < m.size(); ++i)
      if (const auto bad = find_non_finite(Policy{}, g[i]); bad != g[i].size()) {
        local_message_ = "layer '" + m[i].name + "': non-finite value at index " + std::to_string(bad);
        return {rank_, failure_reason::non_finite_gradient, std::ptrdiff_t(i)};
      }
    if (request_skip) return {rank_, failure_reason::requested, -1};
    return {};
  }

  std::uint64_t digest() const {
    std::uint64_t h = plan_.fingerprint() ^ (step_ * 0x9E3779B97F4A7C15ull) ^ (std::uint64_t(ranks_) << 48);
    h = h * 0x100000001B3ull ^ life_->schedule.iteration();
    h = h * 0x100000001B3ull ^ static_cast<std::uint64_t>(life_->schedule.phase());
    for (const auto& b : buckets_) h = h * 0x100000001B3ull ^ b->digest();
    return h ^ (h >> 29) ^ (h >> 47);
  }

  void abandon_all() {
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      if (prepared_[b]) {
        buckets_[b]->abandon();
        prepared_[b] = false;
      }
  }

  void own_bytes(std::size_t bucket, std::size_t bytes) {
    report_.bucket_bytes.resize(buckets_.size(), 0);
    report_.bucket_bytes[bucket] += bytes;
  }

  // Reads the reduced control block; on a failure or a disagreement takes
  // the policy's decision (identical on every rank) and returns false.
  bool agree(std::span<const float> block) {
    std::vector<rank_failure> failures;
    std::vector<float> digests;
    std::size_t votes = 0;
    for (int r = 0; r < ranks_; ++r) {
      const float* s = block.data() + control_block::slots_per_rank * static_cast<std::size_t>(r);
      const float f = s[control_block::failure_slot];
      if (f != 0.0f) {
        const auto v = static_cast<long long>(f);
        failures.push_back({r, static_cast<failure_reason>(v % 8), static_cast<std::ptrdiff_t>(v / 8) - 1});
      }
      votes += s[control_block::vote_slot] != 0.0f ? 1 : 0;
      digests.push_back(s[control_block::digest_slot]);
    }
    report_.stale_votes = votes;
    if (failures.empty())
      for (int r = 1; r < ranks_; ++r)
        if (digests[std::size_t(r)] != digests[0]) {
          fail({rank_failure{r, failure_reason::state_disagreement, -1}},
               "rank " + std::to_string(r) + "'s exchange state differs from rank 0's (another step, plan or basis)",
               true);
          return false;
        }
    if (failures.empty()) return true;
    // Gradients laid out for another model are a bug, not a step to skip.
    const bool layout = std::any_of(failures.begin(), failures.end(),
                                    [](const rank_failure& f) { return f.reason == failure_reason::layout_mismatch; });
    fail(std::move(failures), "", layout);
    return false;
  }

  void fail(std::vector<rank_failure> failures, std::string detail, bool always_throw = false) {
    abandon_all();
    state_ = state::skipped;
    rounds_.clear();
    gathered_.clear();
    report_.skipped = true;
    report_.failures = failures;
    report_.local_detail = local_message_;
    if (opt_.on_failure == failure_policy::throw_error || always_throw) {
      state_ = state::idle;
      std::string what = "exchange step " + std::to_string(step_) + " failed: ";
      for (std::size_t i = 0; i < failures.size(); ++i) {
        const auto& f = failures[i];
        what += (i ? "; " : "") + (f.rank >= 0 ? "rank " + std::to_string(f.rank) : std::string("the sum"));
        what += std::string(": ") + to_string(f.reason);
        if (f.layer >= 0 && std::size_t(f.layer) < plan_.model().size())
          what += " in layer '" + plan_.model()[std::size_t(f.layer)].name + "'";
      }
      if (!detail.empty()) what += " (" + detail + ")";
      throw exchange_failure_error(what, std::move(failures));
    }
  }

  void require_round(bool gather) const {
    if (state_ != state::rounds || rounds_.empty())
      throw state_error("exchange::bucket_layer::complete_round: no round is pending");
    if ((round_.spec.op == round_op::all_gather) != gather)
      throw state_error("exchange::bucket_layer::complete_round: wrong overload for this round's collective");
  }

  void advance() {
    if (++cursor_.round >= buckets_[cursor_.bucket]->rounds()) {
      ++cursor_.bucket;
      cursor_.round = 0;
    }
  }

  plan plan_;
  int rank_;
  int ranks_;
  bucket_layer_options opt_;
  std::unique_ptr<gradiveq_lifecycle> life_;
  std::vector<std::unique_ptr<bucket_codec>> buckets_;
  std::vector<gradiveq_bucket<Policy>*> gradiveq_buckets_;
  std::uint64_t step_ = 0;
  state state_ = state::idle;
  bool fit_pending_ = false;   // defer_fits: finish_step left a fit to the caller
  double fit_seconds_ = 0.0;
  cursor_t cursor_;
  std::vector<bool> prepared_;
  rank_failure local_;
  std::string local_message_;
  std::vector<float> control_;
  std::vector<std::vector<float>> rounds_;
  std::vector<std::unique_ptr<std::vector<std::vector<std::byte>>>> gathered_;
  pending_round round_;
  step_report report_;
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::exchange
