# Runs ports/gradcomp/portfile.cmake the way `vcpkg install gradcomp[<features>]
# --overlay-ports=ports` would, with stand-ins for the vcpkg helper functions
# the portfile calls (vcpkg itself cannot be installed on this machine), then
# builds test_package/ and a component consumer against the installed tree.
#
# What is real: the portfile's own code and the vcpkg.json manifest, CMake
# configuring gradcomp with exactly the options the portfile passes,
# `cmake --install`, and the consumer builds.
# What is emulated (following vcpkg's documented behaviour): vcpkg_check_features,
# vcpkg_cmake_configure/_install (no vcpkg toolchain; dependencies come from
# the Debian packages), vcpkg_cmake_config_fixup (moves CONFIG_PATH to
# share/<port> and corrects _IMPORT_PREFIX / PACKAGE_PREFIX_DIR), vcpkg_install_copyright,
# a subset of the post-build checks, and the copy into the installed tree.
#
#   cmake -DSOURCE_DIR=<checkout> -DWORK_DIR=<scratch> -DCXX_COMPILER=<path>
#         -DGENERATOR=<name> -DFEATURES=<comma-separated, e.g. simd,mpi>
#         [-DTHRUST_DIR=<dir>] -P vcpkg_emulation.cmake
cmake_minimum_required(VERSION 3.20)
foreach(var SOURCE_DIR WORK_DIR CXX_COMPILER GENERATOR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "vcpkg_emulation.cmake: -D${var}=... is required")
  endif()
endforeach()
string(REPLACE "," ";" requested_features "${FEATURES}")

function(check condition_var what)
  if(NOT ${condition_var})
    message(FATAL_ERROR "vcpkg emulation: FAILED: ${what}")
  endif()
  message(STATUS "vcpkg emulation: ok: ${what}")
endfunction()

# check_that(what <if() condition>): check() of the condition.
function(check_that what)
  if(${ARGN})
    set(ok TRUE)
  else()
    set(ok FALSE)
  endif()
  check(ok "${what}")
endfunction()

set(run_prefix "vcpkg emulation:")
include(${CMAKE_CURRENT_LIST_DIR}/run_step.cmake)

set(PORT gradcomp)
set(port_dir ${SOURCE_DIR}/ports/${PORT})
set(TARGET_TRIPLET x64-linux)
set(CURRENT_BUILDTREES_DIR ${WORK_DIR}/buildtrees/${PORT})
set(CURRENT_PACKAGES_DIR ${WORK_DIR}/packages/${PORT}_${TARGET_TRIPLET})
set(CURRENT_INSTALLED_DIR ${WORK_DIR}/installed/${TARGET_TRIPLET})
set(VCPKG_TARGET_EXECUTABLE_SUFFIX "")
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${CURRENT_BUILDTREES_DIR} ${CURRENT_PACKAGES_DIR} ${CURRENT_INSTALLED_DIR})

# --- the manifest -----------------------------------------------------------
file(READ ${port_dir}/vcpkg.json manifest)
string(JSON port_name GET "${manifest}" name)
string(JSON port_version GET "${manifest}" version)
file(STRINGS ${SOURCE_DIR}/CMakeLists.txt project_line REGEX "project\\(gradcomp VERSION")
string(REGEX MATCH "VERSION ([0-9.]+)" _ "${project_line}")
set(project_version ${CMAKE_MATCH_1})
string(COMPARE EQUAL "${port_name}" "${PORT}" ok)
check(ok "vcpkg.json name is ${PORT}")
string(COMPARE EQUAL "${port_version}" "${project_version}" ok)
check(ok "vcpkg.json version ${port_version} == CMake project version ${project_version}")
string(JSON feature_count LENGTH "${manifest}" features)
set(manifest_features "")
math(EXPR last "${feature_count} - 1")
foreach(i RANGE ${last})
  string(JSON feature MEMBER "${manifest}" features ${i})
  list(APPEND manifest_features ${feature})
endforeach()
foreach(feature IN LISTS requested_features)
  list(FIND manifest_features ${feature} index)
  check_that("feature ${feature} is declared in vcpkg.json" index GREATER_EQUAL 0)
endforeach()
set(FEATURES core ${requested_features})

# --- stand-ins for the vcpkg helpers -------------------------------------------
set(emulated_mapped_features "")
function(vcpkg_check_features)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "OUT_FEATURE_OPTIONS;PREFIX" "FEATURES;INVERTED_FEATURES")
  set(options "")
  set(mapped "")
  list(LENGTH arg_FEATURES n)
  math(EXPR last "${n} - 1")
  foreach(i RANGE 0 ${last} 2)
    math(EXPR j "${i} + 1")
    list(GET arg_FEATURES ${i} feature)
    list(GET arg_FEATURES ${j} option)
    list(APPEND mapped ${feature})
    if(feature IN_LIST FEATURES)
      list(APPEND options "-D${option}=ON")
    else()
      list(APPEND options "-D${option}=OFF")
    endif()
  endforeach()
  set(${arg_OUT_FEATURE_OPTIONS} "${options}" PARENT_SCOPE)
  set(emulated_mapped_features "${mapped}" PARENT_SCOPE)
endfunction()

set(emulated_trees "")
function(vcpkg_cmake_configure)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "SOURCE_PATH" "OPTIONS;OPTIONS_RELEASE;OPTIONS_DEBUG")
  set(thrust_arg "")
  if(THRUST_DIR)
    set(thrust_arg -DThrust_DIR=${THRUST_DIR})
  endif()
  set(trees rel)
  if(NOT VCPKG_BUILD_TYPE STREQUAL "release")
    list(APPEND trees dbg)
  endif()
  foreach(tree IN LISTS trees)
    if(tree STREQUAL "rel")
      set(type Release)
      set(prefix ${CURRENT_PACKAGES_DIR})
      set(extra ${arg_OPTIONS_RELEASE})
    else()
      set(type Debug)
      set(prefix ${CURRENT_PACKAGES_DIR}/debug)
      set(extra ${arg_OPTIONS_DEBUG})
    endif()
    run("configure ${tree}" ${CMAKE_COMMAND} -S ${arg_SOURCE_PATH} -B ${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-${tree}
        -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=${type}
        -DCMAKE_INSTALL_PREFIX=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF ${thrust_arg}
        ${arg_OPTIONS} ${extra})
    message("${last_output}")
  endforeach()
  set(emulated_trees "${trees}" PARENT_SCOPE)
  set(emulated_options "${arg_OPTIONS}" PARENT_SCOPE)
endfunction()

function(vcpkg_cmake_install)
  foreach(tree IN LISTS emulated_trees)
    run("install ${tree}" ${CMAKE_COMMAND} --build ${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-${tree} --target install)
  endforeach()
endfunction()

function(vcpkg_cmake_config_fixup)
  cmake_parse_arguments(PARSE_ARGV 0 arg "DO_NOT_DELETE_PARENT_CONFIG_PATH;NO_PREFIX_CORRECTION"
                        "PACKAGE_NAME;CONFIG_PATH" "")
  if(NOT arg_PACKAGE_NAME)
    set(arg_PACKAGE_NAME ${PORT})
  endif()
  if(NOT arg_CONFIG_PATH)
    set(arg_CONFIG_PATH share/${arg_PACKAGE_NAME})
  endif()
  set(share ${CURRENT_PACKAGES_DIR}/share/${arg_PACKAGE_NAME})
  set(from ${CURRENT_PACKAGES_DIR}/${arg_CONFIG_PATH})
  if(NOT EXISTS ${from})
    message(FATAL_ERROR "vcpkg_cmake_config_fixup: '${from}' does not exist")
  endif()
  if(NOT arg_CONFIG_PATH STREQUAL "share/${arg_PACKAGE_NAME}")
    file(GLOB files ${from}/*)
    file(MAKE_DIRECTORY ${share})
    file(COPY ${files} DESTINATION ${share})
    file(REMOVE_RECURSE ${from})
    get_filename_component(parent ${from} DIRECTORY)
    get_filename_component(parent_name ${parent} NAME)
    if(parent_name STREQUAL "cmake" AND NOT arg_DO_NOT_DELETE_PARENT_CONFIG_PATH)
      file(REMOVE_RECURSE ${parent})
    endif()
  endif()
  file(REMOVE_RECURSE ${CURRENT_PACKAGES_DIR}/debug/${arg_CONFIG_PATH})
  # The files now sit two levels below the prefix (share/<name>).
  file(GLOB_RECURSE cmake_files ${share}/*.cmake)
  foreach(f IN LISTS cmake_files)
    file(READ ${f} contents)
    if(NOT arg_NO_PREFIX_CORRECTION)
      string(REGEX REPLACE
        "get_filename_component\\(_IMPORT_PREFIX \"\\\${CMAKE_CURRENT_LIST_FILE}\" PATH\\)(\nget_filename_component\\(_IMPORT_PREFIX \"\\\${_IMPORT_PREFIX}\" PATH\\))*"
        "get_filename_component(_IMPORT_PREFIX \"\${CMAKE_CURRENT_LIST_FILE}\" PATH)\nget_filename_component(_IMPORT_PREFIX \"\${_IMPORT_PREFIX}\" PATH)\nget_filename_component(_IMPORT_PREFIX \"\${_IMPORT_PREFIX}\" PATH)"
        contents "${contents}")
      string(REGEX REPLACE
        "get_filename_component\\(PACKAGE_PREFIX_DIR \"\\\${CMAKE_CURRENT_LIST_DIR}/\\.\\./(\\.\\./)*\" ABSOLUTE\\)"
        "get_filename_component(PACKAGE_PREFIX_DIR \"\${CMAKE_CURRENT_LIST_DIR}/../../\" ABSOLUTE)"
        contents "${contents}")
    endif()
    string(REPLACE "${CURRENT_INSTALLED_DIR}" "\${_IMPORT_PREFIX}" contents "${contents}")
    string(REPLACE "${CURRENT_PACKAGES_DIR}" "\${_IMPORT_PREFIX}" contents "${contents}")
    file(WRITE ${f} "${contents}")
  endforeach()
endfunction()

function(vcpkg_install_copyright)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "FILE_LIST")
  set(text "")
  foreach(f IN LISTS arg_FILE_LIST)
    file(READ ${f} part)
    string(APPEND text "${part}")
  endforeach()
  file(WRITE ${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright "${text}")
endfunction()

# --- run the portfile -----------------------------------------------------------
include(${port_dir}/portfile.cmake)

foreach(feature IN LISTS manifest_features)
  check_that("portfile maps feature ${feature} onto a CMake option" feature IN_LIST emulated_mapped_features)
endforeach()
foreach(feature simd thrust mpi)
  string(TOUPPER ${feature} upper)
  if(feature IN_LIST requested_features)
    set(expected "-DGRADCOMP_WITH_${upper}=ON")
  else()
    set(expected "-DGRADCOMP_WITH_${upper}=OFF")
  endif()
  check_that("portfile passes ${expected}" expected IN_LIST emulated_options)
endforeach()

# --- post-build checks (a subset of vcpkg's) ---------------------------------------
set(share ${CURRENT_PACKAGES_DIR}/share/${PORT})
foreach(file copyright usage gradcompConfig.cmake gradcompConfigVersion.cmake gradcompTargets.cmake)
  check_that("share/${PORT}/${file} exists" EXISTS ${share}/${file})
endforeach()
foreach(dir share/cmake debug lib bin)
  check_that("no ${dir}/ in the package" NOT EXISTS ${CURRENT_PACKAGES_DIR}/${dir})
endforeach()
file(GLOB_RECURSE installed_files ${CURRENT_PACKAGES_DIR}/*)
set(absolute "")
foreach(f IN LISTS installed_files)
  file(READ ${f} contents)
  foreach(path ${CURRENT_PACKAGES_DIR} ${CURRENT_BUILDTREES_DIR} ${SOURCE_DIR})
    string(FIND "${contents}" "${path}" at)
    if(at GREATER_EQUAL 0)
      list(APPEND absolute "${f} contains ${path}")
    endif()
  endforeach()
endforeach()
if(absolute)
  set(ok FALSE)
  list(JOIN absolute "\n  " absolute)
  message("  ${absolute}")
else()
  set(ok TRUE)
endif()
check(ok "no absolute build paths in the installed files")

# --- install into the installed tree and consume ------------------------------------
file(COPY ${CURRENT_PACKAGES_DIR}/ DESTINATION ${CURRENT_INSTALLED_DIR})
set(thrust_arg "")
if(THRUST_DIR)
  set(thrust_arg -DThrust_DIR=${THRUST_DIR})
endif()
set(consumer_args -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${CURRENT_INSTALLED_DIR} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF ${thrust_arg})

run("configure test_package" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/test_package -B ${WORK_DIR}/test_package ${consumer_args})
message("${last_output}")
run("build test_package" ${CMAKE_COMMAND} --build ${WORK_DIR}/test_package -j 2)
run("run test_package" ${WORK_DIR}/test_package/test_package)
message("${last_output}")

# find_package(... COMPONENTS <features>) selects exactly the features installed.
file(WRITE ${WORK_DIR}/consumer-init.cmake
     "set(GRADCOMP_CONSUMER_COMPONENTS \"${requested_features}\" CACHE STRING \"\")\n")
run("configure component consumer" ${CMAKE_COMMAND} -C ${WORK_DIR}/consumer-init.cmake
    -S ${SOURCE_DIR}/tests/consumer/find_package -B ${WORK_DIR}/consumer ${consumer_args})
message("${last_output}")
string(FIND "${last_output}" "from ${CURRENT_INSTALLED_DIR}/share/gradcomp" at)
check_that("consumer found gradcomp in <installed>/share/gradcomp" at GREATER_EQUAL 0)
run("build component consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer -j 2)
foreach(program consumer_quickstart consumer_components)
  run("run ${program}" ${WORK_DIR}/consumer/${program})
  message("${last_output}")
endforeach()

file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "vcpkg emulation: passed")
