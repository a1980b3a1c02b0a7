#include "kernels/cuda_fp8_backend.h"

#include "absl/strings/str_cat.h"
#include "kernels/arch/sm_arch.h"
#include "kernels/cuda_backend.h"

namespace tessera::kernels {
namespace {

std::string S(std::string_view v) { return std::string(v); }

constexpr std::string_view kDecode =
    "decode: FP8 GEMV (e4m3 weights, block scale once per 128-element partial sum); fused "
    "paths off for FP8 layers (RoPE/KV in the qkv GEMV, the staged GEMV, SiLU*mul in the "
    "gate/up GEMV: their epilogues read bf16 weights)";

// What the dequantize path does on `device`, and why nothing faster runs.
std::string DequantDetails(const DeviceDescription& d) {
  std::string why;
  if (d.gpu) {
    const std::optional<arch::ArchCapabilities> caps = arch::CapabilitiesOf(d.gpu->arch);
    if (caps && !caps->fp8_mma) {
      why = absl::StrCat("; SM ", d.gpu->arch.ToString(),
                         " has no FP8 tensor cores, so prefill dequantizes to bf16");
    } else if (std::optional<std::string> lt = CublasLtFp8BlockWhyNot(d)) {
      why = absl::StrCat("; FP8 tensor-core prefill unavailable (", *lt,
                         "; Tessera has no mma.sync e4m3 GEMM yet)");
    }
  }
  return absl::StrCat(S(kDecode), "; prefill: dequantize to bf16 + cuBLASLt bf16 GEMM", why, "; ",
                      CudaBackendDetails(d));
}

}  // namespace

std::optional<std::string> CublasLtFp8BlockWhyNot(const DeviceDescription& device) {
  if (auto reason = CudaKernelsWhyNot(device)) return reason;  // the GEMV and quantizer
  if (auto reason = CublasWhyNot(device)) return reason;
  const arch::SmArch sm = device.gpu->arch;
  if (sm.major != 9) {
    const std::optional<arch::ArchCapabilities> caps = arch::CapabilitiesOf(sm);
    return absl::StrCat(
        "cuBLASLt's 128-block FP8 scaling (VEC128 x BLK128x128) runs on Hopper (SM 9.x) only; "
        "the device is SM ",
        sm.ToString(), caps && !caps->fp8_mma ? ", which has no FP8 tensor cores" : "");
  }
  if (device.build.toolkit_version < kCublasLtBlockScalingVersion) {
    return absl::StrCat(
        "cuBLASLt block-scaled FP8 needs CUDA 12.9 or newer; this binary was built "
        "with CUDA ",
        arch::CudaVersionString(device.build.toolkit_version));
  }
  return std::nullopt;
}

absl::Status AddFp8GemmCandidates(Registry* registry) {
  absl::Status s = registry->Add(Candidate{
      S(kCublasLtFp8BlockBackend), Op::kFp8Gemm, &CublasLtFp8BlockWhyNot,
      [](const DeviceDescription& d) {
        return absl::StrCat(
            S(kDecode),
            "; prefill: cuBLASLt FP8 GEMM (Hopper wgmma kernels) with per-token-group-128 "
            "activation scales and 128x128 weight scales, activations quantized on the fly; "
            "per-tensor/channel weights dequantize to bf16; ",
            CudaBackendDetails(d));
      }});
  s.Update(registry->Add(
      Candidate{S(kCudaFp8DequantBackend), Op::kFp8Gemm, &CudaKernelsWhyNot, &DequantDetails}));
  return s;
}

}  // namespace tessera::kernels
