#pragma once
/// \file errors.hpp
/// The typed errors gradcomp throws. Every error derives from gradcomp::error,
/// so `catch (const gradcomp::error&)` catches everything the library raises.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

#include <gradcomp/abi.hpp>

namespace gradcomp {

/// Base of every exception the library throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A parameter outside its documented domain (threshold <= 0, R outside (0,100], ...).
class invalid_argument_error : public error {
 public:
  using error::error;
};

/// Two spans or payloads that must agree in length do not.
class size_mismatch_error : public error {
 public:
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  size_mismatch_error(const std::string& what, std::size_t expected, std::size_t actual)
      : error(what + ": expected " + std::to_string(expected) + " elements, got " + std::to_string(actual)),
        expected_(expected),
        actual_(actual) {}
  std::size_t expected() const noexcept { return expected_; }
  std::size_t actual() const noexcept { return actual_; }

 private:
  std::size_t expected_;
  std::size_t actual_;
};

/// A NaN or infinity in a gradient. Policy (docs/design.md): encoders reject
/// non-finite input before touching any state, naming the first bad index.
class non_finite_error : public error {
 public:
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  non_finite_error(const std::string& where, std::size_t index)
      : error(where + ": non-finite value (NaN or Inf) at index " + std::to_string(index)), index_(index) {}
  std::size_t index() const noexcept { return index_; }

 private:
  std::size_t index_;
};

/// An operation called in a state that does not allow it (encode before a basis exists, ...).
class state_error : public error {
 public:
  using error::error;
};

/// A saved state (or checkpoint) was made with another value of one of the
/// restoring object's options; `option()` names it. Nothing is restored.
class option_mismatch_error : public state_error {
 public:
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  option_mismatch_error(const std::string& where, std::string option)
      : state_error(where + ": the state was saved with another value of option '" + option + "'"),
        option_(std::move(option)) {}
  const std::string& option() const noexcept { return option_; }

 private:
  std::string option_;
};

/// Gradients, payloads or a checkpoint laid out for another model: other
/// layers, other lengths, another plan or world size.
class layout_error : public error {
 public:
  using error::error;
};

/// A transport failed: a peer is gone, a receive timed out, a message had an unexpected length.
class transport_error : public error {
 public:
  using error::error;
};

/// A blocking transport operation exceeded its deadline.
class timeout_error : public transport_error {
 public:
  using transport_error::transport_error;
};

}  // namespace gradcomp
