# cmake -DNM=<nm> -DOBJECT_A=<obj> -DOBJECT_B=<obj> -P check_odr_symbols.cmake
#
# The ODR check of the mixed-ISA test: every weak (W, V) or unique (u)
# gradcomp symbol defined in both object files must have the same size in
# both. A symbol with two sizes is one name with two bodies, and the linker
# keeps either one. Demangled with nm -C; std::, Eigen:: and xsimd:: symbols
# (instantiated by the standard library or third parties) are ignored.
# Prints "ODR violation" and fails when it finds one.

foreach(var NM OBJECT_A OBJECT_B)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_odr_symbols.cmake: -D${var}=... is required")
  endif()
endforeach()

function(read_weak_symbols object out_prefix)
  execute_process(COMMAND ${NM} -C -S --defined-only ${object}
                  OUTPUT_VARIABLE text RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} ${object} failed: ${err}")
  endif()
  # One symbol per line; ';' in demangled names would split CMake lists.
  # (and unbalanced brackets would join them): both are replaced while parsing.
  string(REPLACE ";" "<semicolon>" text "${text}")
  string(REPLACE "[" "<lbracket>" text "${text}")
  string(REPLACE "]" "<rbracket>" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(names "")
  foreach(line IN LISTS lines)
    # address size type name
    if(line MATCHES "^[0-9a-fA-F]+ ([0-9a-fA-F]+) ([WVu]) (.+)$")
      set(size "${CMAKE_MATCH_1}")
      set(name "${CMAKE_MATCH_3}")
      if(NOT name MATCHES "gradcomp::")
        continue()
      endif()
      if(name MATCHES "^(std::|Eigen::|xsimd::|__gnu_cxx::|void std::|bool std::)")
        continue()
      endif()
      string(MD5 key "${name}")
      set(${out_prefix}_${key}_size "${size}" PARENT_SCOPE)
      set(${out_prefix}_${key}_name "${name}" PARENT_SCOPE)
      list(APPEND names "${key}")
    endif()
  endforeach()
  set(${out_prefix}_keys "${names}" PARENT_SCOPE)
endfunction()

read_weak_symbols(${OBJECT_A} a)
read_weak_symbols(${OBJECT_B} b)
list(LENGTH a_keys count_a)
list(LENGTH b_keys count_b)
if(count_a EQUAL 0 OR count_b EQUAL 0)
  message(FATAL_ERROR "no weak gradcomp symbols in ${OBJECT_A} (${count_a}) or ${OBJECT_B} (${count_b}): "
                      "the check would prove nothing")
endif()

set(shared 0)
set(bad 0)
foreach(key IN LISTS a_keys)
  if(DEFINED b_${key}_size)
    math(EXPR shared "${shared} + 1")
    if(NOT a_${key}_size STREQUAL b_${key}_size)
      math(EXPR bad "${bad} + 1")
      string(REPLACE "<semicolon>" ";" shown "${a_${key}_name}")
      string(REPLACE "<lbracket>" "[" shown "${shown}")
      string(REPLACE "<rbracket>" "]" shown "${shown}")
      message("ODR violation: ${shown}: 0x${a_${key}_size} bytes in one object, 0x${b_${key}_size} in the other")
    endif()
  endif()
endforeach()
message("weak gradcomp symbols: ${count_a} and ${count_b}, ${shared} defined in both, ${bad} with two sizes")
if(bad GREATER 0)
  message(FATAL_ERROR "${bad} weak gradcomp symbols are defined with different sizes (ODR violation)")
endif()
