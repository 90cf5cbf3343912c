# The consumer programs every consumer project builds once it has the
# gradcomp targets, however it got them:
#   consumer_quickstart  the README quickstart, linked to gradcomp::gradcomp only
#   consumer_components  links gradcomp::<c> for each c in GRADCOMP_CONSUMER_COMPONENTS
#                        and checks what each brings (src/components.cpp)
add_executable(consumer_quickstart ${CMAKE_CURRENT_LIST_DIR}/src/quickstart.cpp)
target_link_libraries(consumer_quickstart PRIVATE gradcomp::gradcomp)

add_executable(consumer_components ${CMAKE_CURRENT_LIST_DIR}/src/components.cpp)
target_link_libraries(consumer_components PRIVATE gradcomp::gradcomp)
foreach(component IN LISTS GRADCOMP_CONSUMER_COMPONENTS)
  target_link_libraries(consumer_components PRIVATE gradcomp::${component})
  string(TOUPPER ${component} upper)
  target_compile_definitions(consumer_components PRIVATE GRADCOMP_CONSUMER_WANT_${upper})
endforeach()

foreach(target consumer_quickstart consumer_components)
  target_compile_options(${target} PRIVATE $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra>)
endforeach()
