# Builds tests/smpi/project (the MPI tests compiled with smpicxx), cmake -P:
#   -DSOURCE_DIR=<checkout> -DBUILD_DIR=<dir> -DSMPICXX=<path> -DGENERATOR=<name>
cmake_minimum_required(VERSION 3.20)
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/smpi/project -B ${BUILD_DIR} -G ${GENERATOR}
                        -DCMAKE_CXX_COMPILER=${SMPICXX} -DCMAKE_BUILD_TYPE=Release
                        -DGRADCOMP_SOURCE_DIR=${SOURCE_DIR}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "smpi: configuring the SMPI test project with ${SMPICXX} failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} -j 2 RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "smpi: building the MPI tests with ${SMPICXX} failed")
endif()
