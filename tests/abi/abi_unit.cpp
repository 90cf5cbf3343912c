// One translation unit of the mixed-ISA test (tests/abi/CMakeLists.txt builds
// this file twice: with -mavx2 -mfma and xsimd, and with neither). It runs
// the two-bit and QSGD encodes under execution::seq and execution::simd,
// checks them against a scalar reference computed here, and reports its ABI
// tag, simd_available and the addresses of its copies of the kernels.

#include "abi_unit.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/dense.hpp>
#include <gradcomp/dgs_server.hpp>
#include <gradcomp/gradiveq.hpp>
#include <gradcomp/layout.hpp>
#include <gradcomp/parameter_server.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/samomentum.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/tags.hpp>
#include <gradcomp/transport/emulated_link.hpp>
#include <gradcomp/transport/fault_injection.hpp>
#include <gradcomp/transport/inproc.hpp>
#include <gradcomp/two_bit.hpp>
#include <gradcomp/wire.hpp>
#if defined(GRADCOMP_HAS_ZLIB)
#include <gradcomp/autoencoder.hpp>
#endif

#if !defined(GRADCOMP_ABI_TEST_ENTRY)
#error "define GRADCOMP_ABI_TEST_ENTRY to run_isa_unit or run_baseline_unit"
#endif

namespace abi_test {
namespace {

namespace ex = gradcomp::execution;

// Deterministic gradients (xorshift, values in about [-1, 1]).
std::vector<float> gradient(std::size_t n, std::uint32_t seed) {
  std::vector<float> g(n);
  std::uint32_t s = seed * 2654435761u + 1u;
  for (auto& v : g) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    v = static_cast<float>(static_cast<std::int32_t>(s)) * (1.0f / 2147483648.0f);
  }
  return g;
}

// The address of a non-virtual member function (Itanium C++ ABI: a pointer
// to member function is {function address, this adjustment}).
template <class M>
const void* member_address(M m) {
  static_assert(sizeof(M) == 2 * sizeof(void*), "Itanium C++ ABI member function pointer expected");
  const void* p = nullptr;
  std::memcpy(&p, &m, sizeof p);
  return p;
}

template <class F>
const void* function_address(F* f) {
  return reinterpret_cast<const void*>(f);
}

constexpr std::size_t n = 4099;  // not a multiple of 16: a partial last word
constexpr float threshold = 0.3f;

// Scalar two-bit reference: the rule of seed 003, written out here.
void two_bit_reference(std::span<const float> g, std::vector<float>& r, std::vector<std::uint32_t>& words) {
  words.assign((g.size() + 15) / 16, 0u);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const float x = r[i] + g[i];
    const std::uint32_t code = x >= threshold ? 3u : (x <= -threshold ? 2u : 0u);
    const float q = code == 3u ? threshold : (code == 2u ? -threshold : 0.0f);
    r[i] = x - q;
    words[i / 16] |= code << (2 * (i % 16));
  }
}

template <class Policy>
std::vector<std::vector<std::byte>> run_two_bit(unit_report& rep, const char* name) {
  gradcomp::two_bit_quantizer<Policy> q(n, gradcomp::two_bit_options::fixed(threshold));
  std::vector<float> r(n, 0.0f);
  std::vector<std::uint32_t> words;
  std::vector<std::vector<std::byte>> out;
  gradcomp::two_bit_payload p;
  for (std::uint32_t step = 0; step < 3; ++step) {
    const auto g = gradient(n, 10 + step);
    q.encode(g, p);
    two_bit_reference(g, r, words);
    if (p.words != words) rep.failures.push_back(std::string(name) + ": words differ from the scalar reference");
    if (std::memcmp(r.data(), q.residual().data(), n * sizeof(float)) != 0)
      rep.failures.push_back(std::string(name) + ": residual differs from the scalar reference");
    out.push_back(gradcomp::wire::serialize(p));
    if (gradcomp::wire::parse<gradcomp::two_bit_payload>(out.back()).words != p.words)
      rep.failures.push_back(std::string(name) + ": the payload does not parse back");
  }
  gradcomp::two_bit_quantizer<Policy> restored(n, gradcomp::two_bit_options::fixed(threshold));
  restored.restore_state(q.save_state());
  if (restored.save_state() != q.save_state()) rep.failures.push_back(std::string(name) + ": state round trip");
  return out;
}

template <class Policy>
std::vector<std::vector<std::byte>> run_qsgd(unit_report& rep, const char* name) {
  gradcomp::qsgd_options o;
  o.bits = 4;
  o.bucket_size = 256;
  o.seed = 77;
  gradcomp::qsgd<Policy> q(o);
  std::vector<std::vector<std::byte>> out;
  gradcomp::qsgd_payload p;
  std::vector<float> decoded(n);
  for (std::uint32_t step = 0; step < 3; ++step) {
    const auto g = gradient(n, 20 + step);
    q.encode(g, p);
    q.decode(p, decoded);
    // Reference properties of QSGD (eq. 3.1): per bucket, the norm is ||v||_2
    // and every decoded value has the sign of v_i and lies within one level
    // (||v||_2 / s) of it.
    for (std::size_t b = 0; b * o.bucket_size < n; ++b) {
      const std::size_t lo = b * o.bucket_size, hi = std::min(n, lo + o.bucket_size);
      double sq = 0.0;
      for (std::size_t i = lo; i < hi; ++i) sq += double(g[i]) * double(g[i]);
      const double norm = std::sqrt(sq);
      if (std::fabs(double(p.norms[b]) - norm) > 1e-5 * norm)
        rep.failures.push_back(std::string(name) + ": bucket norm differs from the reference");
      const double unit = norm / q.options().levels;
      for (std::size_t i = lo; i < hi; ++i) {
        const double d = decoded[i];
        if (std::fabs(d - g[i]) > unit * (1.0 + 1e-5) || (d != 0.0 && (d < 0) != (g[i] < 0))) {
          rep.failures.push_back(std::string(name) + ": decoded value " + std::to_string(i) + " is off");
          break;
        }
      }
    }
    out.push_back(gradcomp::wire::serialize(p));
    if (gradcomp::wire::parse<gradcomp::qsgd_payload>(out.back()).words != p.words)
      rep.failures.push_back(std::string(name) + ": the payload does not parse back");
    rep.qsgd_norms.push_back(p.norms);
  }
  gradcomp::qsgd<Policy> restored(o);
  restored.restore_state(q.save_state());
  if (restored.save_state() != q.save_state()) rep.failures.push_back(std::string(name) + ": state round trip");
  return out;
}

// dense_codec: encode, decode_add, accumulate, through the wire.
template <class Policy>
std::vector<std::byte> run_dense(unit_report& rep, const char* name) {
  gradcomp::dense_codec<Policy> c;
  gradcomp::dense_payload a, b;
  const auto g = gradient(n, 30), h = gradient(n, 31);
  c.encode(g, a);
  c.encode(h, b);
  c.accumulate(a, b);
  std::vector<float> out(n, 0.0f);
  c.decode_add(gradcomp::wire::parse<gradcomp::dense_payload>(gradcomp::wire::serialize(a)), out);
  for (std::size_t i = 0; i < n; ++i)
    if (out[i] != g[i] + h[i]) {
      rep.failures.push_back(std::string(name) + ": dense sum differs from the reference");
      break;
    }
  return gradcomp::wire::serialize(a);
}

// ---------------------------------------------------------------------------
// The rest of the library (every header outside the first pass): the sparse
// codecs, GradiVeQ, LGC, the payload parses, the ring over the transports, a
// parameter-server frame and the small helpers (tags, layout, partitions).

template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

void fail(unit_report& rep, const std::string& what) { rep.failures.push_back(what); }

// Runs one part of the unit; an exception it throws is a failed check.
template <class F>
void guarded(unit_report& rep, const char* name, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    fail(rep, std::string(name) + " threw: " + e.what());
  }
}

// The k = max(1, ceil(R% n)) largest |x|, lower index first among equal
// magnitudes, in increasing index order (the exact mode's rule).
std::vector<std::uint32_t> topk_reference(const std::vector<float>& x, std::size_t k) {
  std::vector<std::uint32_t> idx(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) idx[i] = static_cast<std::uint32_t>(i);
  std::stable_sort(idx.begin(), idx.end(), [&](std::uint32_t a, std::uint32_t b) {
    return std::fabs(x[a]) > std::fabs(x[b]);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// sparsifier_with_memory (DGS Alg. 1): the selection is the reference top-k of
// the residual, sent values plus the new residual give back r + g exactly.
template <class Policy>
void run_sparsifier(unit_report& rep, const char* name) {
  gradcomp::sparsifier_options o;
  o.ratio_percent = 2.0;
  gradcomp::sparsifier_with_memory<Policy> c(n, o);
  const std::size_t k = gradcomp::sparse_selection_count(n, o.ratio_percent);
  if (c.selection_size() != k) fail(rep, std::string(name) + ": selection size differs from sparse_selection_count");
  std::vector<float> r(n, 0.0f), decoded(n);
  for (std::uint32_t step = 0; step < 3; ++step) {
    const auto g = gradient(n, 40 + step);
    for (std::size_t i = 0; i < n; ++i) r[i] += g[i];
    gradcomp::sparse_coo_payload p;
    c.encode(g, p);
    if (p.indices != topk_reference(r, k)) fail(rep, std::string(name) + ": selection differs from the reference top-k");
    c.decode(p, decoded);
    for (std::size_t i = 0; i < n; ++i)
      if (decoded[i] + c.residual()[i] != r[i]) {
        fail(rep, std::string(name) + ": decoded + residual != r + g");
        break;
      }
    for (std::size_t i = 0; i < n; ++i) r[i] = c.residual()[i];
    const auto bytes = gradcomp::wire::serialize(p);
    const auto q = gradcomp::wire::parse<gradcomp::sparse_coo_payload>(bytes);
    if (q.indices != p.indices || q.values != p.values) fail(rep, std::string(name) + ": COO payload round trip");
    rep.exact.emplace_back(std::string(name) + " step " + std::to_string(step), bytes);
  }
  gradcomp::sparsifier_with_memory<Policy> restored(n, o);
  restored.restore_state(c.save_state());
  if (restored.save_state() != c.save_state()) fail(rep, std::string(name) + ": state round trip");
}

// sa_momentum (DGS Alg. 3): u = m u + g; the sent entries are the top-k of u
// with u's values; the unsent ones are divided by m.
template <class Policy>
void run_sa_momentum(unit_report& rep, const char* name) {
  gradcomp::sa_momentum_options o;
  o.ratio_percent = 5.0;
  o.momentum = 0.5f;  // 1/m = 2: the rescaling is exact
  gradcomp::sa_momentum<Policy> c(n, o);
  const std::size_t k = gradcomp::sparse_selection_count(n, o.ratio_percent);
  std::vector<float> u(n, 0.0f), all;
  for (std::uint32_t step = 0; step < 3; ++step) {
    const auto g = gradient(n, 50 + step);
    for (std::size_t i = 0; i < n; ++i) u[i] = o.momentum * u[i] + g[i];
    gradcomp::sparse_coo_payload p;
    c.encode(g, p);
    const auto sel = topk_reference(u, k);
    if (p.indices != sel) fail(rep, std::string(name) + ": selection differs from the reference top-k");
    for (std::size_t j = 0; j < p.indices.size() && j < sel.size(); ++j)
      if (p.values[j] != u[p.indices[j]]) {
        fail(rep, std::string(name) + ": a sent value is not the velocity");
        break;
      }
    std::vector<bool> sent(n, false);
    for (auto i : p.indices) sent[i] = true;
    for (std::size_t i = 0; i < n; ++i)
      if (!sent[i]) u[i] = u[i] * (1.0f / o.momentum);
    all.insert(all.end(), p.values.begin(), p.values.end());
  }
  rep.approx.emplace_back(name, all);
}

// GradiVeQ (seed 002): a basis fitted on a low-rank signal reconstructs it,
// the payloads are linear (decode of a sum = sum of decodes) and parse back.
template <class Policy>
void run_gradiveq(unit_report& rep, const char* name) {
  constexpr std::size_t K = 32, slices = 8, tail = 5, len = slices * K + tail;
  // Samples: rank-3 slices (a fixed 3-dimensional subspace) with a tail.
  auto sample = [&](std::uint32_t seed) {
    const auto a = gradient(3 * slices + tail, seed);
    std::vector<float> v(len);
    for (std::size_t m = 0; m < slices; ++m)
      for (std::size_t i = 0; i < K; ++i)
        v[m * K + i] = a[3 * m] * std::sin(0.2f * float(i)) + a[3 * m + 1] * std::cos(0.3f * float(i)) +
                       a[3 * m + 2] * (float(i % 4) - 1.5f) * 0.25f;
    for (std::size_t i = 0; i < tail; ++i) v[slices * K + i] = a[3 * slices + i];
    return v;
  };
  gradcomp::gradiveq_options o;
  o.slice_size = K;
  o.lambda = 1e-4;
  o.summands = 2;
  gradcomp::linear_compressor<Policy> c(len, o);
  for (std::uint32_t t = 0; t < 24; ++t) c.add_sample(sample(100 + t));
  c.fit();
  if (!c.has_basis()) fail(rep, std::string(name) + ": no basis after fit");
  const auto x = sample(500), y = sample(501);
  gradcomp::gradiveq_payload px, py;
  c.encode(x, px);
  c.encode(y, py);
  c.accumulate(px, py);
  const auto bytes = gradcomp::wire::serialize(px);
  const auto parsed = gradcomp::wire::parse<gradcomp::gradiveq_payload>(bytes);
  std::vector<float> sum(len);
  c.decode(parsed, sum);
  double err = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < len; ++i) {
    const double want = double(x[i]) + double(y[i]);
    err += (sum[i] - want) * (sum[i] - want);
    norm += want * want;
  }
  if (!(err <= 1e-6 * norm)) fail(rep, std::string(name) + ": the fitted basis does not reconstruct a rank-3 signal");
  rep.approx.emplace_back(name, sum);
  // Non-finite coefficients are rejected at parse.
  auto bad = px;
  bad.coefficients[0] = std::numeric_limits<float>::infinity();
  try {
    (void)gradcomp::wire::parse<gradcomp::gradiveq_payload>(gradcomp::wire::serialize(bad));
    fail(rep, std::string(name) + ": a non-finite coefficient parsed");
  } catch (const gradcomp::wire::wire_error&) {
  }
  // The schedule and eq. 6.
  gradcomp::gradiveq_schedule_options so;
  so.warmup_iterations = 1;
  so.sampling_iterations = 2;
  so.compressed_iterations = 1;
  gradcomp::gradiveq_schedule sched(so);
  bool fit = false;
  for (int i = 0; i < 3; ++i) fit = sched.advance().fit_basis || fit;
  if (!fit || sched.phase() != gradcomp::gradiveq_phase::compressed)
    fail(rep, std::string(name) + ": schedule did not reach the compressed phase after warm-up and sampling");
  const double eig[] = {4.0, 3.0, 2.0, 1.0};
  if (gradcomp::select_dimension(eig, 0.3) != 2) fail(rep, std::string(name) + ": select_dimension");  // 4 + 3 >= 0.7 * 10
}

#if defined(GRADCOMP_HAS_ZLIB)
// LGC (seed 004): an (untrained, seeded) autoencoder codec encodes and
// decodes; the code and index payloads parse back.
template <class Policy>
void run_lgc(unit_report& rep, const char* name) {
  gradcomp::lgc_architecture a;
  a.encoder_channels = {8, 16};
  a.code_channels = 2;
  a.decoder_channels = {4, 16, 8};
  auto net = std::make_shared<const gradcomp::lgc_network>(gradcomp::lgc_form::ring, 1, 32, a, 7);
  gradcomp::autoencoder_codec<Policy> c(net, 70);
  const auto v = gradient(70, 60);
  gradcomp::lgc_code_payload p;
  c.encode(v, p);
  const auto bytes = gradcomp::wire::serialize(p);
  const auto q = gradcomp::wire::parse<gradcomp::lgc_code_payload>(bytes);
  if (q.codes != p.codes || q.scales != p.scales) fail(rep, std::string(name) + ": code payload round trip");
  std::vector<float> out(70);
  c.decode(q, out);
  for (float x : out)
    if (!std::isfinite(x)) {
      fail(rep, std::string(name) + ": non-finite decode");
      break;
    }
  std::vector<float> both = p.codes;
  both.insert(both.end(), out.begin(), out.end());
  rep.approx.emplace_back(name, both);

  gradcomp::lgc_index_payload ip;
  ip.layer_lengths = {1000, 70000, 5};
  ip.indices = {{0, 3, 999}, {}, {4}};
  for (std::uint32_t i = 7; i < 70000; i += 97) ip.indices[1].push_back(i);
  ip.scales = {1.5f};
  ip.pack();
  const auto ib = gradcomp::wire::serialize(ip);
  if (gradcomp::wire::parse<gradcomp::lgc_index_payload>(ib).indices != ip.indices)
    fail(rep, std::string(name) + ": index payload round trip");
  rep.exact.emplace_back(std::string(name) + " index payload", ib);
  gradcomp::lgc_options lo;
  lo.alpha_percent = 10.0;  // 410 of the 4096-element layer: more than one window
  lo.window = 64;
  const gradcomp::lgc_layout layout({64, 4096, 10}, lo);
  if (layout.total != 64 + 4096 + 10) fail(rep, std::string(name) + ": lgc_layout total");
}
#endif

// The dense ring and the all-gather ring of a sparse codec over 2 inproc
// ranks, the first through emulated_link and fault_injecting (an empty plan).
void run_ring(unit_report& rep) {
  namespace tr = gradcomp::transport;
  constexpr int ranks = 2;
  std::vector<std::vector<float>> data(ranks), sparse(ranks);
  for (int r = 0; r < ranks; ++r) data[r] = sparse[r] = gradient(n, 70 + std::uint32_t(r));
  std::vector<std::string> errors(ranks);
  tr::inproc_fabric fabric(ranks);
  tr::emulated_network net(ranks, {.bits_per_second = 1e12, .latency = std::chrono::nanoseconds(0)});
  fabric.run([&](tr::inproc_endpoint& ep) {
    const int r = ep.rank();
    try {
      tr::emulated_link<tr::inproc_endpoint> link(ep, net);
      tr::fault_injecting<tr::emulated_link<tr::inproc_endpoint>> t(link, tr::fault_plan{});
      gradcomp::ring_allreduce(t, std::span<float>(data[r]));
      gradcomp::sparsifier_options so;
      so.ratio_percent = 10.0;
      gradcomp::sparsifier_with_memory<> codec(n, so);
      (void)gradcomp::ring_allreduce(ep, codec, std::span<float>(sparse[r]));
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  });
  for (const auto& e : errors)
    if (!e.empty()) fail(rep, "ring: " + e);
  const auto g0 = gradient(n, 70), g1 = gradient(n, 71);
  for (std::size_t i = 0; i < n; ++i)
    if (data[0][i] != g0[i] + g1[i] || data[1][i] != data[0][i]) {
      fail(rep, "dense ring over emulated_link/fault_injecting: not the sum on every rank");
      break;
    }
  if (sparse[0] != sparse[1]) fail(rep, "sparse all-gather ring: ranks disagree");
  rep.exact.emplace_back("dense ring", bytes_of(data[0]));
  rep.exact.emplace_back("sparse all-gather ring", bytes_of(sparse[0]));
}

// A parameter-server frame: control message plus a COO and a dense layer,
// built, split and parsed back; a frame with a NaN layer is rejected.
void run_ps_frame(unit_report& rep) {
  gradcomp::ps_control c;
  c.kind = gradcomp::ps_kind::push;
  c.layers = 2;
  c.elements = 16;
  c.sequence = 9;
  gradcomp::sparse_coo_payload sp;
  sp.length = 8;
  sp.indices = {1, 5};
  sp.values = {0.5f, -2.0f};
  gradcomp::dense_payload dp{{1, 2, 3, 4, 5, 6, 7, 8}};
  gradcomp::ps_frame_builder b;
  b.start(c);
  b.append(sp);
  b.append(dp);
  const auto frame = b.take();
  const auto f = gradcomp::ps_split_frame(frame, 4);
  if (f.control.kind != c.kind || f.control.sequence != 9 || f.layers.size() != 2) fail(rep, "ps frame: control");
  if (gradcomp::ps_peek_codec(f.layers[0]) != gradcomp::wire::codec_id::sparse_coo) fail(rep, "ps frame: codec id");
  const auto sq = gradcomp::ps_parse_layer<gradcomp::sparse_coo_payload>(f.layers[0], 8);
  const auto dq = gradcomp::ps_parse_layer<gradcomp::dense_payload>(f.layers[1], 8);
  if (sq.indices != sp.indices || sq.values != sp.values || dq.values != dp.values) fail(rep, "ps frame: layers");
  std::vector<float> scattered(8, 1.0f);
  gradcomp::detail::sparse_scatter<false>(sq, scattered, "abi");
  if (scattered != std::vector<float>{0, 0.5f, 0, 0, 0, -2.0f, 0, 0}) fail(rep, "sparse_scatter");
  rep.exact.emplace_back("ps frame", frame);
  b.start(c);
  b.append(gradcomp::dense_payload{{1, 2, std::numeric_limits<float>::quiet_NaN(), 4, 5, 6, 7, 8}});
  b.append(dp);
  const auto bad = b.take();
  try {
    (void)gradcomp::ps_parse_layer<gradcomp::dense_payload>(gradcomp::ps_split_frame(bad, 4).layers[0], 8);
    fail(rep, "ps frame: a NaN layer parsed");
  } catch (const gradcomp::wire::wire_error&) {
  }
}

// Small helpers: tags, layout, partitions, model updates.
void run_helpers(unit_report& rep) {
  gradcomp::tags::check_tag_base(gradcomp::tags::ring, 32000, 2, "abi");
  try {
    gradcomp::tags::check_tag_base(gradcomp::tags::ring, 31000, 2, "abi");
    fail(rep, "check_tag_base accepted the parameter servers' tags for the ring");
  } catch (const gradcomp::invalid_argument_error&) {
  }
  const auto s = gradcomp::layer_shape::conv(4, 3, 2, 5);
  std::vector<float> fw(s.size()), gv(s.size()), back(s.size());
  for (std::size_t i = 0; i < fw.size(); ++i) fw[i] = float(i);
  gradcomp::flatten_gradiveq(s, fw, gv);
  if (gv[gradcomp::gradiveq_index(s, 3, 2, 1, 4)] != fw[gradcomp::framework_index(s, 3, 2, 1, 4)])
    fail(rep, "flatten_gradiveq");
  gradcomp::unflatten_gradiveq(s, gv, back);
  if (back != fw) fail(rep, "unflatten_gradiveq");
  const gradcomp::layer_partition layers({3, 5});
  gradcomp::model_update u;
  u.layers.resize(2);
  u.layers[0].dense = true;
  u.layers[0].values = {1, 2, 3};
  u.layers[1].indices = {4};
  u.layers[1].values = {9};
  std::vector<float> model(8, 0.0f);
  gradcomp::apply_model_update(layers, u, model);
  if (model != std::vector<float>{1, 2, 3, 0, 0, 0, 0, 9} || u.entries() != 4) fail(rep, "apply_model_update");
  rep.exact.emplace_back("layout", bytes_of(gv));
}

}  // namespace

unit_report GRADCOMP_ABI_TEST_ENTRY() {
  unit_report rep;
  rep.abi_tag = ex::abi_tag;
  rep.simd_available = ex::simd_available;
#if defined(__AVX2__)
  rep.avx2 = true;
#endif
#if defined(__FMA__)
  rep.fma = true;
#endif
  rep.two_bit_seq = run_two_bit<ex::seq>(rep, "two_bit<seq>");
  rep.two_bit_simd = run_two_bit<ex::simd>(rep, "two_bit<simd>");
  rep.qsgd_seq = run_qsgd<ex::seq>(rep, "qsgd<seq>");
  rep.qsgd_simd = run_qsgd<ex::simd>(rep, "qsgd<simd>");
  rep.dense_seq = run_dense<ex::seq>(rep, "dense<seq>");
  rep.dense_simd = run_dense<ex::simd>(rep, "dense<simd>");
  guarded(rep, "run_sparsifier<seq>", [&] { run_sparsifier<ex::seq>(rep, "sparsifier<seq>"); });
  guarded(rep, "run_sparsifier<simd>", [&] { run_sparsifier<ex::simd>(rep, "sparsifier<simd>"); });
  guarded(rep, "run_sa_momentum<seq>", [&] { run_sa_momentum<ex::seq>(rep, "sa_momentum<seq>"); });
  guarded(rep, "run_sa_momentum<simd>", [&] { run_sa_momentum<ex::simd>(rep, "sa_momentum<simd>"); });
  guarded(rep, "run_gradiveq<seq>", [&] { run_gradiveq<ex::seq>(rep, "gradiveq<seq>"); });
  guarded(rep, "run_gradiveq<simd>", [&] { run_gradiveq<ex::simd>(rep, "gradiveq<simd>"); });
#if defined(GRADCOMP_HAS_ZLIB)
  guarded(rep, "run_lgc<seq>", [&] { run_lgc<ex::seq>(rep, "lgc<seq>"); });
  guarded(rep, "run_lgc<simd>", [&] { run_lgc<ex::simd>(rep, "lgc<simd>"); });
#endif
  guarded(rep, "run_ring", [&] { run_ring(rep); });
  guarded(rep, "run_ps_frame", [&] { run_ps_frame(rep); });
  guarded(rep, "run_helpers", [&] { run_helpers(rep); });

  using two_bit_quantize_seq = float(ex::seq, std::span<const float>, std::span<float>, float,
                                     std::span<std::uint32_t>) noexcept;
  using qsgd_quantize_seq = ex::qsgd_quantize_result(ex::seq, std::span<const float>, const ex::qsgd_params&,
                                                     std::span<float>, std::span<std::uint32_t>) noexcept;
  rep.functions = {
      {"two_bit_quantizer<seq>::encode", member_address(&gradcomp::two_bit_quantizer<ex::seq>::encode)},
      {"two_bit_quantizer<simd>::encode", member_address(&gradcomp::two_bit_quantizer<ex::simd>::encode)},
      {"qsgd<seq>::encode", member_address(&gradcomp::qsgd<ex::seq>::encode)},
      {"qsgd<simd>::encode", member_address(&gradcomp::qsgd<ex::simd>::encode)},
      {"execution::two_bit_quantize(seq)", function_address<two_bit_quantize_seq>(&ex::two_bit_quantize)},
      {"execution::qsgd_quantize(seq)", function_address<qsgd_quantize_seq>(&ex::qsgd_quantize)},
      {"dense_codec<simd>::accumulate", member_address(&gradcomp::dense_codec<ex::simd>::accumulate)},
      {"two_bit_payload::codes_valid", function_address(&gradcomp::two_bit_payload::codes_valid<>)},
      {"qsgd_payload::codes_valid", function_address(&gradcomp::qsgd_payload::codes_valid<>)},
      {"wire::serialize<two_bit_payload>",
       function_address(&gradcomp::wire::serialize<gradcomp::two_bit_payload>)},
      {"sparse_coo_payload::read_body", function_address(&gradcomp::sparse_coo_payload::read_body<>)},
      {"sparse_coo_payload::write_body", member_address(&gradcomp::sparse_coo_payload::write_body<>)},
      {"sparse_coo_payload::validate", member_address(&gradcomp::sparse_coo_payload::validate<>)},
      {"gradiveq_payload::read_body", function_address(&gradcomp::gradiveq_payload::read_body<>)},
      {"ps_control::read_body", function_address(&gradcomp::ps_control::read_body<>)},
      {"detail::sparse_scatter<false>", function_address(&gradcomp::detail::sparse_scatter<false>)},
      {"detail::check_sparse_ratio", function_address(&gradcomp::detail::check_sparse_ratio)},
      {"detail::read_finite_floats", function_address(&gradcomp::detail::read_finite_floats)},
      {"sparse_selection_count", function_address(&gradcomp::sparse_selection_count)},
      {"select_dimension", function_address(&gradcomp::select_dimension)},
      {"tags::check_tag_base", function_address(&gradcomp::tags::check_tag_base)},
      {"flatten_gradiveq", function_address(&gradcomp::flatten_gradiveq)},
      {"ps_split_frame", function_address(&gradcomp::ps_split_frame)},
      {"sparsifier_with_memory<seq>::encode",
       member_address(&gradcomp::sparsifier_with_memory<ex::seq>::encode)},
      {"ring_allreduce(inproc_endpoint&, span<float>)",
       function_address<void(gradcomp::transport::inproc_endpoint&, std::span<float>, const gradcomp::ring_options&)>(
           &gradcomp::ring_allreduce<gradcomp::transport::inproc_endpoint>)},
      {"inproc_endpoint::irecv", member_address(&gradcomp::transport::inproc_endpoint::irecv)},
      {"ring_schedule::owned_segment", member_address(&gradcomp::ring_schedule::owned_segment)},
  };
  return rep;
}

}  // namespace abi_test
