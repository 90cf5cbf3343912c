#pragma once
/// \file nn1d.hpp
/// A small, dependency-light 1-D convolutional network on Eigen: the layers,
/// losses and optimisers the LGC autoencoder (autoencoder.hpp, seed 004
/// Sections IV-V) is built from, with forward and backward passes.
///
///     nn1d::sequential<float> net;
///     net.add(nn1d::conv1d<float>(1, 8, 3, 2, 1));    // in, out, kernel, stride, padding
///     net.add(nn1d::leaky_relu<float>(0.01f));
///     net.initialize(seed);                            // counter-based, deterministic
///     const auto& y = net.forward(x);                  // training pass, keeps what backward needs
///     net.zero_grad();
///     net.backward(dy, nullptr);                       // accumulates weight gradients
///     nn1d::sgd<float> opt(1e-3f);
///     opt.step(net.parameters());
///
/// Data layout. A batch of B signals of C channels and length L is one
/// column-major C x (B*L) matrix (`tensor`): sample b occupies columns
/// [b*L, (b+1)*L), so every position is a contiguous column of C values and
/// the whole batch goes through one GEMM per layer.
///
/// Convolutions are im2col + Eigen GEMM. The im2col matrix of a layer with
/// kernel K over C input channels has K*C rows; row k*C + c of column
/// (b, t) holds x(c, b*L + t*S + k - P) (zero outside the signal), so each
/// kernel tap copies one contiguous column. A conv1d weight is therefore the
/// C_out x (K*C_in) matrix whose column k*C_in + c is tap k of input channel
/// c; a conv_transpose1d weight is the (K*C_out) x C_in matrix, the adjoint
/// operator (PyTorch's ConvTranspose1d, weight [C_in, C_out, K], is the same
/// map up to this reordering).
///
/// Shapes (PyTorch's formulas):
///     conv1d            L_out = floor((L_in + 2P - K) / S) + 1
///     conv_transpose1d  L_out = (L_in - 1) S - 2P + K + output_padding
///
/// Everything is templated on the scalar (float for use, double for the
/// finite-difference checks). GEMMs are single-threaded Eigen (no OpenMP), so
/// results are deterministic for a given build and machine whatever the
/// caller's threads do.
///
/// Weights are saved in the wire container (wire::serialize_state with
/// codec_id::autoencoder, element type float32); `load_weights` rejects a
/// buffer of another format version (wire_error unsupported_version) or a
/// network of another shape (invalid_argument_error naming the first layer
/// that differs), and leaves the network untouched on any error.
///
/// The pieces, one per file under nn1d/: tensor.hpp (data types), conv.hpp
/// (conv1d, conv_transpose1d), activation.hpp (leaky_relu), sequential.hpp,
/// loss.hpp (mse_loss, similarity_loss), optimizer.hpp (sgd, adam),
/// weights.hpp (the weights message). This header brings them all.

#include <gradcomp/nn1d/tensor.hpp>  // first: Eigen is included under its diagnostic pragma

#include <gradcomp/nn1d/activation.hpp>
#include <gradcomp/nn1d/conv.hpp>
#include <gradcomp/nn1d/loss.hpp>
#include <gradcomp/nn1d/optimizer.hpp>
#include <gradcomp/nn1d/sequential.hpp>
#include <gradcomp/nn1d/weights.hpp>
