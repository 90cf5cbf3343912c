# Install rules and the exported package: find_package(gradcomp CONFIG
# [COMPONENTS simd thrust mpi]) from an install prefix or from the build tree.
include(CMakePackageConfigHelpers)

install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ${GRADCOMP_EXPORTED_TARGETS} EXPORT gradcompTargets)

set(GRADCOMP_CMAKE_DIR ${CMAKE_INSTALL_DATADIR}/cmake/gradcomp)  # arch-independent
install(EXPORT gradcompTargets NAMESPACE gradcomp:: DESTINATION ${GRADCOMP_CMAKE_DIR})
export(EXPORT gradcompTargets NAMESPACE gradcomp::
       FILE ${CMAKE_CURRENT_BINARY_DIR}/gradcompTargets.cmake)

set(GRADCOMP_BUILT_COMPONENTS "")
foreach(component simd thrust mpi)
  string(TOUPPER ${component} upper)
  if(GRADCOMP_WITH_${upper})
    list(APPEND GRADCOMP_BUILT_COMPONENTS ${component})
  endif()
endforeach()

configure_package_config_file(cmake/gradcompConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/gradcompConfig.cmake
  INSTALL_DESTINATION ${GRADCOMP_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/gradcompConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/gradcompConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/gradcompConfigVersion.cmake
              ${CMAKE_CURRENT_SOURCE_DIR}/cmake/GradcompFindXsimd.cmake
        DESTINATION ${GRADCOMP_CMAKE_DIR})
