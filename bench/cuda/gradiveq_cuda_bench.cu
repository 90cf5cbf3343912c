// GradiVeQ's products (eq. 2 encode, eq. 5 decode) under execution::seq and
// execution::thrust_cuda (cublasSgemm) for bench_thrust_cuda.
#include <cmath>

#include <gradcomp/detail/random.hpp>
#include <gradcomp/gradiveq.hpp>

#include "../common.hpp"
#include "gradiveq_cuda_bench.hpp"

using namespace gradcomp;
namespace ex = gradcomp::execution;

namespace {

float max_abs_difference(const std::vector<float>& a, const std::vector<float>& b, float& scale) {
  float worst = 0.0f;
  scale = 0.0f;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const float diff = std::fabs(a[i] - b[i]);
    if (!(diff <= worst)) worst = diff;  // a NaN on either side makes worst NaN: never "close"
    scale = std::fmax(scale, std::fabs(a[i]));
  }
  return a.size() == b.size() ? worst : INFINITY;
}

}  // namespace

gradcomp_bench::gradiveq_times gradcomp_bench::time_gradiveq(const std::vector<float>& g, int repeats) {
  const std::size_t m = g.size();
  gradiveq_options o;
  o.slice_size = 64;
  o.max_dimension = 8;
  linear_compressor<ex::seq> a(m, o);
  linear_compressor<ex::thrust_cuda> b(m, o);
  for (std::uint64_t s = 0; s < 4; ++s) {  // samples: g scaled and shifted by a little noise
    const auto stream = detail::counter_rng(50 + s).stream(0);
    std::vector<float> sample(g);
    for (std::size_t i = 0; i < m; ++i) sample[i] += 1e-4f * (stream.uniform_float(i) - 0.5f);
    a.add_sample(sample);
    b.add_sample(sample);
  }
  a.fit();
  b.fit();
  gradiveq_times t;
  gradiveq_payload pa, pb;
  t.seq_encode = gradcomp::bench::best_seconds(repeats, [&] { a.encode(g, pa); });
  t.cuda_encode = gradcomp::bench::best_seconds(repeats, [&] { b.encode(g, pb); });
  std::vector<float> da(m), db(m);
  t.seq_decode = gradcomp::bench::best_seconds(repeats, [&] { a.decode(pa, da); });
  t.cuda_decode = gradcomp::bench::best_seconds(repeats, [&] { b.decode(pa, db); });
  float scale_c = 0.0f, scale_d = 0.0f;
  const float worst_c = max_abs_difference(pa.coefficients, pb.coefficients, scale_c);
  const float worst_d = max_abs_difference(da, db, scale_d);
  t.close = worst_c <= 1e-5f * scale_c && worst_d <= 1e-5f * scale_d;
  return t;
}
