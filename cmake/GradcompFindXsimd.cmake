# Helper shared by gradcomp's own build and by the installed gradcompConfig.cmake.
#
# Debian 12's xsimd 8 exports a target `xsimd` whose INTERFACE_LINK_LIBRARIES
# names a bare `xtl` without looking for it. xsimd only needs xtl for its
# optional xtl complex support, so when xtl is not installed an empty stand-in
# target is made. The stand-in is only made when xsimd really links a bare
# `xtl` and no such target exists (other xsimd builds, e.g. vcpkg's or
# Conan's, do not need it).
#
# Call after find_package(xsimd) succeeded, in the same directory scope.
macro(gradcomp_fix_xsimd_xtl)
  if(TARGET xsimd AND NOT TARGET xtl)
    get_target_property(_gradcomp_xsimd_links xsimd INTERFACE_LINK_LIBRARIES)
    if(_gradcomp_xsimd_links AND "xtl" IN_LIST _gradcomp_xsimd_links)
      find_package(xtl CONFIG QUIET)
      if(NOT TARGET xtl)
        add_library(xtl INTERFACE IMPORTED)
      endif()
    endif()
    unset(_gradcomp_xsimd_links)
  endif()
endmacro()
