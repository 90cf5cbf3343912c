#pragma once
// What one translation unit of the mixed-ISA test reports (tests/abi/). Only
// standard types cross between the units: each is built with its own flags.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace abi_test {

/// Results and identities of one unit's kernels.
struct unit_report {
  std::string abi_tag;                  ///< gradcomp::execution::abi_tag of the unit
  bool simd_available = false;          ///< gradcomp::execution::simd_available of the unit
  bool avx2 = false, fma = false;       ///< __AVX2__ / __FMA__ when the unit was compiled
  std::vector<std::string> failures;    ///< checks that failed inside the unit
  /// Serialized payloads of 3 encode steps: two_bit seq, two_bit simd, qsgd seq, qsgd simd.
  std::vector<std::vector<std::byte>> two_bit_seq, two_bit_simd, qsgd_seq, qsgd_simd;
  /// Bucket norms of every qsgd payload (seq steps, then simd steps).
  std::vector<std::vector<float>> qsgd_norms;
  /// Serialized sum of two dense payloads, seq and simd.
  std::vector<std::byte> dense_seq, dense_simd;
  /// Results that must be bit-identical across the units (name, serialized
  /// payload or raw bytes): sparse codecs, payload round trips, the dense
  /// ring over inproc, a parameter-server frame.
  std::vector<std::pair<std::string, std::vector<std::byte>>> exact;
  /// Results compared across the units within a relative tolerance (name,
  /// values): GradiVeQ and the LGC autoencoder (Eigen reduces in another
  /// order under AVX2/FMA), sa_momentum.
  std::vector<std::pair<std::string, std::vector<float>>> approx;
  /// Addresses of the unit's copies of the kernels (name, address).
  std::vector<std::pair<std::string, const void*>> functions;
};

/// The unit built with -mavx2 -mfma and xsimd.
unit_report run_isa_unit();
/// The unit built with neither.
unit_report run_baseline_unit();

}  // namespace abi_test
