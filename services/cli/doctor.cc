// `tessera doctor`: what this build and this machine can run — the build's
// code images, the driver and runtime, every device (GPUs by PCI bus id)
// with its capabilities, the op -> backend table with every rejection's
// reason, and each device's kernel preflight. Exits non-zero, with the
// reason, when a device it checks cannot run (no usable backend for an op,
// or a preflight failure).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/arch/build_manifest.h"
#include "kernels/arch/sm_arch.h"
#include "kernels/cpu_backend.h"
#include "kernels/cuda_devices.h"
#include "kernels/registry.h"
#include "services/cli/commands.h"
#include "services/common/version.h"
#if TESSERA_HAVE_CUDA
#include "kernels/cuda/nccl_group.h"
#include "worker/runner/cuda/cuda_preflight.h"
#endif

ABSL_FLAG(std::string, device, "",
          "doctor: check only this device (cpu, cuda, cuda:<PCI bus id>); default: every device. "
          "generate: where the model runs (default cpu)");
ABSL_FLAG(bool, preflight, true, "doctor: run each device's kernel preflight");
ABSL_FLAG(int, tensor_parallel_size, 1,
          "doctor: check a tensor-parallel group of this many ranks on --device (default cuda "
          "when GPUs are visible): the ranks' devices by PCI bus id, the model-independent "
          "backend table for the group and the NCCL version. generate: run the model as this "
          "many tensor-parallel ranks on --device");

namespace tessera::cli {
namespace {

std::string Features(const kernels::arch::ArchCapabilities& c) {
  std::vector<std::string> f;
  if (c.bf16_mma) f.push_back("bf16-mma");
  if (c.fp8_mma) f.push_back("fp8-mma");
  if (c.cp_async) f.push_back("cp.async");
  if (c.wgmma) f.push_back("wgmma(sm_90a)");
  if (c.tma) f.push_back("tma");
  if (c.tcgen05) f.push_back("tcgen05");
  if (c.thread_block_clusters) f.push_back("clusters");
  return absl::StrJoin(f, " ");
}

// Prints one device's table and preflight; false when it cannot run.
bool CheckDevice(const kernels::DeviceDescription& device, bool preflight) {
  std::printf("\n== %s\n", device.Summary().c_str());
  if (device.kind == kernels::DeviceKind::kCuda && device.gpu) {
    const kernels::GpuInfo& gpu = *device.gpu;
    std::optional<kernels::arch::ArchCapabilities> caps = kernels::arch::CapabilitiesOf(gpu.arch);
    if (caps) {
      std::printf("capability: SM %s, %s (%s): %s\n", gpu.arch.ToString().c_str(),
                  std::string(caps->family).c_str(), std::string(caps->examples).c_str(),
                  Features(*caps).c_str());
    } else {
      std::printf(
          "capability: SM %s, not in this build's capability table (newer GPU): portable "
          "PTX kernels only\n",
          gpu.arch.ToString().c_str());
    }
    std::printf("shared memory per block (opt-in): %lld KiB; memory: %lld MiB\n",
                static_cast<long long>(gpu.shared_memory_per_block_optin >> 10),
                static_cast<long long>(gpu.total_memory_bytes >> 20));
    kernels::arch::ImageMatch match =
        kernels::arch::FindImage(device.build, gpu.arch, gpu.driver_version);
    const char* kind = match.kind == kernels::arch::ImageKind::kSass     ? "native SASS"
                       : match.kind == kernels::arch::ImageKind::kPtxJit ? "PTX JIT (degraded)"
                                                                         : "none";
    std::printf("code image: %s%s%s\n", kind,
                match.image ? absl::StrCat(" ", match.image->Name()).c_str() : "",
                match.note.empty() ? "" : absl::StrCat(" — ", match.note).c_str());
    if (gpu.probe) {
      if (gpu.probe->loadable) {
        std::printf("runtime probe: loaded (binary %d, ptx %d)\n", gpu.probe->binary_version,
                    gpu.probe->ptx_version);
      } else {
        std::printf("runtime probe: FAILED: %s\n", gpu.probe->error.c_str());
      }
    }
  }
  absl::StatusOr<kernels::SelectionReport> report = kernels::BuiltinRegistry().SelectAll(device);
  if (!report.ok()) {
    std::printf("backends: CANNOT RUN: %s\n", std::string(report.status().message()).c_str());
    return false;
  }
  std::printf("%s", report->ToTable().c_str());
  if (!preflight) return true;
  absl::Status pre;
  if (device.kind == kernels::DeviceKind::kCpu) {
    absl::StatusOr<kernels::CpuKernels> k = kernels::CpuKernelsFor(*report);
    pre = k.ok() ? kernels::PreflightCpuKernels(*k, kernels::CpuContextFor(device, nullptr))
                 : k.status();
  } else {
#if TESSERA_HAVE_CUDA
    pre = runner::PreflightCudaKernels(device, *report);
#else
    pre = absl::FailedPreconditionError("this binary was built without the CUDA backend");
#endif
  }
  if (pre.ok()) {
    std::printf("preflight: ok (every chosen kernel matched the CPU reference)\n");
    return true;
  }
  std::printf("preflight: FAILED: %s\n", std::string(pre.message()).c_str());
  return false;
}

}  // namespace

int RunDoctor(const std::vector<char*>&) {
  const kernels::arch::BuildManifest& build = kernels::arch::ThisBuildManifest();
  std::printf("tessera %s\n", services::kTesseraVersion);
  if (build.cuda_built) {
    std::printf("cuda backend: built with nvcc %s (toolkit %s); code images: %s\n",
                build.nvcc_version.c_str(),
                kernels::arch::CudaVersionString(build.toolkit_version).c_str(),
                build.ImageList().c_str());
  } else {
    std::printf("cuda backend: not built (TESSERA_CUDA=OFF or no nvcc)\n");
  }
  const kernels::DetectedCudaDevices gpus = kernels::DetectCudaDevices();
  if (build.cuda_built) {
    std::printf("cuda driver: %s; runtime: %s\n",
                gpus.driver_version ? kernels::arch::CudaVersionString(gpus.driver_version).c_str()
                                    : "none",
                kernels::arch::CudaVersionString(gpus.runtime_version).c_str());
  }
  std::printf("gpus: %zu%s\n", gpus.devices.size(),
              gpus.note.empty() ? "" : absl::StrCat(" (", gpus.note, ")").c_str());
  for (const kernels::DeviceDescription& d : gpus.devices) {
    std::printf("  %s\n", d.Summary().c_str());
  }

  const std::string only = absl::GetFlag(FLAGS_device);
  const int tp = absl::GetFlag(FLAGS_tensor_parallel_size);
  std::vector<kernels::DeviceDescription> devices;
  if (tp != 1) {
    const std::string selector =
        !only.empty() ? only : (gpus.devices.empty() ? std::string("cpu") : std::string("cuda"));
    absl::StatusOr<std::vector<kernels::DeviceDescription>> group =
        kernels::ResolveDevices(selector, tp);
    if (!group.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(group.status().message()).c_str());
      return 1;
    }
    std::printf("\ntensor-parallel group: %d ranks on %s\n", tp, selector.c_str());
    for (int r = 0; r < tp; ++r) {
      std::printf("  rank %d: %s\n", r, (*group)[r].Summary().c_str());
    }
#if TESSERA_HAVE_CUDA
    if ((*group)[0].kind == kernels::DeviceKind::kCuda) {
      std::printf("  nccl: %s (NVLink multicast off: NCCL_NVLS_ENABLE=%s)\n",
                  kernels::cuda::NcclGroup::Version().c_str(),
                  std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE")
                                                  : "unset, set to 0 at start-up");
    }
#endif
    // Every rank's device, each with the group size (all_reduce needs it).
    devices = *group;
    if (devices[0].kind == kernels::DeviceKind::kCpu) devices.resize(1);
  } else if (only.empty()) {
    devices.push_back(kernels::HostCpuDevice());
    devices.insert(devices.end(), gpus.devices.begin(), gpus.devices.end());
  } else {
    absl::StatusOr<kernels::DeviceDescription> d = kernels::ResolveDevice(only);
    if (!d.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(d.status().message()).c_str());
      return 1;
    }
    devices.push_back(*d);
  }
  int failures = 0;
  for (const kernels::DeviceDescription& d : devices) {
    if (!CheckDevice(d, absl::GetFlag(FLAGS_preflight))) ++failures;
  }

  std::printf("\nbackend overrides (flag: choices)\n");
  for (const kernels::BackendFlag& f : kernels::BackendFlags()) {
    std::printf("  --%-20s auto, %s  (%s)\n", std::string(f.flag).c_str(),
                absl::StrJoin(kernels::KnownBackends(f.flag), ", ").c_str(),
                std::string(f.description).c_str());
  }
  std::printf(
      "  --%-20s tensor, expert  (how tensor-parallel ranks split MoE experts: a slice "
      "of every expert, or whole experts per rank)\n",
      "moe_parallel");
  if (failures > 0) {
    std::fprintf(stderr, "error: %d device(s) cannot run Tessera's kernels; see above\n", failures);
    return 1;
  }
  return 0;
}

}  // namespace tessera::cli
