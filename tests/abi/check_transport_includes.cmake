# cmake -DCXX=<compiler> -DINCLUDE_DIR=<include/> -DHEADERS=<a,b,...> -P check_transport_includes.cmake
#
# Issue 19, item 6: the transport headers include concepts.hpp, which must
# not pull in a kernel, so a transport header never includes xsimd or Thrust.
# Each header is preprocessed with the backends switched on (GRADCOMP_HAS_XSIMD,
# GRADCOMP_HAS_THRUST) and -H lists what it includes.

foreach(var CXX INCLUDE_DIR HEADERS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_transport_includes.cmake: -D${var}=... is required")
  endif()
endforeach()
string(REPLACE "," ";" HEADERS "${HEADERS}")
set(bad 0)
foreach(header IN LISTS HEADERS)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/transport_include_check.cpp "#include <${header}>\n")
  execute_process(COMMAND ${CXX} -std=c++20 -H -E -DGRADCOMP_HAS_XSIMD=1 -DGRADCOMP_HAS_THRUST=1 -I${INCLUDE_DIR}
                          ${CMAKE_CURRENT_BINARY_DIR}/transport_include_check.cpp
                  OUTPUT_QUIET ERROR_VARIABLE included RESULT_VARIABLE rc)
  if(included MATCHES "[/\\\\](xsimd|thrust)[/\\\\]")
    message("${header} includes ${CMAKE_MATCH_1}")
    math(EXPR bad "${bad} + 1")
  elseif(NOT rc EQUAL 0)
    message("${header} does not preprocess on its own: ${included}")
    math(EXPR bad "${bad} + 1")
  else()
    message("${header}: no xsimd, no Thrust")
  endif()
endforeach()
if(bad GREATER 0)
  message(FATAL_ERROR "${bad} transport headers include xsimd or Thrust (or fail to preprocess)")
endif()
