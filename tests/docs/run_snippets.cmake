# Driver of the docs tests (cmake -P): configures tests/docs/project with the
# given compiler, builds every block, then runs each program (under mpirun for
# blocks that need MPI) and fails on the first that does not exit 0.
#   -DSOURCE_DIR=<checkout> -DWORK_DIR=<scratch> -DCXX_COMPILER=<path>
#   -DGENERATOR=<name> [-DOPTIONS=<-D...|-D...>]
cmake_minimum_required(VERSION 3.20)
string(REPLACE "|" ";" OPTIONS "${OPTIONS}")
file(MAKE_DIRECTORY ${WORK_DIR})
include(${CMAKE_CURRENT_LIST_DIR}/../build_subproject.cmake)
# The blocks are checked for compiling and running, not timed or debugged: an
# unoptimized build without debug information (asserts stay on) takes about
# half the compile time of -O3 and 0.7x that of -O0 -g (CI time: two
# compilers build them all).
set(SUBPROJECT_BUILD_TYPE Debug)
gradcomp_build_subproject("docs (a block of README.md or docs/)" ${SOURCE_DIR}/tests/docs/project ${WORK_DIR}
                          ${CXX_COMPILER} ${GENERATOR} -DCMAKE_CXX_FLAGS_DEBUG=-O0 ${OPTIONS})
file(STRINGS ${WORK_DIR}/snippets.txt programs)
list(LENGTH programs count)
set(ran 0)
foreach(line IN LISTS programs)
  # <name>|<source markdown:line>|<launcher or empty>
  string(REPLACE "|" ";" fields "${line}")
  list(GET fields 0 name)
  list(GET fields 1 where)
  list(GET fields 2 launcher)
  string(REPLACE " " ";" launcher "${launcher}")
  message(STATUS "docs: running ${name} (${where})")
  execute_process(COMMAND ${launcher} ${WORK_DIR}/${name} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 300)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "docs: the block at ${where} (${name}) exited with ${rc}:\n${out}\n${err}")
  endif()
  math(EXPR ran "${ran} + 1")
endforeach()
if(ran EQUAL 0)
  message(FATAL_ERROR "docs: no block found (the extractor is broken)")
endif()
message(STATUS "docs: ${ran} blocks compiled with ${CXX_COMPILER} and run")
