# The README's quickstart block (between <!-- quickstart:begin --> and
# <!-- quickstart:end -->) must be exactly tests/consumer/src/quickstart.cpp,
# which every consumer test compiles and runs.
#   cmake -DSOURCE_DIR=<checkout> -P readme_check.cmake
file(READ ${SOURCE_DIR}/README.md readme)
file(READ ${SOURCE_DIR}/tests/consumer/src/quickstart.cpp program)
string(FIND "${readme}" "<!-- quickstart:begin -->\n```cpp\n" begin)
string(FIND "${readme}" "```\n<!-- quickstart:end -->" end)
if(begin LESS 0 OR end LESS 0)
  message(FATAL_ERROR "README.md: quickstart markers not found")
endif()
string(LENGTH "<!-- quickstart:begin -->\n```cpp\n" skip)
math(EXPR begin "${begin} + ${skip}")
math(EXPR length "${end} - ${begin}")
string(SUBSTRING "${readme}" ${begin} ${length} block)
if(NOT block STREQUAL program)
  message(FATAL_ERROR "README.md's quickstart differs from tests/consumer/src/quickstart.cpp; keep them identical")
endif()
message(STATUS "README quickstart == tests/consumer/src/quickstart.cpp")
