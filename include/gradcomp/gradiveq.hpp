#pragma once
/// \file gradiveq.hpp
/// GradiVeQ (seed 002): the PCA linear compressor, its payload, the eq. 7
/// compression-loss monitor and the warm-up / sampling / compressed schedule.
///
/// A layer gradient of M elements (conv layers in the Fig. 3a order of
/// layout.hpp) is cut into S = floor(M / K) slices of K adjacent elements.
/// Every node computes the same basis U_d (K x d) and whitening vector mu
/// from the same L_t aggregated samples (PCA, eq. 6 picks d), then
///
///     compress    g'_m = U_d^T (g_m - mu / N)      eq. 3, all slices in one product
///     aggregate   g'   = sum_n g'_n                eq. 4, in the compressed domain
///     decompress  g^_m = U_d g'_m + mu             eq. 5
///
/// which makes the codec linear (a LinearCodec). See docs/codecs.md for the
/// payload layout, the options beyond the paper and how a ring driver cuts a
/// layer into segments (Algorithm 1).
///
/// The pieces, one per file (each may be included on its own):
///
///     gradiveq/payload.hpp            gradiveq_payload, fingerprint_mismatch_error, local_loss_value
///     gradiveq/pca.hpp                the PCA (Eigen) and eq. 6 (select_dimension)
///     gradiveq/basis.hpp              gradiveq_options and the bases of the slice groups
///     gradiveq/linear_compressor.hpp  linear_compressor, the codec (a LinearCodec)
///     gradiveq/schedule.hpp           gradiveq_schedule (Sec. 3, Fig. 6) and the eq. 7 vote

#include <gradcomp/gradiveq/basis.hpp>
#include <gradcomp/gradiveq/linear_compressor.hpp>
#include <gradcomp/gradiveq/payload.hpp>
#include <gradcomp/gradiveq/pca.hpp>
#include <gradcomp/gradiveq/schedule.hpp>
