#pragma once
/// \file transport/mpi_wait.hpp
/// What mpi_transport's waits are made of: the SMPI detection macros, the
/// deadline clock (MPI_Wtime), MPI error strings, and the polling back-off
/// that honours a deadline without spinning a core. Part of
/// <gradcomp/transport/mpi.hpp> (component gradcomp::mpi).

#include <mpi.h>

#include <chrono>
#include <ratio>
#include <string>
#include <thread>

#include <gradcomp/errors.hpp>

#if !defined(GRADCOMP_MPI_SIMULATED)
#if defined(SMPI_H)
#define GRADCOMP_MPI_SIMULATED 1
#else
#define GRADCOMP_MPI_SIMULATED 0
#endif
#endif
#if !defined(GRADCOMP_MPI_MATCHED_PROBE)
#define GRADCOMP_MPI_MATCHED_PROBE (!GRADCOMP_MPI_SIMULATED)
#endif

namespace gradcomp::transport {

/// True when built against SimGrid's SMPI (simulated time, blocking waits).
inline constexpr bool mpi_simulated = GRADCOMP_MPI_SIMULATED != 0;

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// The clock of every deadline: MPI_Wtime, which is simulated time under SMPI
/// (a simulated collective may take minutes of real time) and a monotonic
/// wall clock otherwise.
struct mpi_wtime_clock {
  using rep = double;
  using period = std::ratio<1>;
  using duration = std::chrono::duration<double>;
  using time_point = std::chrono::time_point<mpi_wtime_clock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept { return time_point(duration(MPI_Wtime())); }
};

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

/// Throws transport_error naming the call and MPI's own error string.
inline void mpi_check(int code, const char* call) {
  if (code != MPI_SUCCESS) throw transport_error(std::string("gradcomp mpi: ") + call + " failed: " + mpi_error_string(code));
}

/// Back-off for polling loops that honour a deadline without spinning a
/// core: for the first `spin` of a wait it polls back to back, yielding
/// between polls (a message that is nearly there costs no sleep, and the
/// MPI progress engine advances only while someone polls), then it sleeps
/// between polls, 2 us doubling up to 64 us (plus the kernel's timer slack,
/// about 50 us on Linux), so a rank waiting long for a straggler uses a few
/// per cent of a core and notices its deadline within about 0.1 ms. Under
/// SMPI it never pauses: simulated time advances with each MPI_Test.
class poll_backoff {
 public:
  /// Time of back-to-back polling before the first sleep.
  static constexpr std::chrono::microseconds spin{50};
  /// Longest sleep between two polls.
  static constexpr std::chrono::microseconds max_sleep{64};

  /// `may_sleep` false: yield between polls, never sleep (for MPI's
  /// non-blocking collectives, which advance only while they are polled).
  explicit poll_backoff(bool may_sleep = true) noexcept : may_sleep_(may_sleep) {}

  void pause() {
    if constexpr (mpi_simulated) return;
    if (!may_sleep_) {
      std::this_thread::yield();
      return;
    }  // simulated time advances with each MPI_Test; a real pause only wastes real time
    const auto now = std::chrono::steady_clock::now();
    if (!started_) {
      started_ = true;
      first_ = now;
    }
    if (now - first_ < spin) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    if (sleep_ < max_sleep) sleep_ *= 2;
  }
  /// The next sleep's length (tests).
  std::chrono::microseconds next_sleep() const noexcept { return sleep_; }

 private:
  bool may_sleep_ = true;
  bool started_ = false;
  std::chrono::steady_clock::time_point first_{};
  std::chrono::microseconds sleep_{2};
};

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

}  // namespace gradcomp::transport
