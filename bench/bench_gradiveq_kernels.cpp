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
//   bench_gradiveq_kernels [slices K d]      (default 3 12288 443)
//
// Then the same products with the basis stored as binary16 (gradiveq_options::
// basis_storage = float16): the selected kernels reading the binary16 copy
// against themselves reading the float copy of the same rounded values
// (the same bits; only AVX-512 builds read the binary16 copy).
//
// Ends with: RESULT gradiveq_wide_layer_encode_ms, gradiveq_wide_layer_decode_ms
// and their ratios against the portable kernels, gradiveq_wide_layer_{encode,decode}_vs_portable,
// then gradiveq_wide_layer_{encode,decode}_f16_ms and their ratios against the float basis,
// gradiveq_wide_layer_{encode,decode}_f16_speedup.
#include "common.hpp"

#include <gradcomp/system/generic/gradiveq.hpp>
#include <gradcomp/system/generic/half.hpp>

#include <cstdint>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace gb = gradcomp::bench;
namespace ge = gradcomp::execution;

int main(int argc, char** argv) {
  const std::size_t slices = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 3;
  const std::size_t k = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 12288;
  const std::size_t d = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 443;
  if (slices == 0 || k == 0 || d == 0) {
    std::fprintf(stderr, "usage: bench_gradiveq_kernels [slices K d], all > 0\n");
    return 2;
  }
  const char* kernels =
#if defined(GRADCOMP_GRADIVEQ_AVX512)
      "AVX-512";
#elif defined(GRADCOMP_GRADIVEQ_AVX2)
      "AVX2";
#else
      "portable";
#endif
  std::printf("GradiVeQ eqs. 3 and 5 on %zu slices of K = %zu, d = %zu (basis %.1f MB), kernels %s, one core, "
              "load average %.2f\n",
              slices, k, d, double(k * d * sizeof(float)) / 1e6, kernels, gb::load_average());

  const std::vector<float> u = gb::normal_floats(k * d, 1, 0.01f), x = gb::normal_floats(slices * k, 2, 1.0f),
                           mu = gb::normal_floats(k, 3, 0.1f), offset = gb::normal_floats(d, 4, 0.1f);
  std::vector<float> y(slices * d), y_ref(slices * d), out(slices * k), out_ref(slices * k);
  const float scale = 0.25f;

  const auto best = gb::interleaved_best(
      15, {[&] { ge::gradiveq_compress_slices(ge::seq{}, x.data(), slices, k, u.data(), d, offset.data(), y.data()); },
           [&] { ge::gradiveq_kernel::compress_rows_scalar(x.data(), 0, slices, k, u.data(), 0, d, offset.data(), y_ref.data()); },
           [&] {
             ge::gradiveq_expand_slices(ge::seq{}, y.data(), slices, d, u.data(), k, mu.data(), scale, false, out.data());
           },
           [&] {
             ge::gradiveq_kernel::expand_rows_scalar(y.data(), 0, slices, d, u.data(), k, 0, k, mu.data(), scale, false,
                                                      out_ref.data());
           }});
  // The selected kernels promise the reference order: the same bits.
  if (y != y_ref || out != out_ref) {
    std::printf("ERROR: the selected kernels differ from the portable ones\n");
    return 1;
  }
  const double encode = best[0] * 1e3, encode_ref = best[1] * 1e3, decode = best[2] * 1e3, decode_ref = best[3] * 1e3;
  gb::row("encode (eq. 3), ms", encode, "ms", encode_ref, "portable");
  gb::row("decode (eq. 5), ms", decode, "ms", decode_ref, "portable");
  std::printf("  basis read at %.2f GB/s (encode), %.2f GB/s (decode)\n", double(k * d * 4) / (encode * 1e6),
              double(k * d * 4) / (decode * 1e6));
  gb::result("gradiveq_wide_layer_encode_ms", encode, "ms");
  gb::result("gradiveq_wide_layer_decode_ms", decode, "ms");
  gb::result("gradiveq_wide_layer_encode_vs_portable", encode_ref / encode, "x");
  gb::result("gradiveq_wide_layer_decode_vs_portable", decode_ref / decode, "x");

  // basis_storage = float16: the basis rounded to binary16, read as binary16 or as float.
  std::vector<std::uint16_t> uh(u.size());
  std::vector<float> ur(u.size());
  ge::floats_to_half_portable(u, uh);
  ge::half_to_floats_portable(uh, ur);
  std::vector<float> yh(slices * d), yf(slices * d), outh(slices * k), outf(slices * k);
  const auto half = gb::interleaved_best(
      15, {[&] {
             ge::gradiveq_compress_slices(ge::seq{}, x.data(), slices, k, ur.data(), d, offset.data(), yh.data(),
                                          uh.data());
           },
           [&] { ge::gradiveq_compress_slices(ge::seq{}, x.data(), slices, k, ur.data(), d, offset.data(), yf.data()); },
           [&] {
             ge::gradiveq_expand_slices(ge::seq{}, yh.data(), slices, d, ur.data(), k, mu.data(), scale, false,
                                        outh.data(), uh.data());
           },
           [&] {
             ge::gradiveq_expand_slices(ge::seq{}, yh.data(), slices, d, ur.data(), k, mu.data(), scale, false,
                                        outf.data());
           }});
  if (yh != yf || outh != outf) {
    std::printf("ERROR: the binary16 basis gives other bits than the float copy of its values\n");
    return 1;
  }
  const double encode_h = half[0] * 1e3, encode_f = half[1] * 1e3, decode_h = half[2] * 1e3, decode_f = half[3] * 1e3;
  gb::row("encode (eq. 3), binary16 basis, ms", encode_h, "ms", encode_f, "float basis");
  gb::row("decode (eq. 5), binary16 basis, ms", decode_h, "ms", decode_f, "float basis");
  gb::result("gradiveq_wide_layer_encode_f16_ms", encode_h, "ms");
  gb::result("gradiveq_wide_layer_decode_f16_ms", decode_h, "ms");
  gb::result("gradiveq_wide_layer_encode_f16_speedup", encode_f / encode_h, "x");
  gb::result("gradiveq_wide_layer_decode_f16_speedup", decode_f / decode_h, "x");
  return 0;
}
