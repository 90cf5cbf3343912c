#pragma once
/// \file lgc/architecture.hpp
/// The shapes of the LGC autoencoder (seed 004, Tables I-II): the
/// hyper-parameters `lgc_architecture`, the two forms (`lgc_form`) and the
/// message kinds every LGC wire body starts with.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <gradcomp/errors.hpp>

namespace gradcomp {

/// Hyper-parameters of the LGC autoencoder (seed 004, Tables I-II).
///
/// Encoder: one conv1d(kernel, stride 2, padding kernel/2) + leaky ReLU per
/// entry of `encoder_channels` (Table I conv1-conv4: 64, 128, 256, 64), then a
/// pointwise conv1d to `code_channels` (conv5: 4 filters, 1x1, linear output).
///
/// Decoder: conv_transpose1d(code_channels -> decoder_channels[0], stride 1)
/// + leaky ReLU, then one conv_transpose1d(stride 2, padding kernel/2,
/// output padding 1) + leaky ReLU per further entry (Table II deconv1-deconv5:
/// 4, 32, 64, 128, 32), then a pointwise conv1d to one channel (linear). In
/// the parameter-server form the innovation component is concatenated as one
/// extra channel before that last conv (Section IV-C).
///
/// Stride choice. Table I has four stride-2 layers (length / 16) but Table II
/// five (length x 32), which cannot give back the input length. gradcomp
/// makes deconv1 stride 1: it keeps Table II's filter counts, its 4 filters
/// equal the code's 4 channels (a refinement of the code at its own
/// resolution), and the remaining four stride-2 layers mirror the encoder's
/// four. So decoder_channels.size() must be encoder_channels.size() + 1, and
/// a window of W values (a multiple of 2^depth) becomes
/// code_channels * W / 2^depth code floats: W / 4 with the defaults.
struct lgc_architecture {
  std::vector<std::size_t> encoder_channels = {64, 128, 256, 64};
  std::size_t code_channels = 4;
  std::vector<std::size_t> decoder_channels = {4, 32, 64, 128, 32};
  std::size_t kernel = 3;     ///< odd (padding kernel/2 keeps lengths exact)
  float leaky_slope = 0.01f;  ///< in [0, 1)

  /// The defaults above. A constructor template, as std::pair's, only so
  /// that it has a symbol per instruction set (abi.hpp): the implicit one
  /// is a weak symbol whose body (copying the initializer lists) the
  /// compiler vectorises differently under -mavx2 and without.
  template <class AbiMarker = execution::abi_marker>
  lgc_architecture() {}

  /// Number of stride-2 layers (each halves the length in the encoder).
  std::size_t depth() const noexcept { return encoder_channels.size(); }
  /// 2^depth: the factor between a window and its code positions.
  std::size_t reduction() const noexcept { return std::size_t{1} << depth(); }

  /// Throws invalid_argument_error unless the shapes are consistent.
  template <class AbiMarker = execution::abi_marker>  // a copy per instruction set (abi.hpp)
  void validate() const {
    if (encoder_channels.empty() || encoder_channels.size() > 16)
      throw invalid_argument_error("lgc_architecture: 1 to 16 stride-2 encoder layers required");
    if (decoder_channels.size() != encoder_channels.size() + 1)
      throw invalid_argument_error("lgc_architecture: the decoder needs one stride-1 layer plus one stride-2 layer per "
                                   "encoder layer (decoder_channels.size() == encoder_channels.size() + 1), got " +
                                   std::to_string(decoder_channels.size()) + " and " +
                                   std::to_string(encoder_channels.size()));
    for (auto c : encoder_channels)
      if (c == 0) throw invalid_argument_error("lgc_architecture: zero encoder channels");
    for (auto c : decoder_channels)
      if (c == 0) throw invalid_argument_error("lgc_architecture: zero decoder channels");
    if (code_channels == 0) throw invalid_argument_error("lgc_architecture: zero code channels");
    if (kernel == 0 || kernel % 2 == 0) throw invalid_argument_error("lgc_architecture: the kernel must be odd");
    if (!(leaky_slope >= 0.0f && leaky_slope < 1.0f))
      throw invalid_argument_error("lgc_architecture: leaky slope must be in [0, 1)");
  }
  bool operator==(const lgc_architecture&) const = default;
};

/// Which LGC instance a network belongs to.
enum class lgc_form : std::uint8_t {
  ring = 1,              ///< Section IV-B: one encoder, one decoder fed the average of codes
  parameter_server = 2,  ///< Section IV-A: one encoder, one decoder per worker with the innovation channel
};

/// Version of the network weights body (after the wire container header).
inline constexpr std::uint16_t lgc_weights_version = 1;

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN
inline constexpr std::uint8_t lgc_kind_index = 1;
inline constexpr std::uint8_t lgc_kind_code = 2;
inline constexpr std::uint8_t lgc_kind_weights = 3;
GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

}  // namespace gradcomp
