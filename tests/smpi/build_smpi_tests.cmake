# Builds tests/smpi/project (the MPI tests compiled with smpicxx), cmake -P:
#   -DSOURCE_DIR=<checkout> -DBUILD_DIR=<dir> -DSMPICXX=<path> -DGENERATOR=<name>
#   [-DRELEASE_FLAGS=<the calling build's CMAKE_CXX_FLAGS_RELEASE>]
cmake_minimum_required(VERSION 3.20)
include(${CMAKE_CURRENT_LIST_DIR}/../build_subproject.cmake)
set(extra "")
if(RELEASE_FLAGS)
  set(extra "-DCMAKE_CXX_FLAGS_RELEASE=${RELEASE_FLAGS}")   # the same optimization as the tests around it
endif()
gradcomp_build_subproject(smpi ${SOURCE_DIR}/tests/smpi/project ${BUILD_DIR} ${SMPICXX} ${GENERATOR} ${extra})
