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

#if defined(GRADCOMP_HAS_ZLIB)
// The weights message of a small LGC network (the fuzz corpus holds valid
// ones: fuzz/corpus/wire_parse/lgc_*). load() may reject (wire_error, or
// invalid_argument_error for another form, window or shape) and must leave
// the network as it was; what it accepts saves to bytes that load again to
// the same weights.
gradcomp::lgc_architecture fuzz_lgc_arch() {
  gradcomp::lgc_architecture a;
  a.encoder_channels = {8, 16};
  a.code_channels = 2;
  a.decoder_channels = {4, 16, 8};
  return a;
}

void load_lgc_weights(std::span<const std::byte> bytes) {
  static const gradcomp::lgc_network ring(gradcomp::lgc_form::ring, 1, 32, fuzz_lgc_arch(), 1);
  static const gradcomp::lgc_network ps(gradcomp::lgc_form::parameter_server, 2, 32, fuzz_lgc_arch(), 1);
  // What the networks save before any load (to check a rejected load changed nothing).
  static const std::vector<std::byte> saved[2][2] = {
      {gradcomp::lgc_network(ring).save(false), gradcomp::lgc_network(ring).save(true)},
      {gradcomp::lgc_network(ps).save(false), gradcomp::lgc_network(ps).save(true)}};
  const gradcomp::lgc_network* bases[2] = {&ring, &ps};
  for (int b = 0; b < 2; ++b)
    for (const bool encoder_only : {false, true}) {
      gradcomp::lgc_network net = *bases[b];
      try {
        net.load(bytes, encoder_only);
      } catch (const gradcomp::wire::wire_error&) {
        if (net.save(encoder_only) != saved[b][encoder_only]) std::abort();
        continue;
      } catch (const gradcomp::invalid_argument_error&) {
        if (net.save(encoder_only) != saved[b][encoder_only]) std::abort();
        continue;
      }
      const auto once = net.save(encoder_only);
      gradcomp::lgc_network again = *bases[b];
      again.load(once, encoder_only);
      if (again.save(encoder_only) != once) std::abort();
    }
}
#endif

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
#if defined(GRADCOMP_HAS_ZLIB)
  // The LGC payloads (code, index set) and the LGC weights message.
  gradcomp::for_each_lgc_payload_type([&]<class Payload>() { parse_and_check<Payload>(bytes); });
  load_lgc_weights(bytes);
#endif
  return 0;
}
