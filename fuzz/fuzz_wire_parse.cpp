// libFuzzer target: feed arbitrary bytes to every parser that reads from the
// network. A parser may reject (wire_error) but must never read out of
// bounds or over-allocate, and what it accepts must re-serialise to bytes
// that parse again to the same serialisation (encodings may be canonicalised,
// e.g. a sparse payload's index encoding, so the first re-serialisation may
// differ from the input).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include <gradcomp/gradcomp.hpp>

namespace {

// Tight limits so a hostile header cannot make a parser allocate gigabytes.
const gradcomp::wire::parse_limits limits{std::uint64_t{1} << 20, std::uint64_t{1} << 22};

template <class Payload>
void parse_and_check(std::span<const std::byte> bytes) {
  try {
    const Payload p = gradcomp::wire::parse<Payload>(bytes, limits);
    const auto once = gradcomp::wire::serialize(p);
    const auto twice = gradcomp::wire::serialize(gradcomp::wire::parse<Payload>(once, limits));
    if (once != twice) std::abort();
  } catch (const gradcomp::wire::wire_error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  try {
    (void)gradcomp::wire::parse_header(bytes, limits);
  } catch (const gradcomp::wire::wire_error&) {
  }
  // Every payload type the library defines. gradcomp::wire_payload_types is
  // the list gradcomp.hpp maintains, so new codecs are fuzzed automatically.
  gradcomp::for_each_payload_type([&]<class Payload>() { parse_and_check<Payload>(bytes); });
  return 0;
}
