#pragma once
// Shared by the LGC autoencoder tests (tests/unit/test_autoencoder*.cpp).

#include <gradcomp/autoencoder.hpp>

namespace gradcomp::test_support {

/// A small architecture for the tests: two stride-2 layers (window / 4),
/// 2 code channels: a window of 32 values becomes 16 code floats.
inline lgc_architecture small_arch() {
  lgc_architecture a;
  a.encoder_channels = {8, 16};
  a.code_channels = 2;
  a.decoder_channels = {4, 16, 8};
  return a;
}

}  // namespace gradcomp::test_support
