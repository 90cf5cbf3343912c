# For the consumers that build gradcomp from its source tree (add_subdirectory,
# fetchcontent): switches gradcomp's components on with ordinary variables
# before gradcomp is added, GRADCOMP_WITH_<C> ON for each c in
# GRADCOMP_CONSUMER_COMPONENTS and OFF for the others.
set(GRADCOMP_CONSUMER_COMPONENTS "" CACHE STRING "gradcomp components to enable and check")

foreach(component simd thrust mpi)
  string(TOUPPER ${component} upper)
  if(component IN_LIST GRADCOMP_CONSUMER_COMPONENTS)
    set(GRADCOMP_WITH_${upper} ON)
  else()
    set(GRADCOMP_WITH_${upper} OFF)
  endif()
endforeach()
