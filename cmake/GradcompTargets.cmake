include(GNUInstallDirs)
# The library targets: gradcomp::gradcomp (hard dependency: Eigen 3.4) and one
# opt-in INTERFACE target per backend component. Each backend target defines a
# GRADCOMP_HAS_<NAME> macro so the headers compile its kernels in.
#
#   component  option               target            needs
#   (core)     -                    gradcomp::gradcomp Eigen3 3.4, Threads
#   simd       GRADCOMP_WITH_SIMD   gradcomp::simd     xsimd (Debian 12: 8.1)
#   thrust     GRADCOMP_WITH_THRUST gradcomp::thrust   Thrust 1.x >= 1.17 + OpenMP (device system OMP)
#   mpi        GRADCOMP_WITH_MPI    gradcomp::mpi      MPI (the C API, used from C++)
#
# The installed gradcompConfig.cmake repeats these dependency look-ups; keep
# the two in step (cmake/gradcompConfig.cmake.in).

include(GradcompDependencies)
find_package(Eigen3 3.4 REQUIRED NO_MODULE)
find_package(Threads REQUIRED)

add_library(gradcomp INTERFACE)
add_library(gradcomp::gradcomp ALIAS gradcomp)
target_compile_features(gradcomp INTERFACE cxx_std_20)
target_include_directories(gradcomp INTERFACE
  $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(gradcomp INTERFACE Eigen3::Eigen Threads::Threads)
set(GRADCOMP_EXPORTED_TARGETS gradcomp)
set(GRADCOMP_BUILT_COMPONENTS "")

if(GRADCOMP_WITH_SIMD)
  find_package(xsimd CONFIG)
  if(NOT TARGET xsimd)
    message(FATAL_ERROR "GRADCOMP_WITH_SIMD=ON needs xsimd (Debian: apt-get install libxsimd-dev); "
                        "configure with -DGRADCOMP_WITH_SIMD=OFF to build without gradcomp::simd.")
  endif()
  gradcomp_fix_xsimd_xtl()
  add_library(gradcomp_simd INTERFACE)
  add_library(gradcomp::simd ALIAS gradcomp_simd)
  set_target_properties(gradcomp_simd PROPERTIES EXPORT_NAME simd)
  target_link_libraries(gradcomp_simd INTERFACE gradcomp xsimd)
  target_compile_definitions(gradcomp_simd INTERFACE GRADCOMP_HAS_XSIMD=1)
  list(APPEND GRADCOMP_EXPORTED_TARGETS gradcomp_simd)
  list(APPEND GRADCOMP_BUILT_COMPONENTS simd)
endif()

if(GRADCOMP_WITH_THRUST)
  # Thrust 1.x (Debian 12: libthrust-dev 1.17) on the CPU, device system OpenMP.
  # The version keeps a CUDA toolkit's CCCL Thrust 2.x/3.x (found through PATH
  # when nvcc is installed) from being picked up for this CPU component.
  find_package(Thrust 1.17 CONFIG)
  find_package(OpenMP COMPONENTS CXX)
  if(Thrust_FOUND AND OpenMP_CXX_FOUND)
    gradcomp_make_thrust_backend()
  endif()
  if(NOT Thrust_FOUND OR NOT OpenMP_CXX_FOUND OR NOT gradcomp_thrust_backend_ok)
    message(FATAL_ERROR "GRADCOMP_WITH_THRUST=ON needs Thrust 1.x >= 1.17 (Debian: apt-get install libthrust-dev; "
                        "or -DThrust_DIR=<dir of thrust-config.cmake>) and OpenMP for C++; "
                        "configure with -DGRADCOMP_WITH_THRUST=OFF to build without gradcomp::thrust.")
  endif()
  message(STATUS "gradcomp: Thrust ${Thrust_VERSION} from ${Thrust_DIR}, device system OMP")
  add_library(gradcomp_thrust INTERFACE)
  add_library(gradcomp::thrust ALIAS gradcomp_thrust)
  set_target_properties(gradcomp_thrust PROPERTIES EXPORT_NAME thrust)
  # gradcomp::thrust_backend is an IMPORTED target (cmake/GradcompDependencies.cmake);
  # the installed config makes it again on the consumer side.
  target_link_libraries(gradcomp_thrust INTERFACE gradcomp gradcomp::thrust_backend)
  target_compile_definitions(gradcomp_thrust INTERFACE GRADCOMP_HAS_THRUST=1)
  list(APPEND GRADCOMP_EXPORTED_TARGETS gradcomp_thrust)
  list(APPEND GRADCOMP_BUILT_COMPONENTS thrust)
endif()

if(GRADCOMP_WITH_MPI)
  find_package(MPI COMPONENTS CXX)
  gradcomp_make_mpi_backend()
  if(NOT gradcomp_mpi_backend_ok)
    message(FATAL_ERROR "GRADCOMP_WITH_MPI=ON needs MPI (Debian: apt-get install libopenmpi-dev openmpi-bin); "
                        "configure with -DGRADCOMP_WITH_MPI=OFF to build without gradcomp::mpi.")
  endif()
  add_library(gradcomp_mpi INTERFACE)
  add_library(gradcomp::mpi ALIAS gradcomp_mpi)
  set_target_properties(gradcomp_mpi PROPERTIES EXPORT_NAME mpi)
  target_link_libraries(gradcomp_mpi INTERFACE gradcomp gradcomp::mpi_backend)
  # gradcomp uses the MPI C API only: keep <mpi.h> from pulling in the removed
  # MPI-2 C++ bindings, which need libmpi_cxx (not linked with MPI::MPI_C).
  target_compile_definitions(gradcomp_mpi INTERFACE GRADCOMP_HAS_MPI=1 OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  list(APPEND GRADCOMP_EXPORTED_TARGETS gradcomp_mpi)
  list(APPEND GRADCOMP_BUILT_COMPONENTS mpi)
endif()

# zlib: autoencoder.hpp (LGC, seed 004) DEFLATEs its index sets with zlib, so
# that one header needs ZLIB::ZLIB linked. gradcomp::lgc links it for this build
# tree (tests, benches, add_subdirectory/FetchContent users). It is not an
# exported component: users of an installed gradcomp link ZLIB::ZLIB themselves
# (and define GRADCOMP_HAS_ZLIB=1 for gradcomp.hpp to include autoencoder.hpp).
find_package(ZLIB)
if(ZLIB_FOUND)
  add_library(gradcomp_lgc INTERFACE)
  add_library(gradcomp::lgc ALIAS gradcomp_lgc)
  target_link_libraries(gradcomp_lgc INTERFACE gradcomp ZLIB::ZLIB)
  # gradcomp.hpp brings the LGC headers in only where zlib is linked.
  target_compile_definitions(gradcomp_lgc INTERFACE GRADCOMP_HAS_ZLIB=1)
endif()

list(JOIN GRADCOMP_BUILT_COMPONENTS " " _gradcomp_components_text)
message(STATUS "gradcomp ${PROJECT_VERSION}: components: core ${_gradcomp_components_text}")

# Flags for our own tests/benches/examples only (never pushed onto consumers).
add_library(gradcomp_dev_flags INTERFACE)
target_compile_options(gradcomp_dev_flags INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic>)
if(GRADCOMP_NATIVE)
  target_compile_options(gradcomp_dev_flags INTERFACE -march=native)
endif()
