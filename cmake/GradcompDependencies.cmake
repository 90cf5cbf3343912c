# Helpers shared by gradcomp's own build (cmake/GradcompTargets.cmake) and by
# the installed gradcompConfig.cmake, so that both find the backends'
# dependencies the same way. Each is called in the directory scope where the
# dependency was found.

# Debian 12's xsimd 8 exports a target `xsimd` whose INTERFACE_LINK_LIBRARIES
# names a bare `xtl` without looking for it. xsimd only needs xtl for its
# optional xtl complex support, so when xtl is not installed an empty stand-in
# target is made. Only done when xsimd really links a bare `xtl` and no such
# target exists (other xsimd builds, e.g. vcpkg's or Conan's, do not need it).
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

# Makes the IMPORTED target gradcomp::thrust_backend: Thrust with host system
# CPP and device system OMP. With Thrust's own package config (Debian's
# libthrust-dev, NVIDIA's releases) through thrust_create_target(); with a
# package manager's generated config that only has a thrust::thrust target
# (Conan's CMakeDeps) by hand. Needs find_package(Thrust) and
# find_package(OpenMP COMPONENTS CXX) done. Sets gradcomp_thrust_backend_ok.
macro(gradcomp_make_thrust_backend)
  set(gradcomp_thrust_backend_ok TRUE)
  if(TARGET gradcomp::thrust_backend)
    # made already in this directory
  elseif(COMMAND thrust_create_target)
    thrust_create_target(gradcomp::thrust_backend HOST CPP DEVICE OMP)
  elseif(TARGET thrust::thrust AND TARGET OpenMP::OpenMP_CXX)
    add_library(gradcomp::thrust_backend INTERFACE IMPORTED)
    target_link_libraries(gradcomp::thrust_backend INTERFACE thrust::thrust OpenMP::OpenMP_CXX)
    target_compile_definitions(gradcomp::thrust_backend INTERFACE
      THRUST_HOST_SYSTEM=THRUST_HOST_SYSTEM_CPP THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP)
  else()
    set(gradcomp_thrust_backend_ok FALSE)
  endif()
endmacro()

# Makes the IMPORTED target gradcomp::mpi_backend: MPI::MPI_CXX from CMake's
# FindMPI, or MPI::MPI_C when a package manager's config provides only the C
# bindings target (Conan's openmpi); gradcomp uses the MPI C API either way.
# Needs find_package(MPI) done. Sets gradcomp_mpi_backend_ok.
macro(gradcomp_make_mpi_backend)
  set(gradcomp_mpi_backend_ok TRUE)
  if(TARGET gradcomp::mpi_backend)
    # made already in this directory
  elseif(TARGET MPI::MPI_CXX)
    add_library(gradcomp::mpi_backend INTERFACE IMPORTED)
    target_link_libraries(gradcomp::mpi_backend INTERFACE MPI::MPI_CXX)
  elseif(TARGET MPI::MPI_C)
    add_library(gradcomp::mpi_backend INTERFACE IMPORTED)
    target_link_libraries(gradcomp::mpi_backend INTERFACE MPI::MPI_C)
  else()
    set(gradcomp_mpi_backend_ok FALSE)
  endif()
endmacro()
