// The preflight child protocol, with this binary as the child: its main()
// answers kPreflightChildArg as tessera-worker's does. On a machine without
// GPUs the child preflights the CPU kernels, which exercises the same
// process, arguments and result line as a CUDA worker's child.
#include "worker/engine/preflight_process.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "kernels/cuda_devices.h"

namespace tessera::engine {
namespace {

using ::testing::HasSubstr;

TEST(PreflightProcessTest, ResultLinesReadBack) {
  auto ok = ParsePreflightChildOutput(PreflightResultLine(absl::OkStatus()));
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(*ok);
  auto failed = ParsePreflightChildOutput(absl::StrCat(
      "other output\n",
      PreflightResultLine(absl::FailedPreconditionError("preflight failed on cuda:0:\nbad"))));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(failed.status().message(), "preflight failed on cuda:0: bad");
}

TEST(PreflightProcessTest, OutputWithoutAResultIsNoResult) {
  for (const char* out : {"", "ERROR: Unknown command line flag 'tessera-preflight-child'\n",
                          "tessera-preflight: maybe\n", "tessera-preflight: error x y\n",
                          "tessera-preflight: error 99 out of range\n",
                          "tessera-preflight: error 0 ok is no error\n"}) {
    auto r = ParsePreflightChildOutput(out);
    ASSERT_TRUE(r.ok()) << out;
    EXPECT_FALSE(*r) << out;
  }
}

TEST(PreflightProcessTest, ChildPreflightsTheDevice) {
  auto r = PreflightInChildProcess("cpu", 1, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(*r);  // the child ran and its preflight passed
}

TEST(PreflightProcessTest, ChildReportsItsErrors) {
  // A backend that does not exist: the child's selection fails and the
  // parent gets that error, not a fallback.
  auto r = PreflightInChildProcess("cpu", 1, {{"gemm_backend", "no-such-backend"}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no-such-backend"));
  auto bad_device = PreflightInChildProcess("tpu:0", 1, {});
  ASSERT_FALSE(bad_device.ok());
  EXPECT_THAT(std::string(bad_device.status().message()), HasSubstr("tpu"));
}

TEST(PreflightProcessTest, AChildWithoutAResultIsNoResult) {
  // A program that does not know the argument (it prints a usage error, or
  // nothing, and exits), one that cannot be started, and one that dies by a
  // signal: the caller is told to preflight in its own process, no error.
  const std::string dies = ::testing::TempDir() + "/preflight_child_dies.sh";
  {
    std::ofstream script(dies);
    script << "#!/bin/sh\nkill -9 $$\n";
  }
  ASSERT_EQ(chmod(dies.c_str(), 0755), 0);
  for (const std::string& program : {std::string("/bin/false"), std::string("/bin/true"),
                                     std::string("/nonexistent/tessera-worker"), dies}) {
    auto r = PreflightInChildProcess("cpu", 1, {}, program);
    ASSERT_TRUE(r.ok()) << program << ": " << r.status();
    EXPECT_FALSE(*r) << program;
  }
}

TEST(PreflightProcessTest, PreflightDevicesRunsInThisProcessToo) {
  auto devices = kernels::ResolveDevices("cpu", 1);
  ASSERT_TRUE(devices.ok()) << devices.status();
  auto report = kernels::BuiltinRegistry().SelectAll(devices->front());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(PreflightDevices(*devices, *report).ok());
  EXPECT_EQ(PreflightDevices({}, *report).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PreflightProcessTest, OnlyItsOwnArgumentStartsTheChild) {
  char name[] = "test";
  char other[] = "--gtest_filter=x";
  char* argv[] = {name, other, nullptr};
  EXPECT_EQ(RunPreflightChildIfAsked(2, argv), -1);
  EXPECT_EQ(RunPreflightChildIfAsked(1, argv), -1);
}

}  // namespace
}  // namespace tessera::engine

int main(int argc, char** argv) {
  if (int rc = tessera::engine::RunPreflightChildIfAsked(argc, argv); rc >= 0) return rc;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
