# Small helpers shared by every module's CMakeLists.txt.

# tessera_cc_test(NAME foo_test SRCS foo_test.cc DEPS lib... [LABELS ...] [TIMEOUT s])
# Builds one gtest binary and registers it with ctest (one ctest entry per
# binary keeps the build fast: no gtest_discover_tests step at build time).
function(tessera_cc_test)
  if(NOT TESSERA_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;ARGS" ${ARGN})
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES
    ENVIRONMENT "TESSERA_SOURCE_DIR=${PROJECT_SOURCE_DIR};TESSERA_BINARY_DIR=${PROJECT_BINARY_DIR}")
  if(T_TIMEOUT)
    set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT})
  else()
    set_tests_properties(${T_NAME} PROPERTIES TIMEOUT 300)
  endif()
  if(T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
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
