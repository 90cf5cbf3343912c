# Driver of the consumer tests (cmake -P). Each ROUTE configures, builds and
# runs a consumer project (tests/consumer/<project>) in a fresh WORK_DIR with
# the compiler and generator of the gradcomp build under test.
#
#   -DROUTE=install | build_tree | add_subdirectory | fetchcontent_source |
#           fetchcontent_url | config_checks
#   -DSOURCE_DIR=<gradcomp checkout>  -DBINARY_DIR=<its build dir>
#   -DWORK_DIR=<scratch dir, wiped first>
#   -DCXX_COMPILER=<path>  -DGENERATOR=<name>  -DVERSION=<gradcomp version>
#   -DCOMPONENTS=<comma-separated components to require and check>
#   [-DTHRUST_DIR=<dir of thrust-config.cmake>]
#
# install:             cmake --install BINARY_DIR into WORK_DIR/prefix, then
#                      find_package(gradcomp) with CMAKE_PREFIX_PATH=that prefix
# build_tree:          find_package(gradcomp) with gradcomp_DIR=BINARY_DIR
# add_subdirectory:    add_subdirectory(SOURCE_DIR)
# fetchcontent_source: FetchContent_Declare(SOURCE_DIR SOURCE_DIR)
# fetchcontent_url:    FetchContent_Declare(URL file://<archive of the package files>)
# config_checks:       a core-only gradcomp installed into WORK_DIR: requesting an
#                      unbuilt or unknown component, or a too-new version, fails
#                      with a clear message; OPTIONAL_COMPONENTS does not; the
#                      version file is arch-independent.
cmake_minimum_required(VERSION 3.20)

foreach(var ROUTE SOURCE_DIR BINARY_DIR WORK_DIR CXX_COMPILER GENERATOR VERSION)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
string(REPLACE "," ";" COMPONENTS "${COMPONENTS}")
set(consumer_dir ${SOURCE_DIR}/tests/consumer)

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

# run(what command...): runs a command; FATAL_ERROR with its output unless it exits 0.
set(run_prefix "[${ROUTE}]")
include(${CMAKE_CURRENT_LIST_DIR}/run_step.cmake)

# Configures a consumer project; expects failure with `regex` in the output if given.
function(configure_expect_failure what project build regex)
  list(JOIN ARGN " " printable)
  message(STATUS "[${ROUTE}] ${what} (must fail): ${printable}")
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${consumer_dir}/${project} -B ${build} -G ${GENERATOR}
                          -DCMAKE_CXX_COMPILER=${CXX_COMPILER} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "[${ROUTE}] ${what}: configure succeeded but must fail:\n${out}\n${err}")
  endif()
  string(REGEX REPLACE "[ \t\r\n]+" " " flat "${out}${err}")
  if(NOT flat MATCHES "${regex}")
    message(FATAL_ERROR "[${ROUTE}] ${what}: failed without the expected message /${regex}/:\n${out}\n${err}")
  endif()
  message(STATUS "[${ROUTE}] ${what}: failed as expected, message matches /${regex}/")
endfunction()

# Configures, builds and runs the consumer programs of `project`. The
# component lists go through an initial-cache file (no list escaping).
function(build_and_run project optional_components)
  set(build ${WORK_DIR}/consumer-build)
  file(WRITE ${WORK_DIR}/consumer-init.cmake
       "set(GRADCOMP_CONSUMER_COMPONENTS \"${COMPONENTS}\" CACHE STRING \"\")\n"
       "set(GRADCOMP_CONSUMER_OPTIONAL_COMPONENTS \"${optional_components}\" CACHE STRING \"\")\n")
  run("configure consumer" ${CMAKE_COMMAND} -C ${WORK_DIR}/consumer-init.cmake
      -S ${consumer_dir}/${project} -B ${build} -G ${GENERATOR}
      -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=Release ${ARGN})
  message("${last_output}")
  set(configure_output "${last_output}" PARENT_SCOPE)
  run("build consumer" ${CMAKE_COMMAND} --build ${build} -j 2)
  foreach(program consumer_quickstart consumer_components)
    run("run ${program}" ${build}/${program})
    message("${last_output}")
  endforeach()
  set(consumer_cache ${build}/CMakeCache.txt PARENT_SCOPE)
endfunction()

set(thrust_args "")
if(THRUST_DIR)
  set(thrust_args -DThrust_DIR=${THRUST_DIR})
endif()

# build_and_run of the find_package consumer, which finds gradcomp through
# `locate` (a -D option); FATAL_ERROR unless the gradcomp_DIR it found is `expected_dir`.
function(find_package_consumer expected_dir locate)
  build_and_run(find_package "" ${locate} -DGRADCOMP_CONSUMER_VERSION=${VERSION}
                -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF ${thrust_args})
  file(STRINGS ${consumer_cache} dir_line REGEX "^gradcomp_DIR:")
  string(REGEX REPLACE "^gradcomp_DIR:[A-Z]*=" "" found_dir "${dir_line}")
  if(NOT found_dir STREQUAL expected_dir)
    message(FATAL_ERROR "[${ROUTE}] consumer found the wrong gradcomp: ${dir_line}")
  endif()
endfunction()

if(ROUTE STREQUAL "install")
  set(prefix ${WORK_DIR}/prefix)
  run("install gradcomp" ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${prefix})
  foreach(file share/cmake/gradcomp/gradcompConfig.cmake share/cmake/gradcomp/gradcompConfigVersion.cmake
               share/cmake/gradcomp/gradcompTargets.cmake include/gradcomp/gradcomp.hpp)
    if(NOT EXISTS ${prefix}/${file})
      message(FATAL_ERROR "[install] ${file} is not installed")
    endif()
  endforeach()
  # It must be the installed copy, not the build tree or a system one.
  find_package_consumer(${prefix}/share/cmake/gradcomp -DCMAKE_PREFIX_PATH=${prefix})

elseif(ROUTE STREQUAL "build_tree")
  if(NOT EXISTS ${BINARY_DIR}/gradcompConfig.cmake)
    message(FATAL_ERROR "[build_tree] ${BINARY_DIR}/gradcompConfig.cmake does not exist")
  endif()
  find_package_consumer(${BINARY_DIR} -Dgradcomp_DIR=${BINARY_DIR})

elseif(ROUTE STREQUAL "add_subdirectory")
  build_and_run(add_subdirectory "" -DGRADCOMP_SOURCE_DIR=${SOURCE_DIR} ${thrust_args})

elseif(ROUTE STREQUAL "fetchcontent_source")
  build_and_run(fetchcontent "" -DGRADCOMP_FETCH_SOURCE_DIR=${SOURCE_DIR} ${thrust_args})

elseif(ROUTE STREQUAL "fetchcontent_url")
  # A source archive of just the files a consumer needs (what a release
  # tarball or a Conan export holds): the top CMakeLists.txt, cmake/, include/.
  set(stage ${WORK_DIR}/gradcomp-${VERSION})
  file(MAKE_DIRECTORY ${stage})
  file(COPY ${SOURCE_DIR}/CMakeLists.txt ${SOURCE_DIR}/cmake ${SOURCE_DIR}/include DESTINATION ${stage})
  execute_process(COMMAND ${CMAKE_COMMAND} -E tar czf ${WORK_DIR}/gradcomp-${VERSION}.tar.gz gradcomp-${VERSION}
                  WORKING_DIRECTORY ${WORK_DIR} COMMAND_ERROR_IS_FATAL ANY)
  file(REMOVE_RECURSE ${stage})
  build_and_run(fetchcontent "" -DGRADCOMP_FETCH_URL=file://${WORK_DIR}/gradcomp-${VERSION}.tar.gz ${thrust_args})

elseif(ROUTE STREQUAL "config_checks")
  set(core_build ${WORK_DIR}/core-build)
  set(prefix ${WORK_DIR}/core-prefix)
  run("configure core-only gradcomp" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${core_build} -G ${GENERATOR}
      -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DGRADCOMP_WITH_SIMD=OFF -DGRADCOMP_WITH_THRUST=OFF
      -DGRADCOMP_WITH_MPI=OFF -DGRADCOMP_BUILD_TESTS=OFF -DGRADCOMP_BUILD_BENCH=OFF -DGRADCOMP_BUILD_EXAMPLES=OFF)
  run("install core-only gradcomp" ${CMAKE_COMMAND} --install ${core_build} --prefix ${prefix})

  # Arch-independent version file: no pointer-size check, under share/.
  # Evaluate it as a 32-bit consumer would (the package was built on a 64-bit host).
  set(CMAKE_SIZEOF_VOID_P 4)
  set(PACKAGE_FIND_NAME gradcomp)
  set(PACKAGE_FIND_VERSION ${VERSION})
  string(REPLACE "." ";" parts ${VERSION})
  list(GET parts 0 PACKAGE_FIND_VERSION_MAJOR)
  list(GET parts 1 PACKAGE_FIND_VERSION_MINOR)
  list(GET parts 2 PACKAGE_FIND_VERSION_PATCH)
  set(PACKAGE_FIND_VERSION_COUNT 3)
  include(${prefix}/share/cmake/gradcomp/gradcompConfigVersion.cmake)
  if(PACKAGE_VERSION_UNSUITABLE OR NOT PACKAGE_VERSION_COMPATIBLE)
    message(FATAL_ERROR "[config_checks] gradcompConfigVersion.cmake rejects a 32-bit consumer: not arch-independent")
  endif()
  unset(CMAKE_SIZEOF_VOID_P)
  message(STATUS "[config_checks] version file accepts a consumer with another pointer size")
  if(EXISTS ${prefix}/lib OR EXISTS ${prefix}/lib64)
    message(FATAL_ERROR "[config_checks] a header-only install must not create lib/")
  endif()

  set(common -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
  configure_expect_failure("unbuilt component" find_package ${WORK_DIR}/c1
    "component 'simd' was not built: this gradcomp was configured with GRADCOMP_WITH_SIMD=OFF"
    ${common} -DGRADCOMP_CONSUMER_COMPONENTS=simd)
  configure_expect_failure("unknown component" find_package ${WORK_DIR}/c2
    "'nosuchthing' is not a gradcomp component \\(known components: simd, thrust, mpi\\)"
    ${common} -DGRADCOMP_CONSUMER_COMPONENTS=nosuchthing)
  configure_expect_failure("too new a version" find_package ${WORK_DIR}/c3
    "compatible with requested version \"999.0\".*gradcompConfig.cmake, version: ${VERSION}"
    ${common} -DGRADCOMP_CONSUMER_VERSION=999.0)
  set(COMPONENTS "")
  build_and_run(find_package "simd;mpi" ${common} -DGRADCOMP_CONSUMER_VERSION=${VERSION})
  if(NOT configure_output MATCHES "gradcomp_simd_FOUND=FALSE" OR NOT configure_output MATCHES "gradcomp_mpi_FOUND=FALSE")
    message(FATAL_ERROR "[config_checks] OPTIONAL_COMPONENTS that were not built must be reported not found")
  endif()
  message(STATUS "[config_checks] OPTIONAL_COMPONENTS simd;mpi absent: reported not found, consumer built and ran")

else()
  message(FATAL_ERROR "run_consumer.cmake: unknown ROUTE '${ROUTE}'")
endif()

file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "[${ROUTE}] passed")
