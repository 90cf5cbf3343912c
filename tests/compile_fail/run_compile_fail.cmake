# Runs one compile-fail test (see CMakeLists.txt here):
#   cmake -DBUILD_DIR=... -DCONFIG=... -DNAME=<snippet> -DSOURCE=<snippet.cpp> -P run_compile_fail.cmake
# 1. compile_fail_<NAME>_fail must fail to build, in the snippet itself, with
#    output matching every "// expect-error: <regex>" line of SOURCE;
# 2. compile_fail_<NAME>_twin (GRADCOMP_COMPILE_FAIL_TWIN defined) must build.
foreach(var BUILD_DIR NAME SOURCE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_compile_fail.cmake: -D${var}=... is required")
  endif()
endforeach()
set(config_args "")
if(CONFIG)
  set(config_args --config ${CONFIG})
endif()

file(STRINGS ${SOURCE} expect REGEX "^// expect-error: ")
list(TRANSFORM expect REPLACE "^// expect-error: " "")
if(NOT expect)
  message(FATAL_ERROR "${SOURCE}: no '// expect-error: <regex>' line")
endif()

execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} ${config_args} --target compile_fail_${NAME}_fail
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${NAME}: the snippet compiled, but it must not:\n${out}")
endif()
get_filename_component(file ${SOURCE} NAME)
if(NOT out MATCHES "${file}:[0-9]+:[0-9]+: error")
  message(FATAL_ERROR "${NAME}: the build failed, but not with a compile error in ${file}:\n${out}")
endif()
foreach(re IN LISTS expect)
  if(NOT out MATCHES "${re}")
    message(FATAL_ERROR "${NAME}: the diagnostics do not match the expected regex '${re}':\n${out}")
  endif()
  message(STATUS "${NAME}: diagnostics match '${re}'")
endforeach()

execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} ${config_args} --target compile_fail_${NAME}_twin
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NAME}: the positive twin (GRADCOMP_COMPILE_FAIL_TWIN) must compile, but:\n${out}")
endif()
message(STATUS "${NAME}: fails as expected; its positive twin compiles")
