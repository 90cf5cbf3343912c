// GradiVeQ's two products (seed 002, eqs. 3 and 5) on one wide conv layer,
// the kernels the build selects (AVX-512, AVX2 or portable: system/generic/
// gradiveq.hpp) against the portable reference kernels of the same build
// (gradiveq/portable.hpp), the same-run baseline: same order, same bits.
//
// The default layer is the one that makes the Python hooks' GradiVeQ costly
// under train_ddp.py --full (docs/python.md, Hook overhead): a 3x3 conv of
// 64 x 64 channels cut into the paper's slices K = W*D*F = 12,288, 3 of them,
// with d = 443 (pooled PCA over L_t = 150): a basis of 21.8 MB, read whole by
// each product. One thread, thread CPU time, best of 15 interleaved rounds.
//
//   bench_gradiveq_kernels [slices K d [cold]]      (default 3 12288 443, warm)
//
// `cold`: each timed call starts with caches that hold none of its data (a
// 96 MiB buffer read before it, untimed), as in a training step; the RESULT
// names then start gradiveq_wide_layer_cold instead of gradiveq_wide_layer.
//
// Then the same products with the basis stored as binary16 (gradiveq_options::
// basis_storage = float16): the selected kernels reading the binary16 copy
// against themselves reading the float copy of the same rounded values
// (the same bits; only AVX-512 builds read the binary16 copy).
//
// Ends with: RESULT gradiveq_wide_layer_encode_ms, gradiveq_wide_layer_decode_ms
// and their ratios against the portable kernels, gradiveq_wide_layer_{encode,decode}_vs_portable,
// then gradiveq_wide_layer_{encode,decode}_f16_ms and their ratios against the float basis,
// gradiveq_wide_layer_{encode,decode}_f16_speedup; the same with the basis
// stored as int8 values times a power of two per column (basis_storage =
// int8; AVX2 and AVX-512 builds read the int8 copy):
// gradiveq_wide_layer_{encode,decode}_i8_ms, gradiveq_wide_layer_{encode,decode}_i8_speedup.
#include "common.hpp"

#include <gradcomp/gradiveq/basis.hpp>
#include <gradcomp/system/generic/gradiveq.hpp>
#include <gradcomp/system/generic/half.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace gb = gradcomp::bench;
namespace ge = gradcomp::execution;

namespace {

/// "cold": every timed call starts with the caches holding none of its data
/// (a 96 MiB buffer, three times the largest L3 here, is read before it,
/// untimed), as in a training step, where the forward and backward passes
/// evict the basis between two hook calls.
bool cold = false;

void evict_caches() {
  static const std::vector<float> evictor(std::size_t(24) << 20, 1.0f);
  static volatile float sink = 0.0f;
  float acc = 0.0f;
  for (std::size_t e = 0; e < evictor.size(); e += 16) acc += evictor[e];  // one read per 64-byte line
  sink = sink + acc;
}

/// Milliseconds, best of 15 interleaved rounds: eqs. 3 and 5 with the kernels
/// under test and with their same-run baseline.
struct product_times {
  double encode, encode_base, decode, decode_base;
};
product_times time_products(std::function<void()> encode, std::function<void()> encode_base,
                            std::function<void()> decode, std::function<void()> decode_base) {
  const auto b = gb::interleaved_best(15, {encode, encode_base, decode, decode_base},
                                      cold ? std::function<void()>(evict_caches) : std::function<void()>());
  return {b[0] * 1e3, b[1] * 1e3, b[2] * 1e3, b[3] * 1e3};
}

/// The rows and RESULT lines of one comparison: <prefix>_{encode,decode}<suffix>_ms
/// and the baseline's time over the tested one, <prefix>_{encode,decode}_<ratio>.
void report(const product_times& t, const char* label, const char* baseline, const std::string& prefix,
            const std::string& ratio, const std::string& suffix = "") {
  gb::row("encode (eq. 3), " + std::string(label) + "ms", t.encode, "ms", t.encode_base, baseline);
  gb::row("decode (eq. 5), " + std::string(label) + "ms", t.decode, "ms", t.decode_base, baseline);
  gb::result(prefix + "_encode" + suffix + "_ms", t.encode, "ms");
  gb::result(prefix + "_decode" + suffix + "_ms", t.decode, "ms");
  gb::result(prefix + "_encode_" + ratio, t.encode_base / t.encode, "x");
  gb::result(prefix + "_decode_" + ratio, t.decode_base / t.decode, "x");
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t slices = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 3;
  const std::size_t k = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 12288;
  const std::size_t d = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 443;
  cold = argc > 4 && std::string(argv[4]) == "cold";
  if (slices == 0 || k == 0 || d == 0 || (argc > 4 && !cold) || argc > 5) {
    std::fprintf(stderr, "usage: bench_gradiveq_kernels [slices K d [cold]], all > 0\n");
    return 2;
  }
  const std::string name = cold ? "gradiveq_wide_layer_cold" : "gradiveq_wide_layer";
  const char* kernels =
#if defined(GRADCOMP_GRADIVEQ_AVX512)
      "AVX-512";
#elif defined(GRADCOMP_GRADIVEQ_AVX2)
      "AVX2";
#else
      "portable";
#endif
  std::printf("GradiVeQ eqs. 3 and 5 on %zu slices of K = %zu, d = %zu (basis %.1f MB), kernels %s, one core, "
              "%s caches, load average %.2f\n",
              slices, k, d, double(k * d * sizeof(float)) / 1e6, kernels, cold ? "cold" : "warm", gb::load_average());

  const std::vector<float> u = gb::normal_floats(k * d, 1, 0.01f), x = gb::normal_floats(slices * k, 2, 1.0f),
                           mu = gb::normal_floats(k, 3, 0.1f), offset = gb::normal_floats(d, 4, 0.1f);
  std::vector<float> y(slices * d), y_ref(slices * d), out(slices * k), out_ref(slices * k);
  const float scale = 0.25f;

  auto encode = [&](const float* basis, ge::gradiveq_narrow_basis narrow, std::vector<float>& into) {
    return [&, basis, narrow] {
      ge::gradiveq_compress_slices(ge::seq{}, x.data(), slices, k, basis, d, offset.data(), into.data(), narrow);
    };
  };
  auto decode = [&](const float* basis, ge::gradiveq_narrow_basis narrow, std::vector<float>& into) {
    return [&, basis, narrow] {
      ge::gradiveq_expand_slices(ge::seq{}, y.data(), slices, d, basis, k, mu.data(), scale, false, into.data(),
                                 narrow);
    };
  };

  const auto selected = time_products(
      encode(u.data(), nullptr, y),
      [&] { ge::gradiveq_kernel::compress_rows_scalar(x.data(), 0, slices, k, u.data(), 0, d, offset.data(), y_ref.data()); },
      decode(u.data(), nullptr, out),
      [&] {
        ge::gradiveq_kernel::expand_rows_scalar(y.data(), 0, slices, d, u.data(), k, 0, k, mu.data(), scale, false,
                                                 out_ref.data());
      });
  // The selected kernels promise the reference order: the same bits.
  if (y != y_ref || out != out_ref) {
    std::printf("ERROR: the selected kernels differ from the portable ones\n");
    return 1;
  }
  std::printf("basis read at %.2f GB/s (encode), %.2f GB/s (decode)\n", double(k * d * 4) / (selected.encode * 1e6),
              double(k * d * 4) / (selected.decode * 1e6));
  report(selected, "", "portable", name, "vs_portable");

  // basis_storage = float16: the basis rounded to binary16, read as binary16 or as float
  // (both decodes expand the same coefficients y).
  std::vector<std::uint16_t> uh(u.size());
  std::vector<float> ur(u.size());
  ge::floats_to_half_portable(u, uh);
  ge::half_to_floats_portable(uh, ur);
  std::vector<float> yh(slices * d), yf(slices * d), outh(slices * k), outf(slices * k);
  const auto half = time_products(encode(ur.data(), uh.data(), yh), encode(ur.data(), nullptr, yf),
                                  decode(ur.data(), uh.data(), outh), decode(ur.data(), nullptr, outf));
  if (yh != yf || outh != outf) {
    std::printf("ERROR: the binary16 basis gives other bits than the float copy of its values\n");
    return 1;
  }
  report(half, "binary16 basis, ", "float basis", name, "f16_speedup", "_f16");

  // basis_storage = int8: each column rounded to int8 values times a power of
  // two, read as int8 or as the float copy of the same values.
  std::vector<float> u8 = u;
  std::vector<std::int8_t> q;
  std::vector<float> q_scale;
  gradcomp::detail::round_basis_to_int8(u8, k, q, q_scale);
  std::vector<float> y8(slices * d), y8f(slices * d), out8(slices * k), out8f(slices * k);
  const ge::gradiveq_narrow_basis narrow8(q.data(), q_scale.data());
  const auto int8 = time_products(encode(u8.data(), narrow8, y8), encode(u8.data(), nullptr, y8f),
                                  decode(u8.data(), narrow8, out8), decode(u8.data(), nullptr, out8f));
  if (y8 != y8f || out8 != out8f) {
    std::printf("ERROR: the int8 basis gives other bits than the float copy of its values\n");
    return 1;
  }
  report(int8, "int8 basis, ", "float basis", name, "i8_speedup", "_i8");
  return 0;
}
