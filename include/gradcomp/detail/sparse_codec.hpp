#pragma once
/// \file detail/sparse_codec.hpp
/// Internals shared by the two top-R% codecs, sparsifier_with_memory
/// (sparsify.hpp) and sa_momentum (samomentum.hpp): their parameter checks
/// and the framing of their saved states, which share codec_id::sparse_coo
/// and are told apart by a kind byte.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp::detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

inline void check_sparse_ratio(double ratio_percent, const char* who) {
  if (!(ratio_percent > 0.0 && ratio_percent <= 100.0))
    throw invalid_argument_error(std::string(who) + ": ratio R must be in (0, 100] percent, got " +
                                 std::to_string(ratio_percent));
}
inline void check_sparse_momentum(float m, const char* who) {
  if (!(m > 0.0f && m < 1.0f))
    throw invalid_argument_error(std::string(who) + ": momentum m must be in (0, 1), got " + std::to_string(m));
}
inline void check_sparse_positive(float v, const char* what, const char* who) {
  if (!(v > 0.0f && v <= std::numeric_limits<float>::max()))
    throw invalid_argument_error(std::string(who) + ": " + what + " must be finite and > 0, got " +
                                 std::to_string(v));
}

/// Kinds of saved state under codec_id::sparse_coo.
enum class sparse_state_kind : std::uint8_t { sparsifier = 1, sa_momentum = 2 };

/// A saved state of a layer of n elements: the kind byte, then what `write`
/// appends.
template <class WriteBody>
std::vector<std::byte> save_sparse_state(std::size_t n, sparse_state_kind kind, WriteBody&& write) {
  return wire::serialize_state(wire::codec_id::sparse_coo, n, [&](wire::writer& w) {
    w.put<std::uint8_t>(static_cast<std::uint8_t>(kind));
    write(w);
  });
}

/// Opens a saved state for restore: checks the container, the layer size n
/// (size_mismatch_error) and the kind byte (state_error), and returns a reader
/// over the rest of the body. `who` names the restoring function.
inline wire::reader open_sparse_state(std::span<const std::byte> bytes, std::size_t n, sparse_state_kind kind,
                                      const char* who) {
  wire::header h;
  wire::reader r = wire::parse_state(bytes, wire::codec_id::sparse_coo, &h);
  if (h.element_count != n) throw size_mismatch_error(who, n, static_cast<std::size_t>(h.element_count));
  if (r.get<std::uint8_t>() != static_cast<std::uint8_t>(kind))
    throw state_error(std::string(who) + ": the state belongs to another sparse codec");
  return r;
}

/// Runs `validate` on options read from a saved state: a value out of its
/// domain there is malformed bytes (wire_error), not a bad argument.
template <class Validate>
void validate_saved_options(Validate&& validate) {
  try {
    validate();
  } catch (const invalid_argument_error& e) {
    wire::reader::fail(wire::wire_errc::malformed_body, e.what());
  }
}

/// Reads n floats of a saved state, rejecting non-finite ones.
inline std::vector<float> read_finite_floats(wire::reader& r, std::uint64_t n, const char* what) {
  std::vector<float> v = r.get_vector<float>(n);
  for (float x : v)
    if (!std::isfinite(x))
      wire::reader::fail(wire::wire_errc::malformed_body, std::string("saved ") + what + " holds a non-finite value");
  return v;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::detail
