# Builds tests/smpi/project (the MPI tests compiled with smpicxx), cmake -P:
#   -DSOURCE_DIR=<checkout> -DBUILD_DIR=<dir> -DSMPICXX=<path> -DGENERATOR=<name>
cmake_minimum_required(VERSION 3.20)
include(${CMAKE_CURRENT_LIST_DIR}/../build_subproject.cmake)
gradcomp_build_subproject(smpi ${SOURCE_DIR}/tests/smpi/project ${BUILD_DIR} ${SMPICXX} ${GENERATOR})
