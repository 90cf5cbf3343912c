#pragma once
// Running an all-reduce schedule (schedules.hpp) on N in-process ranks, for
// the schedule tests (tests/unit/test_allreduce_schedules.cpp,
// test_direct_schedule.cpp; test_schedule_max_chunks.cpp takes the face
// enum): each rank sums its copy of its input over the moving face of the
// in-process transport or its zero-copy face, and the test gets every rank's
// result and statistics.

#include <gradcomp/schedules.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <chrono>
#include <cstddef>
#include <vector>

namespace gradcomp::test_support {

/// Which face of the in-process transport a schedule runs over.
enum class inproc_face { moving, zero_copy };

/// Runs gradcomp::allreduce with options `o` on n ranks over copies of x
/// (rank r sums x[r]); returns each rank's result. `stats`, when given,
/// receives each rank's ring_stats. A rank's error propagates (run_workers).
inline std::vector<std::vector<float>> run_allreduce(int n, const std::vector<std::vector<float>>& x,
                                                     const schedule_options& o, inproc_face face = inproc_face::moving,
                                                     std::vector<ring_stats>* stats = nullptr) {
  std::vector<std::vector<float>> out = x;
  if (stats) stats->assign(std::size_t(n), {});
  transport::run_workers(
      n,
      [&](transport::inproc_endpoint& ep) {
        std::vector<float>& mine = out[std::size_t(ep.rank())];
        ring_stats s;
        if (face == inproc_face::zero_copy) {
          auto z = ep.zero_copy();
          s = allreduce(z, std::span<float>(mine), o);
        } else {
          s = allreduce(ep, std::span<float>(mine), o);
        }
        if (stats) (*stats)[std::size_t(ep.rank())] = s;
      },
      {.recv_timeout = std::chrono::seconds(60)});
  return out;
}

}  // namespace gradcomp::test_support
