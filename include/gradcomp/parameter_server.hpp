#pragma once
/// \file parameter_server.hpp
/// Parameter-server drivers over any gradcomp::Transport: rank 0 is the
/// server, ranks 1..N are the workers (worker k is rank k+1).
///
///  - Asynchronous (seed 001, DGS, Algorithms 1-3): every worker pushes at its
///    own pace; the server serves pushes in arrival order (or, in the
///    deterministic mode, in a fixed schedule), applies theta <- theta - g
///    (eq. 1) and answers that worker alone with the model difference
///    G = theta - w_k (eq. 3), optionally sparsified again (secondary
///    compression, eq. 6a), or with the dense model (ps_downlink::dense, which
///    with a compressed uplink is MXNet's dist_async with two-bit compression).
///    The uplink is any Codec; the four rows of seed 001 Table 5 are
///    asgd_rule, gd_async_rule, dgc_async_rule and dgs_rule
///    (presets/parameter_server_rules.hpp, which names the codecs).
///  - Synchronous: every round each worker pushes one payload per layer of any
///    Codec; the server decodes, sums (or averages) in rank order and sends
///    the aggregate back to everyone, dense or re-encoded with a second codec
///    (MXNet dist_sync compresses only worker-to-server).
///
/// The transport-free state machines live in dgs_server.hpp (dgs_server_state,
/// sync_aggregate, ps_uplink); this header adds the messages, the driver
/// loops, failure handling, and async_ps_simulation, a single-threaded
/// deterministic run of the same code without a transport.
///
///     // with presets/parameter_server_rules.hpp (the drivers, the codecs and the Table 5 rules):
///     // server (rank 0)                       // worker k (rank k + 1)
///     async_ps_server<sa_momentum<>> server(   async_ps_worker<sa_momentum<>> w(layers, dgs_rule<>{.ratio_percent = 1});
///         layers, theta0, N, dgs_rule<>{});    w.join(transport, model);           // dense resync
///     server.serve(transport);                 for (...) { grad = ...(model);
///                                                          w.step(transport, grad, lr, model); }
///                                              w.leave(transport);
///
/// Messages (docs/drivers.md). Every message is one transport message, a
/// *frame*: a control message (wire codec_id::control, body below) followed by
/// `layers` wire messages, one per layer, each a complete wire message with
/// its own header and CRC. Worker-to-server frames use tag `tag_up`,
/// server-to-worker frames `tag_down`.
///
///     control body (32 bytes, little-endian)
///       u8  protocol   0x50 ('P')
///       u8  kind       ps_kind: join, push, leave, update, resync, reject, aggregate
///       u8  detail     reject: ps_reject_reason; aggregate: 1 if this worker's push was rejected; else 0
///       u8  reserved   0
///       u32 layers     layer messages that follow (0 for join, leave, reject)
///       u32 count      aggregate: contributing workers; else 0
///       u32 reserved   0
///       u64 sequence   the worker's request number; a reply echoes it
///       u64 timestamp  async: server time t of the model sent; sync: the round
///     header element_count: the model's element count when layers follow, else 0
///
/// Asynchronous downlink layers are `sparse_coo_payload`s whose values are the
/// server's model values at the sent indices (dgs_server.hpp explains why
/// values and not differences: it makes eq. 5 exact), or `dense_payload`s of the
/// whole layer when that is smaller; a resync is dense. Parsing never trusts
/// the bytes: frames are split with bounds checks, each layer is parsed with
/// wire::parse (CRC, layout, element count = the layer's size).
///
/// The pieces live in ps/: frames.hpp (control messages, frames, tags),
/// common.hpp (shared options, counters, decoders), async_server.hpp,
/// async_worker.hpp, simulation.hpp, sync_server.hpp, sync_worker.hpp. This
/// driver names no codec: it sees codecs through the concepts and the shared
/// payloads (dense, sparse COO) through payloads/.
///
/// Failures. A malformed, mis-shaped or non-finite push is rejected with a
/// typed error (wire::wire_error, size_mismatch_error, non_finite_error) and a
/// `reject` reply, and the server's state is unchanged. A worker whose reply
/// cannot be delivered (it died) is marked gone and the server carries on with
/// the others; a worker that comes back (join, or a push while marked gone)
/// receives a dense resync. A worker that times out waiting for its reply, or
/// receives a malformed one, rejoins (a dense resync) up to `max_rejoins` times.
/// The synchronous worker's exchange() throws ps_push_rejected_error (its
/// gradient unchanged) when the server left its push out, and layout_error
/// when the server's layers are not the model's.

#include <gradcomp/dgs_server.hpp>
#include <gradcomp/ps/async_server.hpp>
#include <gradcomp/ps/async_worker.hpp>
#include <gradcomp/ps/common.hpp>
#include <gradcomp/ps/frames.hpp>
#include <gradcomp/ps/simulation.hpp>
#include <gradcomp/ps/sync_server.hpp>
#include <gradcomp/ps/sync_worker.hpp>
