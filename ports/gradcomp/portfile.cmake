# vcpkg port of gradcomp (header-only), used as an overlay port from a gradcomp
# checkout:  vcpkg install gradcomp[simd,mpi] --overlay-ports=<checkout>/ports
# The sources are this checkout (the port sits in <checkout>/ports/gradcomp);
# a registry port would fetch a release with vcpkg_from_github instead.
# Features map one to one onto gradcomp's CMake options and targets; keep them
# in step with CMakeLists.txt, cmake/GradcompTargets.cmake and conanfile.py.
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
if(NOT EXISTS "${SOURCE_PATH}/include/gradcomp/gradcomp.hpp")
  message(FATAL_ERROR "gradcomp port: expected the gradcomp sources at ${SOURCE_PATH}")
endif()

# Header-only: one (release) configuration is enough.
set(VCPKG_BUILD_TYPE release)

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
  FEATURES
    simd   GRADCOMP_WITH_SIMD
    thrust GRADCOMP_WITH_THRUST
    mpi    GRADCOMP_WITH_MPI
)

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    ${FEATURE_OPTIONS}
    -DGRADCOMP_BUILD_TESTS=OFF
    -DGRADCOMP_BUILD_BENCH=OFF
    -DGRADCOMP_BUILD_EXAMPLES=OFF
    -DGRADCOMP_BUILD_FUZZERS=OFF
    -DGRADCOMP_INSTALL=ON
)
vcpkg_cmake_install()
# gradcomp installs its package files to share/cmake/gradcomp; vcpkg wants share/gradcomp.
vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/gradcomp)

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
if(EXISTS "${SOURCE_PATH}/LICENSE")
  vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
else()
  # The project has not chosen a license yet; vcpkg requires a copyright file.
  file(WRITE "${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright"
       "gradcomp has not declared a license (no LICENSE file in its source tree).\n")
endif()
