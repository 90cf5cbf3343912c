// bench_smpi_allreduce: one all-reduce method on one simulated platform and
// one gradient, under SimGrid's SMPI (built with smpicxx by bench/smpi/
// CMakeLists.txt, run by bench/smpi/run). Issue 21, items 6-8.
//
//   smpirun -np N -platform P.xml --cfg=smpi/host-speed:<S>f [--cfg=smpi/allreduce:<alg>] \
//       bench_smpi_allreduce --method <name> --gradient resnet50|floats:<n> [--repeats R] [--label <alg>] [--group G]
//       [--chunk FLOATS] [--max-chunks K]   (schedule_options::chunk_elements, max_chunks; defaults the library's)
//       [--allgather-radix R]   (schedule_options::allgather_radix of the dense Rabenseifner; 0 auto, 2 doubling)
//       [--group-floats F]   (the *_grouped methods: consecutive buckets in groups of at most F floats,
//                             default 16M = 64 MiB; 0: one group)
//   smpirun -np 2 -platform P2.xml ... bench_smpi_allreduce --model N:floats,...   (the cost model's fit and picks)
//   smpirun -np 1 -platform P.xml ... bench_smpi_allreduce --calibrate   (the host speed, real CPU time)
//   bench_smpi_allreduce --list                                           (the methods, no MPI)
//
// A step = one collective per bucket, one bucket after the other (the
// *_grouped methods: one collective per run of consecutive buckets of at most
// --group-floats, 64 MiB by default, the codecs of a run as one
// codec_group; *_mixed_grouped: the dense buckets in the same groups, as
// codec_group<GradiVeQ, dense>). The buckets are views of one buffer, the compressible ones
// first. Every rank rebuilds its gradient before each run (outside the timed
// region); a run is timed from a barrier to the slowest rank's end
// (MPI_Wtime: simulated time), one warm-up run then `repeats` timed runs, the
// best reported. Prints one line `SMPI_RUN key=value ...` that the runner
// collects.
//
// Simulation rules (printed with --rules): every addition, encode and decode
// of gradcomp runs in user code on the calling thread (execution policy simd
// or seq, Eigen on one thread; no MPI_Reduce_local, no user MPI_Op, no helper
// threads), so SMPI charges it through smpi/host-speed; SMPI_SAMPLE is used
// nowhere; where a schedule chooses a message size (the chunks of the
// pipelined ring, Rabenseifner and the hierarchical ring) it is 32768 floats =
// 128 KiB (>= 64 KB); the plain ring's messages are the bucket's N segments.
//
// Methods are one entry each in methods(): a gradcomp schedule is added as a
// `dense_method` (a function all-reducing one float span over mpi_transport)
// or as a codec method (a per-bucket state made once, then one call per step).
#include <mpi.h>

#include <gradcomp/dense.hpp>
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/half.hpp>
#include <gradcomp/homomorphic.hpp>
#include <gradcomp/model_exchange.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/schedules.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/transport/mpi.hpp>
#include <gradcomp/two_bit.hpp>

#include "../common.hpp"
#include "../conv_like_gradients.hpp"
#include "../resnet50_model.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace gb = gradcomp::bench;
namespace gx = gradcomp::exchange;
using gradcomp::transport::mpi_transport;
using policy = gb::policy;

namespace {

constexpr std::size_t gradiveq_K = 256;  // slice size
constexpr std::size_t gradiveq_d = 32;   // K/d = 8, the paper's conv ratio

// ---------------------------------------------------------------------------
// Gradients: a list of buckets (float counts); `compressible` marks the
// buckets a codec method compresses (conv layers), the others are summed
// dense by gradcomp's ring, as the whole-model exchange would.
struct bucket {
  std::size_t elements = 0;
  bool compressible = false;
};

/// The buckets of the whole-model exchange's plan (4 MiB buckets, exchange::plan's
/// greedy fusion): with `compressed` the conv layers get a codec bucket of their own
/// kind (GradiVeQ stands for any codec: the fusion depends only on the kinds).
std::vector<bucket> plan_buckets(const gx::model_description& m, bool compressed) {
  gx::plan_options o;
  o.bucket_bytes = std::size_t{4} << 20;
  o.rules.small_below = 4096;
  o.rules.conv = compressed ? gx::codec_kind::gradiveq : gx::codec_kind::dense;
  o.gradiveq.slice_size = gradiveq_K;
  o.gradiveq.max_dimension = gradiveq_d;
  const gx::plan p(m, o);
  std::vector<bucket> out;
  for (const auto& b : p.buckets()) out.push_back({b.elements, b.kind != gx::codec_kind::dense});
  return out;
}

std::vector<bucket> gradient_buckets(const std::string& spec, bool compressed) {
  if (spec == "resnet50") return plan_buckets(gradcomp::bench::resnet50_model(), compressed);
  if (spec.rfind("floats:", 0) == 0) return {{std::strtoull(spec.c_str() + 7, nullptr, 10), true}};
  throw std::invalid_argument("unknown --gradient '" + spec + "' (resnet50 or floats:<n>)");
}

/// Rank `rank`'s gradient for a bucket: U(-1e-2, 1e-2) from a counter-based hash (cheap to rebuild).
void fill_gradient(std::span<float> g, int rank, std::size_t bucket_index) {
  const std::uint64_t base = gb::splitmix(std::uint64_t(rank) * 1000003u + bucket_index) << 20;
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = 2e-2f * (float(gb::splitmix(base + i) >> 40) * (1.0f / 16777216.0f) - 0.5f);
}

// ---------------------------------------------------------------------------
// Methods.
struct context {
  mpi_transport& transport;
  int rank = 0, size = 1;
  int group = 0;  // --group: ranks per leaf switch for the hierarchical schedule (0: the platform has no groups)
  std::size_t chunk = 32768;  // --chunk: floats per message of the chunked schedules (default 128 KiB)
  std::size_t max_chunks = gradcomp::schedule_options{}.max_chunks;  // --max-chunks: messages per exchange (0: no cap)
  int allgather_radix = gradcomp::schedule_options{}.allgather_radix;  // --allgather-radix: dense Rabenseifner's
  gradcomp::schedule_workspace workspace;  // the schedules' receive scratch, kept across calls as the exchange keeps it
  gradcomp::ring_stats stats;  // the dense schedules' statistics, summed over the timed run's buckets
  // --group-floats: the grouped methods' cap on a group's floats (0: one group). Default 16M floats =
  // 64 MiB, Horovod's default fusion buffer; docs/performance.md has one group and other caps.
  std::size_t group_floats = std::size_t{16} << 20;
};

/// [begin, end) runs of consecutive buckets (sizes `lengths`) of at most `cap` elements each where
/// the buckets allow (a bucket above the cap is a run of its own); cap 0: one run.
std::vector<std::pair<std::size_t, std::size_t>> bucket_runs(const std::vector<std::size_t>& lengths, std::size_t cap) {
  std::vector<std::pair<std::size_t, std::size_t>> runs;
  std::size_t at = 0;
  for (std::size_t n : lengths) {
    if (runs.empty() || (cap != 0 && runs.back().second - runs.back().first + n > cap)) runs.emplace_back(at, at);
    runs.back().second += n;
    at += n;
  }
  return runs;
}

/// Adds a schedule call's statistics to the run's (SMPI_STATS).
void note(context& c, const gradcomp::ring_stats& st) {
  c.stats.messages_sent += st.messages_sent;
  c.stats.combine_seconds += st.combine_seconds;
  c.stats.encode_seconds += st.encode_seconds;
  c.stats.decode_seconds += st.decode_seconds;
}

/// gradcomp's schedule `kind` (chunks of 32768 floats = 128 KiB, >= 64 KB) over one span.
void schedule_allreduce(context& c, std::span<float> x, gradcomp::schedule_kind kind) {
  gradcomp::schedule_options o;
  o.kind = kind;
  o.group_size = c.group;
  o.chunk_elements = c.chunk;
  o.max_chunks = c.max_chunks;
  o.allgather_radix = c.allgather_radix;
  o.workspace = &c.workspace;
  if (kind == gradcomp::schedule_kind::ring) {  // ring_allreduce keeps no statistics
    gradcomp::ring_allreduce(policy{}, c.transport, x);
    return;
  }
  const gradcomp::ring_stats st = gradcomp::allreduce(policy{}, c.transport, x, o);
  note(c, st);
}

/// The buckets in the order the gradient buffer lays them out: the
/// compressible ones first, then the dense ones, each kind in the layout's order.
std::vector<const bucket*> arena_order(const std::vector<bucket>& layout) {
  std::vector<const bucket*> order;
  for (const auto& b : layout)
    if (b.compressible) order.push_back(&b);
  for (const auto& b : layout)
    if (!b.compressible) order.push_back(&b);
  return order;
}

/// A gradient's buckets as views of one buffer: the compressible buckets
/// first, one after the other (a grouped method's codec_group covers them as
/// one vector), then the dense ones (arena_order). `buckets` follows the layout's order.
struct gradient_buffer {
  std::vector<float> arena;
  std::vector<std::span<float>> buckets;
  std::span<float> compressible, dense;  // the two runs of the arena
  explicit gradient_buffer(const std::vector<bucket>& layout) {
    std::size_t total = 0, head = 0;
    for (const auto& b : layout) {
      total += b.elements;
      if (b.compressible) head += b.elements;
    }
    arena.resize(total);
    std::size_t at_compressible = 0, at_dense = head;
    for (const auto& b : layout) {
      std::size_t& at = b.compressible ? at_compressible : at_dense;
      buckets.emplace_back(arena.data() + at, b.elements);
      at += b.elements;
    }
    compressible = std::span<float>(arena).first(head);
    dense = std::span<float>(arena).subspan(head);
  }
};

/// One method's state over the buckets of one gradient: step() all-reduces every bucket once.
struct runner {
  virtual ~runner() = default;
  virtual void step(gradient_buffer& g) = 0;
};

using span_allreduce = std::function<void(context&, std::span<float>)>;

/// A dense method: every bucket through `fn`.
struct dense_runner final : runner {
  context& c;
  span_allreduce fn;
  dense_runner(context& cx, span_allreduce f) : c(cx), fn(std::move(f)) {}
  void step(gradient_buffer& g) override {
    for (auto& b : g.buckets) fn(c, b);
  }
};

/// A codec method: compressible buckets through `run` with a per-bucket state
/// made once by `make` (codecs live across steps, as in training); the other
/// buckets through gradcomp's dense ring.
template <class State>
struct codec_runner final : runner {
  context& c;
  std::vector<std::unique_ptr<State>> states;  // null for dense buckets
  std::function<void(context&, State&, std::span<float>)> run;
  gradcomp::schedule_kind dense_kind;
  codec_runner(context& cx, const std::vector<bucket>& layout, const std::function<std::unique_ptr<State>(context&, std::size_t)>& make,
               std::function<void(context&, State&, std::span<float>)> r, gradcomp::schedule_kind dk)
      : c(cx), run(std::move(r)), dense_kind(dk) {
    for (const auto& b : layout) states.push_back(b.compressible ? make(c, b.elements) : nullptr);
  }
  void step(gradient_buffer& g) override {
    for (std::size_t i = 0; i < g.buckets.size(); ++i) {
      if (states[i]) run(c, *states[i], g.buckets[i]);
      else schedule_allreduce(c, g.buckets[i], dense_kind);
    }
  }
};

/// GradiVeQ over runs of consecutive compressible buckets (at most
/// --group-floats each): the buckets' codecs (one each, made once, as
/// codec_runner's) of a run as one codec_group, so one compressed
/// Rabenseifner runs the run's steps together; the dense buckets in runs of
/// the same cap, one dense Rabenseifner each.
template <class C>
struct grouped_runner final : runner {
  context& c;
  std::vector<std::unique_ptr<C>> codecs;
  std::vector<gradcomp::codec_group<C>> groups;  // consecutive buckets, at most --group-floats each
  std::vector<std::size_t> starts;               // where each group begins in the compressible run
  std::vector<std::pair<std::size_t, std::size_t>> dense_runs;  // the dense buckets' runs of the dense part
  grouped_runner(context& cx, const std::vector<bucket>& layout, const std::function<std::unique_ptr<C>(context&, std::size_t)>& make)
      : c(cx) {
    std::vector<std::size_t> compressible, dense;
    for (const auto& b : layout) (b.compressible ? compressible : dense).push_back(b.elements);
    std::size_t i = 0;
    for (const auto& [begin, end] : bucket_runs(compressible, c.group_floats)) {
      groups.emplace_back();
      starts.push_back(begin);
      for (std::size_t at = begin; at < end; at += compressible[i++]) {
        codecs.push_back(make(c, compressible[i]));
        groups.back().add(*codecs.back(), compressible[i]);
      }
    }
    dense_runs = bucket_runs(dense, c.group_floats);
  }
  void step(gradient_buffer& g) override {
    for (std::size_t i = 0; i < groups.size(); ++i)
      note(c, gradcomp::allreduce_linear(policy{}, c.transport, groups[i], g.compressible.subspan(starts[i], groups[i].length()),
                                         {.kind = gradcomp::schedule_kind::rabenseifner, .chunk_elements = c.chunk,
                                          .max_chunks = c.max_chunks, .workspace = &c.workspace}));
    for (const auto& [begin, end] : dense_runs)
      schedule_allreduce(c, g.dense.subspan(begin, end - begin), gradcomp::schedule_kind::rabenseifner);
  }
};

/// GradiVeQ and dense buckets together: every bucket of the buffer (the
/// compressible ones first, then the dense ones) in runs of consecutive
/// buckets of at most --group-floats, each run one codec_group<C, dense> on
/// the compressed Rabenseifner, so the dense buckets' transfers overlap the
/// GradiVeQ buckets' encodes and decodes instead of running after them.
template <class C>
struct mixed_runner final : runner {
  using dense = gradcomp::dense_codec<policy>;
  context& c;
  std::vector<std::unique_ptr<C>> codecs;
  std::vector<std::unique_ptr<dense>> plain;
  std::vector<gradcomp::codec_group<C, dense>> groups;
  std::vector<std::pair<std::size_t, std::size_t>> runs;  // [begin, end) of the arena
  mixed_runner(context& cx, const std::vector<bucket>& layout, const std::function<std::unique_ptr<C>(context&, std::size_t)>& make)
      : c(cx) {
    const std::vector<const bucket*> order = arena_order(layout);
    std::vector<std::size_t> lengths;
    for (const bucket* b : order) lengths.push_back(b->elements);
    runs = bucket_runs(lengths, c.group_floats);
    std::size_t i = 0;
    for (const auto& [begin, end] : runs) {
      groups.emplace_back();
      for (std::size_t at = begin; at < end; at += order[i++]->elements) {
        if (order[i]->compressible) {
          codecs.push_back(make(c, order[i]->elements));
          groups.back().add(*codecs.back(), order[i]->elements);
        } else {
          plain.push_back(std::make_unique<dense>());
          groups.back().add(*plain.back(), order[i]->elements);
        }
      }
    }
  }
  void step(gradient_buffer& g) override {
    for (std::size_t i = 0; i < groups.size(); ++i)
      note(c, gradcomp::allreduce_linear(policy{}, c.transport, groups[i],
                                         std::span<float>(g.arena).subspan(runs[i].first, runs[i].second - runs[i].first),
                                         {.kind = gradcomp::schedule_kind::rabenseifner, .chunk_elements = c.chunk,
                                          .max_chunks = c.max_chunks, .workspace = &c.workspace}));
  }
};

/// The grouped GradiVeQ method's dense counterpart: consecutive buckets in
/// runs of at most --group-floats, one all-reduce `fn` per run.
struct whole_runner final : runner {
  context& c;
  span_allreduce fn;
  std::vector<std::pair<std::size_t, std::size_t>> runs;
  whole_runner(context& cx, const std::vector<bucket>& layout, span_allreduce f) : c(cx), fn(std::move(f)) {
    std::vector<std::size_t> lengths;
    for (const auto& b : layout) lengths.push_back(b.elements);
    runs = bucket_runs(lengths, c.group_floats);
  }
  void step(gradient_buffer& g) override {
    for (const auto& [begin, end] : runs) fn(c, std::span<float>(g.arena).subspan(begin, end - begin));
  }
};

struct method {
  std::string name;      // --method
  std::string codec;     // dense, gradiveq, qsgd4, two_bit, top_k (the runner's speedup tables group by it)
  std::string schedule;  // ring, reencode_ring, allgather, mpi_allreduce
  bool compressed_layout;
  std::function<std::unique_ptr<runner>(context&, const std::vector<bucket>&)> make;
};

method dense_method(std::string name, std::string schedule, span_allreduce fn) {
  return {std::move(name), "dense", std::move(schedule), false,
          [fn](context& c, const std::vector<bucket>&) -> std::unique_ptr<runner> {
            return std::make_unique<dense_runner>(c, fn);
          }};
}

/// A dense method over runs of consecutive buckets (whole_runner).
method grouped_dense_method(std::string name, std::string codec, std::string schedule, span_allreduce fn) {
  return {std::move(name), std::move(codec), std::move(schedule), false,
          [fn](context& c, const std::vector<bucket>& layout) -> std::unique_ptr<runner> {
            return std::make_unique<whole_runner>(c, layout, fn);
          }};
}

/// A codec method; its dense buckets (fc layer, batch norms) go through gradcomp's `dense_kind` schedule.
template <class State>
method codec_method(std::string name, std::string codec, std::string schedule,
                    std::function<std::unique_ptr<State>(context&, std::size_t)> make,
                    std::function<void(context&, State&, std::span<float>)> run,
                    gradcomp::schedule_kind dense_kind = gradcomp::schedule_kind::ring) {
  return {std::move(name), std::move(codec), std::move(schedule), true,
          [make, run, dense_kind](context& c, const std::vector<bucket>& layout) -> std::unique_ptr<runner> {
            return std::make_unique<codec_runner<State>>(c, layout, make, run, dense_kind);
          }};
}

using gradiveq_codec = gradcomp::linear_compressor<policy>;

/// GradiVeQ of one bucket: K = 256, d = 32 (forced), fitted on 48 aggregated
/// samples of conv-like slices (identical on every rank), then compressed steps.
std::unique_ptr<gradiveq_codec> make_gradiveq(context& c, std::size_t length) {
  gradcomp::gradiveq_options o;
  o.slice_size = gradiveq_K;
  o.summands = std::size_t(c.size);
  o.lambda = 1e-4;
  o.max_dimension = gradiveq_d;
  auto codec = std::make_unique<gradiveq_codec>(length, o);
  static const gb::conv_like_gradients source(gradiveq_K, gradiveq_d);
  gb::fit_on_aggregated_samples(*codec, source, length, 4);
  return codec;
}

/// The methods; a new gradcomp schedule is one more entry.
const std::vector<method>& methods() {
  static const std::vector<method> all = [] {
    std::vector<method> m;
    // Every MPI_Allreduce algorithm of SMPI: the algorithm is smpirun's
    // --cfg=smpi/allreduce:<alg> (the runner passes it, and --label for the record).
    m.push_back(dense_method("mpi_allreduce", "mpi_allreduce", [](context&, std::span<float> x) {
      MPI_Allreduce(MPI_IN_PLACE, x.data(), int(x.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }));
    // gradcomp's dense schedules (schedules.hpp).
    using sk = gradcomp::schedule_kind;
    m.push_back(dense_method("gc_ring", "ring", [](context& c, std::span<float> x) { schedule_allreduce(c, x, sk::ring); }));
    m.push_back(dense_method("gc_pipelined_ring", "pipelined_ring",
                             [](context& c, std::span<float> x) { schedule_allreduce(c, x, sk::pipelined_ring); }));
    m.push_back(dense_method("gc_rabenseifner", "rabenseifner",
                             [](context& c, std::span<float> x) { schedule_allreduce(c, x, sk::rabenseifner); }));
    // Every bucket in one Rabenseifner over the whole buffer (the grouped
    // GradiVeQ method's dense counterpart: one set of latency steps).
    m.push_back(grouped_dense_method("gc_rabenseifner_grouped", "dense", "rabenseifner_grouped",
                                     [](context& c, std::span<float> x) { schedule_allreduce(c, x, sk::rabenseifner); }));
    // Diagnostic, not in the runner's lists: MPI_Allreduce over the same runs of buckets (the fair
    // counterpart of the grouped methods; --cfg=smpi/allreduce picks the algorithm).
    m.push_back(grouped_dense_method("mpi_allreduce_grouped", "mpi_allreduce", "mpi_allreduce_grouped",
                                     [](context&, std::span<float> x) {
                                       MPI_Allreduce(MPI_IN_PLACE, x.data(), int(x.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                                     }));
    m.push_back(dense_method("gc_direct", "direct", [](context& c, std::span<float> x) { schedule_allreduce(c, x, sk::direct); }));
    m.push_back(dense_method("gc_hierarchical", "hierarchical",
                             [](context& c, std::span<float> x) { schedule_allreduce(c, x, sk::hierarchical); }));
    // The hand-off to the MPI library (MPI_Allreduce under the best algorithm's setting): not one of
    // gradcomp's own schedules (the runner does not count it as "gradcomp dense").
    m.push_back(dense_method("gc_library", "library", [](context& c, std::span<float> x) { schedule_allreduce(c, x, sk::library); }));
    // gradcomp's compressed schedules.
    m.push_back(codec_method<gradiveq_codec>(
        "gc_gradiveq_ring", "gradiveq", "ring", make_gradiveq,
        [](context& c, gradiveq_codec& q, std::span<float> x) { gradcomp::ring_allreduce_linear(policy{}, c.transport, q, x); }));
    m.push_back(codec_method<gradiveq_codec>(
        "gc_gradiveq_rabenseifner", "gradiveq", "rabenseifner", make_gradiveq,
        [](context& c, gradiveq_codec& q, std::span<float> x) {
          // --chunk 0 sends the first step's half as one message, --max-chunks caps its pieces
          note(c, gradcomp::allreduce_linear(policy{}, c.transport, q, x,
                                             {.kind = sk::rabenseifner, .chunk_elements = c.chunk,
                                              .max_chunks = c.max_chunks, .workspace = &c.workspace}));
        },
        sk::rabenseifner));
    m.push_back({"gc_gradiveq_rabenseifner_grouped", "gradiveq", "rabenseifner_grouped", true,
                 [](context& c, const std::vector<bucket>& layout) -> std::unique_ptr<runner> {
                   return std::make_unique<grouped_runner<gradiveq_codec>>(c, layout, make_gradiveq);
                 }});
    m.push_back({"gc_gradiveq_rabenseifner_mixed_grouped", "gradiveq", "rabenseifner_mixed_grouped", true,
                 [](context& c, const std::vector<bucket>& layout) -> std::unique_ptr<runner> {
                   return std::make_unique<mixed_runner<gradiveq_codec>>(c, layout, make_gradiveq);
                 }});
    m.push_back(codec_method<gradiveq_codec>(
        "gc_gradiveq_hierarchical", "gradiveq", "hierarchical", make_gradiveq,
        [](context& c, gradiveq_codec& q, std::span<float> x) {
          // groups of --group ranks (the fat tree's leaf switches); one level without
          note(c, gradcomp::allreduce_linear(policy{}, c.transport, q, x,
                                             {.kind = sk::hierarchical, .chunk_elements = c.chunk,
                                              .max_chunks = c.max_chunks, .group_size = c.group,
                                              .workspace = &c.workspace}));
        },
        sk::hierarchical));
    // Diagnostic, not in the runner's lists: GradiVeQ's encode (eq. 3) and decode
    // (eq. 5) of every compressible bucket on each rank, no network: the codec's
    // computation as SMPI charges it, to split gc_gradiveq_*'s time.
    m.push_back(codec_method<gradiveq_codec>(
        "gc_gradiveq_compute", "gradiveq_compute", "none", make_gradiveq,
        [](context&, gradiveq_codec& q, std::span<float> x) {
          gradiveq_codec::payload_type p;
          q.encode(std::span<const float>(x), p);
          q.decode(p, x);
        },
        sk::rabenseifner));
    // fp16 / bf16 (half.hpp): 16-bit payloads, one rounding per hop on the ring (add_raw_and_reencode)
    using fp16 = gradcomp::fp16_codec<policy>;
    using bf16 = gradcomp::bf16_codec<policy>;
    m.push_back(codec_method<fp16>(
        "gc_fp16_ring", "fp16", "ring", [](context&, std::size_t) { return std::make_unique<fp16>(); },
        [](context& c, fp16& q, std::span<float> x) { gradcomp::ring_allreduce_linear(policy{}, c.transport, q, x); }));
    m.push_back(codec_method<fp16>(
        "gc_fp16_rabenseifner", "fp16", "rabenseifner", [](context&, std::size_t) { return std::make_unique<fp16>(); },
        [](context& c, fp16& q, std::span<float> x) {
          gradcomp::allreduce_linear(policy{}, c.transport, q, x, {.kind = sk::rabenseifner, .workspace = &c.workspace});
        },
        sk::rabenseifner));
    m.push_back(codec_method<bf16>(
        "gc_bf16_ring", "bf16", "ring", [](context&, std::size_t) { return std::make_unique<bf16>(); },
        [](context& c, bf16& q, std::span<float> x) { gradcomp::ring_allreduce_linear(policy{}, c.transport, q, x); }));
    m.push_back(codec_method<bf16>(
        "gc_bf16_rabenseifner", "bf16", "rabenseifner", [](context&, std::size_t) { return std::make_unique<bf16>(); },
        [](context& c, bf16& q, std::span<float> x) {
          gradcomp::allreduce_linear(policy{}, c.transport, q, x, {.kind = sk::rabenseifner, .workspace = &c.workspace});
        },
        sk::rabenseifner));
    // The homomorphic quantizer (agreed scales: a ring max of the block scales, then integer sums on the ring).
    using homomorphic = gradcomp::homomorphic_quantizer<policy>;
    m.push_back(codec_method<homomorphic>(
        "gc_homomorphic_ring", "homomorphic", "ring",
        [](context& c, std::size_t) {
          return std::make_unique<homomorphic>(gradcomp::homomorphic_options{.seed = 7, .worker = std::size_t(c.rank)},
                                               std::size_t(c.size));
        },
        [](context& c, homomorphic& q, std::span<float> x) { gradcomp::ring_allreduce_linear(policy{}, c.transport, q, x); }));
    using qsgd_ring = std::vector<gradcomp::qsgd<policy>>;
    m.push_back(codec_method<qsgd_ring>(
        "gc_qsgd4_reencode_ring", "qsgd4", "reencode_ring",
        [](context& c, std::size_t length) {
          return std::make_unique<qsgd_ring>(gradcomp::make_ring_codecs(c.size, length, [&](int j, std::size_t) {
            return gradcomp::qsgd<policy>({.bits = 4, .bucket_size = 512, .seed = std::uint64_t(c.rank * 4096 + j + 1)});
          }));
        },
        [](context& c, qsgd_ring& q, std::span<float> x) { gradcomp::ring_allreduce_reencode(policy{}, c.transport, q, x); }));
    using qsgd_one = gradcomp::qsgd<policy>;
    m.push_back(codec_method<qsgd_one>(
        "gc_qsgd4_allgather", "qsgd4_allgather", "allgather",
        [](context& c, std::size_t) {
          return std::make_unique<qsgd_one>(gradcomp::qsgd_options{.bits = 4, .bucket_size = 512, .seed = std::uint64_t(c.rank * 4096 + 99)});
        },
        [](context& c, qsgd_one& q, std::span<float> x) { gradcomp::ring_allgather_decode(policy{}, c.transport, q, x); }));
    using two_bit = gradcomp::two_bit_quantizer<policy>;
    m.push_back(codec_method<two_bit>(
        "gc_two_bit_allgather", "two_bit", "allgather",
        [](context&, std::size_t length) { return std::make_unique<two_bit>(length, gradcomp::two_bit_options::automatic()); },
        [](context& c, two_bit& q, std::span<float> x) { gradcomp::ring_allgather_decode(policy{}, c.transport, q, x); }));
    using top_k = gradcomp::sparsifier_with_memory<policy>;
    m.push_back(codec_method<top_k>(
        "gc_top_k_allgather", "top_k", "allgather",
        [](context&, std::size_t length) { return std::make_unique<top_k>(length, gradcomp::sparsifier_options{.ratio_percent = 1.0}); },
        [](context& c, top_k& q, std::span<float> x) { gradcomp::ring_allgather_decode(policy{}, c.transport, q, x); }));
    return m;
  }();
  return all;
}

const char* rules_text =
    "simulation rules (issue 21), for every method alike:\n"
    "  - platform host speed = smpi/host-speed = the speed calibrated here (bench_smpi_allreduce --calibrate), one core per node\n"
    "  - computation simulated (default), smpi/cpu-threshold at its default, no computation-adjustment file\n"
    "  - SMPI_SAMPLE: used nowhere\n"
    "  - every addition, encode and decode of gradcomp in user code on the calling thread (policy %s, Eigen %d thread):\n"
    "    no MPI_Reduce_local, no user MPI_Op, no helper threads (SMPI charges nothing for those)\n"
    "  - messages >= 64 KB wherever a schedule chooses the size (pipelined ring, Rabenseifner, hierarchical, direct: chunks of\n"
    "    32768 floats = 128 KiB; the plain ring does not choose: segments = bucket / N)\n"
    "  - SimGrid's default SMPI network model as shipped (bandwidth/latency factors, cross-traffic) for every method\n"
    "  - gradcomp's own small collectives (the bench's barrier and timing reduction) run under the same\n"
    "    smpi/allreduce setting as the best MPI_Allreduce algorithm's run\n"
    "  - glibc's fast bins off (GLIBC_TUNABLES=glibc.malloc.mxfast=0): the N simulated ranks share one heap, and the\n"
    "    first rank to allocate 1 KiB or more after the simulator's own frees otherwise pays for consolidating\n"
    "    all of them (1-5 ms of CPU charged to one rank, in any method that allocates; a real rank has its own heap)\n";

std::uint64_t checksum(const std::vector<std::span<float>>& buckets) {
  std::uint64_t h = 0;
  for (const auto& b : buckets) {
    std::uint64_t x = 0;
    for (std::size_t i = 0; i < b.size(); ++i) {
      std::uint32_t u;
      std::memcpy(&u, &b[i], 4);
      x = x * 0x100000001B3ull + u;
    }
    h = gb::splitmix(h ^ x);
  }
  return h;
}

/// Real (thread CPU) elements per second of the dense ring's addition kernel: the host speed.
int calibrate() {
  const std::size_t n = std::size_t{1} << 22;  // 4M floats, 16 MB: as a ring segment, out of cache
  std::vector<float> acc(n, 1.0f), x(n, 2.0f);
  const double t = gb::best_cpu_seconds(
      15, [&] { gradcomp::execution::add_into(policy{}, std::span<float>(acc), std::span<const float>(x)); gb::do_not_optimize(acc[n / 3]); });
  std::printf("calibration: add_into(%s) over %zu floats, best of 15 (thread CPU time): %.3f ms = %.4g adds/s\n",
              gb::policy_name, n, t * 1e3, double(n) / t);
  std::printf("CALIBRATE host_speed_flops=%.6g\n", double(n) / t);
  return 0;
}

/// The cost model fitted from a simulated ping-pong (rank 0 <-> 1, one-way time of messages of 64 KB to
/// 16 MB, least squares: alpha + bytes x beta, in MPI_Wtime = simulated time), the measured per-element
/// cost of the addition (thread CPU time, as the host speed) and the per-message cost of a burst with
/// every rank at work in pairs (gradcomp::measure_message_seconds), then the model's prediction of every
/// schedule for each "N:floats" of `grid` (printed by rank 0 as MODEL / PICK lines). Nothing here sees
/// the grid's measured times. Runs under smpirun -np N (at least 2) on a flat platform of the link class.
int fit_model(mpi_transport& transport, const std::string& grid) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) {
    if (rank == 0) std::fprintf(stderr, "--model needs at least 2 ranks\n");
    return 2;
  }
  std::vector<double> xs, ys;
  std::vector<char> buf(std::size_t{16} << 20);
  for (std::size_t bytes = std::size_t{64} << 10; bytes <= buf.size(); bytes *= 4) {
    double best = 1e300;
    for (int r = 0; r < 3; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (rank == 0) {
        MPI_Send(buf.data(), int(bytes), MPI_BYTE, 1, 7, MPI_COMM_WORLD);
        MPI_Recv(buf.data(), int(bytes), MPI_BYTE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else if (rank == 1) {
        MPI_Recv(buf.data(), int(bytes), MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buf.data(), int(bytes), MPI_BYTE, 0, 7, MPI_COMM_WORLD);
      }
      best = std::min(best, (MPI_Wtime() - t0) / 2);
    }
    xs.push_back(double(bytes));
    ys.push_back(best);
  }
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) mx += xs[i], my += ys[i];
  mx /= double(xs.size()), my /= double(xs.size());
  double sxy = 0, sxx = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) sxy += (xs[i] - mx) * (ys[i] - my), sxx += (xs[i] - mx) * (xs[i] - mx);
  // The per-message cost (message_s): gradcomp::measure_message_seconds over the same mpi_transport the
  // schedules use (a burst of 32 small messages each way against one), so it includes the transport's own
  // work per message, which SMPI charges as computation (MPI's own calls are not charged).
  gradcomp::cost_model model;
  model.message_s = gradcomp::measure_message_seconds(transport, 32, 4);
  model.inter.seconds_per_byte = sxy / sxx;
  model.inter.latency_s = std::max(0.0, my - model.inter.seconds_per_byte * mx);
  model.intra = model.inter;
  model.price_direct = true;  // the platforms are flat non-blocking switches (a fact of the topology, like group_size)
  const std::size_t n = std::size_t{1} << 22;
  std::vector<float> acc(n, 1.0f), x(n, 2.0f);
  model.add_s = gb::best_cpu_seconds(15, [&] {
                  gradcomp::execution::add_into(policy{}, std::span<float>(acc), std::span<const float>(x));
                  gb::do_not_optimize(acc[n / 3]);
                }) / double(n);
  if (rank != 0) return 0;
  std::printf("MODEL latency_s=%.6g seconds_per_byte=%.6g gbit=%.4g add_s=%.4g message_s=%.4g chunk=%zu\n",
              model.inter.latency_s, model.inter.seconds_per_byte, 8e-9 / model.inter.seconds_per_byte, model.add_s,
              model.message_s, model.chunk_elements);
  for (std::size_t at = 0; at < grid.size();) {
    std::size_t end = grid.find(',', at);
    if (end == std::string::npos) end = grid.size();
    const std::string item = grid.substr(at, end - at);
    at = end + 1;
    const auto colon = item.find(':');
    if (colon == std::string::npos) continue;
    gradcomp::cost_problem pr;
    pr.ranks = std::atoi(item.substr(0, colon).c_str());
    pr.elements = std::strtoull(item.c_str() + colon + 1, nullptr, 10);
    const auto pred = gradcomp::predict(model, pr);
    std::printf("PICK nodes=%d floats=%zu best=%s", pr.ranks, pr.elements, gradcomp::to_string(pred.best));
    for (std::size_t k = 0; k < gradcomp::schedule_kind_count; ++k)
      if (std::isfinite(pred.seconds[k]))
        std::printf(" %s=%.6g", gradcomp::to_string(static_cast<gradcomp::schedule_kind>(k)), pred.seconds[k]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string method_name, spec = "resnet50", label, model_grid;
  int repeats = 1, group = 0, allgather_radix = gradcomp::schedule_options{}.allgather_radix;
  std::size_t chunk = 32768, max_chunks = gradcomp::schedule_options{}.max_chunks, group_floats = std::size_t{16} << 20;
  bool do_model = false;
  bool do_calibrate = false, list = false, rules = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--method") method_name = next();
    else if (a == "--gradient") spec = next();
    else if (a == "--repeats") repeats = std::max(1, std::atoi(next().c_str()));
    else if (a == "--label") label = next();
    else if (a == "--group") group = std::atoi(next().c_str());
    else if (a == "--chunk") chunk = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--max-chunks") max_chunks = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--allgather-radix") allgather_radix = std::atoi(next().c_str());
    else if (a == "--group-floats") group_floats = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--model") do_model = true, model_grid = next();
    else if (a == "--calibrate") do_calibrate = true;
    else if (a == "--list") list = true;
    else if (a == "--rules") rules = true;
  }
  Eigen::setNbThreads(1);
  if (list) {  // runs under smpirun -np 1 as well
    for (const auto& m : methods()) std::printf("METHOD %s codec=%s schedule=%s\n", m.name.c_str(), m.codec.c_str(), m.schedule.c_str());
    return 0;
  }
  if (rules) {
    std::printf(rules_text, gb::policy_name, Eigen::nbThreads());
    return 0;
  }
  if (do_calibrate) return calibrate();

  gradcomp::transport::mpi_environment env(&argc, &argv);
  mpi_transport transport(MPI_COMM_WORLD);
  if (do_model) return fit_model(transport, model_grid);
  context c{transport, transport.rank(), transport.size(), group, chunk, max_chunks, allgather_radix, {}, {}, group_floats};
  const auto found = std::find_if(methods().begin(), methods().end(), [&](const method& m) { return m.name == method_name; });
  if (found == methods().end()) {
    if (c.rank == 0) std::fprintf(stderr, "bench_smpi_allreduce: unknown --method '%s' (--list)\n", method_name.c_str());
    return 2;
  }
  // Every simulated rank shares this process's heap with the simulator: with glibc's fast bins on, the
  // first rank to malloc 1 KiB or more after the simulator's frees runs malloc_consolidate over all of
  // them, and SMPI charges that CPU time to the rank as computation (1-5 ms at 64 ranks, measured: the
  // rank that starts first after each barrier; docs/performance.md). bench/smpi/run turns them off for
  // every run (GLIBC_TUNABLES=glibc.malloc.mxfast=0, read by glibc at start-up: smpicxx's own malloc
  // macros keep mallopt out of reach here); a run without it says so.
  if (const char* tunables = std::getenv("GLIBC_TUNABLES"); c.rank == 0 && (tunables == nullptr || !std::strstr(tunables, "glibc.malloc.mxfast=0")))
    std::fprintf(stderr, "bench_smpi_allreduce: warning: GLIBC_TUNABLES=glibc.malloc.mxfast=0 is not set: one rank per step "
                         "may be charged for the whole simulation's heap consolidation (bench/smpi/run sets it)\n");
  const method& m = *found;
  const auto layout = gradient_buckets(spec, m.compressed_layout);
  gradient_buffer g(layout);
  const std::size_t total = g.arena.size(), compressible = g.compressible.size();
  auto r = m.make(c, layout);

  double best = 1e300;
  for (int it = -1; it < repeats; ++it) {
    for (std::size_t i = 0; i < g.buckets.size(); ++i) fill_gradient(g.buckets[i], c.rank, i);
    c.stats = {};
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    r->step(g);
    double mine = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (it >= 0) best = std::min(best, slowest);
  }
  unsigned long long h = checksum(g.buckets), hmin = 0, hmax = 0;
  MPI_Allreduce(&h, &hmin, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hmax, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  // The schedules' statistics of the last run (real CPU time of the
  // additions, encodes and decodes, as SMPI charges it; messages sent), the
  // largest over the ranks (zero for methods that keep none).
  double mine[4] = {c.stats.combine_seconds, c.stats.encode_seconds, c.stats.decode_seconds, double(c.stats.messages_sent)};
  double most[4] = {};
  MPI_Allreduce(mine, most, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (c.rank == 0)
    std::printf("SMPI_STATS add_cpu_seconds_max=%.6g encode_cpu_seconds_max=%.6g decode_cpu_seconds_max=%.6g messages_max=%.0f\n",
                most[0], most[1], most[2], most[3]);
  if (c.rank == 0)
    std::printf("SMPI_RUN method=%s label=%s codec=%s schedule=%s nodes=%d gradient=%s floats=%zu compressible=%zu "
                "buckets=%zu repeats=%d seconds=%.9g identical=%d\n",
                m.name.c_str(), label.empty() ? "-" : label.c_str(), m.codec.c_str(), m.schedule.c_str(), c.size,
                spec.c_str(), total, compressible, g.buckets.size(), repeats, best, hmin == hmax ? 1 : 0);
  return 0;
}
