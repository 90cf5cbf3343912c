# docs/exchange.md promises a complete 4-worker program of at most 40 lines:
# the block between <!-- exchange-quickstart:begin --> and
# <!-- exchange-quickstart:end --> (built and run like every block by
# docs.clang) must exist and stay that short.
#   cmake -DSOURCE_DIR=<checkout> -P exchange_doc_check.cmake
file(READ ${SOURCE_DIR}/docs/exchange.md page)
set(open "<!-- exchange-quickstart:begin -->\n```cpp\n")
string(FIND "${page}" "${open}" begin)
string(FIND "${page}" "```\n<!-- exchange-quickstart:end -->" end)
if(begin LESS 0 OR end LESS 0)
  message(FATAL_ERROR "docs/exchange.md: exchange-quickstart markers not found")
endif()
string(LENGTH "${open}" skip)
math(EXPR begin "${begin} + ${skip}")
math(EXPR length "${end} - ${begin}")
string(SUBSTRING "${page}" ${begin} ${length} block)
string(REGEX MATCHALL "\n" lines "${block}")
list(LENGTH lines count)
if(count GREATER 40)
  message(FATAL_ERROR "docs/exchange.md's 4-worker program has ${count} lines; the page promises at most 40")
endif()
if(NOT block MATCHES "int main" OR NOT block MATCHES "run_workers\\(4")
  message(FATAL_ERROR "docs/exchange.md's block is not a complete 4-worker program")
endif()
message(STATUS "docs/exchange.md: the 4-worker program has ${count} lines")
