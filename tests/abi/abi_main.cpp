// The mixed-ISA test (issue 19, item 3): two translation units, one built with
// -mavx2 -mfma and xsimd and one with neither, linked into this program. Each
// must run its own kernels (distinct ABI tags that match its flags, distinct
// copies of every kernel) and both must get the right results: equal to the
// scalar reference inside each unit, and bit-equal across the units and
// across seq/simd, as the kernels promise (docs/backends.md).
//
// Exit status 0: all checks passed; 1: a check failed (each is printed);
// 77: this CPU lacks AVX2 or FMA, so the AVX2 unit cannot run (skipped).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "abi_unit.hpp"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

int main() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::printf("SKIP: this CPU has no AVX2/FMA\n");
    return 77;
  }
#endif
  const abi_test::unit_report isa = abi_test::run_isa_unit();
  const abi_test::unit_report base = abi_test::run_baseline_unit();
  std::printf("isa unit:      tag %s, simd_available %d\n", isa.abi_tag.c_str(), int(isa.simd_available));
  std::printf("baseline unit: tag %s, simd_available %d\n", base.abi_tag.c_str(), int(base.simd_available));

  // Each unit was compiled as intended, and its tag says so.
  check(isa.avx2 && isa.fma, "the isa unit was not compiled with -mavx2 -mfma");
  check(!base.avx2 && !base.fma, "the baseline unit was compiled with AVX2 or FMA");
  check(isa.simd_available, "the isa unit has no xsimd kernels (simd_available is false)");
  check(!base.simd_available, "the baseline unit has xsimd kernels (simd_available is true)");
  check(isa.abi_tag != base.abi_tag, "both units report the ABI tag " + isa.abi_tag);
  check(contains(isa.abi_tag, "_avx2") && contains(isa.abi_tag, "_fma") && contains(isa.abi_tag, "_xsimd"),
        "the isa unit's tag " + isa.abi_tag + " does not name avx2, fma and xsimd");
  check(!contains(base.abi_tag, "_avx2") && !contains(base.abi_tag, "_fma") && !contains(base.abi_tag, "_xsimd"),
        "the baseline unit's tag " + base.abi_tag + " names avx2, fma or xsimd");

  // Each unit calls its own copy of every kernel: the linker merged none.
  check(isa.functions.size() == base.functions.size(), "the units report different kernel lists");
  for (std::size_t i = 0; i < isa.functions.size() && i < base.functions.size(); ++i) {
    const auto& [name, a] = isa.functions[i];
    const void* b = base.functions[i].second;
    check(a != nullptr && b != nullptr, name + ": no address");
    check(a != b, name + " is the same function in both units (the linker kept one body for both)");
  }

  // Right results inside each unit (scalar reference, QSGD properties) ...
  for (const auto& f : isa.failures) check(false, "isa unit: " + f);
  for (const auto& f : base.failures) check(false, "baseline unit: " + f);
  // ... and the same bytes everywhere: seq == simd in each unit, and across units.
  check(isa.two_bit_seq.size() == 3 && isa.qsgd_seq.size() == 3, "the isa unit ran fewer than 3 steps");
  check(isa.two_bit_seq == isa.two_bit_simd, "isa unit: two_bit seq and simd payloads differ");
  check(base.two_bit_seq == base.two_bit_simd, "baseline unit: two_bit seq and simd payloads differ");
  check(isa.two_bit_seq == base.two_bit_seq, "two_bit payloads differ between the units");
  check(isa.qsgd_seq == isa.qsgd_simd, "isa unit: qsgd seq and simd payloads differ");
  check(base.qsgd_seq == base.qsgd_simd, "baseline unit: qsgd seq and simd payloads differ");
  check(isa.dense_seq == isa.dense_simd && base.dense_seq == base.dense_simd && isa.dense_seq == base.dense_seq,
        "dense payloads differ between policies or units");
  // QSGD accumulates its squares with a fused multiply-add exactly where the
  // target has FMA (docs/codecs.md), so a norm may differ in its last bits
  // between the units (and then, rarely, a stochastic code): compare norms.
  check(isa.qsgd_norms.size() == base.qsgd_norms.size(), "the units report different numbers of qsgd payloads");
  for (std::size_t s = 0; s < isa.qsgd_norms.size() && s < base.qsgd_norms.size(); ++s) {
    check(isa.qsgd_norms[s].size() == base.qsgd_norms[s].size(), "qsgd bucket counts differ between the units");
    for (std::size_t b = 0; b < isa.qsgd_norms[s].size() && b < base.qsgd_norms[s].size(); ++b) {
      const float x = isa.qsgd_norms[s][b], y = base.qsgd_norms[s][b];
      check(std::fabs(x - y) <= 1e-6f * std::fabs(y),
            "qsgd norms differ by more than float rounding between the units");
    }
  }

  // The rest of the library: bit-identical results where the kernels promise
  // them (sparse codecs, payload bytes, rings, frames) ...
  check(!isa.exact.empty() && isa.exact.size() == base.exact.size(), "the units report different exact results");
  for (std::size_t i = 0; i < isa.exact.size() && i < base.exact.size(); ++i) {
    check(isa.exact[i].first == base.exact[i].first, "exact results in another order: " + isa.exact[i].first);
    check(isa.exact[i].second == base.exact[i].second, isa.exact[i].first + ": bytes differ between the units");
  }
  // ... and within float rounding where Eigen's reductions or FMA may round
  // differently (GradiVeQ, LGC, sa_momentum).
  check(!isa.approx.empty() && isa.approx.size() == base.approx.size(), "the units report different results");
  for (std::size_t i = 0; i < isa.approx.size() && i < base.approx.size(); ++i) {
    const auto& [name, x] = isa.approx[i];
    const auto& y = base.approx[i].second;
    check(name == base.approx[i].first, "results in another order: " + name);
    check(x.size() == y.size() && !x.empty(), name + ": result sizes differ between the units");
    double scale = 0.0;
    for (float v : y) scale = std::max(scale, double(std::fabs(v)));
    for (std::size_t j = 0; j < x.size() && j < y.size(); ++j)
      if (!(std::fabs(double(x[j]) - double(y[j])) <= 1e-4 * std::max(scale, 1e-6))) {
        check(false, name + ": value " + std::to_string(j) + " differs by more than float rounding between the units");
        break;
      }
  }
  std::printf("compared %zu exact and %zu approximate results, %zu functions\n", isa.exact.size(),
              isa.approx.size(), isa.functions.size());

  std::printf("%s (%d failed checks)\n", failures == 0 ? "PASS" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}
