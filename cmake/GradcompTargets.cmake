include(GNUInstallDirs)
# The library targets: gradcomp::gradcomp (hard dependency: Eigen 3.4) and one
# opt-in INTERFACE target per backend. Each backend target defines a
# GRADCOMP_HAS_<NAME> macro so the headers compile its kernels in.

find_package(Eigen3 3.4 REQUIRED NO_MODULE)

add_library(gradcomp INTERFACE)
add_library(gradcomp::gradcomp ALIAS gradcomp)
target_compile_features(gradcomp INTERFACE cxx_std_20)
target_include_directories(gradcomp INTERFACE
  $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(gradcomp INTERFACE Eigen3::Eigen)
find_package(Threads REQUIRED)
target_link_libraries(gradcomp INTERFACE Threads::Threads)
set(GRADCOMP_EXPORTED_TARGETS gradcomp)

if(GRADCOMP_WITH_SIMD)
  include(GradcompFindXsimd)
  add_library(gradcomp_simd INTERFACE)
  add_library(gradcomp::simd ALIAS gradcomp_simd)
  set_target_properties(gradcomp_simd PROPERTIES EXPORT_NAME simd)
  target_link_libraries(gradcomp_simd INTERFACE gradcomp xsimd)
  target_compile_definitions(gradcomp_simd INTERFACE GRADCOMP_HAS_XSIMD=1)
  list(APPEND GRADCOMP_EXPORTED_TARGETS gradcomp_simd)
endif()

if(GRADCOMP_WITH_THRUST)
  find_package(Thrust REQUIRED CONFIG)
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  thrust_create_target(gradcomp_thrust_omp HOST CPP DEVICE OMP)
  add_library(gradcomp_thrust INTERFACE)
  add_library(gradcomp::thrust ALIAS gradcomp_thrust)
  set_target_properties(gradcomp_thrust PROPERTIES EXPORT_NAME thrust)
  target_link_libraries(gradcomp_thrust INTERFACE gradcomp OpenMP::OpenMP_CXX)
  target_compile_definitions(gradcomp_thrust INTERFACE GRADCOMP_HAS_THRUST=1)
  list(APPEND GRADCOMP_EXPORTED_TARGETS gradcomp_thrust)
endif()

if(GRADCOMP_WITH_MPI)
  find_package(MPI REQUIRED COMPONENTS CXX)
  add_library(gradcomp_mpi INTERFACE)
  add_library(gradcomp::mpi ALIAS gradcomp_mpi)
  set_target_properties(gradcomp_mpi PROPERTIES EXPORT_NAME mpi)
  target_link_libraries(gradcomp_mpi INTERFACE gradcomp MPI::MPI_CXX)
  target_compile_definitions(gradcomp_mpi INTERFACE GRADCOMP_HAS_MPI=1)
  list(APPEND GRADCOMP_EXPORTED_TARGETS gradcomp_mpi)
endif()

# Flags for our own tests/benches/examples only (never pushed onto consumers).
add_library(gradcomp_dev_flags INTERFACE)
target_compile_options(gradcomp_dev_flags INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic>)
if(GRADCOMP_NATIVE)
  target_compile_options(gradcomp_dev_flags INTERFACE -march=native)
endif()
