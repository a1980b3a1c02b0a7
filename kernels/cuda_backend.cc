#include "kernels/cuda_backend.h"

#include "absl/strings/str_cat.h"
#include "kernels/arch/build_manifest.h"
#include "kernels/cuda_fp8_backend.h"

namespace tessera::kernels {
namespace {

std::string S(std::string_view v) { return std::string(v); }

// The checks every CUDA candidate shares (device kind, build, arch floor,
// driver). nullopt when they pass.
std::optional<std::string> CommonWhyNot(const DeviceDescription& device) {
  if (device.kind != DeviceKind::kCuda) {
    return absl::StrCat("needs a CUDA device; this is ", S(DeviceKindName(device.kind)), ":",
                        device.ordinal);
  }
  if (!device.gpu) {
    return absl::StrCat("cuda:", device.ordinal,
                        " was not detected through the CUDA driver (no GPU description)");
  }
  if (!device.build.cuda_built) {
    return std::string(
        "this binary was built without the CUDA backend (TESSERA_CUDA=OFF or no nvcc); rebuild "
        "with -DTESSERA_CUDA=ON");
  }
  const GpuInfo& gpu = *device.gpu;
  if (gpu.arch < arch::kMinCudaArch) {
    return absl::StrCat("needs SM ", arch::kMinCudaArch.ToString(),
                        " or newer (bf16 tensor cores); ", device.Summary(), " is SM ",
                        gpu.arch.ToString());
  }
  if (gpu.driver_version == 0) {
    return std::string(
        "no CUDA driver is loaded (is the NVIDIA driver installed and the device "
        "visible to this process?)");
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> CudaKernelsWhyNot(const DeviceDescription& device) {
  if (auto reason = CommonWhyNot(device)) return reason;
  const GpuInfo& gpu = *device.gpu;
  arch::ImageMatch match = arch::FindImage(device.build, gpu.arch, gpu.driver_version);
  if (match.kind == arch::ImageKind::kNone) return match.note;
  if (gpu.probe && !gpu.probe->loadable) {
    return absl::StrCat("the CUDA runtime could not load this binary's kernels on ",
                        device.Summary(), " (", gpu.probe->error,
                        "), although the manifest "
                        "expected ",
                        match.image->Name(), " to run; images: ", device.build.ImageList(),
                        ", runtime CUDA ", arch::CudaVersionString(gpu.runtime_version));
  }
  return std::nullopt;
}

std::optional<std::string> CublasWhyNot(const DeviceDescription& device) {
  if (auto reason = CommonWhyNot(device)) return reason;
  const GpuInfo& gpu = *device.gpu;
  if (gpu.driver_version / 1000 < device.build.toolkit_version / 1000) {
    return arch::FindImage(device.build, gpu.arch, gpu.driver_version).note;
  }
  return std::nullopt;
}

std::optional<std::string> ArchSpecificWhyNot(const DeviceDescription& device, arch::SmArch needs,
                                              char suffix, std::string_view feature) {
  if (auto reason = CudaKernelsWhyNot(device)) return reason;
  const arch::CodeImage image{needs, suffix, false};
  const arch::SmArch have = device.gpu->arch;
  if (!image.RunsOn(have)) {
    return absl::StrCat(S(feature), " needs SM ", needs.ToString(),
                        suffix == 'a' ? " exactly" : " family", " (", image.Name(),
                        " code); the device is SM ", have.ToString());
  }
  for (const arch::CodeImage& i : device.build.images) {
    if (!i.ptx && i.arch == needs && i.suffix == suffix) return std::nullopt;
  }
  return absl::StrCat(S(feature), " needs ", image.Name(),
                      " code, which this binary lacks (images: ", device.build.ImageList(),
                      "); rebuild with ", image.Name(), " in -DTESSERA_CUDA_ARCHS");
}

std::string CudaBackendDetails(const DeviceDescription& device) {
  if (device.kind != DeviceKind::kCuda || !device.gpu) return "";
  const GpuInfo& gpu = *device.gpu;
  arch::ImageMatch match = arch::FindImage(device.build, gpu.arch, gpu.driver_version);
  std::string out;
  switch (match.kind) {
    case arch::ImageKind::kSass:
      out = absl::StrCat("SASS ", match.image->Name());
      break;
    case arch::ImageKind::kPtxJit:
      out = absl::StrCat("PTX ", match.image->Name(), " JIT (", match.note, ")");
      break;
    case arch::ImageKind::kNone:
      return match.note;
  }
  if (gpu.probe && gpu.probe->loadable) {
    absl::StrAppend(&out, "; runtime loaded binary ", gpu.probe->binary_version);
  }
  if (!arch::CapabilitiesOf(gpu.arch)) {
    absl::StrAppend(&out, "; warning: SM ", gpu.arch.ToString(),
                    " is newer than this build's capability table: portable kernels only");
  }
  return out;
}

void AddCudaCandidates(Registry* registry) {
  auto details = [](const DeviceDescription& d) { return CudaBackendDetails(d); };
  for (Op op : kAllOps) {
    absl::Status s;
    switch (op) {
      case Op::kGemm:
        s = registry->Add(
            Candidate{S(kCublasBackend), op, &CublasWhyNot, [](const DeviceDescription&) {
                        return std::string("cuBLASLt bf16, fp32 accumulate");
                      }});
        break;
      case Op::kAttentionPrefill:
        (void)registry->Add(Candidate{
            S(kCudaSm90aBackend), op,
            [](const DeviceDescription& d) {
              return ArchSpecificWhyNot(d, {9, 0}, 'a', "wgmma prefill attention");
            },
            [](const DeviceDescription& d) {
              return absl::StrCat(
                  "wgmma flash attention for head_dim 64/128 (portable kernel otherwise); ",
                  CudaBackendDetails(d));
            }});
        s = registry->Add(Candidate{S(kCudaBackend), op, &CudaKernelsWhyNot, details});
        break;
      case Op::kAllReduce:
        (void)registry->Add(Candidate{
            S(kP2pBackend), op,
            [](const DeviceDescription& d) -> std::optional<std::string> {
              if (auto reason = CommonWhyNot(d)) return reason;
              if (d.tensor_parallel_size < 2) return std::string("one rank: nothing to reduce");
              if (d.tensor_parallel_size > kP2pMaxRanks) {
                return absl::StrCat("at most ", kP2pMaxRanks, " ranks (group of ",
                                    d.tensor_parallel_size, ")");
              }
              if (!d.tensor_parallel_peer_access) {
                return std::string(
                    "the group's GPUs cannot all access each other's memory (no P2P path)");
              }
              return std::nullopt;
            },
            [](const DeviceDescription& d) {
              return absl::StrCat("peer-to-peer one-shot all-reduce over ", d.tensor_parallel_size,
                                  " GPUs for bf16 messages up to ", kP2pAllReduceMaxBytes >> 10,
                                  " KiB, NCCL above");
            }});
        (void)registry->Add(Candidate{S(kNcclBackend), op,
                                      [](const DeviceDescription& d) -> std::optional<std::string> {
                                        if (auto reason = CommonWhyNot(d)) return reason;
                                        if (d.tensor_parallel_size < 2)
                                          return std::string("one rank: nothing to reduce");
                                        return std::nullopt;
                                      },
                                      [](const DeviceDescription& d) {
                                        return absl::StrCat("NCCL all-reduce over ",
                                                            d.tensor_parallel_size, " GPUs");
                                      }});
        s = registry->Add(Candidate{
            S(kSingleRankBackend), op,
            [](const DeviceDescription& d) -> std::optional<std::string> {
              if (auto reason = CommonWhyNot(d)) return reason;
              if (d.tensor_parallel_size > 1) {
                return absl::StrCat("a tensor-parallel group of ", d.tensor_parallel_size,
                                    " ranks needs a real collective (p2p or nccl)");
              }
              return std::nullopt;
            },
            [](const DeviceDescription&) { return std::string("one rank: nothing to reduce"); }});
        break;
      case Op::kMoeRouting:
        s = registry->Add(Candidate{
            S(kCudaBackend), op, &CudaKernelsWhyNot, [](const DeviceDescription& d) {
              return absl::StrCat("device-side softmax / grouped sigmoid top-k (no host sync); ",
                                  CudaBackendDetails(d));
            }});
        break;
      case Op::kMoeExperts:
        s = registry->Add(
            Candidate{S(kCudaBackend), op, &CudaKernelsWhyNot, [](const DeviceDescription& d) {
                        return absl::StrCat(
                            "experts grouped on the device; GEMV up to 64 tokens, mma.sync "
                            "grouped GEMM above; fp32 combine; ",
                            CudaBackendDetails(d));
                      }});
        break;
      case Op::kFp8Gemm:
        s = AddFp8GemmCandidates(registry);
        break;
      default:
        s = registry->Add(Candidate{S(kCudaBackend), op, &CudaKernelsWhyNot, details});
        break;
    }
    (void)s;  // Names are constant and unique; Add cannot fail here.
  }
}

}  // namespace tessera::kernels
