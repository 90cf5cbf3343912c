# Install rules and the exported package, usable two ways:
#   - from an install prefix:  find_package(gradcomp CONFIG) with the prefix in
#     CMAKE_PREFIX_PATH (files in <prefix>/share/cmake/gradcomp: arch-independent,
#     the library is header-only);
#   - from this build tree:    -Dgradcomp_DIR=<this build dir> (export() file plus
#     a gradcompConfig.cmake written into the build dir).
# Both load the same config template, cmake/gradcompConfig.cmake.in.
include(CMakePackageConfigHelpers)

set(GRADCOMP_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/gradcomp"
    CACHE STRING "Where the gradcomp CMake package files are installed, relative to the prefix")
mark_as_advanced(GRADCOMP_INSTALL_CMAKEDIR)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h" PATTERN "*.inl" PATTERN "*.cuh")
install(TARGETS ${GRADCOMP_EXPORTED_TARGETS} EXPORT gradcompTargets)
install(EXPORT gradcompTargets NAMESPACE gradcomp:: DESTINATION ${GRADCOMP_INSTALL_CMAKEDIR})

# Install-tree config.
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/gradcompConfig.cmake.in
  ${PROJECT_BINARY_DIR}/gradcomp-install/gradcompConfig.cmake
  INSTALL_DESTINATION ${GRADCOMP_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gradcompConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/gradcomp-install/gradcompConfig.cmake
              ${PROJECT_BINARY_DIR}/gradcompConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/GradcompDependencies.cmake
        DESTINATION ${GRADCOMP_INSTALL_CMAKEDIR})

# Build-tree package: gradcomp_DIR=<build dir>. The targets point at the
# source tree's include/ (BUILD_INTERFACE).
export(EXPORT gradcompTargets NAMESPACE gradcomp:: FILE ${PROJECT_BINARY_DIR}/gradcompTargets.cmake)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/gradcompConfig.cmake.in
  ${PROJECT_BINARY_DIR}/gradcompConfig.cmake
  INSTALL_DESTINATION ${PROJECT_BINARY_DIR}
  INSTALL_PREFIX ${PROJECT_BINARY_DIR})
configure_file(${PROJECT_SOURCE_DIR}/cmake/GradcompDependencies.cmake
               ${PROJECT_BINARY_DIR}/GradcompDependencies.cmake COPYONLY)
