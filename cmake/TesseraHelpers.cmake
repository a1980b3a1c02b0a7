# tessera_cc_test(NAME foo_test SRCS foo_test.cc DEPS lib... [LABELS ...] [TIMEOUT s]
#                 [GPU [HOST_CASES pattern...]])
# Builds one gtest binary and registers it with ctest (one ctest entry per
# binary keeps the build fast: no gtest_discover_tests step at build time).
#
# GPU: the test needs a CUDA device. It is labelled gpu and built with
# tests/gpu_test_main.cc, which exits 77 when cases skipped and none failed,
# so ctest reports it as skipped, not passed, on a machine without a GPU.
# HOST_CASES: gtest patterns of its cases that need no device; they run as
# a ctest entry of their own, foo_test_host, and the GPU entry leaves them
# out.
function(tessera_cc_test)
  if(NOT TESSERA_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "GPU" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;ARGS;HOST_CASES" ${ARGN})
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gmock)
  set(filter)
  set(names ${T_NAME})
  if(T_GPU)
    target_link_libraries(${T_NAME} PRIVATE tessera_gpu_test_main)
    list(APPEND T_LABELS gpu)
    if(T_HOST_CASES)
      list(JOIN T_HOST_CASES ":" host)
      set(filter "--gtest_filter=-${host}")
      add_test(NAME ${T_NAME}_host COMMAND ${T_NAME} ${T_ARGS} "--gtest_filter=${host}")
      list(APPEND names ${T_NAME}_host)
    endif()
  else()
    target_link_libraries(${T_NAME} PRIVATE GTest::gtest_main)
  endif()
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS} ${filter})
  if(T_GPU)
    set_tests_properties(${T_NAME} PROPERTIES SKIP_RETURN_CODE 77 LABELS "${T_LABELS}")
  endif()
  foreach(n ${names})
    set_tests_properties(${n} PROPERTIES
      ENVIRONMENT "TESSERA_SOURCE_DIR=${PROJECT_SOURCE_DIR};TESSERA_BINARY_DIR=${PROJECT_BINARY_DIR}")
    if(T_TIMEOUT)
      set_tests_properties(${n} PROPERTIES TIMEOUT ${T_TIMEOUT})
    else()
      set_tests_properties(${n} PROPERTIES TIMEOUT 300)
    endif()
    if(T_LABELS AND NOT T_GPU)
      set_tests_properties(${n} PROPERTIES LABELS "${T_LABELS}")
    endif()
  endforeach()
endfunction()

# tessera_cc_benchmark(NAME foo_bench SRCS foo_bench.cc DEPS lib...)
function(tessera_cc_benchmark)
  if(NOT TESSERA_BUILD_BENCHMARKS)
    return()
  endif()
  cmake_parse_arguments(B "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${B_NAME} ${B_SRCS})
  target_link_libraries(${B_NAME} PRIVATE ${B_DEPS} benchmark::benchmark)
endfunction()
