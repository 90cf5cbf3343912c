#pragma once
/// \file autoencoder.hpp
/// Learned Gradient Compression (LGC, Abrahamyan et al., seed 004): top-k
/// sparsification with DGC-style accumulation, followed by a 1-D
/// convolutional autoencoder trained online during the run.
///
/// This is the public codec header: it brings the codec pieces of lgc/
/// and nothing that sends messages. The protocol forms that run LGC over a
/// transport live in the third layer, protocols/lgc.hpp.
///
/// Pieces, from the inside out:
///  - lgc/architecture.hpp, lgc/network.hpp: `lgc_architecture`,
///    `basic_lgc_network<T>`: the encoder E_c of Table I and the decoder(s)
///    D_c of Table II (nn1d.hpp), with the losses of eqs. (5)-(7)
///    (parameter server) and (9)-(11) (ring).
///  - lgc/trainer.hpp: `basic_lgc_trainer<T>`: online training, one
///    transactional step per iteration (SGD lr 1e-3, batch 1 by default,
///    Section VI-A); a step whose loss, gradients or new weights are not
///    finite is rolled back.
///  - lgc/windows.hpp, lgc/deflate.hpp, lgc/payloads.hpp: what goes on the
///    wire (`lgc_code_payload`: codes; `lgc_index_payload`: the leader's
///    top-k index set, DEFLATE-compressed with zlib).
///  - lgc/codec.hpp: `autoencoder_codec<Policy>`: a Codec over the
///    concatenated top-k value vector (values -> code payload -> values).
///  - lgc/schedule.hpp: the three-phase schedule of Section V-B, the options
///    and layer layout of the protocol forms, byte accounting (`lgc_traffic`).
///
/// The forms themselves: protocols/lgc_ring.hpp (`lgc_ring_node<Policy>`,
/// Section IV-B, Algorithm 2) and protocols/lgc_ps.hpp (`lgc_ps_worker`,
/// `lgc_ps_server`, Section IV-A, Algorithm 1); protocols/lgc.hpp brings both.
///
/// docs/codecs.md ("LGC autoencoder") documents the shapes, the stride
/// choice, the windows, the payload layouts and the schedule.
///
/// Link zlib (CMake: gradcomp::lgc).

// nn1d.hpp first: its diagnostic pragma must be active when Eigen is first included.
#include <gradcomp/nn1d.hpp>

#include <gradcomp/lgc/architecture.hpp>
#include <gradcomp/lgc/codec.hpp>
#include <gradcomp/lgc/deflate.hpp>
#include <gradcomp/lgc/network.hpp>
#include <gradcomp/lgc/payloads.hpp>
#include <gradcomp/lgc/schedule.hpp>
#include <gradcomp/lgc/trainer.hpp>
#include <gradcomp/lgc/windows.hpp>
