#pragma once
/// \file gradiveq/saved_options.hpp
/// The option block at the head of a GradiVeQ saved state (linear_compressor
/// and gradiveq_schedule): written field by field, and on restore compared
/// field by field, so a state saved with other options is refused with an
/// option_mismatch_error naming the first option that differs.
/// Part of <gradcomp/gradiveq.hpp>.

#include <algorithm>
#include <cstddef>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp::detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Writes the option block: `for_each_option(visit)` calls visit(name, value)
/// for every option, in the block's order, with a wire scalar `value`.
template <class ForEachOption>
void write_saved_options(wire::writer& w, ForEachOption&& for_each_option) {
  for_each_option([&](const char*, auto value) { w.put<decltype(value)>(value); });
}

/// Reads the option block of a saved state and compares each field byte for
/// byte with this object's value (as write_saved_options writes it): the
/// first that differs throws option_mismatch_error(`where`, its name);
/// nothing is changed. A block cut short is a wire::wire_error (truncated).
template <class ForEachOption>
void expect_saved_options(wire::reader& r, ForEachOption&& for_each_option, const char* where) {
  std::vector<std::byte> mine;
  mine.reserve(64);  // one scalar at a time; also avoids a GCC 12 -Wstringop-overflow false positive
  for_each_option([&](const char* name, auto value) {
    mine.clear();
    wire::writer w(mine);
    w.put<decltype(value)>(value);
    const auto theirs = r.get_bytes(mine.size());
    if (!std::equal(mine.begin(), mine.end(), theirs.begin())) throw option_mismatch_error(where, name);
  });
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::detail
