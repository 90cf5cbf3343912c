# gradcomp_build_subproject(<what> <source dir> <build dir> <compiler> <generator> [-D... ...]):
# configures (GRADCOMP_SOURCE_DIR=${SOURCE_DIR}; CMAKE_BUILD_TYPE from the
# caller's variable SUBPROJECT_BUILD_TYPE, Release when unset) and builds a test
# subproject with the given compiler; FATAL_ERROR naming <what> if either fails.
# Included by the cmake -P drivers of tests/docs and tests/smpi.
function(gradcomp_build_subproject what source build compiler generator)
  if(NOT SUBPROJECT_BUILD_TYPE)
    set(SUBPROJECT_BUILD_TYPE Release)
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${source} -B ${build} -G ${generator}
                          -DCMAKE_CXX_COMPILER=${compiler} -DCMAKE_BUILD_TYPE=${SUBPROJECT_BUILD_TYPE}
                          -DGRADCOMP_SOURCE_DIR=${SOURCE_DIR} ${ARGN}
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what}: configuring ${source} with ${compiler} failed")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${build} -j 2 RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what}: building ${source} with ${compiler} failed (errors above)")
  endif()
endfunction()
