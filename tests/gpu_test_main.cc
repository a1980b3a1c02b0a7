// The gtest main of tests that need a GPU (tessera_cc_test(... GPU)).
//
// A case that finds no usable device skips (GTEST_SKIP). After the run this
// main exits kSkippedExitCode (77) when cases were skipped and none failed,
// so that ctest reports the binary as skipped (SKIP_RETURN_CODE) instead of
// passed. With TESSERA_REQUIRE_GPU=1 (scripts/gpu-run.sh, on hardware where
// every case should run) a skip is a failure instead.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace {
constexpr int kSkippedExitCode = 77;
}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  const int skipped = unit.skipped_test_count();
  if (rc != 0 || skipped == 0) return rc;
  const char* require = std::getenv("TESSERA_REQUIRE_GPU");
  if (require != nullptr && std::strcmp(require, "1") == 0) {
    std::fprintf(stderr, "%d of %d cases skipped where TESSERA_REQUIRE_GPU=1 wants them run\n",
                 skipped, unit.test_to_run_count());
    return 1;
  }
  std::fprintf(stderr, "%d of %d cases skipped (no usable GPU): reporting the test as skipped\n",
               skipped, unit.test_to_run_count());
  return kSkippedExitCode;
}
