// One translation unit of the mixed-ISA test (tests/abi/CMakeLists.txt builds
// this file twice: with -mavx2 -mfma and xsimd, and with neither). It runs
// the two-bit and QSGD encodes under execution::seq and execution::simd,
// checks them against a scalar reference computed here, and reports its ABI
// tag, simd_available and the addresses of its copies of the kernels.

#include "abi_unit.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/dense.hpp>
#include <gradcomp/qsgd.hpp>
#include <gradcomp/two_bit.hpp>
#include <gradcomp/wire.hpp>

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
  };
  return rep;
}

}  // namespace abi_test
