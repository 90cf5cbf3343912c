// GradiVeQ under execution::thrust_cuda (cuBLAS products), part of the CUDA
// check program (see test_cuda_thrust.cu). gradiveq.hpp pulls in Eigen, whose
// headers draw nvcc diagnostics of their own; CMakeLists.txt silences those
// for this file only, so the Thrust kernels' own file stays warning-checked.
#include <gradcomp/gradiveq.hpp>

#include "cuda_check.hpp"

using namespace gradcomp;
namespace ex = gradcomp::execution;

// Every member, hence both products, compiled for thrust_cuda.
template class gradcomp::linear_compressor<ex::thrust_cuda>;

void cuda_check::compare_gradiveq() {
  const std::size_t m = 64 * 500 + 7;
  gradiveq_options o;
  o.slice_size = 64;
  linear_compressor<ex::seq> a(m, o);
  linear_compressor<ex::thrust_cuda> b(m, o);
  for (std::uint64_t s = 0; s < 4; ++s) {
    const auto g = normal_floats(m, 300 + s);
    a.add_sample(g);
    b.add_sample(g);
  }
  a.fit();
  b.fit();
  const auto g = normal_floats(m, 999);
  gradiveq_payload pa, pb;
  a.encode(g, pa);
  b.encode(g, pb);
  float worst = 0.0f, scale = 0.0f;
  for (std::size_t i = 0; i < pa.coefficients.size() && i < pb.coefficients.size(); ++i) {
    worst = std::fmax(worst, std::fabs(pa.coefficients[i] - pb.coefficients[i]));
    scale = std::fmax(scale, std::fabs(pa.coefficients[i]));
  }
  std::vector<float> da(m), db(m);
  a.decode(pa, da);
  b.decode(pa, db);
  float worst_d = 0.0f, scale_d = 0.0f;
  for (std::size_t i = 0; i < m; ++i) {
    worst_d = std::fmax(worst_d, std::fabs(da[i] - db[i]));
    scale_d = std::fmax(scale_d, std::fabs(da[i]));
  }
  std::printf("gradiveq: max coefficient difference %g (of %g), max decode difference %g (of %g)\n", worst, scale,
              worst_d, scale_d);
  expect(pa.coefficients.size() == pb.coefficients.size() && worst <= 1e-5f * scale, "gradiveq encode");
  expect(worst_d <= 1e-5f * scale_d, "gradiveq decode");
}
