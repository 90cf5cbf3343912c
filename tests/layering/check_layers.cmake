# Layer and size rules of include/gradcomp (docs/architecture.md), checked by
# ctest (cmake -DINCLUDE_DIR=<checkout>/include -DCHECK=includes|size -P this).
#
#   core     concepts, execution, errors, wire, tags, layout, abi, config,
#            detail/, system/, payloads/, transport/
#   codecs   dense, gradiveq(/), qsgd, two_bit, sparsify, samomentum,
#            autoencoder + lgc/, nn1d(/), powersgd(/), half, fp16, bf16, homomorphic(/)
#   drivers  ring_allreduce + ring/, parameter_server + ps/, dgs_server, schedules/
#   third    protocols/, presets/, model_exchange + exchange/
#
# includes: a codec includes no driver, transport or third-layer header; a
#           driver includes no codec or third-layer header; a core header
#           includes no codec, driver or third-layer header. gradcomp.hpp, the
#           umbrella, may include anything.
# size:     no header above 600 lines.
cmake_minimum_required(VERSION 3.20)
if(NOT INCLUDE_DIR OR NOT CHECK)
  message(FATAL_ERROR "usage: cmake -DINCLUDE_DIR=<include> -DCHECK=includes|size -P check_layers.cmake")
endif()
set(max_lines 600)

# Layer of a header path relative to include/ ("gradcomp/x.hpp").
function(layer_of path out)
  string(REGEX REPLACE "^gradcomp/" "" p "${path}")
  if(p MATCHES "^(protocols|presets|exchange)/" OR p STREQUAL "model_exchange.hpp")
    set(${out} third PARENT_SCOPE)
  elseif(p MATCHES "^(ring|ps|schedules)/" OR p MATCHES "^(ring_allreduce|parameter_server|dgs_server|schedules)\\.hpp$")
    set(${out} driver PARENT_SCOPE)
  elseif(p MATCHES "^(gradiveq|lgc|nn1d|powersgd|homomorphic)/" OR
         p MATCHES "^(dense|gradiveq|qsgd|two_bit|sparsify|samomentum|autoencoder|nn1d|powersgd|half|fp16|bf16|homomorphic)\\.hpp$")
    set(${out} codec PARENT_SCOPE)
  elseif(p MATCHES "^transport/")
    set(${out} transport PARENT_SCOPE)
  elseif(p STREQUAL "gradcomp.hpp")
    set(${out} umbrella PARENT_SCOPE)
  else()
    set(${out} core PARENT_SCOPE)
  endif()
endfunction()

file(GLOB_RECURSE headers RELATIVE ${INCLUDE_DIR} ${INCLUDE_DIR}/gradcomp/*.hpp)
list(SORT headers)
list(LENGTH headers count)
if(count LESS 10)
  message(FATAL_ERROR "check_layers: only ${count} headers under ${INCLUDE_DIR}: wrong directory?")
endif()
set(violations "")
foreach(header IN LISTS headers)
  if(CHECK STREQUAL "size")
    # file(STRINGS) drops empty lines: count newlines instead.
    file(READ ${INCLUDE_DIR}/${header} text)
    string(REGEX MATCHALL "\n" newlines "${text}")
    list(LENGTH newlines n)
    if(n GREATER max_lines)
      string(APPEND violations "  ${header}: ${n} lines (at most ${max_lines}: split it into a folder of one-piece files)\n")
    endif()
    continue()
  endif()
  layer_of(${header} layer)
  if(layer STREQUAL "umbrella" OR layer STREQUAL "third")
    continue()
  endif()
  file(STRINGS ${INCLUDE_DIR}/${header} includes REGEX "^[ \t]*#[ \t]*include[ \t]*<gradcomp/")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*<([^>]+)>.*" "\\1" target "${line}")
    layer_of(${target} target_layer)
    set(bad "")
    if(target_layer STREQUAL "third" OR target_layer STREQUAL "umbrella")
      set(bad "the third layer (protocols/, presets/, model_exchange) sits above codecs and drivers")
    elseif(layer STREQUAL "codec" AND target_layer STREQUAL "driver")
      set(bad "a codec never includes a driver (drivers see codecs through the concepts)")
    elseif(layer STREQUAL "codec" AND target_layer STREQUAL "transport")
      set(bad "a codec never includes a transport")
    elseif(layer STREQUAL "driver" AND target_layer STREQUAL "codec")
      set(bad "a driver never includes a codec (shared payloads live in payloads/)")
    elseif((layer STREQUAL "core" OR layer STREQUAL "transport") AND (target_layer STREQUAL "codec" OR target_layer STREQUAL "driver"))
      set(bad "a core header includes no codec or driver")
    endif()
    if(bad)
      string(APPEND violations "  ${header} (${layer}) includes ${target} (${target_layer}): ${bad}\n")
    endif()
  endforeach()
endforeach()
if(violations)
  message(FATAL_ERROR "check_layers (${CHECK}): rule broken:\n${violations}")
endif()
message(STATUS "check_layers (${CHECK}): ${count} headers, every rule holds")
