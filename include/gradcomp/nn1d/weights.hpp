#pragma once
/// \file nn1d/weights.hpp
/// nn1d weights in the wire container: `write_weights` / `read_weights`
/// (a body), `save_weights` / `load_weights` (a whole message), `all_finite`.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <gradcomp/nn1d/detail/warnings_push.hpp>  // GCC bug 105593, see there

#include <gradcomp/errors.hpp>
#include <gradcomp/nn1d/sequential.hpp>
#include <gradcomp/nn1d/tensor.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp::nn1d {
GRADCOMP_ABI_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------
// Weights in the wire container.

/// Version of the weights body written by write_weights (independent of the container version).
inline constexpr std::uint16_t weights_format_version = 1;

namespace detail {
enum : std::uint8_t { kind_conv = 1, kind_conv_transpose = 2, kind_leaky_relu = 3 };

template <class T>
std::string describe(const layer<T>& l) {
  return std::visit(
      [](const auto& x) -> std::string {
        using L = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<L, conv1d<T>>)
          return "conv1d(" + std::to_string(x.in_channels()) + "->" + std::to_string(x.out_channels()) + ", k" +
                 std::to_string(x.kernel()) + ", s" + std::to_string(x.stride()) + ", p" + std::to_string(x.padding()) + ")";
        else if constexpr (std::is_same_v<L, conv_transpose1d<T>>)
          return "conv_transpose1d(" + std::to_string(x.in_channels()) + "->" + std::to_string(x.out_channels()) +
                 ", k" + std::to_string(x.kernel()) + ", s" + std::to_string(x.stride()) + ", p" +
                 std::to_string(x.padding()) + ", op" + std::to_string(x.output_padding()) + ")";
        else
          return "leaky_relu(" + std::to_string(double(x.slope())) + ")";
      },
      l);
}
}  // namespace detail

/// Appends a network's structure and weights (float32) to a wire body.
/// Layout: u16 format version, varint layer count, per layer a kind byte and
/// its hyper-parameters (varints; the leaky slope as float64), then varint
/// parameter count and the float32 parameters in `parameters()` order.
template <class T>
void write_weights(wire::writer& w, sequential<T>& net) {
  w.put<std::uint16_t>(weights_format_version);
  w.put_varint(net.size());
  for (const auto& ly : net.layers()) {
    std::visit(
        [&](const auto& x) {
          using L = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<L, conv1d<T>>) {
            w.put<std::uint8_t>(detail::kind_conv);
            for (index_type v : {x.in_channels(), x.out_channels(), x.kernel(), x.stride(), x.padding()})
              w.put_varint(std::uint64_t(v));
          } else if constexpr (std::is_same_v<L, conv_transpose1d<T>>) {
            w.put<std::uint8_t>(detail::kind_conv_transpose);
            for (index_type v : {x.in_channels(), x.out_channels(), x.kernel(), x.stride(), x.padding(), x.output_padding()})
              w.put_varint(std::uint64_t(v));
          } else {
            w.put<std::uint8_t>(detail::kind_leaky_relu);
            w.put<double>(double(x.slope()));
          }
        },
        ly);
  }
  const auto params = net.parameters();
  std::size_t count = 0;
  for (const auto& p : params) count += p.value.size();
  w.put_varint(count);
  std::vector<float> buf;
  for (const auto& p : params) {
    buf.assign(p.value.begin(), p.value.end());
    w.put_array<float>(buf);
  }
}

/// Reads weights written by write_weights into `net`, whose structure must be
/// identical. Throws wire_error (unsupported_version for another format
/// version, malformed_body / truncated for broken bytes or non-finite weights)
/// or invalid_argument_error (another shape, naming the first differing
/// layer). `net` is only modified once everything has been validated.
template <class T>
void read_weights(wire::reader& r, sequential<T>& net) {
  const auto version = r.get<std::uint16_t>();
  if (version != weights_format_version)
    wire::reader::fail(wire::wire_errc::unsupported_version,
                       "nn1d weights format version " + std::to_string(version) + ", this build reads " +
                           std::to_string(weights_format_version));
  const std::uint64_t layers = r.get_varint();
  if (layers != net.size())
    throw invalid_argument_error("nn1d::read_weights: the weights describe " + std::to_string(layers) +
                                 " layers, this network has " + std::to_string(net.size()));
  for (std::size_t i = 0; i < net.size(); ++i) {
    const auto kind = r.get<std::uint8_t>();
    const auto& ly = net.layers()[i];
    bool same = false;
    std::string theirs;
    auto read_n = [&](int n) {
      std::vector<std::uint64_t> v;
      for (int j = 0; j < n; ++j) v.push_back(r.get_varint());
      return v;
    };
    if (kind == detail::kind_conv) {
      const auto v = read_n(5);
      theirs = "conv1d(" + std::to_string(v[0]) + "->" + std::to_string(v[1]) + ", k" + std::to_string(v[2]) + ", s" +
               std::to_string(v[3]) + ", p" + std::to_string(v[4]) + ")";
      if (auto* x = std::get_if<conv1d<T>>(&ly))
        same = v == std::vector<std::uint64_t>{std::uint64_t(x->in_channels()), std::uint64_t(x->out_channels()),
                                               std::uint64_t(x->kernel()), std::uint64_t(x->stride()),
                                               std::uint64_t(x->padding())};
    } else if (kind == detail::kind_conv_transpose) {
      const auto v = read_n(6);
      theirs = "conv_transpose1d(" + std::to_string(v[0]) + "->" + std::to_string(v[1]) + ", k" +
               std::to_string(v[2]) + ", s" + std::to_string(v[3]) + ", p" + std::to_string(v[4]) + ", op" +
               std::to_string(v[5]) + ")";
      if (auto* x = std::get_if<conv_transpose1d<T>>(&ly))
        same = v == std::vector<std::uint64_t>{std::uint64_t(x->in_channels()), std::uint64_t(x->out_channels()),
                                               std::uint64_t(x->kernel()), std::uint64_t(x->stride()),
                                               std::uint64_t(x->padding()), std::uint64_t(x->output_padding())};
    } else if (kind == detail::kind_leaky_relu) {
      const double slope = r.get<double>();
      theirs = "leaky_relu(" + std::to_string(slope) + ")";
      if (auto* x = std::get_if<leaky_relu<T>>(&ly)) same = double(x->slope()) == double(T(slope));
    } else {
      wire::reader::fail(wire::wire_errc::malformed_body, "nn1d weights: unknown layer kind " + std::to_string(kind));
    }
    if (!same)
      throw invalid_argument_error("nn1d::read_weights: layer " + std::to_string(i) + " is " + theirs +
                                   " in the weights, " + detail::describe<T>(ly) + " in this network");
  }
  const std::uint64_t count = r.get_varint();
  const auto params = net.parameters();
  std::size_t expected = 0;
  for (const auto& p : params) expected += p.value.size();
  if (count != expected)
    wire::reader::fail(wire::wire_errc::malformed_body, "nn1d weights: " + std::to_string(count) +
                                                            " parameters for a structure of " + std::to_string(expected));
  const std::vector<float> values = r.get_vector<float>(count);
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      wire::reader::fail(wire::wire_errc::malformed_body, "nn1d weights: non-finite parameter " + std::to_string(i));
  std::size_t at = 0;
  for (const auto& p : params)
    for (auto& v : p.value) v = static_cast<T>(values[at++]);
}

/// A network's weights as a self-contained message (wire container, codec
/// autoencoder, state flag; element_count = parameter count).
template <class T>
[[nodiscard]] std::vector<std::byte> save_weights(sequential<T>& net) {
  return wire::serialize_state(wire::codec_id::autoencoder, net.parameter_count(),
                               [&](wire::writer& w) { write_weights(w, net); });
}

/// Loads a message written by save_weights; see read_weights for the errors.
template <class T>
void load_weights(sequential<T>& net, std::span<const std::byte> bytes) {
  wire::header h;
  wire::reader r = wire::parse_state(bytes, wire::codec_id::autoencoder, &h);
  sequential<T> copy = net;  // read into a copy: the network stays untouched on error
  read_weights(r, copy);
  r.expect_end();
  if (h.element_count != copy.parameter_count())
    wire::reader::fail(wire::wire_errc::malformed_body, "nn1d weights: header element count disagrees with the body");
  net = std::move(copy);
}

/// True when every parameter of `net` is finite.
template <class T>
[[nodiscard]] bool all_finite(sequential<T>& net) {
  for (const auto& p : net.parameters())
    for (T v : p.value)
      if (!std::isfinite(double(v))) return false;
  return true;
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::nn1d

#include <gradcomp/nn1d/detail/warnings_pop.hpp>
