// The README's quickstart, compiled and run by every consumer test
// (tests/consumer/): encode a gradient, put it on the wire, parse the bytes
// back (validated), decode, and show that a corrupted buffer is rejected.
#include <gradcomp/gradcomp.hpp>

#include <cstddef>
#include <cstdio>
#include <vector>

int main() {
  using namespace gradcomp;
  std::vector<float> gradient = {0.5f, -1.25f, 3.0f, 0.0f, 2.5f};

  dense_codec<> codec;  // one codec instance per tensor (layer)
  dense_payload payload;
  codec.encode(gradient, payload);

  std::vector<std::byte> bytes = wire::serialize(payload);        // header + body, CRC-32C
  dense_payload received = wire::parse<dense_payload>(bytes);      // bounds-checked, validated
  std::vector<float> decoded(gradient.size());
  codec.decode(received, decoded);
  std::printf("%zu floats -> %zu bytes on the wire, round trip %s\n", gradient.size(),
              codec.encoded_bytes(payload), decoded == gradient ? "exact" : "WRONG");

  bytes[wire::header_size] ^= std::byte{0x01};  // flip one bit of the body
  try {
    (void)wire::parse<dense_payload>(bytes);
    std::puts("corrupted buffer accepted: WRONG");
    return 1;
  } catch (const wire::wire_error& e) {
    std::printf("corrupted buffer rejected: %s\n", e.what());
    if (e.code() != wire::wire_errc::checksum_mismatch) return 1;
  }
  return decoded == gradient && bytes.size() == codec.encoded_bytes(payload) ? 0 : 1;
}
