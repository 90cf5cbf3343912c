#pragma once
/// \file ring_allreduce.hpp
/// Ring all-reduce over any gradcomp::Transport: reduce-scatter, then
/// all-gather, over N segments (GradiVeQ, seed 002, Algorithm 1 with the
/// compression and decompression steps skipped: "the original RAR is a
/// special case of Algorithm 1").
///
///     gradcomp::ring_allreduce(transport, std::span<float>(grad));             // sum
///     gradcomp::ring_allreduce(transport, grad, {.average = true});            // mean
///     gradcomp::ring_allreduce(gradcomp::execution::simd{}, transport, grad);  // kernel backend
///
/// Every rank calls it with the same length. Afterwards every rank holds the
/// element-wise sum (or mean) of all ranks' inputs, bit-identical on every
/// rank: segment j is summed once, in the fixed order
/// ((x_j + x_{j+1}) + x_{j+2}) + ... + x_{j-1} (ranks mod N) along the ring, and
/// the finished values are then copied to everyone.
///
/// Tags: one call uses tags `tag_base` (reduce-scatter) and `tag_base + 1`
/// (all-gather), messages to rank+1 and from rank-1 only. Collectives that
/// may overlap on one transport must use disjoint tag pairs; consecutive calls
/// with the same tags are fine (messages between a pair of ranks with one tag
/// stay in order). The default base, 32000, is the first of the ring's range
/// in the tag registry (tags.hpp, below MPI's guaranteed MPI_TAG_UB 32767);
/// every entry point checks a user's tag_base against the registry
/// (tags::check_tag_base; ring_options::tag_owner for a protocol running the
/// ring inside its own range).
///
/// Bytes on the wire: each rank sends 2(N-1) segments, about 2(N-1)/N of the
/// vector, as raw floats in native byte order (ranks are assumed homogeneous;
/// codec payloads use wire.hpp instead).
///
/// Copies: over a plain Transport that moves whole byte vectors (a decorator
/// such as emulated_link), received buffers are summed into and forwarded as they are, so a rank
/// copies only its first segment of each phase and the all-gather's segments
/// into `data` (the first send's buffer is the one the thread's previous
/// call received last: no allocation in a loop). Over a ZeroCopyTransport
/// (MPI) it sends from `data` and receives into `data` or four chunk-sized
/// scratch buffers: no copies at all; there every segment goes as messages
/// of at most 256 KiB (detail::ring_zero_copy_chunk), and each chunk is
/// added and forwarded while the next ones arrive (same sums, same bits).
/// Over inproc_endpoint (a ZeroCopyCapableTransport) it takes the wavefront
/// form of that path through ep.zero_copy() (detail::ring_allreduce_wavefront):
/// one copy per chunk and hop, straight between the ranks' memory.
///
/// Errors: a received segment whose byte length is not the expected one (the
/// ranks disagree on the length) throws transport_error naming both; transport
/// errors (a dead peer, a timeout) propagate. After an error `data` is
/// unspecified.
///
/// Compressed forms (ring/linear.hpp, ring/reencode.hpp, ring/allgather.hpp;
/// docs/drivers.md):
///
///     ring_allreduce_linear(t, codec, grad)        // LinearCodec: Algorithm 1 of seed 002
///     ring_allreduce_reencode(t, codecs, grad)     // any Codec: decode-add-re-encode at every hop
///     ring_allgather_decode(t, codec, grad)        // any Codec: all-gather payloads, decode and sum
///     ring_allreduce(t, codec, grad)               // linear form for a LinearCodec, else the all-gather
///     ring_allreduce_summable(t, cells, element)   // a summable buffer: 16-bit floats, packed int words
///
/// Each returns a ring_stats (bytes and messages sent, encode/decode/wait
/// times). Every rank ends with bit-identical values: every rank decodes the
/// same aggregated payloads (the same bytes) in the same order.
///
/// A driver: it includes no codec header and sees codecs through the
/// concepts (concepts.hpp). The pieces, one per file:
///
///     ring/schedule.hpp   ring_options, ring_schedule (segments and steps)
///     ring/dense.hpp      ring_allreduce of floats
///     ring/stats.hpp      ring_stats
///     ring/channel.hpp    what the compressed forms share (channel, parse, all-gather phase)
///     ring/chunks.hpp     chunks inside a hop of the linear ring (ring_options::chunk_elements)
///     ring/linear.hpp     ring_allreduce_linear (Algorithm 1), ring_segmentation
///     ring/reencode.hpp   ring_allreduce_reencode, make_ring_codecs
///     ring/allgather.hpp  ring_allgather_decode, ring_allreduce with a codec
///     ring/summable.hpp   ring_allreduce_summable (float16, bfloat16, int32_words buffers)

#include <gradcomp/ring/allgather.hpp>
#include <gradcomp/ring/channel.hpp>
#include <gradcomp/ring/chunks.hpp>
#include <gradcomp/ring/dense.hpp>
#include <gradcomp/ring/linear.hpp>
#include <gradcomp/ring/reencode.hpp>
#include <gradcomp/ring/schedule.hpp>
#include <gradcomp/ring/stats.hpp>
#include <gradcomp/ring/summable.hpp>
