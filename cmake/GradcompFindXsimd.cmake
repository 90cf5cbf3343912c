# Finds xsimd. Debian 12's xsimd 8 exports a target that links a plain `xtl`
# without looking for it; xsimd only needs xtl for its optional xtl complex
# support, so when the xtl package is absent an empty stand-in target is made.
find_package(xtl QUIET)
if(NOT TARGET xtl)
  add_library(xtl INTERFACE IMPORTED)
endif()
find_package(xsimd REQUIRED)
