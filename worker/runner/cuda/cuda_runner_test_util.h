// Helpers of the CUDA runner's tests: the first GPU or a skip, the runner
// options the tests use, and a small written-out model.
//
// Thread-safety: test code, one thread.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cuda_devices.h"
#include "worker/model/weights.h"
#include "worker/runner/cuda/cuda_model_runner.h"
#include "worker/runner/test_model.h"

// The first visible GPU as `device`, or skip the test.
#define REQUIRE_GPU(device)                                                            \
  kernels::DetectedCudaDevices detected_ = kernels::DetectCudaDevices();               \
  if (detected_.devices.empty()) GTEST_SKIP() << "no CUDA device: " << detected_.note; \
  const kernels::DeviceDescription device = detected_.devices.front()

namespace tessera::runner {

// Runner options of the tests: `blocks` KV blocks, at most `tokens` tokens
// in at most `seqs` sequences per step.
inline CudaRunnerOptions TestOptions(int64_t blocks, int tokens, int seqs = 4) {
  CudaRunnerOptions options;
  options.num_kv_blocks = blocks;
  options.max_num_tokens = tokens;
  options.max_num_seqs = seqs;
  return options;
}

// A small model of `arch` (4 / 2 heads of head_dim, hidden 128) written to
// a temporary directory that goes when the object does.
struct SmallTestModel {
  SmallTestModel(const char* arch, int head_dim) {
    char tmpl[] = "/tmp/tessera-cuda-small-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      model = absl::InternalError("mkdtemp failed");
      return;
    }
    dir = tmpl;
    TestModelSpec spec;
    spec.architecture = arch;
    spec.head_dim = head_dim;
    spec.heads = 4;
    spec.kv_heads = 2;
    spec.hidden = 128;
    spec.intermediate = 256;
    const absl::Status written = WriteTestModel(dir, spec);
    model = written.ok() ? model::LoadModel(dir) : written;
  }
  ~SmallTestModel() {
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
  SmallTestModel(const SmallTestModel&) = delete;
  SmallTestModel& operator=(const SmallTestModel&) = delete;

  std::string dir;
  absl::StatusOr<std::unique_ptr<model::LoadedModel>> model = absl::UnknownError("not loaded");
};

}  // namespace tessera::runner
