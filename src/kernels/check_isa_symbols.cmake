# CTest script: the ISA translation units (avx2.cc, avx512vnni.cc, neon.cc) must define
# exactly one external symbol, their MatMulQ entry; the row-operation units (rowops_avx2.cc,
# rowops_avx512.cc) exactly their row operations (rowops.inc).
# Any other global or weak symbol (an inline function or template instantiated there, e.g.
# std::vector<...>) could be the copy the linker keeps, and generic code would then run
# AVX-512 instructions on a CPU without them (backends.h states the rule).
#   cmake -DNM=<nm> -DOBJECTS=<list of object files> -P check_isa_symbols.cmake
set(checked 0)
foreach(obj ${OBJECTS})
  if(obj MATCHES "rowops_(avx2|avx512)\\.cc\\.o(bj)?$")
    set(allowed "^daisy::kernels::rowops::${CMAKE_MATCH_1}::(QuantizeRow|QuantizeRowTwoTerms|ExpN|SoftmaxRows|Silu|AddScale|Mul)\\(")
  elseif(obj MATCHES "(avx2|avx512vnni|neon)\\.cc\\.o(bj)?$")
    set(allowed "^daisy::kernels::${CMAKE_MATCH_1}::MatMulQ\\(")
  else()
    continue()
  endif()
  math(EXPR checked "${checked} + 1")
  execute_process(COMMAND ${NM} --defined-only -C ${obj} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${obj}")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  foreach(line ${lines})
    # External (upper-case type letter) or weak (W, V, u) definitions.
    if(line MATCHES "^[0-9a-fA-F]* [TDBRWVu] (.*)$")
      set(sym "${CMAKE_MATCH_1}")
      if(NOT sym MATCHES "${allowed}")
        message(FATAL_ERROR "${obj} exports ${sym}: only its entry points (${allowed}) may leave an ISA unit")
      endif()
    endif()
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(STATUS "no ISA unit in this build")
else()
  message(STATUS "${checked} ISA unit(s) export only their entry points")
endif()
