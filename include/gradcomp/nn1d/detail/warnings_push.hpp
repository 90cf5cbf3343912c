// No include guard: included at the top of every nn1d header, paired with
// nn1d/detail/warnings_pop.hpp at its end.
//
// GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 intrinsics when
// Eigen's GEMM kernels are inlined into the nn1d headers with -march=native
// (GCC bug 105593); the warning is spurious and silenced for the nn1d headers
// only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
