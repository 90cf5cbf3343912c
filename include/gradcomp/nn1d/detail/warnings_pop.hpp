// No include guard: closes nn1d/detail/warnings_push.hpp at the end of every nn1d header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
