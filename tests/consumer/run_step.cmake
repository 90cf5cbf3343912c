# run(<what> <command...>), shared by the consumer scripts (run_consumer.cmake,
# vcpkg_emulation.cmake): runs the command, printing it after ${run_prefix}
# and `what`; FATAL_ERROR with its output unless it exits 0. Its output goes
# to last_output in the caller's scope.
function(run what)
  list(JOIN ARGN " " printable)
  message(STATUS "${run_prefix} ${what}: ${printable}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${run_prefix} ${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(last_output "${out}${err}" PARENT_SCOPE)
endfunction()
