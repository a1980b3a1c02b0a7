// The FP8 linear's candidates (Op::kFp8Gemm) for CUDA devices, and the rules
// that pick one per architecture. Plain C++, table-tested with fake devices
// in cuda_selection_test.cc.
//
// Candidates, in priority order (each serves decode, i.e. steps of few
// tokens, with Tessera's FP8 GEMV, kernels/cuda/fp8_gemv.h, which reads the
// e4m3 weights and applies each 128x128 block scale once per 128-element
// partial sum; they differ in prefill):
//   cublaslt-fp8-block  SM 9.x, cuBLASLt >= 12.9: cuBLASLt's FP8 GEMM with
//                       128-element activation scales (VEC128_32F, quantized
//                       per token group of 128 on the fly by Tessera's kernel,
//                       kernels/cuda/fp8_quantize.h) and 128x128 weight scales
//                       (BLK128x128_32F). A well-kept vendor library (its own
//                       Hopper wgmma kernels, tuned per shape, so it does not
//                       need this binary's sm_90a image) beats a hand-written
//                       GEMM here; NVIDIA documents this scaling mode for
//                       Hopper only (cuBLAS 12.9 release notes).
//   cuda-fp8-dequant    every SM 8.0+ device: prefill dequantizes the weight
//                       to bf16 (exact e4m3 x scale, rounded once to bf16)
//                       and runs the bf16 cuBLASLt GEMM. The only path on SM
//                       8.0 / 8.6, which have no FP8 tensor cores; on 8.9,
//                       10.x and 12.x it stands in until an mma.sync e4m3
//                       GEMM exists (the details say so).
// Per-tensor and per-channel (compressed-tensors) weights take
// cuda-fp8-dequant's prefill on every arch: cuBLASLt's block mode needs
// 128x128 weight scales.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/registry.h"

namespace tessera::kernels {

inline constexpr std::string_view kCublasLtFp8BlockBackend = "cublaslt-fp8-block";
inline constexpr std::string_view kCudaFp8DequantBackend = "cuda-fp8-dequant";

// The CUDA version from which cuBLASLt has the 128-block FP8 scaling modes.
inline constexpr int kCublasLtBlockScalingVersion = 12090;

// Adds the CUDA candidates of Op::kFp8Gemm (see above) to `registry`.
absl::Status AddFp8GemmCandidates(Registry* registry);

// Why cuBLASLt's block-scaled FP8 GEMM cannot run on `device`, or nullopt.
std::optional<std::string> CublasLtFp8BlockWhyNot(const DeviceDescription& device);

}  // namespace tessera::kernels
