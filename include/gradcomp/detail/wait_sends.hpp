#pragma once
/// \file detail/wait_sends.hpp
/// How every driver waits for a batch of its sends: in one call where the
/// transport can wait for many handles at once (BatchWaitTransport, such as
/// mpi_transport: one MPI_Waitall instead of one MPI call per message, which
/// also matters under SMPI, where each call lets every other simulated rank
/// run), else one wait() per handle.

#include <span>

#include <gradcomp/abi.hpp>
#include <gradcomp/concepts.hpp>

namespace gradcomp::detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// Waits for every send of `sends`; their buffers may then be reused and the
/// handles are done (a handle's wait() returns at once). Errors as each
/// handle's wait(): a deadline still holds, since wait_all waits one handle at
/// a time when any handle has one.
template <class T, class Handle>
void wait_sends(std::span<Handle> sends) {
  if constexpr (BatchWaitTransport<T> && requires { T::wait_all(sends); })
    T::wait_all(sends);
  else
    for (auto& h : sends) h.wait();
}

GRADCOMP_ABI_NAMESPACE_END
}  // namespace gradcomp::detail
