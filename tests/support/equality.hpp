#pragma once
// Bitwise comparison of float vectors, shared by the unit and MPI tests.
// "Same bits" is what determinism promises: -0.0 != 0.0 and NaN == NaN of the
// same payload, unlike operator==.

#include <cstring>
#include <span>

namespace gradcomp::test_support {

/// True iff `a` and `b` have the same length and the same bytes.
inline bool bit_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

}  // namespace gradcomp::test_support
