#pragma once
/// \file model_exchange.hpp
/// The whole-model exchange (docs/exchange.md): one call per step with every
/// layer's gradient, the codecs' lifecycles inside (GradiVeQ's warm-up /
/// L_t / fit / L_c schedule with the eq. 7 vote, residuals of two-bit and
/// top-k, QSGD's streams), small layers fused into buckets, failures agreed
/// by every rank in the step's first collective, checkpoints and statistics.
///
///  - exchange/contract.hpp     the bucket contract: rounds, summable buffers, flags (BucketCodec)
///  - exchange/model.hpp        model description, plan rules, buckets
///  - exchange/bucket_codecs.hpp, exchange/gradiveq_bucket.hpp   the library's codecs as bucket codecs
///  - exchange/powersgd_bucket.hpp PowerSGD's two rounds (P, then Q) of a bucket
///  - exchange/bucket_layer.hpp the transport-free layer a framework drives with its own collectives
///  - exchange/collectives.hpp, exchange/model_exchange.hpp   the exchange over gradcomp's transports
///  - exchange/schedule_collectives.hpp, exchange/auto_collectives.hpp   sum rounds on other all-reduce
///    schedules (schedules.hpp), fixed or chosen by the cost model

#include <gradcomp/exchange/auto_collectives.hpp>
#include <gradcomp/exchange/bucket_codecs.hpp>
#include <gradcomp/exchange/bucket_layer.hpp>
#include <gradcomp/exchange/collectives.hpp>
#include <gradcomp/exchange/contract.hpp>
#include <gradcomp/exchange/gradiveq_bucket.hpp>
#include <gradcomp/exchange/model.hpp>
#include <gradcomp/exchange/model_exchange.hpp>
#include <gradcomp/exchange/powersgd_bucket.hpp>
#include <gradcomp/exchange/schedule_collectives.hpp>
