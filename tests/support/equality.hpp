#pragma once
// Bitwise comparison of float vectors, and the relative error the schedule
// tests bound, shared by the unit and MPI tests.
// "Same bits" is what determinism promises: -0.0 != 0.0 and NaN == NaN of the
// same payload, unlike operator==.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

namespace gradcomp::test_support {

/// True iff `a` and `b` have the same length and the same bytes.
inline bool bit_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

/// Max |got - want| / max(1, |want|) over got's elements (want at least as long).
inline double max_rel(std::span<const float> got, std::span<const float> want) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - double(want[i])) / std::max(1.0, std::abs(double(want[i]))));
  return worst;
}

}  // namespace gradcomp::test_support
