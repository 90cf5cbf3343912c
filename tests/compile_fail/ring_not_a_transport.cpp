// compile-fail: the ring all-reduce runs over a Transport (rank, size,
// isend, irecv); a type with a rank and a size but no way to send is not one.
// expect-error: ring_allreduce
// expect-error: Transport
// Twin (GRADCOMP_COMPILE_FAIL_TWIN): the same call over an inproc_endpoint compiles.
#include <gradcomp/ring_allreduce.hpp>
#include <gradcomp/transport/inproc.hpp>

#include <span>
#include <vector>

struct not_a_transport {
  int rank() const { return 0; }
  int size() const { return 1; }
};

#if defined(GRADCOMP_COMPILE_FAIL_TWIN)
void run(gradcomp::transport::inproc_endpoint& t, std::vector<float>& x) {
#else
void run(not_a_transport& t, std::vector<float>& x) {
#endif
  gradcomp::ring_allreduce(t, std::span<float>(x));
}
