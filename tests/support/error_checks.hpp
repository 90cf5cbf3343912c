#pragma once
// Checks of the library's typed errors, shared by the unit tests.

#include <gradcomp/errors.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <limits>
#include <string>

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

/// Restores `state` into `x`, which must throw option_mismatch_error whose
/// message names the option; returns that option (the caller checks which),
/// or fails the test and returns "" if restore_state accepts the state.
template <class Restorable, class State>
std::string mismatched_option_of(Restorable& x, const State& state) {
  try {
    x.restore_state(state);
  } catch (const gradcomp::option_mismatch_error& e) {
    CHECK(std::string(e.what()).find(e.option()) != std::string::npos);
    return e.option();
  }
  FAIL("restore_state accepted a state saved with other options");
  return std::string();
}

/// Checks that restoring `state` into `x` throws option_mismatch_error for
/// `option`, named by both option() and the message.
template <class Restorable, class State>
void check_restore_names_option(Restorable& x, const State& state, const std::string& option) {
  try {
    x.restore_state(state);
    FAIL("restore accepted a state saved with another " << option);
  } catch (const gradcomp::option_mismatch_error& e) {
    CHECK(e.option() == option);
    CHECK(std::string(e.what()).find(option) != std::string::npos);
  }
}

}  // namespace gradcomp::test_support
