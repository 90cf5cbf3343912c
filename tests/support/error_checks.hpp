#pragma once
// Checks of the library's typed errors, shared by the unit tests.

#include <gradcomp/errors.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <limits>

namespace gradcomp::test_support {

/// Runs `fn`, which must throw non_finite_error, and returns the index the
/// error names; fails the test (and returns SIZE_MAX) if `fn` returns.
/// Any other exception propagates and fails the test case.
template <class Fn>
std::size_t non_finite_index_of(Fn&& fn) {
  try {
    fn();
  } catch (const gradcomp::non_finite_error& e) {
    return e.index();
  }
  FAIL("expected non_finite_error");
  return std::numeric_limits<std::size_t>::max();
}

}  // namespace gradcomp::test_support
