// GradiVeQ linear compressor (seed 002): encode/decode throughput against the
// Eigen GEMM rate of the same shapes measured in the same run, the PCA refresh
// time (K x K covariance eigensolve vs the L_t x L_t Gram route), and the
// beyond-the-paper options against the paper's recipe on synthetic gradients.
//
// Eigen uses 2 threads when the bench is built with OpenMP (OMP_NUM_THREADS
// overrides), 1 otherwise.
#include "common.hpp"

#include <gradcomp/gradiveq.hpp>

#include <Eigen/Core>
#include <Eigen/Eigenvalues>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

using namespace gradcomp;
using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

// Counter-based standard normal for (seed, index): reproducible at any thread count.
float normal(std::uint64_t seed, std::uint64_t i) {
  const double u = (double(bench::splitmix(seed * 0x9E3779B97F4A7C15ull + 2 * i) >> 11) + 0.5) * 0x1.0p-53;
  const double v = (double(bench::splitmix(seed * 0x9E3779B97F4A7C15ull + 2 * i + 1) >> 11) + 0.5) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v));
}
void fill(std::span<float> x, std::uint64_t seed) {
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = normal(seed, i);
}

// A codec for a layer of `slices` slices of K with d = K/8, fitted on
// `samples` random first slices (full-rank noise, so the cap sets d).
linear_compressor<> make_codec(std::size_t K, std::size_t slices, std::size_t samples) {
  gradiveq_options o;
  o.slice_size = K;
  o.max_dimension = K / 8;
  o.summands = 4;
  linear_compressor<> c(K * slices, o);
  std::vector<float> layer(K * slices, 0.1f);
  for (std::size_t t = 0; t < samples; ++t) {
    fill(std::span<float>(layer.data(), K), 1000 + t);
    c.add_sample(layer);
  }
  c.fit();
  return c;
}

struct throughput {
  double encode_gflops, decode_gflops, gemm_gflops, gemm_t_gflops, naive_gflops;
};

throughput measure_codec(std::size_t K, std::size_t slices) {
  auto codec = make_codec(K, slices, K / 8 + 40);
  const std::size_t d = codec.dimension(), M = K * slices;
  std::vector<float> x(M), out(M);
  fill(x, 7);
  const double flops = 2.0 * double(slices) * double(K) * double(d);
  gradiveq_payload p;
  codec.encode(x, p);
  // Baselines: the bare products of the same shapes, same operand layouts.
  Eigen::Map<const row_major> X(x.data(), static_cast<Eigen::Index>(slices), static_cast<Eigen::Index>(K));
  Eigen::Map<const Eigen::MatrixXf> U(codec.basis().data(), static_cast<Eigen::Index>(K), static_cast<Eigen::Index>(d));
  row_major Y(static_cast<Eigen::Index>(slices), static_cast<Eigen::Index>(d));
  row_major O(static_cast<Eigen::Index>(slices), static_cast<Eigen::Index>(K));
  const Eigen::Map<const Eigen::RowVectorXf> mu(codec.mean().data(), static_cast<Eigen::Index>(K));
  // Interleaved rounds, best of each: codec and baseline see the same machine
  // load (the VM is shared), so their ratio is meaningful even when it is busy.
  double t_enc = 1e300, t_dec = 1e300, t_gemm = 1e300, t_gemm_t = 1e300, t_naive = 1e300;
  auto timed = [](double& best, auto&& fn) {
    const auto t0 = bench::clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(bench::clock::now() - t0).count());
  };
  for (int round = 0; round < 12; ++round) {
    timed(t_gemm, [&] {
      Y.noalias() = X * U;
      bench::do_not_optimize(Y(0, 0));
    });
    timed(t_enc, [&] {
      codec.encode(x, p);
      bench::do_not_optimize(p.coefficients[0]);
    });
    // The form the issue warns about: (X - mu/N) U makes an S x K temporary.
    timed(t_naive, [&] {
      Y.noalias() = (X.rowwise() - mu / 4.0f) * U;
      bench::do_not_optimize(Y(0, 0));
    });
    timed(t_gemm_t, [&] {
      O.noalias() = Y * U.transpose();
      bench::do_not_optimize(O(0, 0));
    });
    timed(t_dec, [&] {
      codec.decode(p, out);
      bench::do_not_optimize(out[0]);
    });
  }
  std::printf("K=%-5zu d=%-4zu slices=%-6zu M=%-8zu ratio K/d=%.1f, payload %zu bytes vs dense %zu\n", K, d, slices, M,
              codec.compression_ratio(), codec.encoded_bytes(p), M * sizeof(float) + wire::header_size);
  const throughput t{flops / t_enc / 1e9, flops / t_dec / 1e9, flops / t_gemm / 1e9, flops / t_gemm_t / 1e9,
                     flops / t_naive / 1e9};
  bench::row("  encode (eq. 3)  GFLOP/s", t.encode_gflops, "GF/s", t.gemm_gflops, "X*U GEMM");
  bench::row("  decode (eq. 5)  GFLOP/s", t.decode_gflops, "GF/s", t.gemm_t_gflops, "Y*U^T GEMM");
  bench::row("  (X - mu/N)*U    GFLOP/s", t.naive_gflops, "GF/s", t.gemm_gflops, "X*U GEMM");
  std::printf("  encode %.3f ms (%.2f GB/s of gradient), decode %.3f ms\n", t_enc * 1e3,
              double(M) * 4 / t_enc / 1e9, t_dec * 1e3);
  return t;
}

// PCA refresh: fit() from L_t = 100 aggregated samples of one slice.
void measure_pca(std::size_t K) {
  const std::size_t L = 100;
  std::vector<float> layer(K);
  auto timed_fit = [&](pca_solver solver, std::size_t& d) {
    gradiveq_options o;
    o.slice_size = K;
    o.solver = solver;
    linear_compressor<> c(K, o);
    double best = 1e300;
    const int reps = K >= 1024 && solver == pca_solver::covariance ? 2 : 3;
    for (int r = 0; r < reps; ++r) {
      for (std::size_t t = 0; t < L; ++t) {
        fill(layer, 5000 + t);
        c.add_sample(layer);
      }
      const auto t0 = bench::clock::now();
      c.fit();
      best = std::min(best, std::chrono::duration<double>(bench::clock::now() - t0).count());
    }
    d = c.dimension();
    return best;
  };
  std::size_t d_cov = 0, d_gram = 0;
  const double t_cov = timed_fit(pca_solver::covariance, d_cov);
  const double t_gram = timed_fit(pca_solver::gram, d_gram);
  std::printf("PCA refresh K=%-5zu L_t=%zu: covariance %8.2f ms (d=%zu)   Gram %6.2f ms (d=%zu)   speed-up %.1fx\n", K,
              L, t_cov * 1e3, d_cov, t_gram * 1e3, d_gram, t_cov / t_gram);
}

// ---------------------------------------------------------------------------
// Options beyond the paper vs the paper's recipe, on synthetic gradients.
//
// A layer of S slices of K: every slice = a shared low-rank part (rank
// r_shared, one basis for all slices, rotating slowly with the iteration)
// + a slice-specific low-rank part (rank r_own, another basis per slice, so
// the first slice does not represent the others) + isotropic noise.
// Synthetic: it shows what each option does to d and to the loss on later
// iterations; it is not a claim about real CNN gradients.
struct synthetic_layer {
  std::size_t K, S, r_shared = 8, r_own = 4;
  double noise = 0.05, drift = 0.002;  // drift in radians per iteration
  std::vector<Eigen::MatrixXf> own;    // per slice, K x r_own
  Eigen::MatrixXf shared_a, shared_b;  // K x r_shared, orthonormal, a rotates towards b
  synthetic_layer(std::size_t k, std::size_t s, std::size_t own_rank = 4, double noise_level = 0.05,
                  double drift_rate = 0.002)
      : K(k), S(s), r_own(own_rank), noise(noise_level), drift(drift_rate) {
    auto ortho = [&](std::size_t cols, std::uint64_t seed) {
      Eigen::MatrixXf m(static_cast<Eigen::Index>(K), static_cast<Eigen::Index>(cols));
      for (Eigen::Index j = 0; j < m.cols(); ++j)
        for (Eigen::Index i = 0; i < m.rows(); ++i) m(i, j) = normal(seed, std::uint64_t(j * m.rows() + i));
      Eigen::HouseholderQR<Eigen::MatrixXf> qr(m);
      return Eigen::MatrixXf(qr.householderQ() * Eigen::MatrixXf::Identity(m.rows(), m.cols()));
    };
    const Eigen::MatrixXf ab = ortho(2 * r_shared, 11);
    shared_a = ab.leftCols(Eigen::Index(r_shared));
    shared_b = ab.rightCols(Eigen::Index(r_shared));
    for (std::size_t m = 0; m < S; ++m) own.push_back(r_own ? ortho(r_own, 100 + m) : Eigen::MatrixXf(Eigen::MatrixXf::Zero(static_cast<Eigen::Index>(K), 0)));
  }
  std::vector<float> at(std::uint64_t t, std::uint64_t seed) const {
    std::vector<float> g(K * S);
    const float c = std::cos(float(drift * double(t))), s = std::sin(float(drift * double(t)));
    const Eigen::MatrixXf shared = c * shared_a + s * shared_b;
    std::uint64_t idx = 0;
    for (std::size_t m = 0; m < S; ++m) {
      Eigen::VectorXf a(static_cast<Eigen::Index>(r_shared)), b(static_cast<Eigen::Index>(r_own));
      for (Eigen::Index j = 0; j < a.size(); ++j) a(j) = normal(seed, idx++) * 3.0f / (1.0f + 0.3f * float(j));
      for (Eigen::Index j = 0; j < b.size(); ++j) b(j) = normal(seed, idx++) * 1.0f;
      const Eigen::VectorXf v = r_own ? Eigen::VectorXf(shared * a + own[m] * b) : Eigen::VectorXf(shared * a);
      for (std::size_t i = 0; i < K; ++i) g[m * K + i] = v(Eigen::Index(i)) + float(noise) * normal(seed, idx++);
    }
    return g;
  }
};

void measure_options() {
  const std::size_t K = 256, S = 16, Lt = 100, Lc = 400;
  const synthetic_layer layer(K, S);
  std::printf("\nOptions vs the paper's recipe (synthetic layer, %zu slices of K=%zu, lambda=0.01, L_t=%zu, then %zu "
              "compressed iterations):\n",
              S, K, Lt, Lc);
  std::printf("  %-34s %6s %8s %14s %14s\n", "basis", "d", "K/d", "loss it. 1-50", "loss 351-400");
  struct variant {
    const char* name;
    basis_source source;
    double holdout;
  };
  const variant variants[] = {{"paper: first slice, d on fit data", basis_source::first_slice, 0.0},
                              {"pooled slices", basis_source::pooled, 0.0},
                              {"d on held-out samples (20%)", basis_source::first_slice, 0.2},
                              {"pooled + held-out", basis_source::pooled, 0.2}};
  for (const auto& v : variants) {
    gradiveq_options o;
    o.slice_size = K;
    o.source = v.source;
    o.holdout_fraction = v.holdout;
    linear_compressor<> c(K * S, o);
    for (std::size_t t = 0; t < Lt; ++t) c.add_sample(layer.at(t, t));
    c.fit();
    double early = 0, late = 0;
    std::vector<float> y(K * S);
    gradiveq_payload p;
    for (std::size_t t = 0; t < Lc; ++t) {
      if (t >= 50 && t < Lc - 50) continue;
      const auto g = layer.at(Lt + t, 1'000'000 + t);
      c.encode(g, p);
      c.decode(p, y);
      double e = 0, n = 0;
      for (std::size_t i = 0; i < g.size(); ++i) {
        e += double(y[i] - g[i]) * double(y[i] - g[i]);
        n += double(g[i]) * double(g[i]);
      }
      (t < 50 ? early : late) += e / n / 50.0;
    }
    std::printf("  %-34s %6zu %8.1f %14.4f %14.4f\n", v.name, c.dimension(), double(K) / double(c.dimension()), early,
                late);
  }
}


// Refresh cycles on drifting gradients: fixed L_c (paper's experiments), L_c
// ended early by the eq. 7 majority vote, and adaptive cycles on top.
void measure_cycles() {
  const std::size_t K = 256, S = 16, N = 4;
  const synthetic_layer layer(K, S, 0, 0.02, 0.001);
  std::printf("\nRefresh cycles on a drifting synthetic layer (%zu slices of K=%zu, %zu nodes, drift 0.001 rad/it, "
              "L_t=100, L_c=400, 3000 iterations after a 100-iteration warm-up, stale threshold 0.05, patience 3):\n",
              S, K, N);
  std::printf("  %-34s %10s %8s %12s %12s\n", "cycles", "compressed", "fits", "mean loss", "worst loss");
  struct variant {
    const char* name;
    double threshold;
    bool adaptive;
  };
  const variant variants[] = {{"paper: fixed L_c = 400", std::numeric_limits<double>::infinity(), false},
                              {"L_c ended by the eq. 7 vote", 0.05, false},
                              {"eq. 7 vote + adaptive cycles", 0.05, true}};
  for (const auto& v : variants) {
    gradiveq_schedule_options so;
    so.warmup_iterations = 100;
    so.stale_threshold = v.threshold;
    so.patience = 3;
    so.adaptive_cycles = v.adaptive;
    gradiveq_schedule sched(so);
    gradiveq_options o;
    o.slice_size = K;
    o.summands = N;
    linear_compressor<> c(K * S, o);
    std::size_t compressed = 0;
    double sum_loss = 0, worst = 0;
    std::vector<float> agg(K * S);
    gradiveq_payload p;
    for (std::uint64_t t = 0; t < 3100; ++t) {
      std::size_t stale = 0;
      if (sched.phase() == gradiveq_phase::sampling) {
        std::fill(agg.begin(), agg.end(), 0.0f);
        for (std::size_t n = 0; n < N; ++n) {
          const auto g = layer.at(t, t * N + n);
          for (std::size_t i = 0; i < agg.size(); ++i) agg[i] += g[i];
        }
        c.add_sample(agg);
      } else if (sched.phase() == gradiveq_phase::compressed) {
        double loss = 0;
        for (std::size_t n = 0; n < N; ++n) {
          const auto g = layer.at(t, t * N + n);
          c.encode(g, p);
          const auto l = c.local_loss(g, p);
          stale += sched.vote(l);
          loss += l.relative() / double(N);
        }
        ++compressed;
        sum_loss += loss;
        worst = std::max(worst, loss);
      }
      if (sched.advance(stale, N).fit_basis) c.fit();
    }
    std::printf("  %-34s %9.1f%% %8llu %12.4f %12.4f\n", v.name, 100.0 * double(compressed) / 3000.0,
                static_cast<unsigned long long>(c.fits()), sum_loss / double(compressed), worst);
  }
}

}  // namespace

int main() {
  int threads = 1;
#if defined(_OPENMP)
  // 2 threads (the machine's cores) unless OMP_NUM_THREADS says otherwise.
  threads = std::getenv("OMP_NUM_THREADS") ? Eigen::nbThreads() : 2;
  Eigen::setNbThreads(threads);
#endif
  std::printf("bench_gradiveq_codec: Eigen %d.%d.%d, %d thread(s), SIMD: %s\n", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION,
              EIGEN_MINOR_VERSION, Eigen::nbThreads(), Eigen::SimdInstructionSetsInUse());

  std::printf("\nEncode/decode of a layer, all slices in one product, against the bare GEMM of the same shapes:\n");
  measure_codec(256, 4096);
  const auto main_shape = measure_codec(768, 2048);
  measure_codec(1024, 1024);

  std::printf("\n");
  for (std::size_t K : {256u, 768u, 1024u}) measure_pca(K);

  measure_options();
  measure_cycles();

  std::printf("\n");
  bench::result("gradiveq_encode_gflops_k768", main_shape.encode_gflops, "GFLOP/s");
  bench::result("gradiveq_decode_vs_gemm", main_shape.decode_gflops / main_shape.gemm_t_gflops, "fraction");
  bench::result("gradiveq_encode_vs_gemm", main_shape.encode_gflops / main_shape.gemm_gflops, "fraction");
  return threads > 0 ? 0 : 1;
}
