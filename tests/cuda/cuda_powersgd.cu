// PowerSGD under execution::thrust_cuda (cuBLAS products), part of the CUDA
// check program (see test_cuda_thrust.cu): three steps of one layer on the
// GPU next to the same steps with execution::seq (the generic loops).
#include <gradcomp/powersgd.hpp>

#include "cuda_check.hpp"

using namespace gradcomp;
namespace ex = gradcomp::execution;

// Every member, hence every product, compiled for thrust_cuda.
template class gradcomp::powersgd_compressor<ex::thrust_cuda>;

void cuda_check::compare_powersgd() {
  const std::size_t rows = 64, cols = 576;
  powersgd_options o;
  o.rank = 4;
  o.seed = 3;
  powersgd_compressor<ex::seq> a(rows, cols, o);
  powersgd_compressor<ex::thrust_cuda> b(rows, cols, o);
  std::vector<float> pa(a.p_length()), pb(b.p_length()), qa(a.q_length()), qb(b.q_length());
  std::vector<float> oa(rows * cols), ob(rows * cols);
  float worst = 0.0f, scale = 0.0f;
  for (std::uint64_t s = 0; s < 3; ++s) {
    const auto g = normal_floats(rows * cols, 500 + s);
    a.encode_p(g, pa);
    b.encode_p(g, pb);
    a.encode_q(pa, qa);
    b.encode_q(pa, qb);  // the same summed P on both sides, as every rank gets
    a.decode(qa, oa);
    b.decode(qa, ob);
    for (std::size_t i = 0; i < oa.size(); ++i) {
      worst = std::fmax(worst, std::fabs(oa[i] - ob[i]));
      scale = std::fmax(scale, std::fabs(oa[i]));
    }
  }
  float worst_e = 0.0f;
  for (std::size_t i = 0; i < rows * cols; ++i) worst_e = std::fmax(worst_e, std::fabs(a.residual()[i] - b.residual()[i]));
  std::printf("powersgd: max output difference %g (of %g), max residual difference %g\n", worst, scale, worst_e);
  expect(worst <= 1e-4f * scale, "powersgd output");
  expect(worst_e <= 1e-4f * scale, "powersgd residual");
}
